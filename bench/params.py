"""
Print the parameter table (the paper's Table 1 / Figure 2; docs/design.md) for every config in config/,
config/modern/ (the modern recipe, named modern/<config>), config/gpt3/ (the GPT-3 sizes,
named gpt3/<config>) and config/official/ (the official runs' twins, named official/<config>; docs/official.md),
and the baseline and res_gelu each with the two output gates (`attn_gate`, named "baseline, attn_gate=headwise").

    python bench/params.py

Models are built on the meta device (shapes only), so this takes a second on any
machine. "non-emb" is GPT.get_num_params(non_embedding=True): every parameter except
the token embedding (tied to the LM head), the positional embedding and an untied LM head.
"vs baseline" compares with the baseline of the same folder and the same L x d (in official/,
config_tiedw_original).
"""

import glob
import os

import torch

from common import REPO  # first: it puts the repo root on the path
from model import GPT, GPTConfig, model_config_keys
from nonlinear_queries.config.configurator import read_config_file

rows = []
for folder in ("", "modern/", "gpt3/", "official/"):
    paths = sorted(glob.glob(os.path.join(REPO, "config", folder, "*.py")))
    if folder == "gpt3/":  # by size, as the GPT-3 paper's table
        paths.sort(key=lambda p: ["medium", "large", "xl", "2p7b"].index(os.path.basename(p).split("_")[0]))
    for path in paths:
        if os.path.basename(path) == "recipe.py":  # config/modern/recipe.py: a base of the modern configs, not a run
            continue
        values = read_config_file(path)
        name = folder + os.path.basename(path)[:-3]
        # the Table 1 baseline and res_gelu also with each output gate (attn_gate; docs/design.md)
        gates = ("none", "headwise", "elementwise") if name in ("baseline", "res_gelu") else ("none",)
        for gate in gates:
            with torch.device("meta"):
                model = GPT(GPTConfig(**{k: v for k, v in values.items() if k in model_config_keys()},
                                      attn_gate=gate))
            cfg = model.config
            rows.append((name if gate == "none" else f"{name}, attn_gate={gate}", cfg.query_mode,
                         f"{cfg.n_layer}x{cfg.n_embd}", cfg.mlp_hidden, model.get_num_params(),
                         model.get_num_params(non_embedding=False), values.get("learning_rate"), values.get("min_lr"),
                         values.get("weight_decay")))

# {(folder, L x d): non-emb} of the baselines
baselines = {(row[0][: row[0].rfind("/") + 1], row[2]): row[4] for row in rows
             if row[0].endswith("baseline") or row[0] == "official/config_tiedw_original"}
header = ("config", "query_mode", "L x d", "mlp_hidden", "non-emb", "vs baseline", "total", "max lr", "min lr", "wd")
print("| " + " | ".join(header) + " |")
print("|" + "|".join("---" for _ in header) + "|")
for name, mode, shape, hidden, non_emb, total, lr, min_lr, wd in rows:
    baseline = baselines.get((name[: name.rfind("/") + 1], shape))
    ratio = f"{100 * (non_emb / baseline - 1):+.2f}%" if baseline else "-"
    cells = (name, mode, shape, hidden, f"{non_emb:,}", ratio, f"{total:,}", f"{lr:g}", f"{min_lr:g}", f"{wd:g}")
    print("| " + " | ".join(map(str, cells)) + " |")
