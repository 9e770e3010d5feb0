"""
The optimizers of train.py, chosen by `optimizer`, as a list the loop treats uniformly.

- 'adamw' (the paper's Table 1 recipe): one AdamW over every parameter, weight decay on those of
  dim >= 2 (`configure_optimizers`).
- 'muon' (Jordan et al. 2024, "Muon: An optimizer for hidden layers in neural networks";
  PyTorch's torch.optim.Muon): Muon for the 2-D weight matrices inside the transformer
  blocks, the query modules' included, whose updates it orthogonalizes by Newton-Schulz
  iterations; AdamW, as above, for everything else: the embeddings, the LM head and every
  1-D parameter (norm weights, biases), which Muon is not meant for. Under FSDP each matrix
  is orthogonalized whole, gathered once a step (`Muon`).

The learning-rate schedule (training.get_lr) drives both: each optimizer's rate is its
base rate (learning_rate for AdamW, muon_learning_rate for Muon) times get_lr(step) /
learning_rate, times its parameter group's `lr_mult`. A checkpoint holds one state dict per
optimizer, in this list's order.

Under μP (parametrization='mup', model.GPT._mup_roles) AdamW's hidden matrices form their own
group with lr_mult = 1/m and weight decay wd * m, so their rate is eta/m while lr * wd, the
decoupled decay per step, stays as at the base width (the `mup` package's MuAdamW does the same);
the embeddings, an untied LM head and the vectors keep eta. The multipliers are plain floats on
the param groups, never attributes of the tensors, which FakeTensor (torch.compile) and FSDP's
DTensors would lose (the `mup` package's issues #60 and #72); the schedule scales every group
relatively, so warmup and decay never overwrite them. Muon's matrices keep lr_mult = 1: its
orthogonalized update has a spectral norm set by the rate and the shape alone, already
independent of width (Jordan et al. 2024; Bernstein & Newhouse 2024), so dividing it by m again
would undertrain the wide model.
"""

import inspect

import torch
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor


def configure_optimizers(model, weight_decay, learning_rate, betas, device_type, exclude=()):
    """AdamW over `model`'s trainable parameters with weight decay on those of dim >= 2 (matmul
    weights, embeddings) and none on norm weights and biases (the paper's recipe, after GPT-2's
    and nanoGPT's). Fused kernel on CUDA. `exclude`: parameters another optimizer updates
    (Muon's matrices). Returns a torch.optim.AdamW whose groups carry `lr_mult`: two groups under
    SP (both 1.0); under μP the hidden matrices' first (lr_mult 1/m, weight decay wd * m; see the
    module docstring, and none where Muon takes them), then the other matrices and the vectors."""
    excluded = {id(p) for p in exclude}
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad and id(p) not in excluded]
    matrices = [p for _, p in named if p.dim() >= 2]
    groups = [{"params": [p for _, p in named if p.dim() < 2], "weight_decay": 0.0, "lr_mult": 1.0}]
    m = model.config.width_mult
    if model.config.parametrization == "mup":
        hidden = [p for n, p in named if model.mup_roles[n] == "hidden"]
        matrices = [p for n, p in named if p.dim() >= 2 and model.mup_roles[n] != "hidden"]
        if hidden:  # none under Muon, which takes the hidden matrices
            groups.insert(0, {"params": hidden, "weight_decay": weight_decay * m, "lr_mult": 1.0 / m})
    groups.insert(-1, {"params": matrices, "weight_decay": weight_decay, "lr_mult": 1.0})
    return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, fused=device_type == "cuda")


def muon_parameters(model):
    """The parameters Muon updates: the 2-D weight matrices inside model.transformer.h, in model order."""
    return [p for p in model.transformer.h.parameters() if p.requires_grad and p.dim() == 2]


# torch.optim.Muon's settings, as its constructor names them (a group also holds others' keys, and an optimizer's
# defaults gain 'differentiable' when it is unpickled, as a sharded checkpoint's loading does)
MUON_SETTINGS = [name for name in inspect.signature(torch.optim.Muon).parameters if name != "params"]


class Muon(torch.optim.Muon):
    """torch.optim.Muon, whose step also runs on the whole matrix when FSDP2 shards it.

    On plain tensors (one process, DDP) the step is torch.optim.Muon's own. On DTensor shards
    (processes.parallelize's FSDP: each process holds some rows of every matrix, its gradient and
    its momentum), torch's step would run Newton-Schulz on the shards, where DTensor turns
    its norm and matmuls into blocking collectives (on 2 processes: 6 all-reduces and 7 or 8
    all-gathers a matrix and step, and rounding that differs from one process's).
    Here each matrix's parameter, gradient and momentum, stacked (3, rows, cols), are all-gathered
    in one collective, a torch.optim.Muon with the group's settings takes its step on those whole
    tensors (the same arithmetic as in one process), and each process keeps its own rows of the
    new parameter and momentum. Per matrix and step: one all-gather of 3 x its size, and every
    process orthogonalizes every matrix; the momentum stays sharded (a DTensor like its
    parameter), so state_dict and the sharded checkpoints (DCP) see what they see under
    torch.optim.Muon.

    The step also takes GradScaler's `found_inf`, as fused AdamW does (an attribute set before
    step(); training.apply_updates sets it to skip a diverged step): a 0-dim float tensor on the
    device, and where it is 1.0 every parameter and momentum is put back as it was, on the device,
    without a host read. That keeps a copy of each matrix and its momentum for the step's length
    (only when found_inf is set); where it is 0.0 the step is torch's, bit for bit.

    Named Muon, as torch's: checkpoints record their optimizers by class name (checkpoint.py),
    and a sharded checkpoint's optimizers are rebuilt without FSDP when it is converted to one
    file. Param groups keep any extra keys; the step reads only Muon's own settings from them.
    Raises ValueError for a DTensor placed otherwise than sharded (Shard) or replicated, and for
    gradients still scaled (a grad_scale set: unscale them first, GradScaler.unscale_).
    """

    _step_supports_amp_scaling = True  # GradScaler's mark of an optimizer that takes found_inf

    @torch.no_grad()
    def step(self, closure=None):
        if getattr(self, "grad_scale", None) is not None:
            raise ValueError("Muon takes unscaled gradients: call GradScaler.unscale_ before its step")
        found_inf = getattr(self, "found_inf", None)
        if found_inf is None:
            return self._step(closure)
        # this process's tensors (a DTensor's local shard), as they were, to put back where found_inf is 1.0
        kept = []
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    buffer = self.state[p].get("momentum_buffer")
                    kept.append((p, local(p).clone(), None if buffer is None else local(buffer).clone()))
        loss = self._step(closure)
        skip = found_inf.to(torch.bool)
        for p, param, buffer in kept:
            local(p).copy_(torch.where(skip, param, local(p)))
            momentum = local(self.state[p]["momentum_buffer"])
            if buffer is None:  # started by this step: back to the zeros torch starts it from
                momentum.masked_fill_(skip, 0.0)
            else:
                momentum.copy_(torch.where(skip, buffer, momentum))
        return loss

    def _step(self, closure):
        if not any(isinstance(p, DTensor) for group in self.param_groups for p in group["params"]):
            return super().step(closure)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            settings = {key: group[key] for key in MUON_SETTINGS}
            for p in group["params"]:
                if p.grad is not None:
                    self._step_whole(p, settings)
        return loss

    def _step_whole(self, p, settings):
        """torch.optim.Muon's step with `settings` on the whole of the sharded matrix p (a DTensor with
        a gradient); p and its momentum keep this process's rows of the result."""
        state = self.state[p]
        if "momentum_buffer" not in state:  # as torch.optim.Muon starts it: zeros like the gradient (sharded)
            state["momentum_buffer"] = torch.zeros_like(p.grad)
        param, grad, momentum = gather_whole([p, p.grad, state["momentum_buffer"]])
        param.grad = grad
        whole = torch.optim.Muon([param], **settings)
        whole.state[param]["momentum_buffer"] = momentum
        whole.step()
        p.copy_(own_part(param, p))
        state["momentum_buffer"].copy_(own_part(whole.state[param]["momentum_buffer"], p))


def local(tensor):
    """A DTensor's local shard (the tensor itself, sharing its storage), or a plain tensor."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def gather_whole(shards):
    """The whole tensors of DTensors `shards` (of one shape, placed alike, on one device mesh) by one
    collective: a list of plain tensors of that shape, views of one gathered stack. Raises ValueError for a
    placement other than Shard or Replicate."""
    like = shards[0]
    if any(type(placement) not in (Shard, Replicate) for placement in like.placements):
        raise ValueError(f"Muon gathers matrices sharded by rows or columns (Shard) or replicated; got the "
                         f"placements {like.placements}")
    # stacked on a new leading dimension, so each Shard(d) becomes Shard(d + 1)
    placements = [Shard(pl.dim + 1) if isinstance(pl, Shard) else pl for pl in like.placements]
    shape = (len(shards), *like.shape)
    stack = DTensor.from_local(torch.stack([s.to_local() for s in shards]), like.device_mesh, placements,
                               run_check=False, shape=shape, stride=torch.empty(shape, device="meta").stride())
    return list(stack.full_tensor().unbind())


def own_part(whole, like):
    """This process's part of the plain tensor `whole`, as a DTensor placed as `like`: a slice, no collective."""
    return distribute_tensor(whole, like.device_mesh, like.placements, src_data_rank=None)


def build_optimizers(model, cfg, device_type):
    """[AdamW] or, with cfg.optimizer='muon', [AdamW, Muon] for `model` (a GPT) from the training
    config cfg (learning_rate, weight_decay, beta1, beta2; muon_learning_rate, muon_momentum,
    muon_weight_decay, muon_adjust_lr_fn). Every trainable parameter is in exactly one of them."""
    if cfg.optimizer == "adamw":
        return [configure_optimizers(model, cfg.weight_decay, cfg.learning_rate, (cfg.beta1, cfg.beta2), device_type)]
    matrices = muon_parameters(model)
    adamw_rest = configure_optimizers(model, cfg.weight_decay, cfg.learning_rate, (cfg.beta1, cfg.beta2), device_type,
                       exclude=matrices)
    muon = Muon([{"params": matrices, "lr_mult": 1.0}], lr=cfg.muon_learning_rate, momentum=cfg.muon_momentum,
                weight_decay=cfg.muon_weight_decay, adjust_lr_fn=cfg.muon_adjust_lr_fn)
    return [adamw_rest, muon]


def set_learning_rates(optimizers, lr, cfg):
    """Set every group's rate for an update at schedule rate `lr` (training.get_lr): the optimizer's
    base rate scaled by lr / cfg.learning_rate, so Muon follows AdamW's warmup and decay, times the
    group's own `lr_mult` (μP's 1/m; 1.0 elsewhere, and for a checkpoint's groups saved before it)."""
    scale = lr / cfg.learning_rate if cfg.learning_rate else 0.0  # learning_rate 0 schedules 0 throughout
    for opt in optimizers:
        # AdamW's rate is `lr` itself, not learning_rate * scale, which may differ in the last bit
        rate = cfg.muon_learning_rate * scale if isinstance(opt, torch.optim.Muon) else lr
        for group in opt.param_groups:
            group["lr"] = rate * group.get("lr_mult", 1.0)


def load_optimizer_states(optimizers, states):
    """Load a checkpoint's optimizer states: a list of state dicts, one per optimizer, or one
    state dict (an AdamW run's checkpoint before Muon was added). Raises ValueError when their
    number differs from the optimizers', i.e. the run was trained with another `optimizer`."""
    states = [states] if isinstance(states, dict) else states
    if len(states) != len(optimizers):
        raise ValueError(f"the checkpoint holds {len(states)} optimizer states but this config builds "
                         f"{len(optimizers)} ({', '.join(type(o).__name__ for o in optimizers)}); resume with "
                         f"the run's own `optimizer`")
    for opt, state in zip(optimizers, states):
        opt.load_state_dict(state)
