import os

import pytest
import torch

from helpers import run_script

# tests never touch the network: datasets and huggingface_hub read these at import time
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["WANDB_MODE"] = "offline"

# the Triton kernels (nonlinear_queries/ops/kernels.py) run on the CPU under Triton's interpreter, which
# triton.jit picks when it decorates a function, its own builtins at triton's import included: so here, before
# anything imports triton
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# the GPU suite (bench/gpu.py runs it) is collected only where there is a GPU
collect_ignore = [] if torch.cuda.is_available() else ["test_cuda.py"]


def pytest_configure(config):
    """Under pytest-xdist, only --dist loadgroup keeps each xdist_group (the SLURM cluster's tests, the GPU's) on
    one worker; any other distribution would start a second test SLURM cluster beside the first. Under loadgroup,
    a worker that crashes is not replaced: pytest-xdist 3.8.0 gives its replacement the crashed worker's work,
    the crashing test included, and then runs it again or waits forever (pytest-xdist #1323, #1371, #1378), so
    the first crash ends the run, the test it crashed in failed by name."""
    dist = getattr(config.option, "dist", "no")
    if not hasattr(config, "workerinput") and dist not in ("no", "loadgroup"):
        raise pytest.UsageError(f"--dist {dist}: run the suite with -n N --dist loadgroup (README.md)")
    if not hasattr(config, "workerinput") and dist == "loadgroup":
        config.option.maxworkerrestart = "0"


@pytest.fixture(scope="session")
def shakespeare_dir(tmp_path_factory):
    """The embedded default corpus prepared once per test session by data/shakespeare/prepare.py."""
    out = tmp_path_factory.mktemp("shakespeare")
    run_script("data/shakespeare/prepare.py", f"--out_dir={out}", "--num_proc=1")
    return str(out)
