"""
A study's declaration, fixed once a decision rests on it. study.json records the declaration the study runs under
(protocol.declaration: what its file declares that the decisions rest on, and its fingerprint, the SHA-256 of its
canonical JSON). Once study.json has recorded a decision, a look of its declared tests or an arm's tuned value, a
study file that declares otherwise is refused (`check`) before anything is run, reported or planned: a look
evaluated again on other seeds, at other boundaries or against another arm is a new question, and a new question
is a new study (its own name and results directory). A study.json written before declarations were recorded holds
none: it is taken as it is, and the declaration is recorded at its next write.
"""

import hashlib
import json
import os

from nonlinear_queries.errors import StudyError
from nonlinear_queries.experiments.protocol import advance, arm_dir, arms_at

# the study file's arrays of tables, keyed in the declaration by each one's name (a horizon's max_iters)
ARRAYS = {"arm": "{}", "horizon": "max_iters = {}", "test": "{}"}


def canonical(fields):
    """The declaration `fields` as JSON text with sorted keys and no spaces: one text per declaration."""
    return json.dumps(fields, sort_keys=True, separators=(",", ":"))


def fingerprint(fields):
    """'sha256:' and the hex SHA-256 of canonical(fields)."""
    return "sha256:" + hashlib.sha256(canonical(fields).encode()).hexdigest()


def entry(study):
    """study.json's 'declaration' entry: the study's declaration and its fingerprint."""
    return {"declaration": {"fingerprint": fingerprint(study.declared), "fields": study.declared}}


def changes(old, new, path=()):
    """[(path, old value, new value)] of every leaf where the declarations `old` and `new` differ, tables followed
    into (a table absent on one side, or null, counts as empty; an absent value is None), in sorted key order."""
    tables = all(v is None or isinstance(v, dict) for v in (old, new)) and (old is not None or new is not None)
    if tables:
        old, new = old or {}, new or {}
        return [c for k in sorted({*old, *new}) for c in changes(old.get(k), new.get(k), (*path, k))]
    return [] if old == new else [(path, old, new)]


def where(path):
    """A declaration path as the study file spells it: '[sequential] looks', '[[arm]] b: overrides.n_embd'."""
    head, rest = path[0], path[1:]
    if head in ARRAYS and rest:
        return f"[[{head}]] {ARRAYS[head].format(rest[0])}" + (f": {'.'.join(rest[1:])}" if rest[1:] else "")
    return f"[{head}] {'.'.join(rest)}" if rest else head


def _value(v):
    return "(not set)" if v is None else json.dumps(v)


def decided(recorded, key):
    """What `recorded` (a study.json) has decided, as text: its last evaluated look and each test's decision there,
    else its first tuning choice (an arm whose value was chosen on its grid) and how many more; None if nothing."""
    evaluated = (recorded.get("sequential") or {}).get("evaluated") or []
    if evaluated:
        last = max(e["look"] for e in evaluated)
        return f"look {last} ({', '.join(e['test'] + ': ' + e['decision'] for e in evaluated if e['look'] == last)})"
    choices = [(h, a, r["chosen"]) for h, arms in recorded.get("horizons", {}).items() for a, r in arms.items()
               if r.get("grid") and r.get("chosen") is not None]
    if not choices:
        return None
    (h, a, chosen), more = choices[0], len(choices) - 1
    return f"the tuning choice {key}={chosen} of arm {a} at {h} steps" + (f" (and {more} more)" if more else "")


def check(study):
    """Refuse to go on under a declaration other than the one study.json's decisions were made under. Returns
    nothing where RESULTS_DIR/study.json does not exist, records no decision, or records no declaration (written
    before they were). Raises StudyError, one sentence, naming the first key that changed (old -> new; the others by
    name), the look or tuning choice it would rewrite, and what to do: put it back, or declare a new study; or, the
    declaration unchanged, naming an arm whose tuning runs now choose another value than the one recorded."""
    path = os.path.join(study.results_dir, "study.json")
    if not os.path.exists(path):
        return
    try:
        with open(path) as f:
            recorded = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise StudyError(f"{path} cannot be read ({e}); restore it (it records the study's decisions) before "
                         f"running or reporting the study") from None
    event = decided(recorded, recorded.get("key", study.key))
    if event is None or "declaration" not in recorded:
        return
    fixed = recorded["declaration"]
    advice = ("a declaration is fixed once a look or tuning choice is recorded: put it back, or ask the new question "
              "as a new study (a new `name`, and a new `results_dir` where the file sets one)")
    if fixed.get("fingerprint") != fingerprint(study.declared):
        found = changes(fixed.get("fields"), json.loads(canonical(study.declared)))
        if not found:  # the fingerprint itself was edited
            found = [(("declaration",), fixed.get("fingerprint"), fingerprint(study.declared))]
        (key, old, new), rest = found[0], found[1:]
        also = f" (and {', '.join(where(p) for p, _, _ in rest)})" if rest else ""
        raise StudyError(f"{study.path} changes the declaration that {event} in {path} was decided under: "
                         f"{where(key)} {_value(old)} -> {_value(new)}{also}; {advice}")
    for horizon in study.horizons:
        for arm in arms_at(study, horizon):
            had = recorded.get("horizons", {}).get(str(horizon.max_iters), {}).get(arm.name, {})
            if had.get("grid") and had.get("chosen") is not None:
                now = advance(study, arm, horizon).chosen
                if now != had["chosen"]:
                    raise StudyError(f"{path} records {study.key}={had['chosen']} chosen for arm {arm.name} at "
                                     f"{horizon.max_iters} steps, and its tuning runs in "
                                     f"{arm_dir(study, arm, horizon)} now choose {now or 'none yet'}; restore those "
                                     f"runs, or ask the new question as a new study (a new `name`, and a new "
                                     f"`results_dir` where the file sets one)")
