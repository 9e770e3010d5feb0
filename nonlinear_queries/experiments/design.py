"""
Operating characteristics of candidate group-sequential designs for a study's declared test, computed before any of
its runs: for each design (looks, spending, futility), the boundaries carried to t, and from simulated studies
(sequential.operating_characteristics, seeded) the rejection rate and the expected runs under each effect, at the
spread of the study's [power] pilot (or given sd).

    python -m nonlinear_queries.experiments.design studies/width256_e.toml --effects 0 0.45 0.86
    python -m nonlinear_queries.experiments.design studies/width256_e.toml --effects 0 0.45 0.86 --pilot_seeds 11 20

The first line's table is the one results/width_ladder/width256_e/README.md's declaration chose its design from.

With --family, a study's family of declared tests: each rule ('fixed_sequence', 'holm') at each candidate schedule of
looks, under the [power] effects, under each of them alone set to 0 and under all 0 (family_rows):

    python -m nonlinear_queries.experiments.design studies/width256_gate.toml --family

results/width_ladder/width256_gate/README.md's declaration chose its rule and looks from that table.
"""

import argparse
import sys

import numpy as np

from nonlinear_queries.analysis import sequential
from nonlinear_queries.errors import StudyError
from nonlinear_queries.experiments import looks
from nonlinear_queries.experiments.protocol import load_study

# (looks, spending, futility |z| bounds per look but the last): the designs compared
CANDIDATES = [
    ([30], "obrien_fleming", []),
    ([15, 30], "obrien_fleming", []),
    ([10, 20, 30], "obrien_fleming", []),
    ([10, 20, 30], "obrien_fleming", [0.0, 1.0]),
    ([10, 20, 30], "pocock", []),
    ([10, 20, 30, 40], "obrien_fleming", []),
]


def design_rows(looks_list, effects, sd, level=0.05, studies=20_000, seed=0, arms=2):
    """Rows (lists of text) of the design table: per candidate its looks, spending, futility, t boundaries, and per
    effect the share of simulated studies that reject and the expected runs (seeds an arm x `arms`)."""
    rows = []
    for looks_, spending, futility in looks_list:
        _, tb, ft = sequential.look_boundaries(looks_, level, spending, futility)
        row = ["/".join(map(str, looks_)), looks.SPENDING_NAMES[spending] if len(looks_) > 1 else "fixed n",
               ", ".join(f"{f:g}" for f in futility) or "none", ", ".join(f"{b:.2f}" for b in tb)]
        for effect in effects:
            oc = sequential.operating_characteristics(looks_, tb, effect, sd, studies, seed, ft or None)
            row += [f"{oc.rejected:.3f}", f"{arms * oc.expected_seeds:.1f}"]
        rows.append(row)
    return rows


# the schedules of looks (seeds an arm) a family's rules are compared at
FAMILY_LOOKS = [[20], [8, 16], [10, 20], [12, 24], [10, 20, 30]]


def family_rows(study, schedules, studies=20_000):
    """(header, rows) of the family table: per rule and schedule, its t boundaries at the first level; at the [power]
    effects, the share of simulated studies that reject each test and the expected runs (seeds an arm x arms); with
    every effect 0, the share that reject any test and the expected runs; and with one effect 0 and the others as
    planned, the share that reject that test (the largest over the tests): sequential.simulate_family, no futility
    bound. The spreads are each test's [power] spread (looks.spread); the covariance
    sequential.contrast_covariance's."""
    tests = [next(t for t in study.tests if t.name == n) for n in study.family]
    sds = [looks.spread(study, t)[0] for t in tests]
    cov = sequential.contrast_covariance([(t.baseline, t.contrast) for t in tests], sds)
    effects = [study.power.targets[t.name].effect for t in tests]
    n_arms = len({a for t in tests for a in (t.baseline, *t.contrast)})
    header = ["rule", "looks (seeds an arm)", "t boundaries at the first level",
              *(f"at the effects: rejects {t.name}" for t in tests), "at the effects: expected runs",
              "every effect 0: rejects any", "every effect 0: expected runs", "one effect 0: rejects it (largest)"]

    def simulated(rule, schedule, means):
        return sequential.simulate_family(schedule, means, cov, tests[0].level, study.sequential.spending, rule,
                                          studies=studies)

    rows = []
    for rule in sequential.FAMILY_RULES:
        for schedule in schedules:
            level = sequential.holm_levels(tests[0].level, len(tests))[0] if rule == "holm" else tests[0].level
            tb = sequential.look_boundaries(schedule, level, study.sequential.spending)[1]
            at, null = simulated(rule, schedule, effects), simulated(rule, schedule, [0.0] * len(tests))
            partial = max(simulated(rule, schedule, [0.0 if j == i else e for j, e in enumerate(effects)]).rejected[i]
                          for i in range(len(tests)))
            rows.append([rule.replace("_", " "), "/".join(map(str, schedule)), ", ".join(f"{b:.2f}" for b in tb),
                         *(f"{p:.3f}" for p in at.rejected), f"{n_arms * at.expected_seeds:.1f}",
                         f"{null.false_rejection:.3f}", f"{n_arms * null.expected_seeds:.1f}", f"{partial:.3f}"])
    return header, rows


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("study", help="a study file with a declared [[test]] and its [power] (pilot or sd)")
    parser.add_argument("--effects", type=float, nargs="+", default=[0.0, 0.45, 0.86], help="true E, points")
    parser.add_argument("--sd", type=float, default=None, help="the spread (points); default: the [power]'s")
    parser.add_argument("--pilot_seeds", type=int, nargs=2, metavar=("FIRST", "LAST"), default=None,
                        help="the spread of the pilot's seeds FIRST..LAST alone")
    parser.add_argument("--studies", type=int, default=20_000, help="simulated studies per design and effect")
    parser.add_argument("--family", action="store_true",
                        help="compare the family's rules at several schedules of looks (the study's [family])")
    args = parser.parse_args(argv)
    if args.family:
        try:
            study = load_study(args.study)
            if not study.family or study.sequential is None:
                raise StudyError(f"{args.study} declares no [family] with [sequential] looks")
            header, rows = family_rows(study, FAMILY_LOOKS, args.studies)
        except (StudyError, KeyError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(f"the family {', '.join(study.family)}: two-sided level {study.tests[0].level:g} over the family, "
              f"{args.studies:,} simulated studies per row and scenario (numpy seed 0), spreads "
              + ", ".join(f"{t.name} {looks.spread(study, t)[0]:.3f}" for t in study.tests) + " points\n")
        for line in [header, ["---"] * 3 + ["---:"] * (len(header) - 3), *rows]:
            print("| " + " | ".join(line) + " |")
        print(f"\neffects: {', '.join(f'{n} {study.power.targets[n].effect:g}' for n in study.family)} points")
        return 0
    try:
        study = load_study(args.study)
        test = study.tests[0]
        target = study.power.targets[test.name]
        if args.sd or target.sd:
            sd, basis = args.sd or target.sd, "given"
        else:
            seeds, d, _ = looks.pilot_contrast(study, test, target)
            first, last = args.pilot_seeds or (seeds[0], seeds[-1])
            d = [x for s, x in zip(seeds, d) if first <= s <= last]
            sd, basis = float(np.std(d, ddof=1)), f"the pilot's seeds {first}-{last} ({len(d)} pairs)"
    except (StudyError, AttributeError, IndexError, KeyError) as e:
        print(f"error: {args.study} needs a [[test]] and its [power] table ({e})", file=sys.stderr)
        return 2
    arms = 1 + len(test.contrast)
    print(f"{test.name}: two-sided level {test.level:g}, sd {sd:.3f} points ({basis}), {args.studies:,} simulated "
          f"studies per design and effect (numpy seed 0); runs = seeds an arm x {arms} arms\n")
    header = ["looks (seeds an arm)", "spending", "futility: stop if abs(z) <", "t boundaries"]
    for effect in args.effects:
        header += [f"rejects at E = {effect:g}", f"expected runs at E = {effect:g}"]
    rows = design_rows(CANDIDATES, args.effects, sd, test.level, args.studies, arms=arms)
    for line in [header, ["---"] * 4 + ["---:"] * (len(header) - 4), *rows]:
        print("| " + " | ".join(line) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
