"""
Sample text from a checkpoint written by train.py, or from any pretrained model.

    python sample.py --out_dir=out-res-gelu --start="To be, or not to be" --num_samples=3
    python sample.py --out_dir=out-quickstart --start=FILE:prompt.txt --device=cpu
    python sample.py --init_from=gpt2 --start="Hello"           # GPT-2 from the local Hugging Face cache

--init_from means what it means to train.py (docs/pretrained.md): 'resume', the default, is the run in
out_dir (its newest checkpoint); anything else is a source pretrained.load_model reads.

Prompts are encoded with GPT-2's BPE, or, for a run on a character-level dataset (its
meta.json says "tokenizer": "char", e.g. data/shakespeare_char), with that dataset's
characters. Models are loaded by pretrained.load_model: checkpoints through
checkpoint_file.load_checkpoint_file (torch.load(weights_only=True): only tensors and plain
containers, never arbitrary pickled objects), which names the run's other checkpoints if
ckpt.pt is truncated or corrupt, and every other source as pretrained.py lists them. Only
reading a model, it imports no optimizer, batch or DCP code (tests/test_imports.py).
"""

import nonlinear_queries.interrupt  # noqa: F401  (first: Ctrl-C at any moment ends with one line)

import os
import sys
from dataclasses import dataclass

import torch

from nonlinear_queries.config.configurator import config_from_argv
from nonlinear_queries.data.tokenizer import run_tokenizer
from nonlinear_queries.errors import PretrainedError, SetupError
from nonlinear_queries.record.runs import RunDir
from nonlinear_queries.runtime.processes import setup
from nonlinear_queries.weights.pretrained import load_model, sharded_hint


@dataclass
class SampleConfig:
    """Sampling settings; every field can be set with --key=value."""

    out_dir: str = "out"  # directory holding ckpt.pt
    # 'resume' = out_dir's newest checkpoint, as train.py's; else any source load_model reads (gpt2, a directory, ...)
    init_from: str = "resume"
    start: str = "\n"  # prompt text, or FILE:path to read it from a file
    num_samples: int = 1  # samples drawn, each from the whole prompt
    max_new_tokens: int = 200  # tokens generated after the prompt, per sample
    temperature: float = 0.8  # below 1 is more conservative; 0 always takes the most likely token
    top_k: int = 200  # keep only the top_k most likely tokens; 0, or more than the vocabulary, keeps all
    seed: int = 1337  # torch's seed for the sampling
    kv_cache: bool = True  # reuse keys and values of earlier positions (exact, and much faster)
    device: str = "auto"  # 'auto' (cuda if available, else cpu), 'cpu', 'cuda', ...
    dtype: str = "auto"  # 'auto' (bfloat16 on CUDA, float32 on CPU), 'float32', 'bfloat16', 'float16'

    def __post_init__(self):
        self.init_from = self.init_from or "resume"  # '' was the default's spelling before 'resume'
        # `not >=` also refuses a NaN temperature, which would sample from NaN probabilities
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy, always the most likely token), "
                             f"got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 keeps every token), got {self.top_k}")
        for name in ("max_new_tokens", "num_samples"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


cfg, _ = config_from_argv(SampleConfig)
start = cfg.start
# read before the model, which takes seconds to load, so that a wrong path fails at once
if start.startswith("FILE:"):
    try:
        with open(start[5:], encoding="utf-8") as f:
            start = f.read()
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) else "it is not UTF-8 text"
        sys.exit(f"error: cannot read the prompt file {start[5:]}: {reason}; pass --start=FILE:PATH of a text file, "
                 f"or the prompt itself as --start=TEXT")
source = cfg.out_dir if cfg.init_from == "resume" else cfg.init_from  # what load_model reads
try:
    runtime = setup(cfg.device, cfg.dtype, join_process_group=False)
    if cfg.init_from == "resume" and not os.path.isfile(checkpoint := RunDir(cfg.out_dir).latest_checkpoint()):
        raise PretrainedError(sharded_hint(cfg.out_dir) or (
            f"no checkpoint at {checkpoint}; train one with train.py, pass --out_dir=DIR, "
            f"or sample from a pretrained model with --init_from=gpt2"))
    model = load_model(source)
except (SetupError, PretrainedError) as e:
    sys.exit(f"error: {e}")
model.eval().to(runtime.device)
loaded = model.loaded_from
print(f"loaded {loaded.path}" + (f": step {loaded.step}" if loaded.step is not None else "")
      + f", query_mode={model.config.query_mode}")

# the tokenizer: the run's (GPT-2 BPE, or the characters of a char-level dataset's meta.json)
enc = run_tokenizer(loaded.run_config)
try:
    start_ids = enc.encode(start)
except ValueError as e:
    sys.exit(f"error: the prompt has {e}")
if not start_ids:
    sys.exit("error: the prompt encodes to no tokens; pass a non-empty --start")
x = torch.tensor(start_ids, dtype=torch.long, device=runtime.device)[None, ...].repeat(cfg.num_samples, 1)

torch.manual_seed(cfg.seed)
with torch.no_grad(), runtime.autocast:
    y = model.generate(x, cfg.max_new_tokens, temperature=cfg.temperature, top_k=cfg.top_k or None,
                       use_kv_cache=cfg.kv_cache)
for i in range(cfg.num_samples):
    print(enc.decode(y[i].tolist()))
    print("---------------")
