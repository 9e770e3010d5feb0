"""Every generated table in results/*/README.md is what its command prints today on the committed runs.

Above each such table a README holds an HTML comment (invisible when rendered) naming the command that made it:

    <!-- table from: python compare.py results/ablations/{baseline,res_gelu} --paired --format=markdown -->

The test runs the command in this process (compare.py's or analyze.py's main) from the repo root and compares
the committed table with the printed one cell by cell. A README may leave out columns that are the same in
every row (it says so in its prose): the committed header must then be the printed header with those columns
removed, in the same order, and each row the printed row with the same columns removed. `(headers renamed)`
marks a table whose column headers a person rewrote (analyze.py's "baseline learning_rate=0.003 (n=3)" as
"baseline lr 3e-3"): its header is left out of the comparison, every other line is compared in full.
"""

import contextlib
import glob
import io
import os
import re
import shlex
import sys

import pytest

import analyze
import compare
from conftest import REPO

MARKER = re.compile(r"<!-- table (\(headers renamed\) )?from: python (compare|analyze)\.py (.*) -->$")
PROGRAMS = {"compare": compare, "analyze": analyze}


def brace_expand(word):
    """bash's expansion of one {a,b,c} group in a word (the READMEs' commands use one at most per word)."""
    match = re.search(r"\{([^{}]*,[^{}]*)\}", word)
    if not match:
        return [word]
    return [word[: match.start()] + part + word[match.end() :] for part in match.group(1).split(",")]


def generated_tables():
    """[(readme, line number, renamed, program, argv, committed table lines)] for every marker in the READMEs."""
    found = []
    for readme in sorted(glob.glob(os.path.join(REPO, "results", "*", "README.md"))):
        lines = open(readme).read().splitlines()
        for i, line in enumerate(lines):
            match = MARKER.match(line)
            if match:
                table = []
                for row in lines[i + 1 :]:
                    if not row.startswith("|"):
                        break
                    table.append(row)
                argv = [w for word in shlex.split(match.group(3)) for w in brace_expand(word)]
                found.append((os.path.relpath(readme, REPO), i + 1, bool(match.group(1)), match.group(2), argv,
                              table))
    return found


TABLES = generated_tables()


def cells(line):
    """The cells of a markdown table line."""
    return [c.strip() for c in line.strip().strip("|").split("|")]


def printed_table(program, argv):
    """The markdown table lines that `program`.py prints for argv, run from the repo root in this process."""
    out, cwd, saved = io.StringIO(), os.getcwd(), sys.argv
    try:
        os.chdir(REPO)
        sys.argv = [f"{program}.py", *argv]
        with contextlib.redirect_stdout(out):
            PROGRAMS[program].main()
    finally:
        os.chdir(cwd)
        sys.argv = saved
    return [line for line in out.getvalue().splitlines() if line.startswith("|")]


def test_every_results_readme_has_generated_tables():
    readmes = {readme for readme, *_ in TABLES}
    assert readmes == {f"results/{name}/README.md" for name in ("ablations", "diagnostics", "mini", "mini_modern")}
    assert sum(readme == "results/ablations/README.md" for readme, *_ in TABLES) == 4


@pytest.mark.parametrize("readme, line, renamed, program, argv, committed", TABLES,
                         ids=[f"{readme}:{line}" for readme, line, *_ in TABLES])
def test_committed_table_equals_what_its_command_prints(readme, line, renamed, program, argv, committed):
    assert len(committed) >= 3, f"{readme}:{line}: no table below the marker"
    printed = printed_table(program, argv)
    assert len(printed) == len(committed), f"{readme}:{line}: {len(printed)} printed lines, {len(committed)} committed"
    header = cells(printed[0])
    if renamed:
        keep = list(range(len(header)))
        assert len(cells(committed[0])) == len(header)
    else:
        shown = cells(committed[0])
        keep = [i for i, h in enumerate(header) if h in shown]
        assert [header[i] for i in keep] == shown, f"{readme}:{line}: columns not in the printed order"
    for number, (mine, theirs) in enumerate(zip(printed, committed)):
        if renamed and number == 0:
            continue
        row = cells(mine)
        assert [row[i] for i in keep] == cells(theirs), f"{readme}:{line + 1 + number}"
