"""
Models in from every source, and this repo's out. In: load_model(source, **overrides), the one
loader of every program (sample.py, eval.py, analyze.py, export.py, train.py's fine-tuning): it
reads checkpoint files itself, this repo's runs' and the official code's (handing their dict to
from_official), and every other source with load_pretrained, OpenAI's GPT-2 and Hugging Face or
export directories. Out: export(model, directory), which export.py calls. The formats are
described in docs/pretrained.md.

A source is one of the following; its kind is read from the files, not from its name:
- 'gpt2', 'gpt2-medium', 'gpt2-large', 'gpt2-xl': OpenAI's GPT-2 from the local Hugging Face
  cache (huggingface_hub with local files only: nothing is ever downloaded here)
- a Hugging Face GPT-2 directory: config.json (model_type 'gpt2') and model.safetensors or
  pytorch_model.bin (either may be sharded with an .index.json). GPT-2 stores its Conv1D
  weights (in, out), transposed against nn.Linear, fuses q, k, v into attn.c_attn (rows
  q | k | v here: split into the query's W_Q and c_kv), has biases everywhere, gelu_new and
  vocab 50257
- a checkpoint file of the official code (arXiv:2603.13381's repository), read by
  load_model: a dict with 'model' (its state dict, keys perhaps prefixed by
  torch.compile's '_orig_mod.') and 'model_args' (num_heads, head_size, mlp_hidden_size,
  tie_weights, bias, scale, query_mode in original | identity | residual | residual_gelu); its
  attention names attn.c_attn (rows q | k | v for original and residual, k | v otherwise),
  attn.residual_rmsnorm_input, attn.residual_in (W1), attn.residual_out (W2),
  attn.residual_layernorm_output
- a checkpoint of this repo's train.py (ckpt.pt: 'model', 'model_args' with this repo's
  GPTConfig names, 'step', 'config', ...), or a run directory holding one: load_model's (a run
  holding only a sharded checkpoint, ckpt.dcp, gets sharded_hint's sentence)
- a directory written by export.py in this repo's own format (config.json with
  "format": "nonlinear-queries" and the model_args)

Loading never unpickles arbitrary objects: files are read with safetensors or with
checkpoint_file.load_checkpoint_file (torch.load(weights_only=True)), which admits only tensors and
plain containers. Every failure is a PretrainedError whose message says what was expected.
"""

import json
import math
import os
from dataclasses import asdict, dataclass

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from model import GPT, QUERY_MODULES, GPTConfig, model_config_keys
from nonlinear_queries.errors import CheckpointError, PretrainedError
from nonlinear_queries.record.atomic import atomic_path, write_json
from nonlinear_queries.record.runs import RunDir
from nonlinear_queries.weights.checkpoint_file import load_checkpoint_file, upgrade_model_args

GPT2_SIZES = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")
REPO_FORMAT = "nonlinear-queries"  # config.json's "format" in export.py's own format
# Hugging Face GPT-2's Conv1D weights, stored (in, out)
CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
# Hugging Face's activation_function -> mlp_activation, and back for export
HF_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}
HF_ACTIVATION_OF = {"gelu_tanh": "gelu_new", "gelu": "gelu"}
# GPT2Config's defaults, for keys a config.json leaves out
HF_GPT2_DEFAULTS = {"vocab_size": 50257, "n_positions": 1024, "n_embd": 768, "n_layer": 12, "n_head": 12}
# the official code's four query modes -> this repo's; the others (res_linear, anchored_res_gelu and any mode added
# to QUERY_MODULES) have no official checkpoint to convert, and an official mode missing here is refused by name
OFFICIAL_QUERY_MODES = {"original": "linear", "identity": "identity", "residual": "residual",
                        "residual_gelu": "res_gelu"}
# The official GPTConfig's defaults, for keys a checkpoint's model_args leaves out. Its default
# scale is sqrt(1/head_size) evaluated once at class definition, with head_size 64.
OFFICIAL_DEFAULTS = {"block_size": 1024, "vocab_size": 50304, "n_layer": 12, "num_heads": 12, "n_embd": 768,
                     "tie_weights": True, "dropout": 0.0, "bias": False, "scale": 0.125, "query_mode": "original",
                     "mlp_hidden_size": 3072}
# the official code's attention names -> this repo's
OFFICIAL_NAMES = {
    ".attn.residual_rmsnorm_input.": ".attn.query.rms.",
    ".attn.residual_in.": ".attn.query.w1.",
    ".attn.residual_out.": ".attn.query.w2.",
    ".attn.residual_layernorm_output.": ".attn.query.ln.",
}
# overrides that may differ from the loaded model's config without changing what its weights compute
FREE_OVERRIDES = ("dropout", "fused_qkv")


@dataclass
class LoadedFrom:
    """Where a loaded model's weights came from (the model's `loaded_from`).

    kind: 'gpt2' (the Hugging Face cache), 'hf' (a Hugging Face GPT-2 directory), 'official'
    (the official code's checkpoint), 'ckpt' (this repo's train.py checkpoint) or 'export'
    (export.py's own format). path: the file or directory read. step: the training step of a
    checkpoint, None where the source has none. run_config: the training config saved in this
    repo's ckpt.pt, whose dataset and data_dir say which tokenizer it was trained with; None
    for every other kind, all of which use GPT-2's BPE.
    """

    kind: str
    path: str
    step: int | None = None
    run_config: dict | None = None


def load_model(source, **overrides):
    """The model of `source` on the CPU in float32, the one loader of sample.py, eval.py, analyze.py,
    export.py and train.py's fine-tuning; `source` is any of the module docstring's. A checkpoint file, or
    a run directory holding ckpt.pt, is read here (checkpoint_file.load_checkpoint_file, which names a
    damaged file's other checkpoints): this repo's train.py's (model_args in GPTConfig's names,
    checkpoint_file.upgrade_model_args) or the official code's (model_args with num_heads, renamed by
    from_official). Every other source, GPT-2 or a Hugging Face or export directory, is load_pretrained's.

    overrides: GPTConfig fields, as build_pretrained takes them. Returns the GPT, its `config` the
    resolved GPTConfig and `loaded_from` a LoadedFrom. Raises PretrainedError, for a directory holding
    only a sharded checkpoint one that says how to make a file of it (sharded_hint)."""
    path = None
    if source not in GPT2_SIZES:
        if os.path.isfile(source):
            path = source
        elif os.path.isfile(RunDir(source).latest_checkpoint()):  # a run directory (its config.json is train.py's)
            path = RunDir(source).latest_checkpoint()
        elif os.path.isdir(source) and sharded_hint(source):
            raise PretrainedError(sharded_hint(source))
    if path is None:
        return load_pretrained(source, **overrides)
    try:
        ckpt = load_checkpoint_file(path)
    except CheckpointError as e:
        raise PretrainedError(str(e)) from None
    if not (isinstance(ckpt, dict) and all(isinstance(ckpt.get(k), dict) for k in ("model", "model_args"))):
        found = sorted(ckpt) if isinstance(ckpt, dict) else type(ckpt).__name__
        raise PretrainedError(f"{path} is not a checkpoint: expected a dict with 'model' (a state dict) and "
                              f"'model_args', as this repo's train.py and the official code write; found {found}")
    args = ckpt["model_args"]
    if "num_heads" in args:
        weights = from_official(ckpt, path)
    elif "n_head" in args:
        weights = (upgrade_model_args(args), ckpt["model"],
                   LoadedFrom("ckpt", path, ckpt.get("step"), ckpt.get("config")))
    else:
        raise PretrainedError(f"{path}: model_args has neither n_head (this repo's train.py) nor num_heads (the "
                              f"official code); its keys: {sorted(args)}")
    return build_pretrained(*weights, source, overrides)


def sharded_hint(directory):
    """A sentence saying how to make ckpt.pt when `directory` is a run holding only a sharded
    checkpoint (ckpt.dcp), or is a sharded checkpoint itself; '' otherwise."""
    if os.path.exists(RunDir(directory).latest_checkpoint("fsdp")):
        command = f"python -m nonlinear_queries.weights.checkpoint --out_dir={directory}"
    elif os.path.isfile(os.path.join(directory, ".metadata")):
        command = f"python -m nonlinear_queries.weights.checkpoint --checkpoint={directory} --to=PATH.pt"
    else:
        return ""
    return (f"{directory} holds a sharded checkpoint (written under parallelism=fsdp); make one file of it with: "
            f"{command}")


def load_pretrained(source, **overrides):
    """The model of `source`, one of GPT-2's names or a Hugging Face GPT-2 or export directory (see the
    module docstring), on the CPU in float32: build_pretrained on what read_source reads (overrides and
    the returned model as there). Raises PretrainedError."""
    return build_pretrained(*read_source(source), source, overrides)


def build_pretrained(model_args, state_dict, loaded_from, source, overrides):
    """The GPT of model_args (GPTConfig keyword arguments) holding state_dict (its weights under this
    repo's names), read from `source` as loaded_from (a LoadedFrom) says, with `overrides` applied.

    overrides: {GPTConfig field: value}. dropout and fused_qkv may take any value; block_size may be
    smaller than the source's (positions past it are dropped, as nanoGPT's crop_block_size);
    query_mode='anchored_res_gelu' (with query_rank) turns a linear model into the anchored
    query, keeping its W_Q and adding f with f = 0, so the logits are the loaded model's until
    training moves f. Every other field must equal the loaded one. Returns the GPT, its
    `config` the resolved GPTConfig and `loaded_from` a LoadedFrom. Raises PretrainedError.
    """
    loaded = make_config(model_args, source)
    config = apply_overrides(loaded, overrides, source)
    model = GPT(config)
    if config.block_size < loaded.block_size and config.pos_encoding == "learned":  # RoPE has no table to crop
        state_dict["transformer.wpe.weight"] = state_dict["transformer.wpe.weight"][: config.block_size]
    new = set()
    if config.query_mode != loaded.query_mode:  # a linear model turned anchored: f keeps its init, f = 0
        new = {k for k in model.state_dict() if ".attn.query." in k and ".attn.query.w_q." not in k}
    try:
        missing, unexpected = model.load_state_dict(state_dict, strict=False)
    except RuntimeError as e:  # a tensor of the wrong shape
        raise PretrainedError(f"{loaded_from.path}: the weights do not fit the model its config describes "
                              f"({loaded_from.kind}): {str(e).splitlines()[-1].strip()}") from None
    missing = sorted(set(missing) - new)
    if missing or unexpected:
        raise PretrainedError(f"{loaded_from.path}: the weights do not fit the model its config describes "
                              f"({loaded_from.kind}): missing {missing[:4]}, unexpected {sorted(unexpected)[:4]}")
    model.loaded_from = loaded_from
    return model


def make_config(model_args, source):
    """GPTConfig(**model_args), with its complaint as a PretrainedError that names the source."""
    try:
        return GPTConfig(**model_args)
    except (TypeError, ValueError) as e:  # an unknown key (a newer version of this repo) or a bad value
        raise PretrainedError(f"{source}: its model config is not one this version can build: {e}") from None


def apply_overrides(loaded, overrides, source):
    """The GPTConfig `loaded` with `overrides` applied, if each is one build_pretrained allows."""
    values = asdict(loaded)
    unknown = sorted(set(overrides) - set(values))
    if unknown:
        raise PretrainedError(f"unknown model settings {unknown}; GPTConfig has {', '.join(model_config_keys())}")
    anchoring = loaded.query_mode == "linear" and overrides.get("query_mode") == "anchored_res_gelu"
    for key, value in overrides.items():
        allowed = (value == values[key] or key in FREE_OVERRIDES or (key == "block_size" and value < values[key])
                   or (anchoring and key in ("query_mode", "query_rank")))
        if not allowed:
            raise PretrainedError(
                f"{source} has {key}={values[key]!r} and cannot be loaded with {key}={value!r}: only dropout, "
                f"fused_qkv, a smaller block_size, and query_mode='anchored_res_gelu' (with its query_rank) on a "
                f"linear model may differ from the pretrained model")
    return make_config({**values, **overrides}, source)


def read_source(source):
    """(model_args, state_dict, LoadedFrom) of `source`, a GPT-2 name or a directory: GPTConfig keyword
    arguments, and the weights under this repo's names for the model those arguments build. A checkpoint
    file, or a run directory (ckpt.pt), is load_model's, which hands every other source here."""
    if source in GPT2_SIZES:
        return read_directory(hub_snapshot(source), kind="gpt2")
    if os.path.isdir(source):
        if os.path.isfile(os.path.join(source, "config.json")):
            return read_directory(source)
        raise PretrainedError(f"{source} holds neither config.json (a Hugging Face GPT-2 directory or export.py's "
                              f"output) nor ckpt.pt (a run directory of train.py)")
    if os.path.isfile(source):
        raise PretrainedError(f"{source} is a file: checkpoint files are read by load_model")
    raise PretrainedError(f"{source!r} is none of {', '.join(GPT2_SIZES)} and no file or directory")


def hub_snapshot(name):
    """The local Hugging Face cache's snapshot directory of OpenAI's GPT-2 `name`; never downloads."""
    # imported here: only these four names need the hub client, which takes a while to import
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    for repo_id in (f"openai-community/{name}", name):  # the hub's name now, and the alias older caches used
        try:
            return snapshot_download(repo_id, local_files_only=True)
        except LocalEntryNotFoundError:
            pass
    raise PretrainedError(
        f"{name} is not in the local Hugging Face cache ({constants.HF_HUB_CACHE}), and nothing is downloaded "
        f"here. On a machine with internet access run\n  hf download openai-community/{name} config.json "
        f"model.safetensors\nand copy its models--openai-community--{name} folder into that cache (or set "
        f"HF_HUB_CACHE to a cache holding it), or pass the directory holding config.json and model.safetensors")


def _read_json(path):
    """The object in the JSON file `path`; PretrainedError if it is not valid JSON."""
    try:
        with open(path) as f:
            return json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise PretrainedError(f"cannot read {path}: not valid JSON ({e})") from None


def read_torch_weights(path):
    """The tensors of a pytorch_model.bin, read by checkpoint_file.load_checkpoint_file (tensors and plain
    containers only); PretrainedError if the file is missing, truncated, corrupt or holds other objects."""
    try:
        return load_checkpoint_file(path)
    except CheckpointError as e:
        raise PretrainedError(str(e)) from None


def read_safetensors(path):
    """The tensors of a safetensors file; PretrainedError if it is not one."""
    try:
        return load_file(path)
    except (SafetensorError, OSError) as e:
        raise PretrainedError(f"cannot read {path}: not a safetensors file, or truncated or corrupt ({e})") from None


def read_weights(directory):
    """The tensors of directory's model.safetensors or else pytorch_model.bin, each possibly sharded
    (model.safetensors.index.json or pytorch_model.bin.index.json naming the shards)."""
    for name, reader in (("model.safetensors", read_safetensors), ("pytorch_model.bin", read_torch_weights)):
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            return reader(path)
        if os.path.isfile(path + ".index.json"):
            shards = sorted(set(_read_json(path + ".index.json")["weight_map"].values()))
            return {k: v for shard in shards for k, v in reader(os.path.join(directory, shard)).items()}
    raise PretrainedError(f"{directory} has no model.safetensors or pytorch_model.bin (nor a sharded index of either)")


def read_directory(path, kind="hf"):
    """A Hugging Face GPT-2 directory, or export.py's output in this repo's format."""
    config = _read_json(os.path.join(path, "config.json"))
    if config.get("format") == REPO_FORMAT:
        state_dict, args = read_weights(path), config["model_args"]
        if args.get("tie_weights", True):  # the tied LM head is stored once, as wte
            state_dict["lm_head.weight"] = state_dict["transformer.wte.weight"]
        return args, state_dict, LoadedFrom("export", path)
    if config.get("model_type") != "gpt2":
        raise PretrainedError(f"{path}/config.json describes model_type={config.get('model_type')!r}: expected a "
                              f"Hugging Face GPT-2 (model_type 'gpt2') or export.py's format "
                              f"(\"format\": \"{REPO_FORMAT}\")")
    args = model_args_from_hf(config, path)
    return args, state_dict_from_hf(read_weights(path), args["n_embd"], args["tie_weights"]), LoadedFrom(kind, path)


def mlp_ratio_of(hidden, n_embd, path):
    """The mlp_ratio whose GPTConfig.mlp_hidden is `hidden` at width n_embd."""
    ratio = hidden / n_embd
    if int(ratio * n_embd) != hidden:
        raise PretrainedError(f"{path}: MLP width {hidden} at n_embd {n_embd} is not int(mlp_ratio * n_embd) "
                              f"for any float mlp_ratio")
    return ratio


def model_args_from_hf(config, path):
    """GPTConfig arguments for a Hugging Face GPT2Config dict; PretrainedError for options this model lacks."""
    config = {**HF_GPT2_DEFAULTS, **config}
    for key in ("scale_attn_by_inverse_layer_idx", "add_cross_attention"):
        if config.get(key):
            raise PretrainedError(f"{path}/config.json sets {key}, which this model does not have")
    activation = config.get("activation_function", "gelu_new")
    if activation not in HF_ACTIVATIONS:
        raise PretrainedError(f"{path}/config.json: activation_function {activation!r} is none of "
                              f"{', '.join(HF_ACTIVATIONS)}")
    if config.get("layer_norm_epsilon", 1e-5) != 1e-5:
        raise PretrainedError(f"{path}/config.json: layer_norm_epsilon {config['layer_norm_epsilon']}; "
                              f"this model's LayerNorms use 1e-5")
    n_embd = config["n_embd"]
    mlp_hidden = config.get("n_inner") or 4 * n_embd  # GPT2Config's n_inner None means 4 n_embd
    return dict(
        block_size=config["n_positions"], vocab_size=config["vocab_size"], n_layer=config["n_layer"],
        n_head=config["n_head"], n_embd=n_embd, mlp_ratio=mlp_ratio_of(mlp_hidden, n_embd, path),
        mlp_activation=HF_ACTIVATIONS[activation], bias=True, tie_weights=config.get("tie_word_embeddings", True),
        attn_scale=0.0 if config.get("scale_attn_weights", True) else 1.0,
    )


def state_dict_from_hf(hf, n_embd, tie_weights):
    """Hugging Face GPT-2 weights under this repo's names: Conv1D weights transposed, c_attn's
    rows q | k | v split into attn.query.w_q and attn.c_kv (weights and biases)."""
    out = {}
    for key, tensor in hf.items():
        key = key.removeprefix("transformer.")  # GPT2LMHeadModel's prefix; a bare GPT2Model has none
        if key.endswith((".attn.bias", ".attn.masked_bias")):  # causal-mask buffers of older transformers
            continue
        if key.endswith(CONV1D):
            tensor = tensor.t()
        if key == "lm_head.weight":
            out[key] = tensor
        elif ".attn.c_attn." in key:
            block, param = key.split(".attn.c_attn.")
            out[f"transformer.{block}.attn.query.w_q.{param}"] = tensor[:n_embd]
            out[f"transformer.{block}.attn.c_kv.{param}"] = tensor[n_embd:]
        else:
            out[f"transformer.{key}"] = tensor
    if tie_weights and "transformer.wte.weight" in out:  # Hugging Face stores a tied LM head once, as wte
        out["lm_head.weight"] = out["transformer.wte.weight"]
    return out


def from_official(ckpt, path):
    """(model_args, state_dict, LoadedFrom) of an official-code checkpoint (the dict that
    load_model read from `path`), under this repo's names.
    The softmax scale is model_args' `scale`: attn_scale 0 where it is the query module's own."""
    args = {**OFFICIAL_DEFAULTS, **ckpt["model_args"]}
    mode = OFFICIAL_QUERY_MODES.get(args["query_mode"])
    if mode is None:
        raise PretrainedError(f"{path}: the official query_mode {args['query_mode']!r} is none of "
                              f"{', '.join(OFFICIAL_QUERY_MODES)}")
    n_embd, n_head = args["n_embd"], args["num_heads"]
    own_scale = QUERY_MODULES[mode].scale_mult / math.sqrt(n_embd // n_head)
    model_args = dict(
        block_size=args["block_size"], vocab_size=args["vocab_size"], n_layer=args["n_layer"], n_head=n_head,
        n_embd=n_embd, dropout=args["dropout"], mlp_ratio=mlp_ratio_of(args["mlp_hidden_size"], n_embd, path),
        query_mode=mode, tie_weights=args["tie_weights"], bias=args["bias"],
        attn_scale=0.0 if math.isclose(args["scale"], own_scale, rel_tol=1e-9) else args["scale"],
    )
    state_dict = {}
    for key, tensor in ckpt["model"].items():
        key = key.removeprefix("_orig_mod.")  # left by saving a torch.compile'd model's state dict
        for official, ours in OFFICIAL_NAMES.items():
            key = key.replace(official, ours)
        if ".attn.c_attn." in key:
            block, param = key.split(".attn.c_attn.")
            if mode in ("linear", "residual"):  # rows q | k | v; the official identity and residual_gelu store k | v
                state_dict[f"{block}.attn.query.w_q.{param}"] = tensor[:n_embd]
                tensor = tensor[n_embd:]
            key = f"{block}.attn.c_kv.{param}"
        state_dict[key] = tensor
    return model_args, state_dict, LoadedFrom("official", path, ckpt.get("iter_num"))


# ---------------------------------------------------------------------------------------
# Weights out


def hf_incompatibility(config):
    """Why Hugging Face's GPT-2 cannot compute the model of `config` (a str), or None if it can."""
    head_dim = config.n_embd // config.n_head
    if config.query_mode != "linear":
        return f"query_mode={config.query_mode!r}: GPT-2's query is linear"
    if config.qk_norm:
        return "qk_norm=True: GPT-2 has no QK-norm"
    if config.attn_gate != "none":
        return f"attn_gate={config.attn_gate!r}: GPT-2 has no output gate on its attention"
    if config.pos_encoding != "learned":
        return f"pos_encoding={config.pos_encoding!r}: GPT-2's positions are learned"
    if config.kv_heads != config.n_head:
        return f"n_kv_head={config.n_kv_head}: GPT-2's keys and values have n_head={config.n_head} heads"
    if config.norm != "layernorm":
        return f"norm={config.norm!r}: GPT-2's norms are LayerNorms"
    if config.mlp_activation not in HF_ACTIVATION_OF:
        return f"mlp_activation={config.mlp_activation!r}: GPT-2 has no such activation"
    if config.width_mult != 1.0 or config.attn_scale_mult != 1.0:
        return (f"parametrization='mup' at width multiplier {config.width_mult:g}: GPT-2 multiplies neither its "
                f"logits by 1/m nor its softmax scale")
    if config.attn_scale not in (0.0, 1.0) and not math.isclose(config.attn_scale, 1 / math.sqrt(head_dim)):
        return f"attn_scale={config.attn_scale}: GPT-2's softmax scale is 1/sqrt(head_dim) or 1"
    return None


def hf_config(config):
    """The Hugging Face GPT2Config dict (config.json) of a model that hf_incompatibility passes."""
    eot = 50256 if config.vocab_size > 50256 else None
    return {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": config.vocab_size,
        "n_positions": config.block_size, "n_embd": config.n_embd, "n_layer": config.n_layer,
        "n_head": config.n_head, "n_inner": config.mlp_hidden,
        "activation_function": HF_ACTIVATION_OF[config.mlp_activation], "layer_norm_epsilon": 1e-5,
        "scale_attn_weights": config.attn_scale != 1.0, "tie_word_embeddings": config.tie_weights,
        "resid_pdrop": config.dropout, "embd_pdrop": config.dropout, "attn_pdrop": config.dropout,
        # GPT-2 BPE's <|endoftext|>, where the vocabulary has it
        "bos_token_id": eot, "eos_token_id": eot,
    }


def hf_state_dict(model):
    """The model's weights under Hugging Face GPT-2's names, the inverse of state_dict_from_hf:
    Conv1D weights (in, out), c_attn = rows q | k | v, zero biases where the model has none
    (GPT-2 always has them; zeros compute the same function), lm_head.weight only if untied."""
    state_dict = dict(model.state_dict())
    for name, module in model.named_modules():
        if isinstance(module, (nn.Linear, nn.LayerNorm)) and module.bias is None and name != "lm_head":
            state_dict[f"{name}.bias"] = module.weight.new_zeros(module.weight.shape[0])
    out = {}
    for key, tensor in state_dict.items():
        if (key == "lm_head.weight" and model.config.tie_weights) or ".attn.query.w_q." in key:
            continue  # the tied head is wte; W_Q goes into c_attn with c_kv
        if ".attn.c_kv." in key:
            block, param = key.split(".attn.c_kv.")
            key, tensor = f"{block}.attn.c_attn.{param}", torch.cat([state_dict[f"{block}.attn.query.w_q.{param}"],
                                                                       tensor])
        out[key] = tensor.t() if key.endswith(CONV1D) else tensor
    return out


def check_export_dir(directory):
    """Raise PretrainedError where export(model, directory) would fail or destroy a file it did not write:
    `directory` (or a directory above it) is a file, or it holds a config.json or model.safetensors beside a
    config.json that is not an export's (a train.py run's config.json, say). An earlier export is replaced."""
    hint = "; name a new directory with --to=DIR"
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise PretrainedError(f"{directory} is a file, not a directory (an export writes model.safetensors and "
                              f"config.json into one){hint}")
    above = os.path.dirname(os.path.abspath(directory))
    while not os.path.exists(above):
        above = os.path.dirname(above)
    if not os.path.isdir(above):
        raise PretrainedError(f"{above} is a file, so the directory {directory} cannot be made{hint}")
    config = os.path.join(directory, "config.json")
    if os.path.isfile(config):
        try:
            with open(config) as f:
                written = json.load(f)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            written = None
        if not isinstance(written, dict) or (written.get("format") != REPO_FORMAT
                                             and written.get("model_type") != "gpt2"):
            raise PretrainedError(f"{config} was not written by export (it is neither Hugging Face GPT-2's config "
                                  f"nor this repo's export format: a run's config.json?), and an export would "
                                  f"replace it{hint}")
    elif os.path.exists(os.path.join(directory, "model.safetensors")):
        raise PretrainedError(f"{directory} holds a model.safetensors without an export's config.json, and an "
                              f"export would replace it{hint}")


def export(model, directory):
    """Write `model` to directory/model.safetensors and directory/config.json (the directory is
    created if need be; an earlier export there is replaced; check_export_dir refuses any other
    destination that holds those files, or is a file).

    Where hf_incompatibility passes, in Hugging Face's GPT-2 format, which
    transformers.GPT2LMHeadModel.from_pretrained(directory) loads, computing the same logits;
    returns None. Otherwise in this repo's format (its state dict, a tied LM head stored once;
    config.json {"format": "nonlinear-queries", "model_args": ...}), which
    load_model(directory) loads; returns the reason Hugging Face cannot hold the model.
    """
    check_export_dir(directory)
    reason = hf_incompatibility(model.config)
    if reason is None:
        tensors, config = hf_state_dict(model), hf_config(model.config)
    else:
        tied_head = "lm_head.weight" if model.config.tie_weights else None
        tensors = {k: v for k, v in model.state_dict().items() if k != tied_head}
        config = {"format": REPO_FORMAT, "model_args": asdict(model.config)}
    os.makedirs(directory, exist_ok=True)
    # safetensors wants contiguous tensors that share no memory: the transposes and the tied head do not qualify
    tensors = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
    with atomic_path(os.path.join(directory, "model.safetensors")) as tmp:
        save_file(tensors, tmp, metadata={"format": "pt"})
    write_json(os.path.join(directory, "config.json"), config)
    return reason
