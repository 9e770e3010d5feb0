"""
A run directory (train.py's out_dir) and its record, metrics.jsonl: RunDir, the one owner of the directory's
files (their names, its checkpoints' included, the header and config.json, the status, replacing a run), and
the record's one writer (RunLog, and wandb) and its one reader. Comparing runs grouped into arms is arms.py's.
It imports no torch, and nothing of the package but atomic and errors: the checkpoint side (checkpoint_file,
checkpoint) asks a RunDir for its paths, never the other way round.

Writing: the training loop calls RunLog.log and RunLog.print unconditionally: on every rank but 0,
and for wandb when it is off, they do nothing (as nanochat's DummyWandb), so the loop
has no `if master` or `if wandb` branches. metrics.jsonl holds one JSON object a line:
first a `config` record (the header, run_header: resolved config, command line, git commit, the
model's parameter counts and flops_per_token), then `train`, `eval`, `diag` (per-layer diagnostics,
diagnostics.py), `downstream` (one per lm-eval task) and `diverged` records, each with its `step`.

Reading: what train.py and sweep.py leave on disk, a run directory (RunDir) and a
sweep directory (one run per subdirectory, sweep.json). compare.py, analyze.py, sweep.py and study.py all
read through it, so a run has one history and one status wherever it is read. A run's history is its
metrics.jsonl as it stands now: a `config` record at step s (a restart) replaces what an earlier session
logged after step s, and of records logged twice the later one counts. A line that is not a JSON record
(torn by a crash, or damaged) is skipped with one warning naming it (read_metrics).
"""

import contextlib
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from urllib.parse import urlparse

from nonlinear_queries.errors import CheckpointError, RunsError
from nonlinear_queries.record.atomic import write_json

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


class RunDir:
    """A run directory, train.py's out_dir: the one place its file names are spelled, its checkpoints' included,
    and what is done to it as a whole. path: the directory (relative to the working directory, as train.py takes
    it). Its files, each an attribute holding its path:

        metrics     metrics.jsonl, the run's record (RunLog writes it, read_records reads it)
        config      config.json, the newest header alone
        lock        .lock, the lock of the run in it now (lock.py)
        claim       .sweep.lock, a sweep's claim on the point whose run it is (sweeps.Point.claim)
        wandb       wandb/, wandb's files (wandb.init(dir=path) makes it)
        log         train.log, train.py's output where a sweep on this machine launched it (SLURM's is in slurm/)
        launch      launch.json, how a sweep launched the run: launcher, log, job_id or exit_status
        attempt     attempt.json, a SLURM job's starts of the run and the last one's exit status

    and its checkpoints (checkpoint.py writes them, in the format its docstring describes), each a method: the
    newest as each parallelism writes it (latest_checkpoint: ckpt.pt, or ckpt.dcp, a symbolic link to the newest
    sharded directory), the step checkpoints (step_checkpoint: ckpt_<step>.pt or ckpt_<step>.dcp/), and the names
    a checkpoint has while it is written (writing, linking, replaced), which a crash may leave behind
    (partial_checkpoints)."""

    LATEST = {"ddp": "ckpt.pt", "fsdp": "ckpt.dcp"}  # the newest checkpoint, by the parallelism that writes it
    PREFIX = "ckpt"  # every checkpoint's name, and what a crash leaves of one, starts with it
    PARTIAL = (".tmp", ".old")  # the endings of a checkpoint's names while it is written or replaced

    def __init__(self, path):
        self.path = path
        self.metrics = os.path.join(path, "metrics.jsonl")
        self.config = os.path.join(path, "config.json")
        self.lock = os.path.join(path, ".lock")
        self.claim = os.path.join(path, ".sweep.lock")
        self.wandb = os.path.join(path, "wandb")
        self.log = os.path.join(path, "train.log")
        self.launch = os.path.join(path, "launch.json")
        self.attempt = os.path.join(path, "attempt.json")

    def latest_checkpoint(self, parallelism="ddp"):
        """The path of the newest checkpoint as `parallelism` ('ddp' or 'fsdp') writes it: ckpt.pt or ckpt.dcp,
        whether or not it exists."""
        return os.path.join(self.path, self.LATEST[parallelism])

    def step_checkpoint(self, step, kind=".pt"):
        """The path of the step checkpoint of `step`: ckpt_<step, 6 digits><kind> (kind '.pt' or '.dcp'), whether
        or not it exists."""
        return os.path.join(self.path, f"{self.PREFIX}_{step:06d}{kind}")

    @staticmethod
    def writing(path):
        """The name a checkpoint `path` (a file or a sharded directory) is written under before it is renamed to
        `path`: path + '.tmp', as atomic.atomic_path spells it too."""
        return path + ".tmp"

    @staticmethod
    def linking(path):
        """The name of the link (a hard link to a checkpoint file, or ckpt.dcp's symbolic link) made before it is
        renamed over `path`."""
        return path + ".link.tmp"

    @staticmethod
    def replaced(path):
        """The name a sharded checkpoint directory `path` is moved to while a new one of the same step takes its
        place, until it is removed."""
        return path + ".old"

    @classmethod
    def is_checkpoint_name(cls, path):
        """Whether the file name of `path` is a run directory's checkpoint's, or what a crash left of one."""
        return os.path.basename(path).startswith(cls.PREFIX)

    def has_checkpoint(self):
        """Whether the run has a checkpoint to resume from: ckpt.pt, or ckpt.dcp (a link to a checkpoint that is
        there)."""
        return any(os.path.exists(self.latest_checkpoint(p)) for p in self.LATEST)

    def step_checkpoints(self, kinds=(".pt",)):
        """[(step, path)] of the step checkpoints here, newest first ([] where the directory is missing): the
        ckpt_<step>.pt files, and with kinds=(".pt", ".dcp") the ckpt_<step>.dcp directories too."""
        names = os.listdir(self.path) if os.path.isdir(self.path) else []
        pattern = rf"{self.PREFIX}_(\d+)({'|'.join(re.escape(k) for k in kinds)})"
        found = [(int(m[1]), os.path.join(self.path, n)) for n in names if (m := re.fullmatch(pattern, n))]
        return sorted(found, reverse=True)

    def checkpoints(self):
        """Every checkpoint of the run, of either kind: ckpt.pt, ckpt.dcp, then the step checkpoints, newest
        first."""
        latest = [self.latest_checkpoint(p) for p in self.LATEST]
        return [p for p in latest if os.path.lexists(p)] + [p for _, p in self.step_checkpoints((".pt", ".dcp"))]

    def partial_checkpoints(self):
        """What a crash left of checkpoints being written or replaced (ckpt*.tmp, ckpt*.old), in name order."""
        names = sorted(os.listdir(self.path)) if os.path.isdir(self.path) else []
        return [os.path.join(self.path, n) for n in names if self.is_checkpoint_name(n) and n.endswith(self.PARTIAL)]

    def remove_checkpoints(self):
        """Delete every checkpoint of the run (checkpoints) and what a crash left of one (partial_checkpoints), for
        a new run that replaces it."""
        for path in self.checkpoints() + self.partial_checkpoints():
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.remove(path)

    def has_record(self):
        """Whether the directory holds a run's record (metrics.jsonl): what makes it a run to read."""
        return os.path.isfile(self.metrics)

    def records(self, warn=True):
        """The records of its metrics.jsonl as the run stands now (read_records), [] where there is none."""
        return read_records(self.metrics, warn=warn) if self.has_record() else []

    def status(self, max_iters):
        """sweep.py's status of the run, which should reach max_iters: 'done' (an eval at max_iters),
        'diverged at step k', 'resume' (a checkpoint to continue from, as has_checkpoint says) or 'new', read with
        the restart rule, so that a run that diverged and was resumed past it counts as compare.py counts it."""
        evals, diverged, _, _ = history(self.records(warn=False))
        if diverged is not None:
            return f"diverged at step {diverged}"
        if max_iters in evals:
            return "done"
        return "resume" if self.has_checkpoint() else "new"

    def leftovers(self, left_lock=None):
        """What a run left here, all of which a new run would replace: its checkpoints (checkpoints, the newest
        first) and what a crash left of one being written (partial_checkpoints), metrics.jsonl, config.json, wandb/
        and, where left_lock is not None, its .lock (one that no process holds: lock.left_lock_holder). Returns
        their paths."""
        files = [self.metrics, self.config, self.wandb] + ([self.lock] if left_lock is not None else [])
        return self.checkpoints() + self.partial_checkpoints() + [p for p in files if os.path.lexists(p)]

    def check_start(self, start, overwrite, command, left_lock=None):
        """Refuse a run that cannot start here as asked (`start`, train.py's start.Start), every file here left as it
        was: one that resumes a checkpoint that is not there (the Start's path), and a new run (one that does not
        resume: from scratch or fine-tuning) that would replace or append to what a run left here (leftovers:
        checkpoints, metrics.jsonl, config.json, wandb/, a .lock that no process holds), in whatever state that run
        stopped, unless overwrite. command: the command line of this run with its --init_from, --resume_from and
        --overwrite replaced by the arguments it is given (cli.run_command); left_lock: what such a .lock names
        (lock.left_lock_holder), None where there is none. Raises errors.CheckpointError, one sentence naming what
        is here (the killed run a .lock names) and how to go on, each way a command that this check accepts: the
        command that resumes the run where there is a checkpoint (with --resume_from where only step checkpoints
        are left), --overwrite=True (or another --out_dir) for a new run in its place, a new run where there is
        none."""
        if start.resumes:
            if not os.path.exists(start.path):
                self._refuse_missing_checkpoint(start.path, command, left_lock)
            return
        found = self.leftovers(left_lock) if not overwrite else []
        if not found:
            return
        what = self._describe(found, left_lock)
        checkpoints = self.checkpoints()
        resume = command("--init_from=resume")
        if checkpoints:
            command = resume if self.has_checkpoint() else f"{resume} --resume_from={shlex.quote(checkpoints[0])}"
            raise CheckpointError(f"{self.path} already holds a run ({what}); continue it with `{command}`, pass "
                                  f"--overwrite=True to replace it, or choose another --out_dir")
        raise CheckpointError(f"{self.path} already holds a run with no checkpoint to resume ({what}); pass "
                              f"--overwrite=True to replace it, or choose another --out_dir")

    def _describe(self, found, left_lock):
        """The names of `found` (leftovers' paths) for a refusal, a .lock among them with the run it names."""
        what = ", ".join(os.path.basename(p) + ("/" if os.path.isdir(p) else "") for p in found)
        if self.lock in found:
            what += (f", a lock file no process holds: the run of {left_lock} was killed or crashed here" if left_lock
                     else ", a lock file no process holds: a run was killed or crashed here")
        return what

    def _refuse_missing_checkpoint(self, path, command, left_lock):
        """Raise the CheckpointError of a resume from `path`, a checkpoint that is not there, with the ways on that
        check_start accepts: the newest checkpoint here, else a new run (in place of what a run left here, with
        --overwrite=True)."""
        checkpoints = [p for p in self.checkpoints() if os.path.exists(p)]
        found = self.leftovers(left_lock)
        new = command("--init_from=scratch")
        if checkpoints:
            ways = (f"continue from the newest checkpoint here with "
                    f"`{command('--init_from=resume', f'--resume_from={checkpoints[0]}')}`, or start a new run in "
                    f"place of this one ({self._describe(found, left_lock)}) with `{new} --overwrite=True`")
        elif found:
            ways = (f"{self.path} holds a run with no checkpoint to resume ({self._describe(found, left_lock)}); "
                    f"start a new run in its place with `{new} --overwrite=True`, or choose another --out_dir")
        else:
            ways = f"{self.path} holds no run; start a new one with `{new}`"
        raise CheckpointError(f"cannot resume {path}: there is no such checkpoint; {ways}")

    def replace(self):
        """Remove what the run held here left (leftovers but the lock: its checkpoints, metrics.jsonl, config.json,
        wandb/), for the new run that replaces it (allowed by check_start) once every check of that run has
        passed. Call it on rank 0 only."""
        self.remove_checkpoints()
        self.remove_log()

    def remove_log(self):
        """Remove what open_log and log_header wrote (metrics.jsonl, config.json, wandb/), for a new run that
        ends before its first checkpoint and so leaves nothing to resume, and for replace. Call it on rank 0
        only."""
        for path in (self.metrics, self.config):
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
        shutil.rmtree(self.wandb, ignore_errors=True)

    def open_log(self, master, wandb_log=False, wandb_id=None, **wandb_init):
        """The RunLog of the run (the directory created if missing). On rank 0 a torn last line of an
        existing metrics.jsonl (a crash in the middle of a write) is cut first, and said so
        (cut_torn_line). wandb_log starts or, with wandb_id, continues a wandb run on rank 0
        (wandb_init: wandb.init's project, group, name, job_type, tags, config), in the mode wandb_mode()
        chooses; otherwise the run logs to NullWandb."""
        os.makedirs(self.path, exist_ok=True)
        torn = cut_torn_line(self.metrics) if master else ""
        if torn:
            print(f"{self.metrics}: cut its last line, left unfinished by a crash while it was written "
                  f"({len(torn.encode())} bytes: {torn[:60]!r}); the steps it logged are logged again")
        run = NullWandb()
        if wandb_log and master:
            import wandb

            run = wandb.init(dir=self.path, mode=wandb_mode(), id=wandb_id, resume="allow", **wandb_init)
        return RunLog(self.metrics, run, master)

    def log_header(self, out, step, script, **facts):
        """Open this session's part of the record: the header (run_header(step, script, **facts)) logged
        through `out` (a RunLog) and, on rank 0, written alone to config.json (atomically). Returns it."""
        header = run_header(step, script, **facts)
        out.log(header)
        if out.master:
            write_json(self.config, header)
        return header


def run_header(step, script, **facts):
    """The `config` record that opens a run's (or a resumed run's) part of metrics.jsonl:
    the step it starts at, the command line, the git commit of `script` and whether the
    checkout was dirty outside results/ and the run's own out_dir (facts["config"]["out_dir"];
    git_state), then `facts` (config, device, parameter counts, data fingerprints)."""
    out_dir = facts.get("config", {}).get("out_dir")
    commit, dirty = git_state(script, ignore=[out_dir] if out_dir else [])
    return {"type": "config", "step": step, "argv": sys.argv, "git_commit": commit, "git_dirty": dirty, **facts}



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


def step_seconds(records):
    """The seconds a run's training steps took, from its records (read_records): its logged step laps summed. A
    `train` record's ms_per_step is the mean over the steps since the record before it (train.py's StepClock.lap:
    the previous `train` record, or the `config` record that opened the session, a restart's at its step), so it
    counts that many steps, not log_interval: a run's last lap, or a session's first after a restart, can be
    shorter. Evaluation, diagnostics, checkpoints, lm-eval tasks and startup fall outside the laps and are left
    out; steps a crashed session logged past its resume point go with its dropped records. 0.0 where no `train`
    record has ms_per_step (a run that logged none yet)."""
    seconds, since = 0.0, 0
    for record in records:
        if record["type"] == "train" and record.get("ms_per_step"):
            seconds += record["ms_per_step"] / 1000 * (record["step"] - since)
        if record["type"] in ("train", "config"):
            since = record["step"]
    return seconds


def load_run(path):
    """Read a run directory into a Run: config.json, else the last `config` record of metrics.jsonl, as the
    header. Raises RunsError if it has neither."""
    run_dir = RunDir(path)
    records = read_records(run_dir.metrics)
    headers = [r for r in records if r["type"] == "config"]
    if os.path.isfile(run_dir.config):
        with open(run_dir.config) as f:
            headers.append(json.load(f))
    if not headers:
        raise RunsError(f"{path} has neither config.json nor a config record in metrics.jsonl; pass runs written "
                        f"by train.py")
    return Run(path, headers[-1], *history(records))


def finished(status):
    """Whether a run whose RunDir.status is `status` is over: done, or diverged (a result too, never run again)."""
    return status == "done" or status.startswith("diverged")


def read_sweep(sweep_dir):
    """The record sweep.py keeps in SWEEP_DIR/sweep.json ({"command": ..., "points": {point: status}}), or None
    where there is none."""
    path = os.path.join(sweep_dir, "sweep.json")
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)


def find_run_dirs(paths):
    """Run directories named in `paths`, as a shell glob gives them: a directory holding metrics.jsonl is a run; any
    other directory stands for every run beneath it (a sweep, a study's arms, a folder of studies), in sorted order,
    a run's own subdirectories not searched; a plain file (the README.md or figure.png a glob catches) is skipped,
    said in one line on stderr. A run named twice counts once. Raises RunsError for a path that is not there, a
    directory that holds no run, or paths that name no run at all."""
    dirs, files = [], []
    for path in paths:
        if os.path.isfile(path):
            files.append(path)
            continue
        runs = []
        for top, subdirs, _ in os.walk(path):
            subdirs.sort()
            if RunDir(top).has_record():
                runs.append(top)
                subdirs.clear()
        if not runs:
            raise RunsError(f"{path} is not a run directory (one holding the metrics.jsonl and config.json that "
                            f"train.py writes) nor a directory of such runs; pass the out_dir of a train.py run")
        dirs += runs
    if not dirs:
        raise RunsError(f"no run directory among {', '.join(paths)}; pass the out_dir of a train.py run")
    if files:
        print(f"note: skipped {len(files)} file(s), not run directories: {', '.join(files)}", file=sys.stderr)
    unique = {}
    for d in dirs:
        unique.setdefault(os.path.realpath(d), d)
    return list(unique.values())


def format_value(value):
    """A float as run directories, study files and tables write it: the shortest mantissa and a power of ten
    (0.003 -> '3e-3', 0.012 -> '1.2e-2', 0.00075 -> '7.5e-4')."""
    mantissa, exponent = f"{value:e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"
