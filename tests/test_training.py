"""The pieces of train.py's loop (training.py) held to hand computations, without a training run:
the schedules, the dropout seeds, the divergence rule, the loop's decisions, one step, evaluation."""

import math

import numpy as np
import pytest
import torch

from model import GPT, GPTConfig
from nonlinear_queries.config.train_config import TrainConfig
from nonlinear_queries.data.batches import get_batch
from nonlinear_queries.runtime.processes import Runtime
from nonlinear_queries.trainer.optimizers import Muon, configure_optimizers
from nonlinear_queries.trainer.training import (
    DivergenceGuard,
    apply_updates,
    divergence_reason,
    dropout_seed,
    evaluate,
    get_lr,
    should_eval,
    should_read_back,
    train_step,
)
from nonlinear_queries.weights.checkpoint import should_save

LR, MIN_LR = 1e-3, 1e-4


def schedule(name, **overrides):
    return TrainConfig(learning_rate=LR, min_lr=MIN_LR, warmup_iters=2, lr_decay_iters=6, lr_schedule=name,
                       **overrides)


def test_cosine_schedule_warms_up_decays_to_min_lr_and_stays():
    cfg = schedule("cosine")
    expected = [LR / 3, 2 * LR / 3] + [MIN_LR + 0.5 * (1 + math.cos(math.pi * i / 4)) * (LR - MIN_LR)
                                       for i in range(4)] + [MIN_LR, MIN_LR]
    assert [get_lr(s, cfg) for s in range(8)] == pytest.approx(expected, rel=1e-12, abs=1e-15)
    assert get_lr(2, cfg) == LR  # the peak, right after warmup


def test_linear_to_zero_ignores_min_lr_and_constant_without_decay():
    cfg = schedule("linear_to_zero")
    assert [get_lr(s, cfg) for s in range(8)] == pytest.approx(
        [LR / 3, 2 * LR / 3, LR, 0.75 * LR, 0.5 * LR, 0.25 * LR, 0.0, 0.0], rel=1e-12, abs=1e-15)
    assert {get_lr(s, schedule("cosine", decay_lr=False)) for s in (0, 3, 100)} == {LR}


def test_dropout_seed_depends_on_seed_step_and_micro_batch_only():
    seeds = {dropout_seed(seed, step, micro) for seed in (1, 2) for step in (0, 1, 2) for micro in (0, 1, 2, 3)}
    assert len(seeds) == 24 and all(0 <= s < 2**64 for s in seeds)
    assert dropout_seed(1337, 5, 3) == dropout_seed(1337, 5, 3)
    assert dropout_seed(1337, 5, 3) == int(np.random.SeedSequence([1337, 5, 3]).generate_state(1, np.uint64)[0])


def test_divergence_rule():
    assert divergence_reason(float("nan"), 1.0, 0, 12.0, 100) == ("the loss is nan", 0)
    assert divergence_reason(3.0, float("inf"), 0, 12.0, 100) == ("the gradient norm is inf", 0)
    assert divergence_reason(3.0, float("inf"), 0, 12.0, 100, check_grad_norm=False) == (None, 0)
    # patience 3: the third step in a row above the threshold stops the run; a step below resets the streak
    streak, reasons = 0, []
    for loss in (13.0, 13.0, 11.0, 13.0, 13.0, 13.0):
        reason, streak = divergence_reason(loss, 1.0, streak, 12.0, 3)
        reasons.append(reason)
    assert reasons[:5] == [None] * 5 and streak == 3
    assert reasons[5] == "the loss has been above divergence_threshold=12.0 for 3 steps (now 13.0000)"
    assert divergence_reason(1e6, 1.0, 50, 0.0, 3) == (None, 0)  # threshold 0: only non-finite values count


@pytest.mark.parametrize("threshold, patience, check_grad_norm", [(12.0, 3, True), (12.0, 1, False), (0.0, 3, True)])
def test_the_guard_on_the_device_follows_the_rule_on_the_host(threshold, patience, check_grad_norm):
    # steps of (loss, gradient norm): the guard's first diverged step, reason and streak are the host rule's, and
    # it skips that step's update and every later one
    steps = [(13.0, 1.0), (11.0, 1.0), (13.0, 1.0), (12.5, float("inf")), (13.0, 1.0), (float("nan"), 2.0),
             (3.0, 1.0), (13.0, float("nan"))]
    guard = DivergenceGuard(1, threshold, patience, check_grad_norm, "cpu")
    streak, first, skips = 1, None, []
    for step, (loss, norm) in enumerate(steps, start=1):
        skips.append(guard.check(step, torch.tensor(loss, dtype=torch.float64), torch.tensor(norm)).item())
        reason, streak = divergence_reason(loss, norm, streak, threshold, patience, check_grad_norm)
        if reason and not first:
            first = (reason, step, loss, norm)
    diverged, _ = guard.outcome(guard.values().tolist())
    assert diverged[0] == first[0] and diverged[1:] == pytest.approx(first[1:], nan_ok=True)
    assert skips == [0.0] * (first[1] - 1) + [1.0] * (len(steps) - first[1] + 1)
    clean = DivergenceGuard(2, 12.0, 5, True, "cpu")
    for loss in (13.0, 12.5):
        clean.check(1, torch.tensor(loss, dtype=torch.float64), torch.tensor(1.0))
    assert clean.outcome(clean.values().tolist()) == (None, 4)  # the streak a checkpoint keeps


def optimizers_and_grads(muon_matrix):
    """A fused AdamW (as train.py builds it on CUDA) and a Muon, with gradients, after one step each."""
    torch.manual_seed(0)
    vector, matrix = torch.nn.Parameter(torch.randn(5)), torch.nn.Parameter(torch.randn(4, 6))
    adamw = torch.optim.AdamW([vector], lr=0.1, weight_decay=0.1, fused=True)
    muon = Muon([matrix], lr=0.1, weight_decay=0.1)
    for p in (vector, matrix):
        p.grad = torch.randn_like(p)
    if muon_matrix == "stepped":
        adamw.step()
        muon.step()
    return [adamw, muon], [vector, matrix]


def snapshot(optimizers, params):
    return [p.detach().clone() for p in params] + [t.clone() for o in optimizers for s in o.state.values()
                                                   for t in s.values()]


@pytest.mark.parametrize("history", ["fresh", "stepped"])
def test_a_skipped_update_leaves_the_optimizers_as_they_were_on_the_device(history):
    # fused AdamW and Muon take the skip as GradScaler's found_inf: skipped, nothing changes (Muon's first step
    # leaves its momentum at the zeros it starts from); not skipped, the step is the optimizer's own, bit for bit
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    optimizers, params = optimizers_and_grads(history)
    before = snapshot(optimizers, params)
    for p in params:
        p.grad = torch.full_like(p, float("nan"))
    apply_updates(optimizers, scaler, torch.ones(()))
    after = snapshot(optimizers, params)
    assert all(p.grad is None for p in params)
    assert len(after) >= len(before) and all(torch.equal(a, b) for a, b in zip(before, after))
    assert all(torch.equal(t, torch.zeros_like(t)) for t in after[len(before):])  # a momentum started as zeros
    optimizers, params = optimizers_and_grads(history)
    twins, twin_params = optimizers_and_grads(history)
    apply_updates(optimizers, scaler, torch.zeros(()))
    torch.optim.Muon.step(twins[1])  # torch's own step, without the found_inf path
    twins[0].step()
    assert all(torch.equal(a, b) for a, b in zip(snapshot(optimizers, params), snapshot(twins, twin_params)))


def test_when_to_read_the_device_back():
    cfg = TrainConfig(log_interval=4, eval_interval=6, max_iters=14, save_checkpoint_steps=(9,))
    assert [s for s in range(1, 15) if should_read_back(s, cfg, 0, False)] == [4, 6, 8, 9, 12, 14]
    assert should_read_back(5, cfg, 0, False, tasks_due=True)  # lm-eval's tasks at step 5


def test_when_to_evaluate_and_checkpoint():
    cfg = TrainConfig(eval_interval=4, max_iters=10, save_checkpoint_steps=(7,))
    assert [s for s in range(11) if should_eval(s, cfg, 0, False, False)] == [0, 4, 8, 10]
    assert not should_eval(4, cfg, 4, True, False)  # resumed from a checkpoint written after step 4's eval
    assert should_eval(4, cfg, 4, False, False)  # resumed from one written before it
    assert not should_eval(8, cfg, 0, False, True)  # a signal: stop fast, no evaluation
    assert [s for s in range(11) if should_save(s, cfg, 0, should_eval(s, cfg, 0, False, False), False)] == [4, 7, 8,
                                                                                                           10]
    assert should_save(5, cfg, 0, False, True) and not should_save(4, cfg, 4, True, True)  # never the start step
    eval_only = TrainConfig(eval_only=True)
    assert should_eval(3, eval_only, 3, True, False) and not should_save(3, eval_only, 0, True, False)


@pytest.fixture
def tiny():
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=64, dropout=0.1))
    tokens = np.random.default_rng(0).integers(0, 64, 500).astype(np.uint16)
    return model, tokens


def test_train_step_equals_the_hand_written_step(tiny):
    model, tokens = tiny
    offsets = [[3, 50, 100], [200, 300, 410]]  # two micro-batches of 3 sequences
    batches = [get_batch(tokens, np.array(o), 8, "cpu") for o in offsets]
    seeds = [11, 12]
    z, clip = 0.5, 0.1
    state = {k: v.clone() for k, v in model.state_dict().items()}
    optimizer = configure_optimizers(model, 0.1, 1e-3, (0.9, 0.95), "cpu")
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    params = list(model.parameters())
    loss_sum, norm = train_step(model, params, [optimizer], scaler, lambda k: batches[k], 2, torch.autocast("cpu",
                                enabled=False), seeds, z_loss=z, grad_clip=clip)
    got = [p.grad.clone() for p in params]

    model.load_state_dict(state)
    model.zero_grad()
    losses = []
    for (x, y), seed in zip(batches, seeds):
        torch.manual_seed(seed)  # the same dropout masks
        logits, loss = model(x, y)
        losses.append(loss.item())
        ((loss + z * torch.logsumexp(logits, dim=-1).pow(2).mean()) / 2).backward()
    want_norm = torch.sqrt(sum(p.grad.pow(2).sum() for p in params))
    assert loss_sum.item() == pytest.approx(sum(losses), rel=1e-6)  # the cross-entropy alone
    assert norm.item() == pytest.approx(want_norm.item(), rel=1e-5) and norm.item() > clip
    for g, p in zip(got, params):  # clipped to norm `clip`
        torch.testing.assert_close(g, p.grad * clip / want_norm, rtol=1e-4, atol=1e-8)


def test_evaluate_is_the_mean_loss_over_the_fixed_rows(tiny):
    model, tokens = tiny
    index = np.array([[0, 10], [20, 30], [40, 50]])
    runtime = Runtime(0, 0, 1, "cpu", "float32", None)
    model.train()
    out = evaluate(model, {"val": (tokens, index)}, 8, "cpu", runtime.autocast, runtime)
    assert model.training  # back in training mode
    model.eval()
    with torch.no_grad():
        want = np.mean([model(*get_batch(tokens, row, 8, "cpu"))[1].item() for row in index])
    assert out == {"val": pytest.approx(want, rel=1e-6)}
    # process 1 of 2 evaluates rows 1, 3, ...; the all-reduce (absent here) adds process 0's share
    half = evaluate(model, {"val": (tokens, index)}, 8, "cpu", runtime.autocast,
                    Runtime(1, 1, 2, "cpu", "float32", None))
    model.eval()
    with torch.no_grad():
        assert half["val"] == pytest.approx(model(*get_batch(tokens, index[1], 8, "cpu"))[1].item() / 3, rel=1e-6)
