"""
A run's record, out_dir/metrics.jsonl: its one writer and its one reader.

Writing: the training loop calls RunLog.log and RunLog.print unconditionally: on every rank but 0,
and for wandb when it is off, they do nothing (as nanochat's DummyWandb), so the loop
has no `if master` or `if wandb` branches. metrics.jsonl holds one JSON object a line:
first a `config` record (the header, run_header: resolved config, command line, git commit, the
model's parameter counts and flops_per_token), then `train`, `eval`, `diag` (per-layer diagnostics,
diagnostics.py), `downstream` (one per lm-eval task) and `diverged` records, each with its `step`.

Reading: what train.py and sweep.py leave on disk, a run directory (metrics.jsonl, config.json) and a
sweep directory (one run per subdirectory, sweep.json). compare.py, analyze.py, sweep.py and study.py all
read through it, so a run has one history and one status wherever it is read. A run's history is its
metrics.jsonl as it stands now: a `config` record at step s (a restart) replaces what an earlier session
logged after step s, and of records logged twice the later one counts. A line that is not a JSON record
(torn by a crash, or damaged) is skipped with one warning naming it (read_metrics).
"""

import difflib
import json
import os
import socket
import subprocess
import sys
from dataclasses import dataclass, field, fields
from urllib.parse import urlparse

# where studies keep their runs (results/<study>/<arm>/<point>), at the top of the checkout
RESULTS_DIR = "results"


def git_state(path, ignore=()):
    """(commit, dirty) of the git checkout holding `path`, or (None, None) outside one or without git.

    dirty: tracked files differ from the commit, apart from RESULTS_DIR and the paths in `ignore` (a run's own
    out_dir; relative to the working directory, as train.py takes it; one outside the checkout changes nothing).
    A study commits the runs it has finished while others still write theirs, and a run resumed after its first
    part was committed rewrites its own metrics.jsonl: neither changes the code a run records, so neither makes it
    dirty. Untracked files do not count. The paths are left out with git's `exclude` pathspecs (gitglossary
    "pathspec"), taken literally."""
    try:
        git = ["git", "-C", os.path.dirname(os.path.abspath(path))]

        def ask(*args):
            return subprocess.run([*git, *args], capture_output=True, text=True, timeout=10).stdout.strip()

        commit, top = ask("rev-parse", "HEAD"), ask("rev-parse", "--show-toplevel")
        if not commit:
            return None, None
        skip = [RESULTS_DIR]
        for p in ignore:
            rel = os.path.relpath(os.path.realpath(p), os.path.realpath(top))
            if rel != os.curdir and rel != os.pardir and not rel.startswith(os.pardir + os.sep):
                skip.append(rel)
        status = ask("status", "--porcelain", "--untracked-files=no", "--", ":(top)",
                     *(f":(top,exclude,literal){p}" for p in skip))
        return commit, bool(status)
    except (OSError, subprocess.SubprocessError):
        return None, None


def wandb_mode():
    """WANDB_MODE if set; else 'online' only with an API key and a reachable server, so that
    wandb never waits for input or for a dead network (it would, for minutes)."""
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    import netrc

    url = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai"))
    host, port = url.hostname, url.port or (80 if url.scheme == "http" else 443)
    try:
        has_key = bool(os.environ.get("WANDB_API_KEY")) or netrc.netrc().authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        has_key = False
    if not has_key:
        print("wandb: no API key found, logging offline (sync later with `wandb sync`)")
        return "offline"
    try:
        socket.create_connection((host, port), timeout=3).close()
    except OSError:
        print(f"wandb: {host} unreachable, logging offline (sync later with `wandb sync`)")
        return "offline"
    return "online"


class NullWandb:
    """Stands in for a wandb run when wandb is off: every call does nothing."""

    id = None
    summary = {}

    def log(self, data, step=None):
        pass

    def finish(self, exit_code=0):
        pass


class RunLog:
    """metrics.jsonl and wandb for rank 0; a no-op on every other rank.

    path: the metrics.jsonl to append to; wandb_run: a wandb run or NullWandb();
    master: whether this process writes and prints.
    """

    def __init__(self, path, wandb_run, master):
        self.path, self.wandb, self.master = path, wandb_run, master

    def log(self, record):
        """Append one record (a dict with 'type' and 'step') to metrics.jsonl and, but for the
        header, to wandb as '<type>/<key>', or '<type>/<task>/<key>' for a record with a 'task'; a
        list value holds one number per layer (a `diag` record) and goes to wandb as
        '<type>/layer<i>/<key>', its None entries left out."""
        if not self.master:
            return
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
        if record["type"] != "config":
            # a task's record (downstream) goes under its own name: downstream/hellaswag/acc_norm
            prefix, items = f"{record['type']}/" + (f"{record['task']}/" if "task" in record else ""), {}
            for key, value in record.items():
                if isinstance(value, list):
                    items.update({f"{prefix}layer{i}/{key}": v for i, v in enumerate(value) if v is not None})
                elif key not in ("type", "step", "task"):
                    items[prefix + key] = value
            self.wandb.log(items, step=record["step"])
            if record["type"] == "diverged":
                self.wandb.summary["diverged_step"] = record["step"]

    def print(self, *args, **kwargs):
        """print() on rank 0 only."""
        if self.master:
            print(*args, **kwargs)

    def finish(self, exit_code):
        """Close the wandb run with the exit status."""
        if self.master:
            self.wandb.finish(exit_code=exit_code)


def cut_torn_line(path):
    """Cut a last line that a crash left unfinished (no newline: the process died while writing
    it; disk full, power loss) from the file at `path`, so that the next record starts a line of
    its own. Returns the text cut ('' if none, or no file). The records it held come again: a
    resumed run repeats every step after its checkpoint, which was written before that line."""
    if not os.path.isfile(path):
        return ""
    with open(path, "rb+") as f:
        data = f.read()
        keep = data.rfind(b"\n") + 1
        if keep == len(data):
            return ""
        f.truncate(keep)
    return data[keep:].decode("utf-8", errors="replace")


def read_json(path):
    """The object in the JSON file `path` of a run or sweep directory (launch.json, attempt.json, sweep.json,
    config.json), or {} where it is missing or not (yet) whole JSON: a file another process is writing reads as
    not there."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def read_metrics(path, warn=True):
    """The records of a metrics.jsonl, in order. A line that is not a JSON record (torn by a crash,
    or damaged) is skipped, with one warning on stderr naming the file and the line, not fatal:
    the rest of the run is still good."""
    records = []
    with open(path, errors="replace") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                if not isinstance(record, dict) or "type" not in record or "step" not in record:
                    raise ValueError("not a record with 'type' and 'step'")
            except ValueError as e:
                if warn:
                    print(f"warning: skipping line {number} of {path}, which is not a JSON record ({e}): "
                          f"{line.strip()[:80]!r}", file=sys.stderr)
                continue
            records.append(record)
    return records


def open_run_log(out_dir, master, wandb_log=False, wandb_id=None, **wandb_init):
    """The RunLog of a run in out_dir (created if missing). On rank 0 a torn last line of an
    existing metrics.jsonl (a crash in the middle of a write) is cut first, and said so
    (cut_torn_line). wandb_log starts or, with wandb_id, continues a wandb run on rank 0
    (wandb_init: project, group, name, config), in the mode wandb_mode() chooses; otherwise
    the run logs to NullWandb."""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "metrics.jsonl")
    torn = cut_torn_line(path) if master else ""
    if torn:
        print(f"{path}: cut its last line, left unfinished by a crash while it was written "
              f"({len(torn.encode())} bytes: {torn[:60]!r}); the steps it logged are logged again")
    run = NullWandb()
    if wandb_log and master:
        import wandb

        run = wandb.init(dir=out_dir, mode=wandb_mode(), id=wandb_id, resume="allow", **wandb_init)
    return RunLog(path, run, master)


def run_header(step, script, **facts):
    """The `config` record that opens a run's (or a resumed run's) part of metrics.jsonl:
    the step it starts at, the command line, the git commit of `script` and whether the
    checkout was dirty outside results/ and the run's own out_dir (facts["config"]["out_dir"];
    git_state), then `facts` (config, device, parameter counts, data fingerprints)."""
    out_dir = facts.get("config", {}).get("out_dir")
    commit, dirty = git_state(script, ignore=[out_dir] if out_dir else [])
    return {"type": "config", "step": step, "argv": sys.argv, "git_commit": commit, "git_dirty": dirty, **facts}


# settings that say where, how or whether a run is stored, logged, compiled or diagnosed, not what it computes
IGNORED_KEYS = {
    "out_dir", "overwrite", "init_from", "resume_from", "eval_only", "keep_last_n", "save_checkpoint_steps",
    "log_interval", "wandb_log", "wandb_project", "wandb_group", "wandb_run_name", "data_dir", "compile",
    "compile_mode", "compile_pointwise_cat", "compile_options", "kernels", "backend", "peak_flops", "device",
    "eval_tasks", "eval_tasks_interval", "eval_tasks_limit", "eval_tasks_include_path", "parallelism",
    "activation_checkpointing", "diagnostics", "diagnostics_batches",
}


class RunsError(ValueError):
    """Run directories that cannot be read as asked; the message says what to pass instead."""


@dataclass
class Run:
    """One run directory: train.py's config header, its evals {step: (train_loss, val_loss)} (nats per token),
    the step at which it diverged (None if it did not), its downstream scores {step: {"task/metric": value}} and
    its diagnostics {step: {name: [value per layer]}} (the `diag` records, diagnostics.py)."""

    out_dir: str
    header: dict
    evals: dict
    diverged: int | None
    downstream: dict
    diags: dict = field(default_factory=dict)

    @property
    def config(self):
        return self.header["config"]


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


def read_records(path, warn=True):
    """The records of a metrics.jsonl as the run stands now. A `config` record at step s, written at a restart,
    drops the records of earlier sessions past step s (the resumed run logs those steps again). warn=False
    skips damaged lines silently (for a status check; the reader of the numbers reports them)."""
    records = []
    for record in read_metrics(path, warn=warn):
        if record["type"] == "config":
            records = [r for r in records if r["step"] <= record["step"]]
        records.append(record)
    return records


def history(records):
    """(evals, diverged, downstream, diags) of a run's records (read_records): evals {step: (train_loss,
    val_loss)}, the step of its last `diverged` record or None, downstream {step: {"task/metric": value}},
    diags {step: {name: [value per layer]}}; a step logged twice keeps its later record."""
    evals = {r["step"]: (r["train_loss"], r["val_loss"]) for r in records if r["type"] == "eval"}
    diverged = [r["step"] for r in records if r["type"] == "diverged"]
    downstream = {}
    for r in records:
        if r["type"] == "downstream":
            downstream.setdefault(r["step"], {}).update(
                {f"{r['task']}/{k}": v for k, v in r.items() if k not in ("type", "step", "task")})
    diags = {r["step"]: {k: v for k, v in r.items() if k not in ("type", "step")}
             for r in records if r["type"] == "diag"}
    return evals, diverged[-1] if diverged else None, downstream, diags


def load_run(path):
    """Read a run directory into a Run: config.json, else the last `config` record of metrics.jsonl, as the
    header. Raises RunsError if it has neither."""
    records = read_records(os.path.join(path, "metrics.jsonl"))
    headers = [r for r in records if r["type"] == "config"]
    if os.path.isfile(os.path.join(path, "config.json")):
        with open(os.path.join(path, "config.json")) as f:
            headers.append(json.load(f))
    if not headers:
        raise RunsError(f"{path} has neither config.json nor a config record in metrics.jsonl; pass runs written "
                        f"by train.py")
    return Run(path, headers[-1], *history(records))


def run_status(out_dir, max_iters):
    """sweep.py's status of a run directory that should reach max_iters: 'done' (an eval at max_iters),
    'diverged at step k', 'resume' (a checkpoint to continue from) or 'new', read with the restart rule, so
    that a run that diverged and was resumed past it counts as compare.py counts it."""
    metrics = os.path.join(out_dir, "metrics.jsonl")
    if os.path.isfile(metrics):
        evals, diverged, _, _ = history(read_records(metrics, warn=False))
        if diverged is not None:
            return f"diverged at step {diverged}"
        if max_iters in evals:
            return "done"
    return "resume" if any(os.path.exists(os.path.join(out_dir, n)) for n in ("ckpt.pt", "ckpt.dcp")) else "new"


def finished(status):
    """Whether a run whose run_status is `status` is over: done, or diverged (a result too, never run again)."""
    return status == "done" or status.startswith("diverged")


def read_sweep(sweep_dir):
    """The record sweep.py keeps in SWEEP_DIR/sweep.json ({"command": ..., "points": {point: status}}), or None
    where there is none."""
    path = os.path.join(sweep_dir, "sweep.json")
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)


def fill_defaults(runs):
    """Give a setting that only some runs' configs have (one added to train.py after the others ran) today's
    default where it is missing: the defaults reproduce what the older code did."""
    keys = set().union(*(r.config for r in runs))
    if all(keys <= set(r.config) for r in runs):
        return
    # imported only here: train_config imports model, and so torch, which takes seconds
    from nonlinear_queries.train_config import TrainConfig

    defaults = {f.name: f.default for f in fields(TrainConfig)}
    for run in runs:
        for key in keys - set(run.config):
            if key in defaults:
                run.config[key] = defaults[key]


def find_run_dirs(paths):
    """Run directories named in `paths`: a directory holding metrics.jsonl is a run; one that does not but whose
    subdirectories do (a sweep) stands for those, sorted. A run named twice counts once. Raises RunsError for a
    path that is neither."""
    dirs = []
    for path in paths:
        if os.path.isfile(os.path.join(path, "metrics.jsonl")):
            dirs.append(path)
            continue
        subdirs = sorted(os.path.join(path, d) for d in os.listdir(path)) if os.path.isdir(path) else []
        runs = [d for d in subdirs if os.path.isfile(os.path.join(d, "metrics.jsonl"))]
        if not runs:
            raise RunsError(f"{path} is not a run directory (one holding the metrics.jsonl and config.json that "
                            f"train.py writes) nor a directory of such runs; pass the out_dir of a train.py run")
        dirs += runs
    unique = {}
    for d in dirs:
        unique.setdefault(os.path.realpath(d), d)
    return list(unique.values())


def read_runs(paths, group_over):
    """(runs, the set of keys to pool over): the runs under `paths` (find_run_dirs), their configs filled with
    train.py's defaults, and `group_over` (comma-separated config keys) checked against them. Raises RunsError
    naming a key that no run's config has."""
    runs = [load_run(d) for d in find_run_dirs(paths)]
    fill_defaults(runs)
    keys = set(group_over.split(","))
    check_keys(runs, "--group_over", keys)
    return runs, keys


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


def format_value(value):
    """A float as run directories, study files and tables write it: the shortest mantissa and a power of ten
    (0.003 -> '3e-3', 0.012 -> '1.2e-2', 0.00075 -> '7.5e-4')."""
    mantissa, exponent = f"{value:e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


def arm_key(config, skip):
    """The arm of a run's config: its settings apart from the keys in `skip` (the pooled ones, and for a tuned or
    width comparison the tuned key and the width too), as a string equal for the runs of one arm."""
    return json.dumps({k: v for k, v in config.items() if k not in skip}, sort_keys=True)


def make_arms(runs, group_over):
    """The Arms of runs whose configs are equal apart from IGNORED_KEYS and group_over, in order of first
    appearance. Each arm's label is its run_name, plus key=value for every setting in which it differs from
    another arm of the same run_name."""
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
