"""Larger scales on the CPU over gloo: FSDP2 against one process; a sharded run killed while it
writes a checkpoint and resumed on 2 processes and on 1; the conversion to ckpt.pt; sharded
checkpoints saved and loaded in this process; Muon on shards against one process, and after a
sharded checkpoint; FSDP's numerics under bf16 autocast against DDP's; the process group of FSDP on
one GPU (CUDA imitated); activation checkpointing; the combinations refused at startup. (The GPT-3
configs are in tests/test_configs.py, torn metrics.jsonl lines in tests/test_faults.py and
tests/test_compare.py.)

Runs compared across processes are single-threaded (see tests/test_faults.py)."""

import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.distributed.tensor.debug import CommDebugMode

from helpers import ONE_THREAD, REPO, TINY, descendants, last_logged_step, read_metrics, run_script
from helpers import train as train_tiny
from helpers import val_losses_by_step as evals
from model import GPT, GPTConfig
from nonlinear_queries.config.train_config import TrainConfig
from nonlinear_queries.errors import CheckpointError, SetupError
from nonlinear_queries.record.runs import RunDir
from nonlinear_queries.runtime import processes
from nonlinear_queries.runtime.processes import parallelize, setup
from nonlinear_queries.trainer.optimizers import build_optimizers, muon_parameters
from nonlinear_queries.weights.checkpoint import load_training_state, read_checkpoint, save_sharded_checkpoint
from nonlinear_queries.weights.pretrained import load_model

# the schedule is fixed by lr_decay_iters, so runs of any max_iters share their first steps; the global
# batch is 4 micro-batches of 2 sequences: 4 micro-steps in one process, 2 per rank in two
RUN = ["--lr_decay_iters=24", "--eval_interval=4", "--dropout=0.1", "--batch_size=2", "--gradient_accumulation_steps=4"]
FSDP = "--parallelism=fsdp"


def train(data_dir, out_dir, *args, check=True):
    """train.py in one process, the tiny model and RUN, single-threaded."""
    return train_tiny(data_dir, out_dir, *RUN, *args, check=check, env=ONE_THREAD)


def launch(data_dir, out_dir, *args):
    """train.py under torchrun (the tiny model, RUN, single-threaded) in the background, its output in
    out_dir.log."""
    with open(f"{out_dir}.log", "w") as log:
        return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone",
                                 "--nproc_per_node=2", os.path.join(REPO, "train.py"), *TINY, *RUN,
                                 f"--data_dir={data_dir}", f"--out_dir={out_dir}", *args],
                                cwd=REPO, env={**os.environ, **ONE_THREAD}, stdout=log, stderr=subprocess.STDOUT)


def kill(proc):
    """SIGKILL the process and every process it started, found by their parent ids (a kill of torchrun's
    process group misses its workers), workers first: a power cut, as far as the run can tell."""
    family = descendants(proc.pid)
    for pid in [*reversed(family), proc.pid]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()


def output(proc, out_dir, timeout=300):
    """Wait for the process; its exit status and output."""
    code = proc.wait(timeout=timeout)
    with open(f"{out_dir}.log") as f:
        return code, f.read()


def wait_for(condition, proc, timeout=300):
    """Poll condition() every millisecond while the process runs."""
    start = time.time()
    while not condition():
        if proc.poll() is not None or time.time() - start > timeout:
            kill(proc)
            raise AssertionError(f"train.py ended ({proc.wait()}) or ran {timeout} s before the awaited moment")
        time.sleep(0.001)


def sharded_step(out_dir):
    """The step of the checkpoint that out_dir/ckpt.dcp names."""
    return read_checkpoint(os.path.join(out_dir, "ckpt.dcp"))["step"]


def assert_same_steps(got_dir, want_dir, steps, tol=1e-5):
    """The training losses (to tol) and gradient norms (to tol, relatively) of `steps`, and every
    evaluation both runs logged, equal in both runs."""
    got = {r["step"]: r for r in read_metrics(got_dir, "train")}
    want = {r["step"]: r for r in read_metrics(want_dir, "train")}
    for s in steps:
        assert abs(got[s]["loss"] - want[s]["loss"]) <= tol, (s, got[s]["loss"], want[s]["loss"])
        assert abs(got[s]["grad_norm"] - want[s]["grad_norm"]) <= tol * want[s]["grad_norm"], (s, got[s], want[s])
    got_evals, want_evals = evals(got_dir), evals(want_dir)
    assert got_evals
    for s in set(got_evals) & set(want_evals):
        assert abs(got_evals[s] - want_evals[s]) <= tol, (s, got_evals[s], want_evals[s])


@pytest.fixture(scope="module")
def one_process(shakespeare_dir, tmp_path_factory):
    """8 steps in one process, without sharding: the reference."""
    out = tmp_path_factory.mktemp("one") / "out"
    train(shakespeare_dir, out, "--max_iters=8")
    return out


@pytest.mark.slow
def test_fsdp_on_two_processes_trains_like_one_and_resumes_on_two_or_one(shakespeare_dir, one_process, tmp_path):
    # two processes shard the model; SIGKILL to every process while they write the checkpoint of step 8,
    # so the steps since the checkpoint of step 4 are lost
    out = tmp_path / "two"
    proc = launch(shakespeare_dir, out, FSDP, "--max_iters=1000")
    wait_for(lambda: os.path.exists(out / "ckpt_000008.dcp.tmp"), proc)
    kill(proc)
    assert not os.path.exists(out / "ckpt_000008.dcp")  # the kill landed in the write
    assert sharded_step(out) == 4 and last_logged_step(out) == 8  # the previous checkpoint is whole
    with open(f"{out}.log") as f:
        assert "x 2 processes (gloo)" in f.read()
    # The same per-step losses and gradient norms as one process to 1e-5: the gradients are averaged over
    # the processes, not summed (gloo's AVG, pytorch #162338), and the clipping norm is the global one.
    assert_same_steps(out, one_process, range(1, 9))
    assert len(read_metrics(out, "config")) == 1  # only rank 0 writes

    # resumed from step 4 on one process (a process group of one) with activation checkpointing, and on two
    one = tmp_path / "one"
    shutil.copytree(out, one, symlinks=True)
    train(shakespeare_dir, one, FSDP, "--activation_checkpointing=True", "--max_iters=8", "--init_from=resume")
    code, log = output(launch(shakespeare_dir, out, FSDP, "--max_iters=8", "--init_from=resume"), out)
    assert code == 0, log
    assert f"resuming from {out / 'ckpt.dcp'} at step 4" in log
    for resumed in (out, one):
        assert_same_steps(resumed, one_process, range(5, 9))
    # the half-written directory is replaced, the newest two step checkpoints kept, ckpt.dcp names the newest
    assert sorted(os.listdir(out)) == ["ckpt.dcp", "ckpt_000004.dcp", "ckpt_000008.dcp", "config.json",
                                       "metrics.jsonl"]
    assert os.readlink(out / "ckpt.dcp") == "ckpt_000008.dcp"

    # one command makes ckpt.pt of it: the one-process run's checkpoint, weights and optimizer states,
    # which sample.py and export.py read (pretrained.load_model)
    proc = run_script("-m nonlinear_queries.weights.checkpoint", f"--out_dir={out}")
    assert f"wrote {out / 'ckpt.pt'}: the checkpoint of step 8" in proc.stdout
    made, want = (torch.load(d / "ckpt.pt", weights_only=True) for d in (out, one_process))
    assert set(made) == set(want) and made["step"] == 8 and made["model_args"] == want["model_args"]
    assert list(made["model"]) == list(want["model"])
    for name, tensor in want["model"].items():
        torch.testing.assert_close(made["model"][name], tensor, rtol=0, atol=1e-5)
    (made_adamw,), (want_adamw,) = made["optimizer"], want["optimizer"]
    assert made_adamw["param_groups"] == want_adamw["param_groups"]
    for i, state in want_adamw["state"].items():
        for key, tensor in state.items():
            torch.testing.assert_close(made_adamw["state"][i][key], tensor, rtol=0, atol=1e-5)
    loaded = load_model(str(out))
    assert loaded.loaded_from.step == 8
    assert all(torch.equal(t, made["model"][name]) for name, t in loaded.state_dict().items())


def muon_steps_on_shards(rank, init_file, out):
    """Process `rank` of 2 (gloo, single-threaded): two steps of build_optimizers' Muon on the FSDP shards of a
    one-block res_gelu model, from the same random whole gradients on both processes, each step's collectives
    counted (CommDebugMode); beside them torch.optim.Muon in this process on unsharded copies of the matrices.
    Rank 0 saves to `out` the counts, the largest differences of the weights and momenta, the number of
    matrices and its param group as state_dict() gives it."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    # r = 15: W1's 15 rows are shared out unevenly, 8 and 7
    config = GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=8, vocab_size=64, query_mode="res_gelu",
                       query_rank=15)
    torch.manual_seed(0)
    model = GPT(config)
    reference = GPT(config)
    reference.load_state_dict(model.state_dict())
    parallelize(model, processes.Runtime(rank, rank, 2, "cpu", "float32", "gloo"), "fsdp")
    cfg = TrainConfig(optimizer="muon", muon_learning_rate=0.05, muon_momentum=0.9, muon_weight_decay=0.2,
                      muon_adjust_lr_fn="match_rms_adamw")
    muon = build_optimizers(model, cfg, "cpu")[1]
    muon.param_groups[0].update(lr=0.025, lr_mult=0.5)  # a key of another's (muP's) making, kept as it is
    matrices = muon_parameters(reference)
    by_one = torch.optim.Muon(matrices, lr=0.025, momentum=0.9, weight_decay=0.2, adjust_lr_fn="match_rms_adamw")
    counts = []
    for step in range(2):
        g = torch.Generator().manual_seed(step)
        for p, q in zip(muon_parameters(model), matrices):
            q.grad = torch.randn(q.shape, generator=g)
            p.grad = distribute_tensor(q.grad, p.device_mesh, p.placements, src_data_rank=None)
        with CommDebugMode() as comm:
            muon.step()
        by_one.step()
        counts.append({str(op): n for op, n in comm.get_comm_counts().items()})
    sharded = muon_parameters(model)
    assert all(muon.state[p]["momentum_buffer"].placements == p.placements for p in sharded)  # still sharded
    weights = max((p.full_tensor() - q).abs().max().item() for p, q in zip(sharded, matrices))
    momenta = max((muon.state[p]["momentum_buffer"].full_tensor() - by_one.state[q]["momentum_buffer"]).abs().max()
                  .item() for p, q in zip(sharded, matrices))
    if rank == 0:
        torch.save({"counts": counts, "weights": weights, "momenta": momenta, "matrices": len(matrices),
                    "group": {k: v for k, v in muon.state_dict()["param_groups"][0].items() if k != "params"}}, out)
    # as processes.teardown: both ranks done before either leaves (once, under load, rank 0 aborted in gloo's
    # teardown when rank 1 had left while it was still saving)
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.slow
def test_muon_on_fsdp_shards_steps_whole_matrices_as_one_process_does(tmp_path):
    torch.multiprocessing.spawn(muon_steps_on_shards, args=(str(tmp_path / "init"), str(tmp_path / "out.pt")),
                                nprocs=2)
    got = torch.load(tmp_path / "out.pt", weights_only=True)
    # one all-gather a matrix and step (its weight, gradient and momentum at once), nothing else
    assert got["matrices"] == 6
    assert got["counts"] == [{"c10d_functional.all_gather_into_tensor": 6}] * 2, got["counts"]
    # torch.optim.Muon's arithmetic on the whole matrices: the one-process weights and momenta, bit for bit
    assert got["weights"] == 0 and got["momenta"] == 0, got
    assert got["group"]["lr_mult"] == 0.5 and got["group"]["lr"] == 0.025


@pytest.fixture
def process_group_of_one():
    """This process as a process group of one (gloo), as train.py runs FSDP without torchrun."""
    runtime = setup("cpu", "float32", parallelism="fsdp")
    yield runtime
    dist.destroy_process_group()


# what save_sharded_checkpoint needs besides the model and the optimizers
META = {"model_args": {}, "step": 1, "evaluated": False, "steps_above_threshold": 0, "config": {}, "data": {},
        "wandb_id": ""}


def test_sharded_checkpoint_round_trip_and_refusals(process_group_of_one, tmp_path):
    runtime = process_group_of_one
    cfg = TrainConfig(n_layer=2, n_head=2, n_embd=32, block_size=8, vocab_size=64, device="cpu")

    def sharded():
        torch.manual_seed(0)
        model = parallelize(GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=8, vocab_size=64)), runtime,
                            "fsdp")[0]
        return model, build_optimizers(model, cfg, "cpu")

    model, optimizers = sharded()
    x = torch.randint(0, 64, (2, 8))
    model(x, x)[1].backward()
    optimizers[0].step()
    path = save_sharded_checkpoint(RunDir(str(tmp_path)), model, optimizers, META, keep_last_n=2)
    again, again_optimizers = sharded()
    load_training_state(read_checkpoint(path), path, again, again_optimizers)
    for (name, p), q in zip(model.named_parameters(), again.parameters()):
        assert torch.equal(p.full_tensor(), q.full_tensor()), name
    assert torch.equal(optimizers[0].state_dict()["state"][0]["exp_avg"].full_tensor(),
                       again_optimizers[0].state_dict()["state"][0]["exp_avg"].full_tensor())

    # the states of other optimizers, and a checkpoint file of a ddp run, are refused with what to do
    with pytest.raises(CheckpointError, match="holds the states of AdamW but this config builds AdamW, Muon; resume "
                                              "with the run's own `optimizer`"):
        muon = build_optimizers(again, replace(cfg, optimizer="muon"), "cpu")
        load_training_state(read_checkpoint(path), path, again, muon)
    with pytest.raises(CheckpointError, match="is a checkpoint file, written under parallelism=ddp: continue that run "
                                              "with --parallelism=ddp"):
        load_training_state({"model": {}, "optimizer": []}, str(tmp_path / "ckpt.pt"), again, again_optimizers)


@pytest.mark.parametrize("attn_gate", ["none", "elementwise"])
def test_fsdp_under_bf16_autocast_computes_what_ddp_computes(process_group_of_one, monkeypatch, attn_gate):
    # parallelize as it runs for a CUDA bfloat16 run, its device mesh built on the CPU; the forward pass under
    # bf16 autocast (the CPU's), as train.py runs it (runtime.autocast); with and without the output gate
    cuda_mesh = processes.init_device_mesh
    monkeypatch.setattr(processes, "init_device_mesh", lambda device_type, shape: cuda_mesh("cpu", shape))
    on_cuda = SimpleNamespace(device_type="cuda", dtype="bfloat16", world_size=1, backend="nccl", distributed=True)
    config = GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=8, vocab_size=64, pos_encoding="rope",
                       qk_norm=True, query_mode="res_gelu", bias=True, attn_gate=attn_gate)
    x, y = torch.randint(0, 64, (2, 2, 8), generator=torch.Generator().manual_seed(0))

    def step(runtime, parallelism):
        """What the blocks are given (the dtypes of the residual stream entering each block and the final norm,
        and of RoPE's cos and sin), the logits, the loss and the gradients of one forward-backward pass."""
        torch.manual_seed(0)
        model = GPT(config)
        with torch.no_grad():  # norm weights off 1, where bfloat16 would round them
            for p in model.parameters():
                p.add_(0.1 * torch.randn_like(p))
        seen = []
        for block in model.transformer.h:
            block.ln_1.register_forward_pre_hook(lambda m, args: seen.append(("block input", args[0].dtype)))
            block.attn.register_forward_pre_hook(lambda m, args: seen.append(("cos, sin", *(t.dtype for t in args[2]))))
        model.transformer.ln_f.register_forward_pre_hook(lambda m, args: seen.append(("final norm", args[0].dtype)))
        model, train_model = parallelize(model, runtime, parallelism)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits, loss = train_model(x, y)
        loss.backward()
        grads = [p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad for p in model.parameters()]
        return seen, logits, loss, grads

    (seen, logits, loss, grads), (want_seen, want_logits, want_loss, want_grads) = (
        step(on_cuda, "fsdp"), step(process_group_of_one, "ddp"))
    f32 = torch.float32
    assert want_seen == [("block input", f32), ("cos, sin", f32, f32)] * 2 + [("final norm", f32)]  # autocast's
    assert seen == want_seen
    assert logits.dtype == want_logits.dtype == torch.bfloat16  # the matmuls did run in bfloat16
    assert torch.equal(logits, want_logits) and torch.equal(loss, want_loss)
    assert all(torch.equal(g, want) for g, want in zip(grads, want_grads))


def test_muon_on_shards_steps_on_after_a_sharded_checkpoint_as_before_it(process_group_of_one, tmp_path):
    # loading a sharded checkpoint unpickles the optimizers, whose defaults then gain keys of torch's own
    # ('differentiable'): Muon's next step is still the one the saved run takes
    cfg = TrainConfig(n_layer=2, n_head=2, n_embd=32, block_size=8, vocab_size=64, device="cpu", optimizer="muon")

    def sharded():
        torch.manual_seed(0)
        model = parallelize(GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=8, vocab_size=64)),
                            process_group_of_one, "fsdp")[0]
        return model, build_optimizers(model, cfg, "cpu")

    def step(model, optimizers, seed):
        x = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(seed))
        model(x, x)[1].backward()
        for optimizer in optimizers:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    model, optimizers = sharded()
    step(model, optimizers, 0)
    path = save_sharded_checkpoint(RunDir(str(tmp_path)), model, optimizers, META, keep_last_n=2)
    again, again_optimizers = sharded()
    load_training_state(read_checkpoint(path), path, again, again_optimizers)
    for run in ((model, optimizers), (again, again_optimizers)):
        step(*run, 1)
    for (name, p), q in zip(model.named_parameters(), again.parameters()):
        assert torch.equal(p.full_tensor(), q.full_tensor()), name


@pytest.mark.parametrize("settings, message", [
    ({"parallelism": "zero3"}, "parallelism must be 'ddp' or 'fsdp', got 'zero3'"),
    ({"parallelism": "fsdp", "dtype": "float16"},
     "parallelism='fsdp' with dtype='float16' cannot work here: float16 needs loss scaling"),
    ({"parallelism": "fsdp", "eval_tasks": "hellaswag"},
     "eval_tasks with parallelism='fsdp' cannot work here: the tasks run on rank 0 alone"),
])
def test_impossible_combinations_are_config_errors(settings, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(**settings)


def test_fsdp_on_cuda_over_gloo_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(SetupError, match="parallelism=fsdp on CUDA needs backend=nccl"):
        setup("cuda", backend="gloo", parallelism="fsdp")


@pytest.mark.parametrize("device, env, index", [
    ("cuda", {}, 0),  # `python train.py --parallelism=fsdp` on a GPU machine: a process group of one
    ("cuda:1", {}, 1),
    ("cuda", {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4"}, 1),  # torchrun's process 3, on the GPU cuda:1
], ids=["one-gpu", "one-gpu-cuda:1", "torchrun"])
def test_fsdp_on_cuda_joins_its_process_group_with_the_gpu_index(monkeypatch, device, env, index):
    # CUDA imitated on the CPU: the current device follows set_device as in torch.cuda, and init_process_group
    # is recorded instead of run (it refuses a device_id without an index: "Please use a device_id with index")
    current = [0]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: current.__setitem__(
        0, current[0] if torch.device(d).index is None else torch.device(d).index))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current[0])
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)  # asked by torch.autocast("cuda")
    tf32 = SimpleNamespace(allow_tf32=False)  # what setup switches on, kept off this process's real settings
    monkeypatch.setattr(torch.backends.cuda, "matmul", tf32)
    monkeypatch.setattr(torch.backends, "cudnn", tf32)
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    calls = []
    monkeypatch.setattr(dist, "init_process_group", lambda **kwargs: calls.append(kwargs))
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)

    runtime = setup(device, "bfloat16", parallelism="fsdp")
    (call,) = calls
    assert call["device_id"] == torch.device("cuda", index) and call["backend"] == "nccl"
    # the GPU the process computes on is the one its process group is bound to
    assert current[0] == index and tf32.allow_tf32
    assert (runtime.device, runtime.world_size, runtime.backend) == (device if not env else f"cuda:{index}",
                                                      int(env.get("WORLD_SIZE", 1)), "nccl")
    if not env:  # without torchrun: a group of one whose store lives in this process
        assert (call["rank"], call["world_size"], type(call["store"])) == (0, 1, dist.HashStore)


@pytest.mark.parametrize("attn_gate", ["none", "headwise"])
def test_activation_checkpointing_gives_the_same_gradients_from_less_memory(attn_gate):
    config = GPTConfig(n_layer=3, n_head=2, n_embd=32, block_size=16, vocab_size=64, dropout=0.1,
                       query_mode="res_gelu", attn_gate=attn_gate)
    x, y = torch.randint(0, 64, (2, 2, 16))
    runtime = setup("cpu", "float32")

    def gradients(checkpointing):
        """Gradients of one forward-backward (dropout on) and the bytes saved for the backward pass."""
        torch.manual_seed(0)
        model = parallelize(GPT(config), runtime, activation_checkpointing=checkpointing)[1]
        saved = {}

        def pack(t):
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        torch.manual_seed(1)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = model(x, y)[1]
        loss.backward()
        return [p.grad for p in model.parameters()], sum(saved.values())

    (plain, plain_bytes), (checkpointed, checkpointed_bytes) = gradients(False), gradients(True)
    assert all(torch.equal(a, b) for a, b in zip(plain, checkpointed))
    assert checkpointed_bytes < plain_bytes / 2, (checkpointed_bytes, plain_bytes)


@pytest.mark.slow
def test_mup_on_two_fsdp_processes_trains_like_one(shakespeare_dir, tmp_path):
    # μP at m = 32 / 16 = 2: its hidden group's 1/m rate and m weight decay are plain floats on the param groups,
    # which FSDP's DTensors leave alone (the `mup` package's attributes on the tensors would be lost)
    mup = ["--parametrization=mup", "--mup_base_width=16", "--max_iters=4"]
    train(shakespeare_dir, tmp_path / "one", *mup)
    code, log = output(launch(shakespeare_dir, tmp_path / "two", FSDP, *mup), tmp_path / "two")
    assert code == 0, log
    assert_same_steps(tmp_path / "two", tmp_path / "one", range(1, 5))
    assert read_metrics(tmp_path / "two", "config")[0]["config"]["parametrization"] == "mup"
