"""
Compare runs written by train.py: the paper's Table 1, and with --plot its Figure 1.

    python compare.py out-baseline out-res-gelu                    # baseline = the first run's group
    python compare.py sweeps/seeds --baseline=baseline             # a sweep directory: one run per subdirectory
    python compare.py out-* --step=59000 --baseline=baseline --format=markdown   # the paper's step, for RESULTS.md
    python compare.py sweeps/lr --group_over=seed,data_seed --format=csv > lr.csv
    python compare.py out-baseline out-res-gelu --plot=figure1.png
    python compare.py out-mini/* --best_over=learning_rate         # each arm at its own best learning rate
    python compare.py out-baseline out-res-gelu --metric=hellaswag/acc_norm   # a downstream score beside val loss
    python compare.py results/ablations/{baseline,res_gelu} --best_over=learning_rate --select_on=seed=0 --holm --paired
    python compare.py results/width_transfer/* --width_transfer --plot=transfer.png   # the best rate per width
    python compare.py results/width_ladder/{baseline,res_gelu,res_gelu_no_half}_w* \
        results/long_horizon/{baseline,res_gelu,res_gelu_no_half} --width_ladder --seeds=1,2,3,4,5 \
        --baseline=baseline    # the gap per width (128: long_horizon's runs) and its slope: results/width_ladder

Runs whose settings are equal except for --group_over (default: seed) and for settings that
cannot change the numbers (paths, logging, compile, ...) form a group, one row of the table:
the mean ± sample std of the validation loss over the group's n runs at one eval step, by
default the last step that every run that did not diverge has reached. rel. improvement is
(L_base - L) / L_base of the group means in percent (the paper's Table 1; positive = lower loss than the
baseline); p is Welch's t-test against the baseline group when both have n >= 2. A run that
diverged is left out of its group's mean and n, and its row says so. --metric=TASK/METRIC
(train.py's eval_tasks: the `downstream` records) adds a column with that score at the same
step, mean ± sample std over the group's runs like the loss.

A run's history is its metrics.jsonl as it stands now: a `config` record at step s (a
restart) replaces what an earlier session logged after step s, and of records logged twice
the later one counts. A setting missing from an older run's config (one added to train.py
later) counts as today's default, which reproduces what the older code did. --seeds keeps only the runs
with those seeds (e.g. the held-out ones). A directory that is not a run stands for every run beneath it (a
sweep, a study's arms), and files among the paths (the README.md a glob catches) are skipped with a note.

Across widths (nonlinear_queries/analysis/width.py, docs/width.md): --width_transfer tables each arm's mean val loss
at every learning rate per width and parametrization, where the best rate sits and whether it transfers;
--width_ladder each arm's relative improvement over the baseline at each width (runs paired by seed, 95% CI)
and its slope against log2(width), and with --effect_difference PLUS MINUS CONTROL the difference of
three arms' gaps per seed (what dropping res_gelu's 1/2 gains minus what doubling the baseline's softmax
scale gains) per width and pooled; with --plot, their figures instead of Figure 1 (with --pooled_plot, the
pooled tests' estimates and D instead of the per-width figure). Exit status: 0 ok; 1 bad
input (a run given twice, as a copy, among them); 2 bad command line; a reader that goes early
(`| head -1`) ends it by SIGPIPE, as it does Unix tools.
"""

import nonlinear_queries.interrupt  # noqa: F401  (first: Ctrl-C at any moment ends with one line)

import sys

from nonlinear_queries.analysis.comparison import (
    parse_args,
    report,
)
from nonlinear_queries.cli import run_main
from nonlinear_queries.errors import RunsError


def main(argv=None):
    """Read the runs named on the command line, print the table and, with --plot, write the figure; exits with
    status 1 and one line on stderr for a figure that cannot be written or runs that cannot be compared as asked."""
    args = parse_args(argv, __doc__)
    try:
        report(args)
    except RunsError as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    sys.exit(run_main(main))
