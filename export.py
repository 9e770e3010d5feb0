"""
Export a run's weights as safetensors, in Hugging Face's GPT-2 format where it can hold them.

    python export.py --out_dir=out-baseline --to=hf-baseline
    python -c "from transformers import GPT2LMHeadModel; GPT2LMHeadModel.from_pretrained('hf-baseline')"

Writes DIR/model.safetensors and DIR/config.json, replacing an earlier export there; a DIR that
is a file, or that holds another config.json (a run's), is refused. A linear-query model (with learned
positions, GPT-2's softmax scale, exact or tanh GELU) is written as Hugging Face's GPT-2:
Conv1D weights (in, out), c_attn = [W_Q | W_K | W_V], zero biases where the model has none,
which transformers.GPT2LMHeadModel.from_pretrained(DIR) loads with the same logits. Any
other model (res_gelu, identity, residual, anchored_res_gelu, qk_norm, ...) has no
architecture in transformers: it is written under this repo's weight names with config.json
holding its model_args, which load_model(DIR) loads, and the script says so and
why. --out_dir may also name any source pretrained.load_model reads (pretrained.py lists them).
"""

import nonlinear_queries.interrupt  # noqa: F401  (first: Ctrl-C at any moment ends with one line)

import sys
from dataclasses import dataclass

from nonlinear_queries.config.configurator import config_from_argv
from nonlinear_queries.errors import PretrainedError
from nonlinear_queries.weights.pretrained import check_export_dir, export, load_model


@dataclass
class ExportConfig:
    """Export settings; every field can be set with --key=value."""

    out_dir: str = "out"  # the run directory holding ckpt.pt
    to: str = ""  # required: the directory to write model.safetensors and config.json into

    def __post_init__(self):
        if not self.to:
            raise ValueError("say where to write with --to=DIR")


cfg, _ = config_from_argv(ExportConfig)
try:
    # the destination first: loading a large model takes a while
    check_export_dir(cfg.to)
    model = load_model(cfg.out_dir)
    reason = export(model, cfg.to)
except PretrainedError as e:
    sys.exit(f"error: {e}")
except OSError as e:  # e.g. a directory without write permission
    sys.exit(f"error: cannot write {e.filename or cfg.to}: {e.strerror}; name a directory you can write with --to=DIR")
if reason is None:
    print(f"wrote {cfg.to}/model.safetensors and config.json in Hugging Face GPT-2 format; "
          f"transformers.GPT2LMHeadModel.from_pretrained({cfg.to!r}) loads it")
else:
    print(f"{reason}. Hugging Face transformers has no such architecture, so {cfg.to}/model.safetensors holds this "
          f"repo's weight names and config.json its model_args: load_model({cfg.to!r}) loads it")
