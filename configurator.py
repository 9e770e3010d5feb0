"""
Config loading shared by train.py and sample.py (nanoGPT's convention, validated).

    python train.py config/res_gelu.py --batch_size=8 --compile=False

Positional arguments are config files of plain Python assignments, executed in order
in their own namespace; `--key=value` arguments override them. Values are parsed as
Python literals (`--learning_rate=3e-3`, `--compile=False`); a string needs no quotes.
Every key must be a field of the script's config dataclass and every value must have
that field's type (an int is accepted for a float); anything else is a ConfigError that
names the key.
"""

import ast
import dataclasses
import difflib
import os
import sys
import types


class ConfigError(ValueError):
    """A config file or override that names an unknown key or has a wrong type."""


def _parse_literal(raw):
    try:
        return ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        return raw  # a bare word such as --dataset=shakespeare is a string


def _unknown_key(key, ftypes, where):
    close = difflib.get_close_matches(key, ftypes, n=3)
    hint = f"did you mean {' or '.join(repr(c) for c in close)}?" if close else f"valid keys: {', '.join(ftypes)}"
    return ConfigError(f"{where}: unknown config key {key!r}; {hint}")


def _check_type(key, value, ftype, source, raw=None):
    if ftype is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if ftype is tuple and isinstance(value, list):
        return tuple(value)  # --save_checkpoint_steps=[59000,60000] and (59000, 60000) alike
    if ftype is str and raw is not None and not isinstance(value, str):
        return raw  # --wandb_run_name=123 means the string "123"
    if ftype is int and isinstance(value, bool):
        raise ConfigError(f"{source}: {key} must be int, got bool {value!r}")
    if not isinstance(value, ftype):
        raise ConfigError(f"{source}: {key} must be {ftype.__name__}, got {type(value).__name__} {value!r}")
    return value


def read_config_file(path):
    """The assignments of a config file as a dict (names starting with _ and modules
    left out), unvalidated. Raises ConfigError if the file does not exist."""
    if not os.path.isfile(path):
        raise ConfigError(f"config file {path!r} not found")
    namespace = {"__file__": os.path.abspath(path)}  # lets a config exec a sibling config
    with open(path) as f:
        exec(compile(f.read(), path, "exec"), namespace)
    return {k: v for k, v in namespace.items() if not k.startswith("_") and not isinstance(v, types.ModuleType)}


def parse_config(config_cls, argv):
    """Build a `config_cls` dataclass instance from config files and --key=value overrides.

    argv: the command-line arguments after the script name. Returns (config, files), the
    resolved config and the list of config files read. Raises ConfigError for an unknown
    key, a value of the wrong type or one that config_cls.__post_init__ rejects with a
    ValueError, a missing config file, or a malformed argument.
    """
    ftypes = {f.name: f.type for f in dataclasses.fields(config_cls)}
    values, files = {}, []
    for arg in argv:
        if arg.startswith("--"):
            if "=" not in arg:
                raise ConfigError(f"argument {arg!r}: overrides are written --key=value")
            key, raw = arg[2:].split("=", 1)
            if key not in ftypes:
                raise _unknown_key(key, ftypes, arg)
            values[key] = _check_type(key, _parse_literal(raw), ftypes[key], arg, raw)
        else:
            for key, value in read_config_file(arg).items():
                if key not in ftypes:
                    raise _unknown_key(key, ftypes, arg)
                values[key] = _check_type(key, value, ftypes[key], arg)
            files.append(arg)
    try:
        return config_cls(**values), files
    except ValueError as e:  # a value the config's own validation rejects, e.g. an unknown query_mode
        raise ConfigError(str(e)) from None


def config_from_argv(config_cls, argv=None):
    """parse_config on sys.argv[1:], exiting with status 2 and the message on a ConfigError."""
    try:
        return parse_config(config_cls, sys.argv[1:] if argv is None else argv)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        sys.exit(2)
