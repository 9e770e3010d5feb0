"""
Run logging: out_dir/metrics.jsonl always, wandb when asked, and the run header.

The training loop calls RunLog.log and RunLog.print unconditionally: on every rank but 0,
and for wandb when it is off, they do nothing (as nanochat's DummyWandb), so the loop
has no `if master` or `if wandb` branches. metrics.jsonl holds one JSON object a line:
first a `config` record (the header: resolved config, command line, git commit), then
`train`, `eval`, `diag` (per-layer diagnostics, diagnostics.py), `downstream` (one per
lm-eval task) and `diverged` records, each with its `step`.
"""

import json
import os
import socket
import subprocess
import sys
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
