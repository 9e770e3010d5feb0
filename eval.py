"""
Evaluate any checkpoint on lm-evaluation-harness tasks (lm-eval; downstream.py).

    python eval.py --init_from=out-res-gelu --tasks=hellaswag,arc_easy,piqa,lambada_openai
    python eval.py --init_from=gpt2 --tasks=hellaswag --limit=1000 --batch_size=32 --output=gpt2_hellaswag.json
    python eval.py --init_from=out-quickstart --tasks=example_mc --include_path=tasks --device=cpu   # tasks/, shipped

--init_from is a run's out_dir or anything pretrained.load_model reads, as train.py's --init_from=SOURCE
(eval.py has no out_dir of its own, so no 'resume'), and the text is encoded with the run's own
tokenizer (GPT-2 BPE, or a char-level dataset's characters).
--tasks names lm-eval's tasks, groups or tags (`lm-eval ls tasks` lists them), or tasks defined
by YAML files in --include_path, such as a task over a local copy of a data set for a machine
without the Hugging Face hub (docs/evaluation.md; tasks/example_mc.yaml is one). Prints lm-eval's
results table and, with --output, writes lm-eval's results as JSON.

Exit status: 0 done; 1 error (a task, data file or model that cannot be loaded); 2 config error.
"""

import nonlinear_queries.interrupt  # noqa: F401  (first: Ctrl-C at any moment ends with one line)

import json
import os
import sys
import time
from dataclasses import dataclass

from nonlinear_queries.config.configurator import config_from_argv
from nonlinear_queries.errors import EvalError, PretrainedError, SetupError
from nonlinear_queries.record.atomic import atomic_write


@dataclass
class EvalConfig:
    """Evaluation settings; every field can be set with --key=value."""

    # required: a run's out_dir, a checkpoint, gpt2[-medium|-large|-xl], a Hugging Face or export directory
    init_from: str = ""
    tasks: str = ""  # required: comma-separated lm-eval task, group or tag names, or task YAML files
    limit: int = 0  # examples per task, the first ones; 0 = all
    num_fewshot: int = -1  # examples put before each question; -1 = each task's own default
    batch_size: int = 8  # sequences per forward pass
    device: str = "auto"  # 'auto' (cuda if available, else cpu), 'cpu', 'cuda', ...
    dtype: str = "auto"  # 'auto' (bfloat16 on CUDA, float32 on CPU), 'float32', 'bfloat16', 'float16'
    include_path: str = ""  # a directory of task YAML files (local tasks), searched before lm-eval's own
    output: str = ""  # a JSON file for lm-eval's results; '' = none

    def __post_init__(self):
        if not self.init_from:
            raise ValueError("init_from is required: a run's out_dir or a pretrained model (see pretrained.py)")
        if self.init_from in ("resume", "scratch"):
            raise ValueError(f"init_from={self.init_from!r} is train.py's; eval.py has no out_dir: name the run's "
                             f"directory itself, e.g. --init_from=out-quickstart, or a pretrained model")
        if not self.tasks:
            raise ValueError("tasks is required: comma-separated lm-eval task names, e.g. hellaswag,arc_easy")
        if self.limit < 0 or self.batch_size < 1 or self.num_fewshot < -1:
            raise ValueError(f"limit must be >= 0, batch_size >= 1 and num_fewshot >= -1, got {self.limit}, "
                             f"{self.batch_size}, {self.num_fewshot}")


def main():
    cfg, _ = config_from_argv(EvalConfig)
    # imported after the command line is checked: lm-eval takes a second or two to import
    from nonlinear_queries.evaluation.downstream import (
        GPTLM,
        prepare_hub,
        run_tasks,
        task_manager,
        task_names,
        task_scores,
    )

    try:
        names = task_names(cfg.tasks)
        prepare_hub()
        manager = task_manager(names, cfg.include_path)
        lm = GPTLM(cfg.init_from, batch_size=cfg.batch_size, device=cfg.device, dtype=cfg.dtype)
        loaded = lm.model.loaded_from
        print(f"loaded {loaded.path}" + (f": step {loaded.step}" if loaded.step is not None else "")
              + f", query_mode={lm.model.config.query_mode}, tokenizer {lm.tokenizer.name}, device {lm.device}")
        t0 = time.time()
        results = run_tasks(lm, names, manager, cfg.limit, None if cfg.num_fewshot < 0 else cfg.num_fewshot)
        seconds = time.time() - t0
    except (EvalError, PretrainedError, SetupError) as e:
        sys.exit(f"error: {e}")
    from lm_eval.utils import make_table

    print(make_table(results))
    if results.get("groups"):
        print(make_table(results, "groups"))
    examples = sum(s.get("examples", 0) for s in task_scores(results).values())
    print(f"{examples:,} examples in {seconds:.1f} s")
    if cfg.output:
        write_results(results, lm, cfg)
        print(f"wrote {cfg.output}")


def write_results(results, lm, cfg):
    """Write lm-eval's results to cfg.output (temp file, then rename) with what lm_eval.simple_evaluate records
    besides the scores: the model, the settings, the git commit and lm-eval's report of the environment."""
    from lm_eval.loggers.utils import add_env_info
    from lm_eval.utils import handle_non_serializable

    from nonlinear_queries.evaluation.downstream import MODEL_NAME
    from nonlinear_queries.record.runs import git_state

    results["config"] = {"model": MODEL_NAME, "model_args": {"pretrained": cfg.init_from}, **lm.get_model_info(),
                         "batch_size": cfg.batch_size, "device": str(lm.device), "limit": cfg.limit or None,
                         "num_fewshot": None if cfg.num_fewshot < 0 else cfg.num_fewshot}
    results["git_hash"] = git_state(__file__)[0]
    add_env_info(results)
    os.makedirs(os.path.dirname(os.path.abspath(cfg.output)), exist_ok=True)
    with atomic_write(cfg.output) as f:
        json.dump(results, f, indent=2, default=handle_non_serializable)

if __name__ == "__main__":
    main()
