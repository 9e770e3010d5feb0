"""
The optimizers of train.py, chosen by `optimizer`, as a list the loop treats uniformly.

- 'adamw' (the paper's Table 1 recipe): one AdamW over every parameter, weight decay on those of
  dim >= 2 (`configure_optimizers`).
- 'muon' (Jordan et al. 2024, "Muon: An optimizer for hidden layers in neural networks";
  PyTorch's torch.optim.Muon): Muon for the 2-D weight matrices inside the transformer
  blocks, the query modules' included, whose updates it orthogonalizes by Newton-Schulz
  iterations; AdamW, as above, for everything else: the embeddings, the LM head and every
  1-D parameter (norm weights, biases), which Muon is not meant for.

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

import torch


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


def build_optimizers(model, cfg, device_type):
    """[AdamW] or, with cfg.optimizer='muon', [AdamW, Muon] for `model` (a GPT) from the training
    config cfg (learning_rate, weight_decay, beta1, beta2; muon_learning_rate, muon_momentum,
    muon_weight_decay, muon_adjust_lr_fn). Every trainable parameter is in exactly one of them."""
    if cfg.optimizer == "adamw":
        return [configure_optimizers(model, cfg.weight_decay, cfg.learning_rate, (cfg.beta1, cfg.beta2), device_type)]
    matrices = muon_parameters(model)
    adamw_rest = configure_optimizers(model, cfg.weight_decay, cfg.learning_rate, (cfg.beta1, cfg.beta2), device_type,
                       exclude=matrices)
    muon = torch.optim.Muon([{"params": matrices, "lr_mult": 1.0}], lr=cfg.muon_learning_rate,
                            momentum=cfg.muon_momentum, weight_decay=cfg.muon_weight_decay,
                            adjust_lr_fn=cfg.muon_adjust_lr_fn)
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
