"""Every program at the root answers --help and -h with exit 0; those that take a config dataclass list
each key with its type, default and comment, read from the dataclass's source (configurator.help_text)."""

import dataclasses
import glob
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import ClassVar

import pytest

from helpers import REPO
from nonlinear_queries.config.configurator import config_from_argv, field_comments, help_text
from nonlinear_queries.config.train_config import TrainConfig

# root .py files that are not programs: imported, never run
NOT_PROGRAMS = {"model.py"}
# per program, what its help must show: a config key with its type and default, or an option
MUST_SHOW = {
    "train.py": ["learning_rate: float = 0.0006", "AdamW's peak rate", "max_iters: int = 60000", "n_layer: int = 12"],
    "sample.py": ["temperature: float = 0.8", "out_dir: str = 'out'"],
    "eval.py": ["tasks: str = ''", "batch_size: int = 8"],
    "export.py": ["to: str = ''", "the directory to write model.safetensors"],
    "compare.py": ["--best_over", "--group_over"],
    "analyze.py": ["--checkpoint", "--coord_check"],
    "sweep.py": ["--grid", "--launcher", "python train.py --help"],
    "study.py": ["--dry_run"],
}


@dataclass
class Toy:
    """A toy config: its first line heads its keys."""

    kept: ClassVar[int] = 3  # a ClassVar, not a setting

    plain: int = 1
    trailing: float = 0.5  # the comment at the end of the line
    # the lines above a field
    # are its comment
    above: str = "x"  # and the end of its line follows them

    # first section
    # the first line after a blank line is the section's title
    opened: bool = True
    tupled: tuple = ()  # still in the first section

    # second section
    last: str = ""


def test_field_comments_read_the_dataclass_source():
    assert field_comments(Toy) == {
        "plain": ("", ""),
        "trailing": ("", "the comment at the end of the line"),
        "above": ("", "the lines above a field are its comment and the end of its line follows them"),
        "opened": ("first section", "the first line after a blank line is the section's title"),
        "tupled": ("first section", "still in the first section"),
        "last": ("second section", ""),
    }


def test_help_text_lists_every_key_with_type_default_and_comment():
    text = help_text(TrainConfig, "train.py", "\nTrain a GPT.\n\n    python train.py config/quickstart.py\n")
    lines = text.splitlines()
    assert lines[0] == "usage: train.py [-h] [CONFIG_FILE ...] [--KEY=VALUE ...]"
    assert "    python train.py config/quickstart.py" in lines and "config files and overrides:" in lines
    for f in dataclasses.fields(TrainConfig):
        key = f"  {f.name}: {f.type.__name__} = {f.default!r}"
        assert key in lines, key
        # every setting says what it is: a field added without a comment fails here
        assert lines[lines.index(key) + 1].startswith("      "), f"{f.name} has no comment in its dataclass"
    at = lines.index("  learning_rate: float = 0.0006")
    assert lines[at - 1] == "  # AdamW" and lines[at + 1].strip().startswith("AdamW's peak rate")
    # the model's keys under GPTConfig first, then the training's
    assert lines.index("  n_layer: int = 12") < lines.index("  out_dir: str = 'out'")


def test_a_help_flag_anywhere_prints_the_help_and_exits_0(capsys):
    for argv in (["-h"], ["--help"], ["config/quickstart.py", "--plain=2", "--help"], ["no-such-file.py", "-h"]):
        with pytest.raises(SystemExit) as e:
            config_from_argv(Toy, argv)
        assert e.value.code in (0, None)
        out = capsys.readouterr().out
        assert "Toy: A toy config: its first line heads its keys." in out
        assert "  trailing: float = 0.5\n      the comment at the end of the line\n" in out
        assert "  # second section\n  last: str = ''\n" in out
    assert config_from_argv(Toy, ["--plain=2"])[0].plain == 2  # without it, the config as before


def root_programs():
    """The .py files at the repo root that are programs: a new one is checked without being named here."""
    return sorted(os.path.basename(p) for p in glob.glob(os.path.join(REPO, "*.py"))
                  if os.path.basename(p) not in NOT_PROGRAMS)


@pytest.mark.slow
def test_every_root_program_answers_help():
    programs = root_programs()
    assert set(programs) == set(MUST_SHOW), "a program at the root without an entry in MUST_SHOW, or one gone"
    # all at once: each imports torch for seconds
    procs = {(p, flag): subprocess.Popen([sys.executable, os.path.join(REPO, p), flag], cwd=REPO, text=True,
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for p in programs for flag in ("--help", "-h")}
    outputs = {}
    for (program, flag), proc in procs.items():
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, f"{program} {flag} exited {proc.returncode}: {err}"
        assert out.startswith(f"usage: {program} "), f"{program} {flag}: {out[:200]}"
        assert f"python {program}" in out, f"{program} {flag} shows no example command"
        for shown in MUST_SHOW[program]:
            assert shown in out, f"{program} {flag} does not show {shown!r}"
        outputs[program, flag] = out
    for program in programs:
        assert outputs[program, "--help"] == outputs[program, "-h"]
