"""study.py: the held-out protocol as a program. The widening rule and the choices on hand-made
runs, the study files' checks, and studies/ablations.toml against the committed runs."""

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import asdict

import numpy as np
import pytest
import torch
from test_results import TABLES, printed_table

import study
from helpers import ONE_THREAD, REPO, read_metrics, run_script, wait_until
from nonlinear_queries.config.configurator import parse_config
from nonlinear_queries.config.train_config import TrainConfig
from nonlinear_queries.errors import ConfigError
from nonlinear_queries.experiments import looks, protocol, sweeps
from nonlinear_queries.record import runs

TOML = """
name = "toy"
results_dir = "{results}"
[tuning]
key = "learning_rate"
grid = ["1e-3", "2e-3", "4e-3"]
seed = 0
max_widen = 2
[held_out]
seeds = [1, 2]
[[horizon]]
max_iters = 10
[[arm]]
name = "a"
config = "config/mini/baseline.py"
[[arm]]
name = "b"
config = "config/mini/res_gelu.py"
grid = ["2e-3"]
"""


def write_study(tmp_path, text=TOML):
    path = tmp_path / "toy.toml"
    path.write_text(text.replace("{results}", str(tmp_path / "results")))
    return study.load_study(str(path))


def fake_run(path, val_loss, max_iters=10, diverged=False):
    """A run directory as train.py leaves it, with only what the protocol reads: its config and the
    val loss of the evaluation at max_iters (or a divergence)."""
    os.makedirs(path, exist_ok=True)
    header = {"type": "config", "step": 0, "config": asdict(TrainConfig(max_iters=max_iters))}
    records = [header, {"type": "diverged", "step": 5, "reason": "loss is nan"} if diverged else
               {"type": "eval", "step": max_iters, "train_loss": val_loss, "val_loss": val_loss}]
    with open(os.path.join(path, "metrics.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)


def test_format_value_names_widened_values_as_the_committed_grids_do():
    # one formatter for run directories, study files, tables and plot ticks
    assert [runs.format_value(v) for v in (0.012, 0.024, 0.00075, 0.000375, 6e-4, 1e-3, 3e-3, 1.5e-3)] == [
        "1.2e-2", "2.4e-2", "7.5e-4", "3.75e-4", "6e-4", "1e-3", "3e-3", "1.5e-3"]


def test_the_protocol_widens_at_an_edge_then_reports_the_inside_best_on_held_out_seeds(tmp_path):
    s = write_study(tmp_path)
    arm, horizon = s.arms[0], s.horizons[0]
    tune = lambda v: study.point_dir(s, arm, horizon, {"learning_rate": v, "seed": 0})  # noqa: E731
    stage = study.advance(s, arm, horizon)
    assert stage.todo == [{"learning_rate": v, "seed": 0} for v in ("1e-3", "2e-3", "4e-3")] and stage.chosen is None
    # the best at the high edge: 8e-3 joins the grid
    for v, loss in (("1e-3", 3.0), ("2e-3", 2.5), ("4e-3", 2.0)):
        fake_run(tune(v), loss)
    stage = study.advance(s, arm, horizon)
    assert stage.todo == [{"learning_rate": "8e-3", "seed": 0}]
    assert stage.widening == [{"edge": "high", "added": "8e-3", "best": "4e-3",
                               "because": {"1e-3": 3.0, "2e-3": 2.5, "4e-3": 2.0}}]
    # 8e-3 diverges: the best, 4e-3, is inside; the held-out seeds vary the data order too
    fake_run(tune("8e-3"), None, diverged=True)
    stage = study.advance(s, arm, horizon)
    assert stage.chosen == "4e-3" and stage.values == ["1e-3", "2e-3", "4e-3", "8e-3"]
    assert stage.todo == [{"learning_rate": "4e-3", "seed": 1, "data_seed": 1},
                          {"learning_rate": "4e-3", "seed": 2, "data_seed": 2}]
    assert study.sweep_command(s, arm, horizon, stage.todo)[-3:] == [
        "--grid", "seed,data_seed=1,2", f"--sweep_dir={study.arm_dir(s, arm, horizon)}"]
    for seed in (1, 2):
        fake_run(study.point_dir(s, arm, horizon, protocol.held_out_point(s, "4e-3", seed)), 2.0 + seed / 100)
    stage = study.advance(s, arm, horizon)
    assert stage.todo == [] and stage.held_out == {1: 2.01, 2: 2.02}


def test_each_arm_is_one_wandb_group_its_stage_the_job_type_its_seed_a_tag_and_each_run_its_own_name(tmp_path):
    # grouped by wandb_group in wandb, an arm is one line with its spread over seeds; job type and tag tell them
    # apart, and each run's name is its directory under the study's, unique across arms (not the point's alone)
    s = write_study(tmp_path)
    horizon = s.horizons[0]
    names = []
    for arm in s.arms:
        for values, stage in (({"learning_rate": "2e-3", "seed": 0}, "tuning"),
                              (protocol.held_out_point(s, "2e-3", 2), "held-out")):
            shared = [*protocol.train_args(s, arm, horizon), *protocol.wandb_args(s, arm, horizon, [values])]
            # as study.py's pooled scheduler starts it, and as the sweep.py of its stage (on SLURM) does
            pooled = sweeps.Point(sweeps.point_name(values), list(values.items()),
                                  study.point_dir(s, arm, horizon, values), 10,
                                  protocol.wandb_name(s, arm, horizon, values))
            (swept,), train_args, _ = sweeps.plan(sweeps.Sweep(train_args=shared, grid=study.sweep_grid(s, [values]),
                                                               sweep_dir=study.arm_dir(s, arm, horizon)))
            for point, args in ((pooled, shared), (swept, train_args)):
                config = parse_config(TrainConfig, point.train_args(args, resume=False)[1:])[0]
                assert config.wandb_init() == {
                    "project": "nonlinear-queries", "group": f"toy/{arm.name}", "name": f"{arm.name}/{point.name}",
                    "job_type": stage, "tags": [f"seed={values['seed']}"]}
                # the run's label in compare.py's tables (train.py's run_name): the arm's name, one label an arm
                assert config.wandb_run_name == arm.name
            names.append(f"{arm.name}/{pooled.name}")
    assert len(set(names)) == len(names) == 4
    arm = s.arms[0]
    s.pilot_seeds = [7]  # a [pilot] stage's seeds
    assert "--wandb_job_type=pilot" in protocol.wandb_args(s, arm, horizon, [protocol.held_out_point(s, "2e-3", 7)])
    # an arm's own overrides win; its wandb_name comes before each run's directory
    arm.overrides.update(wandb_group="mine", wandb_name="own")
    assert protocol.wandb_args(s, arm, horizon, [values]) == [f"--wandb_run_name={arm.name}",
                                                              "--wandb_job_type=held-out"]
    assert protocol.wandb_name(s, arm, horizon, values) == f"own/{sweeps.point_name(values)}"


def test_widening_stops_at_max_widen_and_an_arm_may_have_its_own_grid(tmp_path):
    s = write_study(tmp_path)
    arm, horizon = s.arms[1], s.horizons[0]  # grid ["2e-3"]: both edges at once
    tune = lambda v: study.point_dir(s, arm, horizon, {"learning_rate": v, "seed": 0})  # noqa: E731
    losses = {"2e-3": 2.0, "1e-3": 1.9, "5e-4": 1.8}  # always better lower: widen down twice, then stop
    fake_run(tune("2e-3"), losses["2e-3"])
    assert study.advance(s, arm, horizon).todo == [{"learning_rate": "1e-3", "seed": 0}]
    fake_run(tune("1e-3"), losses["1e-3"])
    assert study.advance(s, arm, horizon).todo == [{"learning_rate": "5e-4", "seed": 0}]
    fake_run(tune("5e-4"), losses["5e-4"])
    stage = study.advance(s, arm, horizon)
    assert stage.chosen == "5e-4" and [w["added"] for w in stage.widening] == ["1e-3", "5e-4"]


def test_the_dry_run_costs_the_runs_left_in_run_hours_and_wall_hours_at_the_slots(tmp_path, capsys):
    toml = TOML.replace("max_iters = 10", "max_iters = 3600") + "[cost]\nseconds_per_step = 0.5\n"
    # arm a: 3 tuning runs and 2 held-out seeds; arm b: 1 and 2. 8 runs x 3600 steps x 0.5 s = 4 hours
    assert study.plan(write_study(tmp_path, toml)) == 8
    assert "at least 8 run(s) left, about 4.0 run-hours (one run at a time;" in capsys.readouterr().out
    assert study.plan(write_study(tmp_path, toml + "[launcher]\njobs = 2\n")) == 8
    assert "about 4.0 run-hours, about 2.0 hours of wall time at 2 runs at a time" in capsys.readouterr().out


def test_the_measured_run_hours_sum_each_logged_lap_over_its_own_steps(tmp_path, capsys):
    """runs.step_seconds: a `train` record's ms_per_step is the mean over the steps since the log before it, so it
    counts those steps, not log_interval: a session's first lap after a restart at step 110 (40 steps) and the last
    lap of a run stopped at 165 (15 steps) are shorter; what a crashed session logged past its resume point does
    not count. The dry run prints the sum over the study's runs."""
    lines = [{"type": "config", "step": 0}, {"type": "train", "step": 50, "ms_per_step": 100e3},
             {"type": "eval", "step": 100, "train_loss": 2.0, "val_loss": 2.1},
             {"type": "train", "step": 100, "ms_per_step": 200e3},
             {"type": "train", "step": 120, "ms_per_step": 9e6},  # dropped: the restart below resumes at 110
             {"type": "config", "step": 110}, {"type": "train", "step": 150, "ms_per_step": 400e3},
             {"type": "train", "step": 165, "ms_per_step": 500e3}]
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    # 50 x 100 + 50 x 200 + 40 x 400 + 15 x 500 s; ms_per_step x 50 a record would give 60,000 s
    assert runs.step_seconds(runs.read_records(str(path))) == pytest.approx(38_500)
    assert runs.step_seconds([{"type": "config", "step": 0}]) == 0.0
    s = write_study(tmp_path)
    run = study.point_dir(s, s.arms[0], s.horizons[0], {"learning_rate": "1e-3", "seed": 0})
    os.makedirs(run)
    (tmp_path / "metrics.jsonl").rename(os.path.join(run, "metrics.jsonl"))
    study.plan(s)
    assert "the 1 runs' training steps took 10.69 run-hours, measured: each run's logged step laps summed" in \
        " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("edit, message", [
    (lambda t: t.replace('seed = 0\n', 'seed = 1\n'), "also a held-out seed"),
    (lambda t: t.replace('max_widen = 2', 'max_widen = 2\nwiden = "x2"'),
     "[tuning]: unknown key(s) widen; did you mean 'max_widen'?"),
    (lambda t: t.replace('name = "b"', 'name = "b"\noverride = { n_layer = 2 }'),
     "[[arm]] 2: unknown key(s) override; did you mean 'overrides'?"),
    (lambda t: t + '[launcher]\njob = 2\n',
     "[launcher] (sweep.py's options): unknown key(s) job; did you mean 'jobs'?"),
    (lambda t: t.replace('name = "toy"', 'name = "toy"\nrunsdir = "out"'),
     "toy.toml: unknown key(s) runsdir; did you mean 'runs_dir'?"),
    (lambda t: t.replace('key = "learning_rate"\n', ''), "'key' is missing"),
    (lambda t: t.replace('max_widen = 2', 'max_widen = "2"'), "'max_widen' must be int"),
    (lambda t: t.replace('config/mini/res_gelu.py', 'config/mini/nope.py'), "config/mini/nope.py does not exist"),
    (lambda t: t.replace('grid = ["2e-3"]', 'grid = ["fast"]'), "must be numeric"),
    (lambda t: t.replace('name = "b"', 'name = "b"\noverrides = { n_layers = 2 }'), "n_layers"),
], ids=["seed-twice", "unknown-key", "unknown-arm-key", "unknown-launcher-option", "unknown-top-key",
     "missing-key", "wrong-type", "no-config", "not-numeric", "bad-override"])
def test_a_bad_study_file_is_one_error_naming_the_key(tmp_path, edit, message):
    with pytest.raises(study.StudyError, match=re.escape(message)):
        write_study(tmp_path, edit(TOML))


@pytest.mark.slow
def test_the_plan_piped_into_a_reader_that_has_gone_ends_quietly():
    read, write = os.pipe()
    os.close(read)  # as `| head` once it has read its lines: every write to the pipe now fails
    try:
        proc = subprocess.run([sys.executable, "study.py", "studies/long_horizon.toml", "--dry_run"], cwd=REPO,
                              stdout=write, stderr=subprocess.PIPE, text=True, timeout=300)
    finally:
        os.close(write)
    # ended by SIGPIPE as `yes | head` is (status 1 is bad input's), and no traceback
    assert (proc.returncode, proc.stderr) == (-signal.SIGPIPE, "")


class FakeSweep:
    """A stand-in for the train.py process that study.run_pooled starts for a point (subprocess.Popen's part that
    it uses), on a clock the test owns: its point (--out_dir) takes `duration`, and is left as fake_run's finished
    run once the clock has passed its end, its val loss 2 + |log2(learning_rate / 2e-3)| (best at 2e-3)."""

    clock, duration, started = [0.0], 10.0, []

    def __init__(self, cmd, cwd=None, stdout=None, stderr=None, env=None):
        value = lambda flag: [a.split("=", 1)[1] for a in cmd if a.startswith(f"--{flag}=")][-1]  # noqa: E731
        self.jobs, self.env, self.returncode, self.start = 1, env, None, self.clock[0]
        self.ends = {value("out_dir"): (self.start + self.duration, float(value("learning_rate")))}
        self.end = max(end for end, _ in self.ends.values())
        self.started.append(self)

    def poll(self):
        for path, (end, lr) in self.ends.items():
            if self.clock[0] >= end and not os.path.exists(os.path.join(path, "metrics.jsonl")):
                fake_run(path, 2 + abs(math.log2(lr / 2e-3)))
        if self.returncode is None and all(self.clock[0] >= end for end, _ in self.ends.values()):
            self.returncode = 0
        return self.returncode

    def send_signal(self, signum):
        raise AssertionError("no signal in this test")


POOLED = """
name = "pooled"
results_dir = "{results}"
[tuning]
key = "learning_rate"
grid = ["2e-3"]
seed = 0
max_widen = 0
[held_out]
seeds = [1]
[[horizon]]
max_iters = 10
[[arm]]
name = "a"
config = "config/mini/baseline.py"
[[arm]]
name = "b"
config = "config/mini/res_gelu.py"
grid = ["5e-4", "1e-3", "2e-3", "4e-3"]
"""


def run_pooled_on_a_fake_clock(monkeypatch, s, slots):
    """study.run_pooled(s, slots) with FakeSweep for train.py (slots None: study.run(s), the launcher's slots, its
    tables not written); returns (its status, the clock at its end)."""
    FakeSweep.clock[0], FakeSweep.started[:] = 0.0, []
    os.makedirs(s.results_dir, exist_ok=True)  # as study.run makes it
    monkeypatch.setattr(subprocess, "Popen", FakeSweep)  # the scheduler's processes (sweeps.schedule)
    monkeypatch.setattr(time, "sleep", lambda dt: FakeSweep.clock.__setitem__(0, FakeSweep.clock[0] + dt))
    monkeypatch.setattr(study, "write_tables", lambda s: None)
    code = study.run(s) if slots is None else study.run_pooled(s, slots)
    return code, FakeSweep.clock[0]


def test_a_slot_that_frees_goes_to_the_points_still_waiting_in_a_stage_that_began_before(tmp_path, monkeypatch):
    # arm a: 1 tuning run, then 1 held-out; arm b: 4 tuning runs, then 1 held-out; 2 slots, each run 10 s.
    # At 0 b's tuning stage begins with one slot (a has the other); the slot a frees at 20 goes to b's
    # last 2 tuning runs, so b's 4 take 3 rounds, not 4, and the study ends at 40, the least 7 runs allow
    s = write_study(tmp_path, POOLED)
    assert [len(study.advance(s, arm, s.horizons[0]).todo) for arm in s.arms] == [1, 4]
    code, end = run_pooled_on_a_fake_clock(monkeypatch, s, 2)
    assert code == 0 and end == 40
    starts = {(os.path.basename(os.path.dirname(path)), os.path.basename(path)): sweep.start
              for sweep in FakeSweep.started for path in sweep.ends}
    assert starts == {("a", "learning_rate=2e-3,seed=0"): 0, ("a", "learning_rate=2e-3,seed=1,data_seed=1"): 10,
                      ("b", "learning_rate=5e-4,seed=0"): 0, ("b", "learning_rate=1e-3,seed=0"): 10,
                      ("b", "learning_rate=2e-3,seed=0"): 20, ("b", "learning_rate=4e-3,seed=0"): 20,
                      ("b", "learning_rate=2e-3,seed=1,data_seed=1"): 30}
    assert all(study.advance(s, arm, s.horizons[0]).held_out == {1: 2.0} for arm in s.arms)


def test_a_freed_slot_goes_to_the_arm_that_has_had_the_fewest_points(tmp_path, monkeypatch):
    # three arms of one tuning run and two held-out seeds each, 2 slots, 10 s a run. Dealing from the first arm
    # each time gave c nothing until a's and b's seeds were all done (c's seed 1 at 40, a's seed 2 at 10); dealt
    # to the arm with the fewest points finished or running, every arm's seed 1 starts before any arm's seed 2,
    # so a study stopped midway has whole seeds to compare
    three = POOLED.replace('grid = ["5e-4", "1e-3", "2e-3", "4e-3"]\n', "").replace("seeds = [1]", "seeds = [1, 2]")
    s = write_study(tmp_path, three + '[[arm]]\nname = "c"\nconfig = "config/mini/res_gelu_no_half.py"\n')
    code, end = run_pooled_on_a_fake_clock(monkeypatch, s, 2)
    assert code == 0 and end == 50
    starts = {(os.path.basename(os.path.dirname(path)), os.path.basename(path)): sweep.start
              for sweep in FakeSweep.started for path in sweep.ends}
    seed = {k: [t for (arm, name), t in starts.items() if name.endswith(f"seed={k},data_seed={k}")] for k in (1, 2)}
    assert len(seed[1]) == len(seed[2]) == 3 and max(seed[1]) < min(seed[2]), starts


def test_one_slot_on_this_machine_deals_whole_seeds_too(tmp_path, monkeypatch):
    # [launcher] jobs = 1 (the default): one point at a time, still dealt round the arms, so a study stopped
    # midway has whole seeds; one sweep per arm ran a's seeds 1 and 2 before b's seed 1
    three = POOLED.replace('grid = ["5e-4", "1e-3", "2e-3", "4e-3"]\n', "").replace("seeds = [1]", "seeds = [1, 2]")
    s = write_study(tmp_path, three + '[[arm]]\nname = "c"\nconfig = "config/mini/res_gelu_no_half.py"\n')
    assert study.local_slots(s) == 1
    code, end = run_pooled_on_a_fake_clock(monkeypatch, s, None)
    assert code == 0 and end == 90  # 9 runs of 10 s, one at a time
    starts = {(os.path.basename(os.path.dirname(path)), os.path.basename(path)): sweep.start
              for sweep in FakeSweep.started for path in sweep.ends}
    seed = {k: [t for (arm, name), t in starts.items() if name.endswith(f"seed={k},data_seed={k}")] for k in (1, 2)}
    assert len(seed[1]) == len(seed[2]) == 3 and max(seed[1]) < min(seed[2]), starts


def test_an_arm_that_a_stopped_command_left_a_seed_behind_catches_up_first(tmp_path, monkeypatch):
    # an earlier command, stopped, finished a's and b's seed 1 and only c's tuning run. Dealt by the points this
    # command launched, a's and b's seed 2 would start first (c's seed 1 at 10); dealt by the points each arm has
    # finished, c's seed 1 starts at once, beside a's seed 2
    three = POOLED.replace('grid = ["5e-4", "1e-3", "2e-3", "4e-3"]\n', "").replace("seeds = [1]", "seeds = [1, 2]")
    s = write_study(tmp_path, three + '[[arm]]\nname = "c"\nconfig = "config/mini/res_gelu_no_half.py"\n')
    horizon = s.horizons[0]
    for arm, names in zip(s.arms, (["seed=0", "seed=1,data_seed=1"], ["seed=0", "seed=1,data_seed=1"], ["seed=0"])):
        for name in names:
            fake_run(os.path.join(study.arm_dir(s, arm, horizon), f"learning_rate=2e-3,{name}"), 2.0)
    assert [study.points_had(s, study.advance(s, arm, horizon)) for arm in s.arms] == [2, 2, 1]
    code, end = run_pooled_on_a_fake_clock(monkeypatch, s, 2)
    starts = {(os.path.basename(os.path.dirname(path)), os.path.basename(path)): sweep.start
              for sweep in FakeSweep.started for path in sweep.ends}
    assert code == 0 and end == 20
    assert {(arm, name.split(",")[1]): t for (arm, name), t in starts.items()} == {
        ("c", "seed=1"): 0, ("a", "seed=2"): 0, ("b", "seed=2"): 10, ("c", "seed=2"): 10}


def test_each_slot_is_a_set_of_gpus_of_its_own_and_there_are_no_more_slots_than_the_gpus_make(
        tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # 4 GPUs, none here
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    gpu = POOLED.replace('config = "config/mini/res_gelu.py"', 'config = "config/mini/res_gelu.py"\n'
                         'overrides = { device = "cuda" }') + '[launcher]\njobs = 3\ngpus_per_run = 2\n'
    s = write_study(tmp_path, gpu)
    env = study.slot_environment(s, 3)
    assert [env[slot].get("CUDA_VISIBLE_DEVICES") for slot in range(len(env))] == ["0,1", "2,3"]
    assert {slot["OMP_NUM_THREADS"] for slot in env} == {str(max(1, len(os.sched_getaffinity(0)) // 4))}  # 2 x 2
    assert "4 visible GPU(s) make 2 slot(s) of 2; the study runs 2 point(s) at a time" in capsys.readouterr().out
    assert [slot.get("CUDA_VISIBLE_DEVICES") for slot in study.slot_environment(s, 1)] == ["0,1"]  # jobs caps them
    code, end = run_pooled_on_a_fake_clock(monkeypatch, s, 3)
    for sweep in FakeSweep.started:  # each point on 2 GPUs of its own, that no point running beside it has
        gpus = sweep.env.get("CUDA_VISIBLE_DEVICES", "").split(",")
        assert len(gpus) == 2 * sweep.jobs
        beside = [o for o in FakeSweep.started if o is not sweep and o.start <= sweep.start < o.end]
        assert all(not set(gpus) & set(o.env.get("CUDA_VISIBLE_DEVICES", "").split(",")) for o in beside)
    assert code == 0 and end == 40 and len(FakeSweep.started) == 7
    s.launcher["gpus_per_run"] = 8
    with pytest.raises(study.StudyError, match="a point needs 8 GPUs"):
        study.slot_environment(s, 3)


def test_the_committed_ablations_are_all_done():
    proc = run_script("study.py", "studies/ablations.toml", "--dry_run")
    assert proc.stdout.count("; 0 run(s) left") == 14  # 11 arms at 1000 steps, 3 at 3000
    assert "101 run directories exist; at least 0 run(s) left" in proc.stdout
    # the widening as it was done by hand: the QK-norm baseline twice down, identity twice up
    assert ("baseline_qk_norm: tuning 5/5 done, held-out 5/5 done, chosen learning_rate=7.5e-4; 0 run(s) left "
            "(widened: 7.5e-4, 3.75e-4)") in proc.stdout
    assert ("identity: tuning 5/5 done, held-out 5/5 done, chosen learning_rate=1.2e-2; 0 run(s) left "
            "(widened: 1.2e-2, 2.4e-2)") in proc.stdout


def write_tables_from_the_repo(s):
    """study.write_tables(s) run from the repo's root, as study.py runs it (its commands name repo paths)."""
    cwd = os.getcwd()
    try:
        os.chdir(REPO)
        study.write_tables(s)
    finally:
        os.chdir(cwd)


def test_the_ablations_study_writes_the_committed_tables(tmp_path):
    """Each table study.py writes for studies/ablations.toml is, line for line, what the command written above
    the committed table in results/ablations/README.md prints (test_results holds the README to that)."""
    s = study.load_study(os.path.join(REPO, "studies", "ablations.toml"))
    s.results_dir = str(tmp_path)
    for table in s.tables:
        table.figure = ""
    write_tables_from_the_repo(s)
    written = [[line for line in section.splitlines() if line.startswith("|")]
               for section in (tmp_path / "TABLES.md").read_text().split("\n## ")[1:]]
    committed = [t for t in TABLES if t[0] == "results/ablations/README.md"]
    assert len(written) == len(committed) == 4
    for lines, (readme, line, _, program, argv, _, _) in zip(written, committed):
        assert lines == printed_table(program, argv), f"the table for {readme}:{line}"


COMMITTED_TABLES = sorted(
    name for name in os.listdir(os.path.join(REPO, "studies"))
    if os.path.exists(os.path.join(REPO, study.load_study(os.path.join(REPO, "studies", name)).results_dir,
                                   "TABLES.md")))


@pytest.mark.parametrize("name", COMMITTED_TABLES)
def test_every_study_regenerates_its_committed_tables_byte_for_byte(name, tmp_path, monkeypatch):
    """Each study's committed TABLES.md is what `python study.py studies/NAME` writes from the committed runs, byte
    for byte (its figures drawn into tmp_path, their paths then spelled as the study file spells them)."""
    monkeypatch.chdir(REPO)
    s = study.load_study(os.path.join("studies", name))
    committed = open(os.path.join(s.results_dir, "TABLES.md")).read()
    s.results_dir = str(tmp_path)
    drawn = {}
    for i, table in enumerate(s.tables):
        if table.figure:
            drawn[str(tmp_path / f"figure{i}.png")], table.figure = table.figure, str(tmp_path / f"figure{i}.png")
    write_tables_from_the_repo(s)
    written = (tmp_path / "TABLES.md").read_text()
    for here, declared in drawn.items():
        assert os.path.getsize(here) > 0
        written = written.replace(here, declared)
    assert written == committed


def test_a_zipped_grid_axis_sets_its_keys_together():
    axes = sweeps.parse_grid(["learning_rate=1e-3,2e-3", "seed,data_seed=1,2"])
    assert axes == [(("learning_rate",), ["1e-3", "2e-3"]), (("seed", "data_seed"), ["1", "2"])]
    for bad, message in (["seed,seed=1"], "already an axis"), (["seed,nope=1"], "unknown config key 'nope'"), \
            (["seed,=1"], "write an axis"):
        with pytest.raises(ConfigError, match=message):
            sweeps.parse_grid(bad)
    proc = run_script("sweep.py", "config/mini/baseline.py", "--grid", "learning_rate=3e-3", "--grid",
                      "seed,data_seed=1,2", "--sweep_dir=unused", "--dry_run")
    assert "learning_rate=3e-3,seed=2,data_seed=2: starting" in proc.stdout
    assert "--learning_rate=3e-3 --seed=2 --data_seed=2 --out_dir=unused/learning_rate=3e-3,seed=2,data_seed=2" \
        in proc.stdout


def tiny_study(tmp_path, arms, grid, seeds, max_iters, name="tiny"):
    """A study file of tiny runs (see helpers.TINY) in tmp_path: `arms` {name: the overrides of
    config/quickstart.py, as TOML inline-table items}, the tuning `grid` on seed 0 (no widening),
    the held-out `seeds`, one horizon of `max_iters`, 2 slots. Returns its path."""
    tiny = ("n_layer = 1, n_head = 2, n_embd = 32, block_size = 32, batch_size = 2, eval_iters = 2, "
            "warmup_iters = 1, log_interval = 1, wandb_log = false")
    path = tmp_path / f"{name}.toml"
    path.write_text(f"""
name = "{name}"
results_dir = "{tmp_path / 'results'}"
runs_dir = "{tmp_path / 'runs'}"
[tuning]
key = "learning_rate"
grid = {json.dumps(grid)}
seed = 0
max_widen = 0
[held_out]
seeds = {json.dumps(seeds)}
[[horizon]]
max_iters = {max_iters}
[launcher]
jobs = 2
""" + "".join(f"""[[arm]]
name = "{arm}"
config = "config/quickstart.py"
overrides = {{ {overrides}, {tiny} }}
""" for arm, overrides in arms.items()))
    return path


@pytest.mark.slow
def test_a_tiny_study_runs_to_its_tables_and_a_second_run_trains_nothing(tmp_path, shakespeare_dir):
    data = f'data_dir = "{shakespeare_dir}", eval_interval = 2'
    path = tiny_study(tmp_path, {"linear": f'query_mode = "linear", {data}', "res_gelu": data}, ["1e-3", "2e-2"],
                      [1, 2], 4)
    out = run_script("study.py", str(path), env=ONE_THREAD).stdout
    # the two arms share the 2 slots: both tune at once, not one arm's runs after the other's
    first_end = out.index(" ended\n")
    for arm in ("linear", "res_gelu"):
        assert out.index(f"{arm} @ 4 steps: learning_rate=1e-3,seed=0 in slot") < first_end
        assert "learning_rate=1e-3,seed=0: starting" in (tmp_path / "runs" / arm / "sweep.log").read_text()
    record = json.loads((tmp_path / "results" / "study.json").read_text())["horizons"]["4"]
    for arm in ("linear", "res_gelu"):
        losses = record[arm]["tuning_val_loss"]
        assert record[arm]["chosen"] == min(losses, key=losses.get) and record[arm]["widening"] == []
        for seed in (1, 2):  # a held-out seed sets the data order too
            run = tmp_path / "runs" / arm / f"learning_rate={record[arm]['chosen']},seed={seed},data_seed={seed}"
            config = json.loads((run / "config.json").read_text())["config"]
            assert (config["seed"], config["data_seed"], config["max_iters"]) == (seed, seed, 4)
    tables = (tmp_path / "results" / "TABLES.md").read_text()
    assert "--select_on=seed=0 --holm --paired --group_over=seed,data_seed" in tables
    # one label an arm, its name (issue 82): not its config file's name with the settings that set it apart
    assert "| linear " in tables and "| res_gelu " in tables and "quickstart query_mode" not in tables
    assert "wrote " not in tables
    assert (tmp_path / "results" / "figure_4.png").is_file()
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "runs").rglob("metrics.jsonl")}
    assert len(before) == 8
    assert "done: every arm" in run_script("study.py", str(path), env=ONE_THREAD).stdout
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "runs").rglob("metrics.jsonl")} == before


@pytest.mark.slow
def test_a_failing_arm_stops_only_itself(tmp_path, shakespeare_dir):
    path = tiny_study(tmp_path, {"broken": f'data_dir = "{tmp_path / "no_such_data"}", eval_interval = 2',
                                 "fine": f'data_dir = "{shakespeare_dir}", eval_interval = 2'}, ["1e-3"], [1], 2)
    proc = run_script("study.py", str(path), env=ONE_THREAD, check=False)
    assert proc.returncode == 1
    assert "error: the sweep of broken @ 2 steps exited with status 1" in proc.stderr
    assert "error: the sweeps of broken @ 2 steps failed" in proc.stderr
    record = json.loads((tmp_path / "results" / "study.json").read_text())["horizons"]["2"]
    assert record["broken"]["tuning_val_loss"] == {"1e-3": None} and record["broken"]["chosen"] is None
    assert record["fine"]["chosen"] == "1e-3" and record["fine"]["held_out_val_loss"]["1"] > 0  # ran to its end
    assert not (tmp_path / "results" / "TABLES.md").exists()


@pytest.mark.slow
def test_sigterm_to_a_study_checkpoints_every_running_point_and_the_same_command_continues(tmp_path,
                                                                                          shakespeare_dir):
    data = f'data_dir = "{shakespeare_dir}", eval_interval = 75'
    path = tiny_study(tmp_path, {"linear": f'query_mode = "linear", {data}', "res_gelu": data}, ["1e-3"], [1], 150)
    running = [tmp_path / "runs" / arm / "learning_rate=1e-3,seed=0" for arm in ("linear", "res_gelu")]
    proc = subprocess.Popen([sys.executable, "study.py", str(path)], cwd=REPO, env={**os.environ, **ONE_THREAD},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: all((d / "metrics.jsonl").exists() and read_metrics(d, "train") for d in running), 300,
                   "both arms' tuning runs training")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM and "study stopped; every running point wrote its checkpoint" in err
    stopped = {}
    for point in running:  # each finished its step and checkpointed it
        stopped[point] = read_metrics(point, "train")[-1]["step"]
        assert torch.load(point / "ckpt.pt", weights_only=True)["step"] == stopped[point] < 150
    assert "done: every arm" in run_script("study.py", str(path), env=ONE_THREAD).stdout
    for point in running:  # resumed where it stopped, not started again
        assert [r["step"] for r in read_metrics(point, "config")] == [0, stopped[point]]
        assert read_metrics(point, "eval")[-1]["step"] == 150


WIDTHS = """
name = "widths"
results_dir = "{results}"
[tuning]
key = "learning_rate"
grid = ["1e-3", "2e-3"]
seeds = [0, 6]
max_widen = 1
[held_out]
seeds = [1, 2]
[[horizon]]
max_iters = 10
[[arm]]
name = "small"
config = "config/mini/baseline.py"
[[arm]]
name = "wide"
config = "config/mini/baseline.py"
overrides = { n_embd = 256, n_head = 8, parametrization = "mup" }
value_from = "small"
seeds = [1]
[[arm]]
name = "fixed"
config = "config/mini/res_gelu.py"
value = "3e-3"
[[table]]
kind = "width_ladder"
arms = ["small", "wide"]
"""


def test_tuning_on_several_seeds_chooses_on_their_mean_and_other_arms_take_the_value(tmp_path):
    s = write_study(tmp_path, WIDTHS)
    small, wide, fixed = s.arms
    horizon = s.horizons[0]
    # the wide arm waits for the small arm's choice; the fixed arm goes straight to its held-out seeds
    assert study.advance(s, wide, horizon).todo == [] and study.advance(s, wide, horizon).chosen is None
    assert study.advance(s, fixed, horizon).todo == [{"learning_rate": "3e-3", "seed": s, "data_seed": s}
                                                     for s in (1, 2)]
    assert study.advance(s, small, horizon).todo == [{"learning_rate": v, "seed": seed}
                                                     for v in ("1e-3", "2e-3") for seed in (0, 6)]
    # 1e-3 wins on seed 0, 2e-3 on their mean: 2e-3 sits at the high edge and 4e-3 joins
    for (v, seed), loss in {("1e-3", 0): 2.0, ("1e-3", 6): 2.6, ("2e-3", 0): 2.1, ("2e-3", 6): 2.3}.items():
        fake_run(study.point_dir(s, small, horizon, {"learning_rate": v, "seed": seed}), loss)
    stage = study.advance(s, small, horizon)
    assert stage.tuning == {"1e-3": pytest.approx(2.3), "2e-3": pytest.approx(2.2), "4e-3": None}
    assert stage.todo == [{"learning_rate": "4e-3", "seed": 0}, {"learning_rate": "4e-3", "seed": 6}]
    fake_run(study.point_dir(s, small, horizon, {"learning_rate": "4e-3", "seed": 0}), 2.0)
    fake_run(study.point_dir(s, small, horizon, {"learning_rate": "4e-3", "seed": 6}), None, diverged=True)
    assert study.advance(s, small, horizon).chosen == "2e-3"
    assert study.advance(s, wide, horizon).todo == [{"learning_rate": "2e-3", "seed": 1, "data_seed": 1}]
    # the ladder table runs compare.py over the held-out seeds of its arms
    cmd = study.table_command(s, s.tables[0], {a.name: a for a in s.arms})
    assert cmd[:3] == ["compare.py", study.arm_dir(s, small, horizon), study.arm_dir(s, wide, horizon)]
    assert {"--width_ladder", "--seeds=1,2", "--format=markdown"} <= set(cmd) and "--best_over" not in " ".join(cmd)
    # a transfer table over the same arms reads the tuning runs only, though the arms' directories hold held-out runs
    transfer = protocol.Table(horizon.max_iters, "", ["small", "wide"], [], "", "width_transfer")
    cmd = study.table_command(s, transfer, {a.name: a for a in s.arms})
    assert {"--width_transfer", "--seeds=0,6"} <= set(cmd) and "--seeds=1,2" not in cmd


def test_a_study_that_only_tunes_tables_each_arm_at_its_best_and_says_a_failed_table_in_one_line(
        tmp_path, monkeypatch, capsys):
    s = write_study(tmp_path, TOML.replace("seeds = [1, 2]", "seeds = []"))
    a, b = s.arms
    horizon = s.horizons[0]
    for arm, losses in ((a, {"1e-3": 3.0, "2e-3": 2.0, "4e-3": 2.5}), (b, {"1e-3": 2.5, "2e-3": 2.2, "4e-3": 2.4})):
        for v, loss in losses.items():
            fake_run(study.point_dir(s, arm, horizon, {"learning_rate": v, "seed": 0}), loss)
    assert [study.advance(s, arm, horizon).chosen for arm in s.arms] == ["2e-3", "2e-3"]
    # no held-out run to report: --select_on would find none, so the table is each arm at its best tuning value
    cmd = study.table_command(s, s.tables[0], {arm.name: arm for arm in s.arms})
    assert "--best_over=learning_rate" in cmd and not any(c.startswith(("--select_on", "--holm")) for c in cmd)

    def failing(_):
        raise study.StudyError("python compare.py ... failed: error: no runs")

    monkeypatch.setattr(study, "write_tables", failing)
    assert study.main([s.path]) == 1
    assert capsys.readouterr().err == "study error: python compare.py ... failed: error: no runs\n"


def test_reused_runs_must_be_complete_and_are_never_run(tmp_path):
    reused = tmp_path / "other"
    text = WIDTHS.replace('name = "small"\nconfig = "config/mini/baseline.py"',
                          f'name = "small"\nconfig = "config/mini/baseline.py"\nruns = "{reused}"')
    with pytest.raises(study.StudyError, match=r"arm small reuses the runs in .*other, which lack 4 the protocol asks"):
        write_study(tmp_path, text)
    # 1e-3 is best at the low edge, so 5e-4 joined the grid there, and lost
    for v, loss in (("5e-4", 2.5), ("1e-3", 2.0), ("2e-3", 2.2)):
        for seed in (0, 6):
            fake_run(reused / f"learning_rate={v},seed={seed}", loss)
    for seed in (1, 2):
        fake_run(reused / f"learning_rate=1e-3,seed={seed},data_seed={seed}", 2.0)
    s = write_study(tmp_path, text)
    assert study.arm_dir(s, s.arms[0], s.horizons[0]) == str(reused)
    assert study.advance(s, s.arms[0], s.horizons[0]).chosen == "1e-3"


def test_a_wider_arm_is_costed_by_its_flops_and_a_proxy_tuning_by_the_gpu_hours_it_saves(tmp_path, capsys):
    toml = WIDTHS.replace("max_iters = 10", "max_iters = 1000")
    s = write_study(tmp_path, toml)
    small, wide, _ = s.arms
    for v in ("1e-3", "2e-3"):
        for seed in (0, 6):
            fake_run(study.point_dir(s, small, s.horizons[0], {"learning_rate": v, "seed": seed}),
                     2.0 + float(v), max_iters=1000)
            with open(os.path.join(study.point_dir(s, small, s.horizons[0], {"learning_rate": v, "seed": seed}),
                                   "metrics.jsonl"), "a") as f:
                f.write(json.dumps({"type": "train", "step": 1, "loss": 3.0, "ms_per_step": 200.0}) + "\n")
    # one size measured: the wide arm's steps cost its FLOPs over the small arm's times 0.2 s
    seconds, how = study.estimated_seconds(s, wide, s.horizons[0], 1)
    ratio = study.arm_flops(s, wide, s.horizons[0])[0] / study.arm_flops(s, small, s.horizons[0])[0]
    assert how == "scaled" and seconds == pytest.approx(1000 * 0.2 * ratio) and 3 < ratio < 4
    assert study.estimated_seconds(s, small, s.horizons[0], 2) == (pytest.approx(400.0), "measured")
    # two sizes measured, the wide one faster per FLOP: an arm of the small one's size (res_gelu at width 128,
    # within 1% of its FLOPs) is scaled from the small arm's times alone, not from the mean over both sizes
    for seed in (1,):
        run = study.point_dir(s, wide, s.horizons[0], {"learning_rate": "1e-3", "seed": seed, "data_seed": seed})
        fake_run(run, 2.0, max_iters=1000)
        with open(os.path.join(run, "metrics.jsonl"), "a") as f:
            f.write(json.dumps({"type": "train", "step": 1, "loss": 3.0, "ms_per_step": 400.0}) + "\n")
    fixed = s.arms[2]
    near = study.arm_flops(s, fixed, s.horizons[0])[0] / study.arm_flops(s, small, s.horizons[0])[0]
    assert 1 < near < 1.01
    assert study.estimated_seconds(s, fixed, s.horizons[0], 1) == (pytest.approx(1000 * 0.2 * near), "scaled")
    # on a GPU, the plan says what tuning the wide arm at its own size would have cost
    cuda = toml.replace('value_from = "small"', 'value_from = "small"\noverrides = { n_embd = 256, n_head = 8, '
                        'parametrization = "mup", device = "cuda" }').replace(
        'overrides = { n_embd = 256, n_head = 8, parametrization = "mup" }\n', '')
    s = write_study(tmp_path, cuda)
    line, saved = study.tuning_saved(s, s.arms[1], s.horizons[0])
    n = 2 * len(study.advance(s, s.arms[0], s.horizons[0]).values)  # the grid, widened, times the 2 tuning seeds
    small_h, wide_h = (n * study.arm_flops(s, a, s.horizons[0])[0] / (s.peak_flops * s.mfu) / 3600
                       for a in s.arms[:2])
    assert n == 6 and saved == pytest.approx(wide_h - small_h)
    assert line == (f"    tuning small ({n} runs, n_embd=128) takes about {small_h:.1f} GPU-hours; the same tuning at "
                    f"n_embd=256 would take {wide_h:.1f}: {wide_h - small_h:.1f} GPU-hours saved (FLOPs at the "
                    f"study's [cost] peak and MFU)")


@pytest.mark.slow
def test_the_readmes_dry_run_example_shows_a_plan_and_its_cost():
    # a newcomer's first look at a study: one with every run committed would show "0 run(s) left" and no cost
    readme = open(os.path.join(REPO, "README.md")).read()
    line = next(ln for ln in readme.splitlines() if ln.startswith("python study.py") and "--dry_run" in ln)
    command, comment = line.split("#")
    proc = run_script("study.py", *command.split()[2:])
    total = proc.stdout.strip().splitlines()[-1]
    runs, hours = int(total.split("at least ")[1].split(" run(s)")[0]), float(total.split("about ")[1].split()[0])
    assert runs > 0 and hours > 1, total
    assert comment.strip() == f"Table 1 held out: {runs} runs planned, about {round(hours, -1):.0f} GPU-hours"


def test_the_temperature_study_plans_exactly_its_40_declared_runs():
    """studies/width_ladder_temperature.toml, declared in results/width_ladder/README.md's section on E:
    its --dry_run plans baseline_temp2 and res_gelu_no_half at widths 128 and 256 on seeds 11-20 (data_seed =
    seed), μP, 3e-3, 3000 steps, on the CPU in float32, 40 runs, and no other."""
    s = study.load_study(os.path.join(REPO, "studies", "width_ladder_temperature.toml"))
    (horizon,) = s.horizons
    planned = []
    for arm in s.arms:
        stage = protocol.advance(s, arm, horizon)
        assert stage.chosen == "3e-3" and not stage.tuning, arm.name
        for seed in stage.held_out:
            c = protocol.arm_config(s, arm, horizon, protocol.held_out_point(s, stage.chosen, seed))
            planned.append((c.query_mode, c.attn_scale, c.n_embd, c.n_head, c.parametrization, c.learning_rate,
                            c.seed, c.data_seed, c.max_iters, c.lr_decay_iters, c.device,
                            "float32" if c.dtype == "auto" and c.device == "cpu" else c.dtype))  # setup's auto
    temp2, no_half = ("linear", 2 / math.sqrt(32)), ("res_gelu", 32 ** -0.5)  # as the configs compute them
    assert sorted(planned) == sorted((*arm, w, w // 32, "mup", 3e-3, seed, seed, 3000, 3000, "cpu", "float32")
                                     for arm in (temp2, no_half) for w in (128, 256) for seed in range(11, 21))
    proc = run_script("study.py", "studies/width_ladder_temperature.toml", "--dry_run")
    done = int(proc.stdout.split(" run directories exist")[0].split()[-1])
    assert f"at least {40 - done} run(s) left" in proc.stdout
    assert proc.stdout.count("held-out ") == 4


def test_the_gpt2_temperature_study_plans_its_stages_and_tests_its_family_in_order(tmp_path, capsys):
    """studies/table1_gpt2_temperature.toml: its --dry_run plans the seven arms' tuning (each on a grid of 3 rates
    around its known rate: 6e-4 for the linear queries and mlp475, 3e-3 for the res_gelu arms, the two gated arms
    with theirs) and the pilot stage
    (seeds 101-103), the looks set by E's power at the assumed spread, the family's order, each test's MDE at each
    look and the GPU-hours with widening; on faked finished runs of the tuning, the pilot and look 1, E (the gate) is
    tested on the look's seeds alone, and E_gated, D, then the gaps, at that look while each before rejected."""
    path = os.path.join(REPO, "studies", "table1_gpt2_temperature.toml")
    assert study.main([path, "--dry_run"]) == 0
    out = capsys.readouterr().out
    arms = ("baseline", "baseline_temp2", "res_gelu", "res_gelu_no_half", "mlp475", "baseline_temp2_gate",
            "res_gelu_no_half_gate")
    assert all(f"  {a}: tuning 0/3 done, held-out 0/3 done" in out for a in arms), out
    assert "at least 42 run(s) left" in out and "pilot stage: seeds 101, 102, 103 of every arm" in out
    assert "3 looks, at 9, 18, 27 seeds an arm, set by [power]: E's simulated power" in out
    assert "E -> E_gated -> D -> gap_res_gelu -> gap_res_gelu_no_half -> gap_baseline_temp2 -> gap_mlp475" in out
    assert "each look alone detects (MDE at its nominal level): look 1 (9 seeds)" in out
    assert "with widening and one rerun per arm" in out and "GPU-hours" in out
    s = study.load_study(path)
    s.runs_dir, s.results_dir = str(tmp_path / "runs"), str(tmp_path / "results")
    (horizon,) = s.horizons
    assert {a.name: (a.grid or s.grid)[1] for a in s.arms} == {
        "baseline": "6e-4", "baseline_temp2": "6e-4", "res_gelu": "3e-3", "res_gelu_no_half": "3e-3", "mlp475": "6e-4",
        "baseline_temp2_gate": "6e-4", "res_gelu_no_half_gate": "3e-3"}
    offset = {"baseline": 0.0, "baseline_temp2": -0.02, "res_gelu": 0.01, "res_gelu_no_half": -0.03, "mlp475": -0.005,
              "baseline_temp2_gate": -0.025, "res_gelu_no_half_gate": -0.04}
    loss = {}

    def fake(arm, points):
        best = (arm.grid or s.grid)[1]
        for point in points:
            c = protocol.arm_config(s, arm, horizon, point)
            # the middle rate is every arm's best on seed 0; the seeds move each arm by its own amount
            value = 3.0 + offset[arm.name] + (0.0 if point["learning_rate"] == best else 0.1) + 0.003 * (
                (point["seed"] * (1 + list(offset).index(arm.name))) % 7)
            loss[arm.name, point["seed"]] = value
            out_dir = protocol.point_dir(s, arm, horizon, point)
            os.makedirs(out_dir)
            header = {"type": "config", "step": 0, "config": asdict(c), "run_name": arm.name,
                      "non_embedding_params": 1, "flops_per_token": 1.0}
            with open(os.path.join(out_dir, "metrics.jsonl"), "w") as f:
                f.writelines(json.dumps(r) + "\n" for r in (header, {"type": "eval", "step": horizon.max_iters,
                                                                     "train_loss": value, "val_loss": value}))
            with open(os.path.join(out_dir, "config.json"), "w") as f:
                json.dump(header, f)

    for arm in s.arms:
        best = (arm.grid or s.grid)[1]
        config = protocol.arm_config(s, arm, horizon, {"learning_rate": best, "seed": 0})
        assert (config.attn_scale, config.query_mode, config.attn_gate) == {
            "baseline_temp2": (0.25, "linear", "none"), "res_gelu_no_half": (0.125, "res_gelu", "none"),
            "baseline_temp2_gate": (0.25, "linear", "elementwise"),
            "res_gelu_no_half_gate": (0.125, "res_gelu", "elementwise")}.get(arm.name,
                                                                             (0.0, config.query_mode, "none"))
        fake(arm, [{"learning_rate": v, "seed": 0} for v in arm.grid or s.grid] +
             [protocol.held_out_point(s, best, seed) for seed in (101, 102, 103)])
    planned, how = looks.planned_looks(s)
    assert how.endswith("from the pilot stage's 3 seeds (seeds 101-103)") and looks.state(s).current == 0
    for arm in s.arms:
        fake(arm, [protocol.held_out_point(s, (arm.grid or s.grid)[1], seed) for seed in range(1, planned[-1] + 1)])
    state = looks.state(s)
    gate = [x for x in state.evaluated if x.test == "E"]
    assert [x.look for x in gate] == list(range(1, len(gate) + 1)) and state.stopped_at == len(gate) - 1
    assert all(x.decision == "continue" for x in gate[:-1])
    e = [100 * (loss["baseline_temp2", k] - loss["res_gelu_no_half", k]) / loss["baseline_temp2", k]
         for k in range(1, planned[0] + 1)]
    assert gate[0].mean == pytest.approx(np.mean(e)) and gate[0].seeds == list(range(1, planned[0] + 1))
    # the pilot's small spread sets three looks of 3 seeds; E crosses at the last, then the family in its order at
    # that look while each rejects: mlp475's gap (its t 1.26) is not rejected, and nothing follows it
    assert planned == [3, 6, 9] and [(x.test, x.look, x.decision) for x in state.evaluated] == [
        ("E", 1, "continue"), ("E", 2, "continue"), ("E", 3, "reject"), ("E_gated", 3, "reject"), ("D", 3, "reject"),
        ("gap_res_gelu", 3, "reject"), ("gap_res_gelu_no_half", 3, "reject"), ("gap_baseline_temp2", 3, "reject"),
        ("gap_mlp475", 3, "not rejected")]
    write_tables_from_the_repo(s)
    text = (tmp_path / "results" / "TABLES.md").read_text()
    assert "## The declared tests, look by look" in text and "E -> E_gated -> D -> gap_res_gelu" in text


def test_a_recorded_tuning_choice_fixes_the_declaration_and_the_runs_it_was_chosen_on(tmp_path, capsys):
    """Before any decision the study file may change (study.json records the new declaration); once an arm's tuned
    value is recorded, a changed grid is refused by the run and the dry run alike, naming the choice, and so are
    tuning runs that now choose another value; study.json stays as it was."""
    s = write_study(tmp_path)
    arm, horizon = s.arms[0], s.horizons[0]
    path, written = str(tmp_path / "toy.toml"), tmp_path / "results" / "study.json"
    record = lambda st: study.record(st, {10: {a.name: study.advance(st, a, horizon) for a in st.arms}})  # noqa: E731
    os.makedirs(s.results_dir)
    record(s)
    (tmp_path / "toy.toml").write_text((tmp_path / "toy.toml").read_text().replace("max_widen = 2", "max_widen = 3"))
    assert study.main([path, "--dry_run"]) == 0  # nothing is decided yet
    s = study.load_study(path)
    for v, loss in (("1e-3", 2.1), ("2e-3", 2.0), ("4e-3", 2.05)):
        fake_run(study.point_dir(s, arm, horizon, {"learning_rate": v, "seed": 0}), loss)
    record(s)
    before = written.read_bytes()
    assert json.loads(before)["horizons"]["10"]["a"]["chosen"] == "2e-3"
    capsys.readouterr()
    text = (tmp_path / "toy.toml").read_text()
    (tmp_path / "toy.toml").write_text(text.replace('"4e-3"]', '"4e-3", "8e-3"]'))
    for argv in ([path, "--dry_run"], [path]):  # the dry run first: unrefused, the run would train
        assert study.main(argv) == 2
        assert capsys.readouterr().err == (
            f"study error: {path} changes the declaration that the tuning choice learning_rate=2e-3 of arm a at 10 "
            f"steps in {written} was decided under: [tuning] grid [\"1e-3\", \"2e-3\", \"4e-3\"] -> [\"1e-3\", "
            f"\"2e-3\", \"4e-3\", \"8e-3\"]; a declaration is fixed once a look or tuning choice is recorded: put it "
            f"back, or ask the new question as a new study (a new `name`, and a new `results_dir` where the file "
            f"sets one)\n")
    (tmp_path / "toy.toml").write_text(text)
    fake_run(study.point_dir(s, arm, horizon, {"learning_rate": "4e-3", "seed": 0}), 1.9)  # now 4e-3 is best
    assert study.main([path, "--dry_run"]) == 2
    assert capsys.readouterr().err == (
        f"study error: {written} records learning_rate=2e-3 chosen for arm a at 10 steps, and its tuning runs in "
        f"{study.arm_dir(s, arm, horizon)} now choose none yet; restore those runs, or ask the new question as a "
        f"new study (a new `name`, and a new `results_dir` where the file sets one)\n")
    assert written.read_bytes() == before
