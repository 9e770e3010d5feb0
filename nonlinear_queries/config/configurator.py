"""
Config loading for every program at the root that takes a config (train, sample, eval, export,
analyze, sweep, study) and the bench scripts: nanoGPT's convention, validated.

    python train.py config/res_gelu.py --batch_size=8 --compile=False

Positional arguments are config files of plain assignments (read_config_file: parsed,
never executed), applied in order; `--key=value` arguments override them. Values are parsed as
Python literals (`--learning_rate=3e-3`, `--compile=False`); a string needs no quotes.
Every key must be a field of the script's config dataclass and every value must have
that field's type (an int is accepted for a float); anything else is a ConfigError that
names the key. `-h` or `--help` prints the program's docstring and every key with its type,
default and the comment the config dataclass gives it in its source (help_text), the one
place each setting is described.
"""

import ast
import dataclasses
import difflib
import inspect
import io
import math
import operator
import os
import shutil
import sys
import textwrap
import tokenize

from nonlinear_queries.cli import run_main
from nonlinear_queries.errors import ConfigError

HELP_FLAGS = ("-h", "--help")


def _parse_literal(raw):
    try:
        return ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        return raw  # a bare word such as --dataset=shakespeare is a string


def did_you_mean(key, keys):
    """The hint for an unknown `key` among `keys` (a config's, a study file table's): the nearest ones by difflib's
    ratio ("did you mean 'n_layer'?"), or every key where none is near."""
    close = difflib.get_close_matches(key, keys, n=3)
    return f"did you mean {' or '.join(repr(c) for c in close)}?" if close else f"valid keys: {', '.join(keys)}"


def _unknown_key(key, ftypes, where):
    return ConfigError(f"{where}: unknown config key {key!r}; {did_you_mean(key, ftypes)}")


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


_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}
# The largest value arithmetic may make, far beyond any setting: an int of MAX_INT_BITS bits (about 1,233
# digits), a string, list or tuple of MAX_ITEMS items. Each is checked before the operation that could exceed
# it runs, so a line such as `_x = 9 ** 9 ** 9` is refused at once instead of computing for hours.
MAX_INT_BITS = 4096
MAX_ITEMS = 100_000
_INT_LIMIT = (f"beyond 2**{MAX_INT_BITS} (about 10**{MAX_INT_BITS * math.log10(2):.0f}), the largest int a config "
              f"value may be")
_ITEMS_LIMIT = f"more than the {MAX_ITEMS:,} a config value may hold"


class _Unfit(Exception):
    """Arithmetic in a config value that is too large or fails: (the expression, what is wrong with it);
    _read names the key, the file and the line."""


def _is_number(v):
    return isinstance(v, (int, float, complex))


def _is_sequence(v):
    return isinstance(v, (str, list, tuple))


def _arithmetic(op, operands, node):
    """op(*operands) for arithmetic on numbers, + of two sequences and * of a sequence by an int, each checked
    before it runs against MAX_INT_BITS and MAX_ITEMS. Raises _Unfit for a result too large, an operation on
    other values (such as % on a string, which formats it) and an ArithmeticError such as a division by 0."""
    code = ast.unparse(node)
    if op is operator.mul and len(operands) == 2 and any(map(_is_sequence, operands)):
        seq, n = operands if _is_sequence(operands[0]) else operands[::-1]
        if isinstance(n, int) and len(seq) * n > MAX_ITEMS:
            raise _Unfit(code, f"would hold {len(seq) * n:,} items, {_ITEMS_LIMIT}")
    elif op is operator.add and len(operands) == 2 and all(map(_is_sequence, operands)):
        pass  # no larger than its operands together; the result is checked below
    elif not all(map(_is_number, operands)):
        raise _Unfit(code, f"is not arithmetic on numbers (nor + or * of strings, lists and tuples): "
                           f"{' and '.join(type(v).__name__ for v in operands)}")
    elif op is operator.pow and all(isinstance(v, int) for v in operands):
        base, exponent = operands
        if exponent > 0 and abs(base) > 1 and exponent * math.log2(abs(base)) > MAX_INT_BITS:
            raise _Unfit(code, f"would be about 10**{exponent * math.log10(abs(base)):.0f}, {_INT_LIMIT}")
    try:
        value = op(*operands)
    except (ArithmeticError, TypeError) as e:
        raise _Unfit(code, f"cannot be computed: {e.args[-1] if e.args else e}") from None
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise _Unfit(code, f"is about 10**{math.log10(abs(value)):.0f}, {_INT_LIMIT}")
    if _is_sequence(value) and len(value) > MAX_ITEMS:
        raise _Unfit(code, f"holds {len(value):,} items, {_ITEMS_LIMIT}")
    return value


def _evaluate(node, names, where):
    """The value of a config expression: literals, tuples, lists, arithmetic on them (_arithmetic), and
    names assigned earlier (in this file or its bases). Raises ConfigError for anything else, _Unfit for
    arithmetic too large or failing."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, (ast.Tuple, ast.List)):
        items = [_evaluate(e, names, where) for e in node.elts]
        return tuple(items) if isinstance(node, ast.Tuple) else items
    if isinstance(node, ast.Name) and node.id in names:
        return names[node.id]
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        return _arithmetic(_BINARY[type(node.op)], [_evaluate(node.left, names, where),
                                                    _evaluate(node.right, names, where)], node)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _arithmetic(_UNARY[type(node.op)], [_evaluate(node.operand, names, where)], node)
    raise ConfigError(f"{where}: {ast.unparse(node)!r} is not a value; a config value is a literal, arithmetic on "
                      f"literals, or a key assigned above")


def _read(path, chain=()):
    """{key: (value, 'file, line n')} of a config file, its base's keys first. `chain`: the
    files that led here, for the cycle check."""
    if not os.path.isfile(path):
        raise ConfigError(f"config file {path!r} not found")
    if os.path.abspath(path) in chain:
        files = [os.path.relpath(p) for p in (*chain, os.path.abspath(path))]
        raise ConfigError(f"config files inherit from each other in a cycle: {' -> '.join(files)}")
    with open(path) as f:
        try:
            tree = ast.parse(f.read(), path)
        except SyntaxError as e:
            raise ConfigError(f"{path}, line {e.lineno}: {e.msg}") from None
    found, names = {}, {}
    for node in tree.body:
        where = f"{path}, line {node.lineno}"
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            continue  # a docstring
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
            raise ConfigError(f"{where}: a config file holds only assignments `key = value` (and `base = FILE`), "
                              f"not {ast.unparse(node).splitlines()[0]!r}")
        key = node.targets[0].id
        try:
            value = _evaluate(node.value, names, where)
        except _Unfit as e:
            code, problem = e.args
            whole = ast.unparse(node.value)
            raise ConfigError(f"{where}: {key} = {whole}" + (f": {code}" if code != whole else "")
                              + f" {problem}; write the value itself") from None
        if key == "base":
            bases = [value] if isinstance(value, str) else value
            if found or not isinstance(bases, (list, tuple)) or not bases or not all(
                    isinstance(b, str) for b in bases):
                raise ConfigError(f"{where}: `base = \"FILE\"` must be the first assignment, naming a config file "
                                  f"(or a list of them)")
            for name in bases:  # in order: a later base's setting replaces an earlier one's
                base = os.path.join(os.path.dirname(path), name)
                if not os.path.isfile(base):
                    raise ConfigError(f"{where}: base config {name!r} not found (looked for {base})")
                found.update(_read(base, (*chain, os.path.abspath(path))))
            names = {k: v for k, (v, _) in found.items()}
            continue
        names[key] = value
        if not key.startswith("_"):  # _name: a local helper value, not a setting
            found[key] = (value, where)
    return found


def read_config_file(path):
    """The settings of a config file as a dict, unvalidated.

    A config file holds assignments `key = value`, where a value is a literal, arithmetic
    on literals, or a key assigned above (`min_lr = learning_rate / 10`); names that start
    with _ are local helpers, not settings. A first line `base = "other.py"` (relative to
    the file) takes every setting of that file first, so a config says only how it
    differs; `base = ["a.py", "b.py"]` takes a's settings, then b's over them. Nothing in the
    file is executed. Raises ConfigError naming the file and line for anything else, a missing
    file or base, or a cycle of bases.
    """
    return {key: value for key, (value, _) in _read(path).items()}


def train_config_class():
    """train.py's TrainConfig (nonlinear_queries.config.train_config), loaded on first call. Its model fields are
    model.py's GPTConfig, whose module imports torch: the harness's commands that check no config (sweep.py
    --help and --status, study.py --help, compare.py) call this only where they check one, so they run without
    the training stack. This is the package's one import inside a function (tests/test_imports.py)."""
    from nonlinear_queries.config.train_config import TrainConfig

    return TrainConfig


def parse_config(config_cls, argv):
    """Build a `config_cls` dataclass instance from config files and --key=value overrides.

    argv: the command-line arguments after the script name. Returns (config, files), the
    resolved config and the list of config files read; config.set_keys is the frozenset of
    the keys the files and overrides assign, whatever their values (a key set to its default
    is set). A key in config_cls.COMMAND_LINE_ONLY ({key: why}, e.g. TrainConfig's overwrite,
    which deletes a run) is taken from an override only, never inherited from a file. Raises
    ConfigError for an unknown key, a command-line-only key in a file, a value of the wrong
    type or one that config_cls.__post_init__ rejects with a ValueError, a missing config
    file, or a malformed argument.
    """
    ftypes = {f.name: f.type for f in dataclasses.fields(config_cls)}
    command_line_only = getattr(config_cls, "COMMAND_LINE_ONLY", {})
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
            for key, (value, where) in _read(arg).items():
                if key not in ftypes:
                    raise _unknown_key(key, ftypes, where)
                if key in command_line_only:
                    raise ConfigError(f"{where}: {key} cannot be set in a config file: {command_line_only[key]}")
                values[key] = _check_type(key, value, ftypes[key], where)
            files.append(arg)
    try:
        config = config_cls(**values)
    except ValueError as e:  # a value the config's own validation rejects, e.g. an unknown query_mode
        raise ConfigError(str(e)) from None
    config.set_keys = frozenset(values)
    return config, files


def field_comments(cls):
    """{field: (section, comment)} for the dataclass fields that `cls` itself declares (not its bases), read from
    its source (inspect, tokenize, ast): a field's comment is the block of comment lines right above it, then the
    comment at the end of its line, joined into one paragraph ('' if it has neither). A comment block that follows
    a blank line opens a section: its first line is the section's title (such as `# AdamW`), '' before any.
    Raises OSError (inspect's) for a class whose source cannot be read."""
    source = textwrap.dedent("".join(inspect.getsourcelines(cls)[0]))
    lines = source.splitlines()
    comments = {}  # line number: (text, whether the comment is alone on its line)
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            comments[token.start[0]] = (token.string.lstrip("#").strip(), not token.line[:token.start[1]].strip())
    names = {f.name for f in dataclasses.fields(cls)} & set(inspect.get_annotations(cls))
    found, section = {}, ""
    for node in ast.parse(source).body[0].body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id in names):
            continue  # a method, a docstring, a ClassVar
        above, n = [], node.lineno - 1
        while n in comments and comments[n][1]:
            above.insert(0, comments[n][0])
            n -= 1
        if above and not lines[n - 1].strip():
            section = above.pop(0)
        trailing = [comments[i][0] for i in range(node.lineno, node.end_lineno + 1)
                    if i in comments and not comments[i][1]]
        found[node.target.id] = (section, " ".join(above + trailing))
    return found


def help_text(config_cls, prog, doc):
    """The text of `prog --help` for a program whose settings are the dataclass `config_cls`: a usage line, `doc`
    (the program's docstring; None for none), how config files and overrides are written, then every key as
    `key: type = default` over its comment (field_comments), grouped by the dataclass that declares it (its
    docstring's first line) and by the sections of that class's source. Lines fit the terminal's width."""
    width = max(shutil.get_terminal_size().columns - 2, 60)
    wrap = textwrap.TextWrapper(width, initial_indent="  ", subsequent_indent="  ", break_on_hyphens=False)
    parts = [f"usage: {prog} [-h] [CONFIG_FILE ...] [--KEY=VALUE ...]", *([inspect.cleandoc(doc)] if doc else []),
             "config files and overrides:\n" + wrap.fill(
                 "Positional arguments are config files of plain assignments `key = value` (train.py's are in "
                 "config/), read in order and never executed: a value is a Python literal, arithmetic on "
                 "literals, or a key assigned above, and a first line `base = \"other.py\"` takes that file's "
                 "settings first. Then each --KEY=VALUE overrides them, the value a Python literal; a string "
                 "needs no quotes. Every key, its type, default and meaning:")]
    fields = {f.name: f for f in dataclasses.fields(config_cls)}
    listed, blocks = set(), []
    for cls in [c for c in config_cls.__mro__ if dataclasses.is_dataclass(c)]:  # the most derived first
        own = {name: text for name, text in field_comments(cls).items() if name not in listed}
        listed |= set(own)  # a field a subclass declares again is listed with the subclass's default and comment
        if not own:
            continue
        summary = (inspect.getdoc(cls) or "").split("\n")[0]
        block, open_section = [cls.__name__ + (f": {summary}" if summary else "")], ""
        for name, (section, comment) in own.items():
            if section != open_section:
                block.append(f"  # {section}")
                open_section = section
            field = fields[name]
            block.append(f"  {name}: {getattr(field.type, '__name__', field.type)} = {field.default!r}")
            block += textwrap.wrap(comment, width, initial_indent=" " * 6, subsequent_indent=" " * 6,
                                   break_on_hyphens=False)
        blocks.insert(0, "\n".join(block))
    return "\n\n".join(parts + blocks)


def config_from_argv(config_cls, argv=None):
    """parse_config on sys.argv[1:], exiting with status 2 and the message on a ConfigError. With -h or --help
    anywhere among the arguments it prints help_text (the program's docstring: __main__'s) and exits 0."""
    argv = sys.argv[1:] if argv is None else argv
    if any(arg in HELP_FLAGS for arg in argv):
        # run_main: a reader that stops early (`--help | head`) ends it quietly
        sys.exit(run_main(print, help_text(config_cls, os.path.basename(sys.argv[0]), sys.modules["__main__"].__doc__)))
    try:
        return parse_config(config_cls, argv)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        sys.exit(2)
