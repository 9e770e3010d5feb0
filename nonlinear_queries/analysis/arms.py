"""
Comparison arms: runs read from their directories (runs.py) grouped into arms, the runs of equal settings
but for the pooled keys (the seed), and what is read off an arm: its label, its pooled runs, its paired
losses, the step every run has reached, a value of each run.
"""

import difflib
import json
import os
from dataclasses import dataclass, fields

from nonlinear_queries.config.configurator import train_config_class
from nonlinear_queries.errors import RunsError
from nonlinear_queries.record.runs import find_run_dirs, load_run

# settings that say where, how or whether a run is stored, logged, compiled or diagnosed, not what it computes
IGNORED_KEYS = {
    "out_dir", "overwrite", "init_from", "resume_from", "eval_only", "keep_last_n", "save_checkpoint_steps",
    "log_interval", "wandb_log", "wandb_project", "wandb_group", "wandb_run_name", "wandb_name", "wandb_job_type",
    "wandb_tags",
    "data_dir", "compile", "compile_mode", "compile_pointwise_cat", "compile_options", "kernels", "backend",
    "peak_flops", "device", "eval_tasks", "eval_tasks_interval", "eval_tasks_limit", "eval_tasks_include_path",
    "parallelism", "activation_checkpointing", "diagnostics", "diagnostics_batches",
}

@dataclass
class Arm:
    """Runs with equal settings apart from the pooled keys (e.g. the seed), under a label unique in a table."""

    label: str
    runs: list

    @property
    def header(self):
        return self.runs[0].header

    @property
    def config(self):
        return self.header["config"]


def read_runs(paths, group_over):
    """(runs, the set of keys to pool over): the runs under `paths` (find_run_dirs), their configs filled with
    train.py's defaults, and `group_over` (comma-separated config keys) checked against them. Raises RunsError
    naming a key that no run's config has."""
    runs = [load_run(d) for d in find_run_dirs(paths)]
    fill_defaults(runs)
    keys = set(group_over.split(","))
    check_keys(runs, "--group_over", keys)
    return runs, keys


def fill_defaults(runs):
    """Give a setting that only some runs' configs have (one added to train.py after the others ran) today's
    default (TrainConfig's) where it is missing: the defaults reproduce what the older code did."""
    keys = set().union(*(r.config for r in runs))
    if all(keys <= set(r.config) for r in runs):
        return
    defaults = {f.name: f.default for f in fields(train_config_class())}
    for run in runs:
        for key in keys - set(run.config):
            if key in defaults:
                run.config[key] = defaults[key]


def check_keys(runs, option, keys):
    """Raise RunsError if an option's config `keys` (--group_over, --best_over) name one that no run's config has:
    a typo would otherwise pool or tune over nothing and print a table that says it did. The message names, for
    each such key, the few closest keys the runs have (difflib), not all of them (a run has every setting)."""
    known = sorted(set().union(*(r.config for r in runs)))
    unknown = sorted(set(keys) - set(known))
    if unknown:
        named = [f"{key} (did you mean {' or '.join(close)}?)" if close else key
                 for key, close in ((k, difflib.get_close_matches(k, known, n=3)) for k in unknown)]
        raise RunsError(f"{option} names {', '.join(named)}, which no run's config has; name keys of the runs' "
                        f"configs, train.py's settings (python train.py --help lists them)")


def arm_key(config, skip):
    """The arm of a run's config: its settings apart from the keys in `skip` (the pooled ones, and for a tuned or
    width comparison the tuned key and the width too), as a string equal for the runs of one arm."""
    return json.dumps({k: v for k, v in config.items() if k not in skip}, sort_keys=True)


def check_copies(runs):
    """Raise RunsError where two runs have equal configs apart from IGNORED_KEYS, the seed included: one run
    given twice under two directories (`cp -r RUN RUN_copy`), which an arm would count as two seeds."""
    seen = {}
    for run in runs:
        other = seen.setdefault(arm_key(run.config, IGNORED_KEYS), run)
        if other is not run:
            raise RunsError(f"{other.out_dir} and {run.out_dir} have the same settings and seed (seed="
                            f"{run.config.get('seed')}, data_seed={run.config.get('data_seed')}), so they are one "
                            f"run given twice (a copy?), not two seeds; pass one of them")


def make_arms(runs, group_over):
    """The Arms of runs whose configs are equal apart from IGNORED_KEYS and group_over, in order of first
    appearance. Each arm's label is its run_name, plus key=value for every setting in which it differs from
    another arm of the same run_name. Raises RunsError for two runs of one config and seed (check_copies)."""
    check_copies(runs)
    skip = IGNORED_KEYS | group_over
    members = {}
    for run in runs:
        members.setdefault(arm_key(run.config, skip), []).append(run)
    names = ["/".join(dict.fromkeys(run.header["run_name"] for run in arm)) for arm in members.values()]
    arms = []
    for name, arm in zip(names, members.values()):
        configs = [other[0].config for n, other in zip(names, members.values()) if n == name]
        keys = [k for k in dict.fromkeys(k for c in configs for k in c)
                if k not in skip and len({json.dumps(c.get(k, "(unset)")) for c in configs}) > 1]
        arms.append(Arm(" ".join([name] + [f"{k}={arm[0].config.get(k, '(unset)')}" for k in keys]), arm))
    return arms


def numerics_note(arm):
    """A warning, or '' if none is due: the arm's runs differ in what decides their floating-point results
    beyond the config (the threads, the CPU's instruction set and model, the BLAS, the GPU: the header's
    `numerics`, runtime.numerics), so their spread mixes the seeds' with the machines'. Runs from before the
    header held it are not compared."""
    known = [(r, r.header["numerics"]) for r in arm.runs if r.header.get("numerics")]
    differ = sorted({k for _, n in known for k in n if len({json.dumps(m.get(k)) for _, m in known}) > 1})
    if not differ:
        return ""
    values = "; ".join(f"{k}: " + ", ".join(f"{n.get(k)!r} ({os.path.basename(os.path.normpath(r.out_dir))})"
                                             for r, n in known) for k in differ)
    return (f"warning: the runs of {arm.label} differ in {', '.join(differ)} ({values}), which change a run's "
            f"numbers as a seed does: its n and std pool machines with seeds")


def pooled(arm):
    """The runs of an arm that count in a curve: those that did not diverge, or all when every one did (then
    up to where they stopped)."""
    return [r for r in arm.runs if r.diverged is None] or arm.runs


def paired_losses(arm, step, keys):
    """{values of `keys` (e.g. the seed): val loss at `step`} of the arm's runs that did not diverge and have an
    eval there, the runs a paired comparison matches. Raises RunsError if two runs have the same values of
    `keys`, since a pair would then be ambiguous."""
    losses = {}
    for run in arm.runs:
        if run.diverged is None and step in run.evals:
            key = tuple(json.dumps(run.config.get(k)) for k in sorted(keys))
            if key in losses:
                raise RunsError(f"{arm.label}: two runs with {', '.join(sorted(keys))} = {', '.join(key)}; "
                                f"--paired needs one run per value (a run given twice under two paths?)")
            losses[key] = run.evals[step][1]
    return losses


def find_baseline(arms, name):
    """The arm named by --baseline (a label or one of the run directories); the first arm if name is None.
    Raises RunsError if there is no such arm."""
    if name is None:
        return arms[0]
    for arm in arms:
        if name == arm.label or any(os.path.realpath(name) == os.path.realpath(r.out_dir) for r in arm.runs):
            return arm
    raise RunsError(f"--baseline={name} is neither a group label nor a run directory given; "
        f"labels: {', '.join(repr(a.label) for a in arms)}")


def default_step(runs):
    """The largest eval step that every run that did not diverge has reached; raises RunsError if there is none."""
    alive = [r for r in runs if r.diverged is None]
    if not alive:
        raise RunsError("every run diverged, so no eval step is common to the runs that did not; pass --step=N")
    common = set.intersection(*(set(r.evals) for r in alive))
    if not common:
        raise RunsError("no eval step is common to all runs that did not diverge; pass --step=N, or leave out the "
                        "runs that have not reached an eval yet")
    return max(common)


def unfinished_note(runs, step):
    """A one-line note for stderr where `step` (default_step's) is below some run's last eval because that run
    has not reached its max_iters (a sweep or study still running), naming how many and one of them; else ""."""
    behind = [r for r in runs if r.diverged is None and max(r.evals, default=-1) < r.config.get("max_iters", -1)]
    if not behind or all(max(r.evals) <= step for r in runs if r.evals):
        return ""
    return (f"note: {len(behind)} run(s) have not reached their max_iters (e.g. {behind[0].out_dir}), so step {step} "
            f"is the last eval every run has; pass --step=N to compare at a later eval, which leaves out the runs "
            f"without it")


def val_loss(run, step):
    """A run's val loss at `step` (nats per token), None if it has no eval there."""
    return run.evals[step][1] if step in run.evals else None


def downstream_score(metric):
    """value(run, step) of a downstream score "task/metric", None where the run has none."""
    return lambda run, step: run.downstream.get(step, {}).get(metric)


def diag_value(name):
    """value(run, step) of a diagnostic (a `diag` record, diagnostics.py): its mean over the layers, None where
    the run has none."""
    return lambda run, step: layer_mean(run.diags.get(step, {}).get(name) or [])


def layer_mean(values):
    """The mean over the layers of one diagnostic ([value per layer]); None where it is undefined (None) at every
    layer, as query_f_ratio is for a query without an f."""
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None
