"""
Process setup and teardown for every entry point (train.py, sample.py, bench/): which
process this is, the device, the dtype and its autocast context, the process group, how
the model is spread over the processes (DDP or FSDP2, with activation checkpointing), and
the device's peak FLOP/s for MFU. One pair of functions, as nanochat's compute_init /
compute_cleanup:

    runtime = setup(device="auto", dtype="auto")   # under torchrun also joins the process group
    with runtime.autocast:
        logits, loss = model(x, y)
    teardown(runtime)

Under torchrun (RANK, LOCAL_RANK and WORLD_SIZE in the environment) process r of W uses
cuda:LOCAL_RANK on a GPU machine and joins a process group (NCCL on CUDA, gloo on the
CPU); `python script.py` is process 0 of 1 and joins none, unless it shards with FSDP,
which then runs as a process group of one.
"""

import functools
import os
import platform
import re
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel
from torch.utils.checkpoint import checkpoint

from nonlinear_queries.errors import SetupError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class Runtime:
    """Where and how this process computes.

    rank, local_rank, world_size: the torchrun process layout (0, 0, 1 without torchrun).
    device: 'cpu', 'cuda', 'cuda:1', ...; device_type: 'cpu' or 'cuda'.
    dtype: the autocast dtype's name; float32 means no autocast.
    backend: the process group's backend ('nccl' or 'gloo'), None without one (a single
    process that does not shard).
    """

    rank: int
    local_rank: int
    world_size: int
    device: str
    dtype: str
    backend: str | None
    autocast: object = field(init=False, repr=False)

    def __post_init__(self):
        # one context object, entered anew for every forward pass
        self.autocast = (nullcontext() if self.dtype == "float32"
                         else torch.autocast(device_type=self.device_type, dtype=DTYPES[self.dtype]))

    @property
    def device_type(self):
        return "cuda" if self.device.startswith("cuda") else "cpu"

    @property
    def distributed(self):
        """Whether this process is in a process group: started by torchrun, or sharding with FSDP."""
        return self.backend is not None

    @property
    def master(self):
        """Rank 0: the process that writes files and prints."""
        return self.rank == 0

    def barrier(self):
        """Wait until every process of the group gets here (torch.distributed.barrier); returns at once
        without one."""
        if self.distributed:
            dist.barrier()


def setup(device="auto", dtype="auto", backend="auto", join_process_group=True, parallelism="ddp"):
    """Resolve the device and dtype, and under torchrun join the process group.

    device: 'auto' (cuda if available, else cpu), 'cpu', 'cuda', 'cuda:1', ...; under
    torchrun a CUDA device becomes cuda:LOCAL_RANK. dtype: 'auto' (bfloat16 on CUDA,
    float32 on the CPU), 'float32', 'bfloat16', 'float16' (CUDA only). backend: 'auto'
    (nccl on CUDA, gloo on the CPU), 'nccl', 'gloo'. join_process_group=False resolves
    everything but leaves the group to the caller (tests, tools that never communicate).
    parallelism='fsdp' without torchrun joins a process group of one process (FSDP shards
    over a process group, and its checkpoints are the same on any number of processes).
    Enables TF32 matmuls on CUDA. Returns a Runtime. Raises SetupError for a CUDA device
    without CUDA, float16 on the CPU, NCCL without CUDA, or FSDP on CUDA over gloo.
    """
    launched = "RANK" in os.environ
    grouped = launched or parallelism == "fsdp"
    rank, local_rank, world_size = ((int(os.environ[k]) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"))
                                    if launched else (0, 0, 1))
    device = device if device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    device_type = "cuda" if device.startswith("cuda") else "cpu"
    if device_type == "cuda" and not torch.cuda.is_available():
        raise SetupError(f"device={device} but torch.cuda.is_available() is False; use --device=cpu")
    if launched and device_type == "cuda":
        device = f"cuda:{local_rank}"
    dtype = dtype if dtype != "auto" else ("bfloat16" if device_type == "cuda" else "float32")
    if dtype not in DTYPES:
        raise SetupError(f"dtype must be auto, {', '.join(DTYPES)}; got {dtype!r}")
    if device_type == "cpu" and dtype == "float16":
        raise SetupError("dtype=float16 is for CUDA; use --dtype=float32 or bfloat16 on the CPU")
    if grouped:
        backend = backend if backend != "auto" else ("nccl" if device_type == "cuda" else "gloo")
        if backend == "nccl" and device_type != "cuda":
            raise SetupError("backend=nccl needs CUDA devices; use --backend=gloo on the CPU")
        if backend == "gloo" and device_type == "cuda" and parallelism == "fsdp":
            raise SetupError("parallelism=fsdp on CUDA needs backend=nccl: gloo has no reduce-scatter of CUDA "
                             "tensors, which FSDP runs for every gradient")
    else:
        backend = None
    if device_type == "cuda":
        if ":" in device:  # plain 'cuda' is the current device; set_device refuses it (torch 2.11, seen on an H100)
            torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    if grouped and join_process_group and not dist.is_initialized():
        # init_process_group wants a device with an index: plain 'cuda' (one GPU, no torchrun) is the current one
        device_id = torch.device("cuda", torch.cuda.current_device()) if device_type == "cuda" else None
        if launched:
            dist.init_process_group(backend=backend, device_id=device_id)
        else:  # FSDP in one process: a group of one, whose store lives in this process
            dist.init_process_group(backend=backend, device_id=device_id, store=dist.HashStore(), rank=0,
                                    world_size=1)
    return Runtime(rank, local_rank, world_size, device, dtype, backend)


def teardown(runtime, clean=True):
    """Leave the process group, if any. clean=True waits for every rank first (a normal
    end); clean=False leaves at once (an error: the other ranks may never get there)."""
    if dist.is_initialized():
        if clean:
            dist.barrier()
        dist.destroy_process_group()


def checkpointed(forward):
    """`forward` (a Block's bound forward) under torch.utils.checkpoint (non-reentrant, Chen et al.
    2016): the backward pass recomputes the block's activations from its input instead of keeping
    them. A plain function, not a functools.partial of checkpoint: dynamo traces a call to
    checkpoint inside a compiled function into its activation-checkpoint operator, and the
    compiled block then holds the recomputation, whereas a Module.compile()d block whose forward
    is a partial of checkpoint compiles nothing (checkpoint itself is never traced)."""

    @functools.wraps(forward)
    def forward_checkpointed(*args, **kwargs):
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    return forward_checkpointed


def compile_kwargs(mode="default", backend="inductor", pointwise_cat=True, options=None):
    """torch.compile's keyword arguments for `mode` (TrainConfig's compile_mode) and `pointwise_cat`
    (TrainConfig's compile_pointwise_cat): {'mode': mode}, or with pointwise_cat=False under inductor,
    {'options': the mode's inductor options (torch._inductor.list_mode_options) with cat lowered as
    copies}, since torch.compile takes a mode or options, not both. `options`, {name: value} of
    torch._inductor.config (TrainConfig's compile_options, bench/train_speed.py --inductor), join the mode's last.

    Why the option: inductor lowers a cat of computed tensors to one kernel that loads every input
    under a mask, so each input's math runs over every element of the output. In res_gelu's fused
    backward (the gradient of the [K | V | W1] output is a cat) that put GELU's backward over all
    2.5 C columns instead of its r: 0.56 ms per call against 0.21 ms for linear's cat of about as
    many bytes (H200, bench/RESULTS.md). Lowered as copies, res_gelu's step saved only 3.5 ms of
    998 there (and linear's took 0.4 % longer), so TrainConfig keeps inductor's default. max_pointwise_cat_inputs=0
    (and max_complex_pointwise_cat_inputs=0 where the release has it) makes each input write its own
    slice of the output instead (inductor's ConcatKernel), which is exact: the numbers do not change.
    Raises nothing: a backend other than inductor gets {'mode': mode} (as before) either way."""
    if (pointwise_cat and not options) or backend != "inductor":
        return {"mode": mode}
    from torch._inductor import config as inductor_config
    from torch._inductor import list_mode_options

    cat = {} if pointwise_cat else {key: 0 for key in ("max_pointwise_cat_inputs", "max_complex_pointwise_cat_inputs")
                                    if hasattr(inductor_config, key)}
    return {"options": {**list_mode_options(mode), **cat, **(options or {})}}


def parallelize(model, runtime, parallelism="ddp", compile=False, activation_checkpointing=False, backend="inductor",
                mode="default", pointwise_cat=True, options=None):
    """Spread `model` (a GPT, on runtime.device) over the processes of runtime. Returns (model, train_model):
    the module that evaluates, and the module the training step calls.

    The three transformations are applied in torchtitan's order (docs/gpu-path.md): activation
    checkpointing, then torch.compile, then sharding, so that what is compiled is the
    checkpointed block and what is sharded is the compiled one.

    activation_checkpointing=True: each Block's forward runs under torch.utils.checkpoint
    (checkpointed()); the dropout masks are replayed (the RNG state is restored), so the
    gradients are the same.

    compile=True: torch.compile with `backend` (tests pass a counting one) in `mode` (TrainConfig's
    compile_mode: 'default', 'reduce-overhead', 'max-autotune-no-cudagraphs', 'max-autotune'; a backend
    other than inductor gets a mode other than 'default' as its `mode` keyword); pointwise_cat=False
    lowers inductor's cats as copies and `options` ({name: value} of torch._inductor.config, TrainConfig's
    compile_options) join the mode's (compile_kwargs), under ddp and fsdp alike. Under ddp the whole model
    is compiled, one graph. Under fsdp each Block is compiled on its own (one graph that every block reuses) and so
    is the root, in two graphs: the embeddings, and the LM head with the cross-entropy. FSDP's hooks
    around each block are not traced (dynamo breaks the root's graph there), and the final norm,
    called after the loop over the blocks, runs eager.

    parallelism='ddp': train_model is PyTorch's DistributedDataParallel around the (compiled)
    model under torchrun, which averages the gradients over the processes once per step; in one
    process, the model itself.
    parallelism='fsdp': FSDP2 (torch.distributed.fsdp.fully_shard) on a 1-D device mesh of the
    W processes (an explicit CPU mesh on the CPU), one unit per transformer Block and one at the
    root (embeddings, final norm, LM head): each process keeps 1/W of every weight, gradient and
    optimizer state, all-gathers a unit's weights just before its forward and backward, and
    reduce-scatters its gradients (averaged over the processes) after its backward, as in Zhao et
    al. 2023, "PyTorch FSDP". Weights are gathered and gradients reduced in float32, and mixed
    precision is left to runtime.autocast as under DDP, so a step computes what DDP's computes: the
    residual stream and RoPE's cos/sin stay float32, and each matmul casts its float32 weight to
    bfloat16 (no MixedPrecisionPolicy: its bfloat16 gathers cast every block's input to bfloat16,
    and it would round the norms' weights, which autocast keeps float32). The model is changed in
    place (its parameters become DTensor shards, its state-dict names stay) and is returned twice.
    """
    if activation_checkpointing:
        for block in model.transformer.h:
            block.forward = checkpointed(block.forward)
    kwargs = compile_kwargs(mode, backend, pointwise_cat, options)
    if parallelism == "fsdp":
        if compile:
            for block in model.transformer.h:
                block.compile(backend=backend, **kwargs)
            model.compile(backend=backend, **kwargs)
        mesh = init_device_mesh(runtime.device_type, (runtime.world_size,))
        units = [*model.transformer.h, model]
        for unit in units:
            fully_shard(unit, mesh=mesh)  # float32 throughout; autocast does the mixed precision, as under DDP
        if runtime.backend == "gloo":
            # Reduce-scatter with SUM, then let FSDP divide by W itself, instead of gloo's AVG: gloo's AVG
            # summed without dividing in some PyTorch releases (pytorch issue #162338), which would double
            # every gradient on 2 processes without an error. On the CPU the extra division costs nothing.
            for unit in units:
                unit.set_force_sum_reduction_for_comms(True)
        return model, model
    if compile:
        model = torch.compile(model, backend=backend, **kwargs)
    if not runtime.distributed:
        return model, model
    device_ids = [runtime.local_rank] if runtime.device_type == "cuda" else None
    return model, DistributedDataParallel(model, device_ids=device_ids)


def all_reduce_sum(tensor, runtime):
    """Sum `tensor` over the processes in place (nothing to do in one process); returns it."""
    if runtime.distributed:
        dist.all_reduce(tensor)
    return tensor


def numerics(device):
    """What decides a run's floating-point results beyond its config, data and torch version: the
    threads (a multithreaded kernel sums in another order with another count), the CPU's instruction
    set that ATen's kernels use (torch.backends.cpu.get_cpu_capability(); ATEN_CPU_CAPABILITY lowers
    it), the CPU model, the BLAS torch was built with, and on CUDA the GPU and cuDNN. Returns a dict of
    strings and ints for the run's header (train.py); compare.py warns when runs pooled as seeds of
    one arm differ in any of them (arms.numerics_note)."""
    blas = re.search(r"BLAS_INFO=(\w+)", torch.__config__.show())
    facts = {"torch_threads": torch.get_num_threads(), "interop_threads": torch.get_num_interop_threads(),
             "omp_num_threads": os.environ.get("OMP_NUM_THREADS", ""),
             "cpu_capability": torch.backends.cpu.get_cpu_capability(), "cpu_model": cpu_model(),
             "blas": blas.group(1) if blas else ""}
    if torch.device(device).type == "cuda":
        facts |= {"gpu": torch.cuda.get_device_name(torch.device(device)), "cuda": torch.version.cuda or "",
                  "cudnn": torch.backends.cudnn.version() or 0}
    return facts


def cpu_model():
    """The CPU's model name (/proc/cpuinfo on Linux, platform.processor() elsewhere), '' if unknown."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


# Dense (no sparsity) bf16 tensor-core peaks in FLOP/s, from the vendors' spec sheets,
# matched against torch.cuda.get_device_name() in this order, so that the PCIe and NVL
# variants are found before the SXM part of the same name ("NVIDIA H100 80GB HBM3" is
# the SXM H100, "NVIDIA H200" the SXM H200).
PEAK_FLOPS_BF16 = [
    ("H100 PCIe", 756e12),
    ("H100 NVL", 835e12),
    ("H200 NVL", 835e12),
    ("GH200", 989e12),
    ("H200", 989e12),  # SXM
    ("H100", 989e12),  # SXM
    ("A100", 312e12),  # SXM and PCIe alike
    ("L40S", 362e12),
    ("RTX 5090", 209.5e12),
    ("RTX 4090", 165.2e12),
]


def peak_flops(device):
    """Peak dense bf16 FLOP/s of a CUDA device from PEAK_FLOPS_BF16, or None for the CPU
    and for GPUs not in the table (MFU is then not reported)."""
    if not device.startswith("cuda"):
        return None
    name = torch.cuda.get_device_name(device)
    return next((flops for key, flops in PEAK_FLOPS_BF16 if key in name), None)


def mfu(flops_per_token, tokens_per_s, peak, world_size=1):
    """Model FLOPs utilization: achieved training FLOP/s (flops_per_token, e.g.
    GPT.flops_per_token(), times tokens/s over all processes) over the peak of
    world_size devices of `peak` FLOP/s each (PaLM, appendix B). None if peak is None."""
    return None if not peak else flops_per_token * tokens_per_s / (peak * world_size)

