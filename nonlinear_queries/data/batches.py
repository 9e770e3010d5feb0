"""
Fixed-seed batch indices: every model variant sees the same tokens at every step.

The paper pre-generates all batch indices from a fixed seed (arXiv:2603.13381 §3.1;
docs/training.md). Here each stream is an int64 array of sequence start offsets, shape
(rows, cols), stored as a .npy file and opened with np.memmap, so 60k steps x 480
sequences (230 MB) never has to sit in RAM:

    train       rows = max_iters,  cols = batch_size * gradient_accumulation_steps
    train_eval  rows = eval_iters, cols = batch_size     (train loss at every eval)
    val_eval    rows = eval_iters, cols = batch_size     (val loss at every eval)

Row i of a stream is drawn by its own generator seeded with (data_seed, stream, i), so
a row does not depend on how many rows the file has: a 2,000-step run and a 60,000-step
run with the same data_seed train on the same first 2,000 batches, and a run that is
extended and resumed keeps its batches. Offsets lie in [0, n_tokens - block_size - 1]
so that x = data[o : o+T] and its target y = data[o+1 : o+T+1] are both in range.
"""

import hashlib
import json
import os
from dataclasses import dataclass

import numpy as np
import torch

from nonlinear_queries.errors import DataError
from nonlinear_queries.record.atomic import atomic_path

STREAMS = {"train": 0, "train_eval": 1, "val_eval": 2}
_CHUNK_ROWS = 1024  # rows generated and flushed at a time: bounded RAM for any file size
_HASH_CHUNKS, _HASH_CHUNK_BYTES = 64, 1 << 20  # token files above 64 MiB are hashed at 64 places
_HASH_ROWS = 16  # index rows fingerprinted per stream


def open_tokens(path, prepare_hint):
    """Open a uint16 token file as a read-only np.memmap.

    Raises FileNotFoundError with `prepare_hint` (the command that creates it) if missing, and
    ValueError if its size is not a whole number of 2-byte tokens (a truncated copy or another format).
    """
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} not found; create it with: {prepare_hint}")
    size = os.path.getsize(path)
    if size == 0:
        raise ValueError(f"{path} is empty; recreate it with: {prepare_hint}")
    if size % 2:
        raise ValueError(f"{path} holds {size:,} bytes, an odd number, so it is not a file of uint16 tokens (2 bytes "
                         f"each): it is truncated or in another format. Recreate it with: {prepare_hint}")
    return np.memmap(path, dtype=np.uint16, mode="r")


def row_offsets(data_seed, stream, row, cols, high):
    """Offsets of one row: int64 (cols,), uniform in [0, high), from seed (data_seed, stream, row)."""
    rng = np.random.default_rng([data_seed, STREAMS[stream], row])
    return rng.integers(0, high, size=cols, dtype=np.int64)


def index_file(index_dir, stream, data_seed, rows, cols, block_size, n_tokens):
    """Open (creating it if missing) the index file of one stream; returns int64 memmap (rows, cols).

    The file name carries everything that determines its contents, so runs of any
    model variant with the same data and data_seed share it. It is written to a temp
    file and renamed, so an interrupted build never leaves a partial file behind.
    Raises ValueError if the token file is too short for block_size.
    """
    high = n_tokens - block_size
    if high < 1:
        raise ValueError(
            f"block_size={block_size} needs at least {block_size + 1} tokens, but the "
            f"{stream.split('_')[0]} split has {n_tokens}; lower block_size or use more data"
        )
    name = f"{stream}_seed{data_seed}_{rows}x{cols}_T{block_size}_N{n_tokens}.npy"
    path = os.path.join(index_dir, name)
    if not os.path.exists(path):
        os.makedirs(index_dir, exist_ok=True)
        with atomic_path(path, per_process=True) as tmp:  # runs starting together may build the same file
            arr = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.int64, shape=(rows, cols))
            for start in range(0, rows, _CHUNK_ROWS):
                stop = min(start + _CHUNK_ROWS, rows)
                arr[start:stop] = [row_offsets(data_seed, stream, r, cols, high) for r in range(start, stop)]
                arr.flush()
            del arr
    return np.load(path, mmap_mode="r")


def get_batch(data, offsets, block_size, device):
    """Inputs and targets for the given start offsets.

    data: uint16 token memmap; offsets: int64 (B,). Returns x, y: int64 (B, block_size)
    on `device`, y shifted one token right of x.
    """
    seqs = np.stack([data[o : o + block_size + 1] for o in offsets]).astype(np.int64)
    xy = torch.from_numpy(seqs)
    if device.startswith("cuda"):
        xy = xy.pin_memory().to(device, non_blocking=True)
    else:
        xy = xy.to(device)
    return xy[:, :-1].contiguous(), xy[:, 1:].contiguous()


def file_fingerprint(path):
    """Size (bytes) and blake2b (hex) of a token file, to tell on resume whether it changed.

    Files up to 64 MiB are hashed whole. Larger ones are hashed at 64 evenly spaced 1 MiB
    chunks (the first at offset 0, the last ending at the end of the file): OpenWebText's
    17 GB train.bin costs 64 MiB of reading instead of minutes, and a re-prepared or
    replaced file differs in size or at the sampled places, but an edit confined to the
    bytes between chunks goes unnoticed.
    """
    size = os.path.getsize(path)
    digest = hashlib.blake2b(str(size).encode())
    with open(path, "rb") as f:
        if size <= _HASH_CHUNKS * _HASH_CHUNK_BYTES:
            for block in iter(lambda: f.read(_HASH_CHUNK_BYTES), b""):
                digest.update(block)
        else:
            step = (size - _HASH_CHUNK_BYTES) / (_HASH_CHUNKS - 1)
            for k in range(_HASH_CHUNKS):
                f.seek(round(k * step))
                digest.update(f.read(_HASH_CHUNK_BYTES))
    return {"file": os.path.basename(path), "size": size, "blake2b": digest.hexdigest()}


def index_fingerprint(idx):
    """Width and per-row blake2b (hex) of the first 16 rows of an index stream (rows, cols).

    Rows rather than the whole file, because a run may be resumed with another max_iters
    (another row count, another file name) and must then see the same rows; a change of
    seed, width, block_size, token count or random generator changes every row.
    """
    rows = np.asarray(idx[:_HASH_ROWS], dtype=np.int64)
    return {"cols": int(idx.shape[1]), "rows_blake2b": [hashlib.blake2b(r.tobytes()).hexdigest() for r in rows]}


def fingerprint_change(saved, current):
    """What differs between two fingerprints of the same file or stream, or None if nothing
    does. Index streams are compared on the rows both fingerprints cover."""
    if "size" in saved:
        if saved["size"] != current["size"]:
            return f"size {saved['size']:,} bytes, now {current['size']:,}"
        return None if saved["blake2b"] == current["blake2b"] else "same size, different contents"
    if saved["cols"] != current["cols"]:
        return f"{saved['cols']} sequences per row, now {current['cols']}"
    for i, (a, b) in enumerate(zip(saved["rows_blake2b"], current["rows_blake2b"])):
        if a != b:
            return f"row {i} holds other offsets"
    return None


@dataclass
class RunData:
    """The token memmaps and fixed index streams of one run (shapes in the module docstring)."""

    train: np.memmap
    val: np.memmap
    train_idx: np.ndarray
    train_eval_idx: np.ndarray
    val_eval_idx: np.ndarray

    def files(self):
        """{name: path} of the five files, the names used in fingerprints and messages."""
        return {"train.bin": self.train.filename, "val.bin": self.val.filename,
                "train index": self.train_idx.filename, "train_eval index": self.train_eval_idx.filename,
                "val_eval index": self.val_eval_idx.filename}

    def fingerprint(self):
        """{name: fingerprint}: file_fingerprint of the token files, index_fingerprint of the
        streams. Runs with equal fingerprints trained and evaluated on the same batches."""
        return {"train.bin": file_fingerprint(self.train.filename), "val.bin": file_fingerprint(self.val.filename),
                "train index": index_fingerprint(self.train_idx),
                "train_eval index": index_fingerprint(self.train_eval_idx),
                "val_eval index": index_fingerprint(self.val_eval_idx)}


def open_run_data(data_dir, prepare_cmd, data_seed, max_iters, global_batch, eval_batch, block_size, eval_iters,
                  vocab_size):
    """Open data_dir's train.bin and val.bin and the three index streams of a run (creating
    the streams in data_dir/indices if missing). global_batch: sequences per step (batch_size
    x gradient_accumulation_steps); eval_batch: sequences per evaluation batch. Returns a
    RunData. Raises DataError naming prepare_cmd for a missing, empty or odd-sized token file, for a split
    shorter than block_size + 1 tokens, and for a meta.json vocabulary larger than vocab_size.
    """
    try:
        train = open_tokens(os.path.join(data_dir, "train.bin"), prepare_cmd)
        val = open_tokens(os.path.join(data_dir, "val.bin"), prepare_cmd)
        index_dir = os.path.join(data_dir, "indices")
        streams = [index_file(index_dir, "train", data_seed, max_iters, global_batch, block_size, len(train)),
                   index_file(index_dir, "train_eval", data_seed, eval_iters, eval_batch, block_size, len(train)),
                   index_file(index_dir, "val_eval", data_seed, eval_iters, eval_batch, block_size, len(val))]
    except (FileNotFoundError, ValueError) as e:
        raise DataError(str(e)) from None
    meta_path = os.path.join(data_dir, "meta.json")
    if os.path.exists(meta_path):
        with open(meta_path) as f:
            data_vocab = json.load(f)["vocab_size"]
        if data_vocab > vocab_size:
            raise DataError(f"the data uses {data_vocab} token ids but vocab_size={vocab_size}; raise vocab_size")
    return RunData(train, val, *streams)
