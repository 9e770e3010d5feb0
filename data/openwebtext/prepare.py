"""
OpenWebText -> data/openwebtext/{train,val}.bin (uint16 GPT-2 tokens) + meta.json.

Default source: the hub data set Skylion007/openwebtext (about 8.0M documents; the
download and datasets' cache take tens of GB). Expect about 9.04B train and 4.43M val
tokens (test_size 0.0005, seed 2357), i.e. an 18 GB train.bin.
Where the hub is unreachable, pass local copies (e.g. its parquet files) with --input. The
validation split is that fraction of the documents or, for a small corpus, the fewest documents
that hold 4,100 tokens (four windows of block_size 1024 and the next token); a corpus that needs
more than half its documents for that is refused.

    python data/openwebtext/prepare.py
    python data/openwebtext/prepare.py --input /path/to/openwebtext/*.parquet --num_proc 8
"""

import os

from nonlinear_queries.data.corpus import load_hub_documents, load_local_documents, run_prepare

HUB_NAME = "Skylion007/openwebtext"
TEST_SIZE = 0.0005


def load(args):
    """Documents from --input files if given, else from the hub."""
    if args.input:
        return load_local_documents(args.input)
    return load_hub_documents(HUB_NAME, args.num_proc)


if __name__ == "__main__":
    run_prepare(load, __doc__, out_dir=os.path.dirname(os.path.abspath(__file__)), test_size=TEST_SIZE)
