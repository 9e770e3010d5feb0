"""The import graph runs one way: no module of the package and no program at the repo's root imports
itself back through others (no circle, a function's import included: none dodges one), a program that
only reads a model imports no training code (optimizers, batches, torch.distributed.checkpoint), and the
experiment harness's commands that train nothing (help, a sweep's status) import no torch. study.py --dry_run
does: it checks every planned run's TrainConfig, whose model fields are model.py's GPTConfig."""

import ast
import os
import re
import subprocess
import sys

import pytest

from helpers import REPO

# what only training needs: its optimizers, its batches, and DCP (torch.distributed.checkpoint, sharded checkpoints)
TRAINING_ONLY = ("nonlinear_queries.trainer.optimizers", "nonlinear_queries.data.batches",
                 "torch.distributed.checkpoint")
# the package's rooms bottom-up, as its __init__.py lists them (its modules at the top first): each imports only
# rooms before it
ROOMS = ["cli", "interrupt", "errors", "config", "record", "data", "ops", "runtime", "trainer", "weights", "evaluation",
         "analysis", "experiments"]
# the one function of the package that imports a module of it: TrainConfig, whose model fields bring torch, loaded
# where a config is checked, so the harness's commands that check none run without torch
DOOR_TO_TORCH = ("nonlinear_queries.config.configurator", "train_config_class")
# the harness's commands that start no run, and a module each must have loaded (the command did run)
HARNESS_COMMANDS = {
    "sweep.py --help": "nonlinear_queries.experiments.sweeps",
    "sweep.py --status SWEEP": "nonlinear_queries.record.lock",
    "study.py --help": "nonlinear_queries.experiments.protocol",
    "compare.py --help": "nonlinear_queries.analysis.comparison",
}


def repo_modules():
    """{module name: path} of the package's modules (a package by its __init__.py, a room's module by its
    dotted name) and the programs at the repo's root (model.py among them)."""
    modules = {f[:-3]: os.path.join(REPO, f) for f in os.listdir(REPO) if f.endswith(".py")}
    for folder, _, files in os.walk(os.path.join(REPO, "nonlinear_queries")):
        package = os.path.relpath(folder, REPO).replace(os.sep, ".")
        for f in files:
            if f.endswith(".py"):
                modules[package if f == "__init__.py" else f"{package}.{f[:-3]}"] = os.path.join(folder, f)
    return modules


def import_nodes(path):
    """The import statements of the Python file at `path`, wherever they stand (a function's too)."""
    with open(path) as f:
        tree = ast.parse(f.read())
    return [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]


def imported(node, name, modules):
    """The modules of `modules` that the import statement `node` in the module `name` loads."""
    if isinstance(node, ast.Import):
        candidates = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:  # relative: from the package the module `name` stands in
            package = name if name == "nonlinear_queries" else name.rpartition(".")[0]
            base = ".".join(p for p in (package, base) if p)
        # `from nonlinear_queries.runtime import processes` loads nonlinear_queries.runtime.processes
        candidates = [base, *(f"{base}.{alias.name}" for alias in node.names)]
    return {c for c in candidates if c in modules and c != name}


def import_graph():
    """{module: {module it imports: line of the import}} over repo_modules."""
    modules = repo_modules()
    graph = {}
    for name, path in modules.items():
        graph[name] = {}
        for node in import_nodes(path):
            for target in imported(node, name, modules):
                graph[name].setdefault(target, node.lineno)
    return graph


def find_circle(graph):
    """One circle of `graph` as [a, b, ..., a], or None where there is none (a depth-first search)."""
    done, path = set(), []

    def visit(name):
        if name in path:
            return path[path.index(name):] + [name]
        if name in done:
            return None
        path.append(name)
        for target in sorted(graph[name]):
            circle = visit(target)
            if circle:
                return circle
        path.pop()
        done.add(name)
        return None

    for name in sorted(graph):
        circle = visit(name)
        if circle:
            return circle
    return None


def test_the_import_graph_has_no_circle():
    graph = import_graph()
    # the walk read the package's rooms and the root
    assert "nonlinear_queries.weights.checkpoint" in graph and "sample" in graph
    circle = find_circle(graph)
    assert circle is None, "an import circle: " + " -> ".join(
        f"{a} (line {graph[a][b]})" for a, b in zip(circle, circle[1:])) + f" -> {circle[-1]}"


def room(module):
    """The room of the package that `module` (a dotted name) stands in, or None for a program at the root."""
    parts = module.split(".")
    return parts[1] if parts[0] == "nonlinear_queries" and len(parts) > 1 else None


def test_the_package_is_a_few_rooms_each_importing_only_the_rooms_below_it():
    package = os.path.join(REPO, "nonlinear_queries")
    top = sorted(f.removesuffix(".py") for f in os.listdir(package) if f != "__init__.py" and (
        f.endswith(".py") or os.path.isfile(os.path.join(package, f, "__init__.py"))))
    assert top == sorted(ROOMS) and len(top) <= 13
    with open(os.path.join(package, "__init__.py")) as f:
        listed = re.findall(r"^(\w+)(?:, \w+)*(?::| \(modules at the top\))", f.read(), re.MULTILINE)
    assert listed == ["cli", *ROOMS[3:]], "the __init__ docstring's rooms, bottom-up, are ROOMS"
    upward = [(a, b, line) for a, targets in import_graph().items() for b, line in targets.items()
              if room(a) and room(b) and room(a) != room(b) and ROOMS.index(room(b)) > ROOMS.index(room(a))]
    assert upward == [], f"imports of a room listed later (module, module, line): {upward}"


def test_no_function_of_the_package_imports_a_module_of_the_package():
    # an import inside a function that dodges a circle hides the graph; third-party ones (matplotlib, lm-eval)
    # may wait until needed, and so may a program's (analyze.py loads the trainer only for --coord_check)
    modules, found = repo_modules(), []
    for name, path in modules.items():
        if not name.startswith("nonlinear_queries"):
            continue
        with open(path) as f:
            tree = ast.parse(f.read())
        functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                     and (name, n.name) != DOOR_TO_TORCH]
        for node in {i for fn in functions for i in ast.walk(fn) if isinstance(i, (ast.Import, ast.ImportFrom))}:
            if any(t.startswith("nonlinear_queries") for t in imported(node, name, modules)):
                found.append((path.removeprefix(REPO + os.sep), node.lineno))
    assert found == [], f"function-level imports of the package: {found}"


def test_the_loader_of_models_stands_on_the_sources_side():
    # pretrained (every source) reads files through checkpoint_file; checkpoint (the training state) never
    # loads a model, and neither of the two imports the other
    graph = import_graph()
    assert "nonlinear_queries.weights.checkpoint_file" in graph["nonlinear_queries.weights.pretrained"]
    assert "nonlinear_queries.weights.checkpoint" not in graph["nonlinear_queries.weights.pretrained"]
    assert "nonlinear_queries.weights.pretrained" not in graph["nonlinear_queries.weights.checkpoint"]


@pytest.mark.parametrize("program", ["sample.py", "export.py"])
def test_a_program_that_only_reads_a_model_imports_no_training_code(program):
    # the program's own import statements, run in a fresh interpreter (the program itself would run)
    with open(os.path.join(REPO, program)) as f:
        source = f.read()
    statements = [ast.get_source_segment(source, node) for node in import_nodes(os.path.join(REPO, program))]
    code = "\n".join([*statements, "import sys", "print('\\n'.join(sorted(sys.modules)))"])
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": REPO}, timeout=300)
    assert proc.returncode == 0, proc.stderr
    loaded = proc.stdout.split()
    assert "nonlinear_queries.weights.pretrained" in loaded  # the statements did load the program's modules
    found = [m for m in loaded if any(m == t or m.startswith(t + ".") for t in TRAINING_ONLY)]
    assert found == [], f"{program} imports training code: {found}"


def importtime_modules(stderr):
    """The modules, in import order, that `python -X importtime` reports on `stderr` (the last column of each
    'import time:' line, its nesting's indent stripped)."""
    return [line.rpartition("|")[2].strip() for line in stderr.splitlines() if line.startswith("import time:")]


def test_importtime_modules_reads_python_s_report():
    stderr = ("import time: self [us] | cumulative | imported package\n"
              "import time:       120 |        120 |   torch._C\n"
              "import time:      3001 |       3121 | torch\n"
              "a warning on stderr\n")
    assert importtime_modules(stderr) == ["imported package", "torch._C", "torch"]


@pytest.mark.slow
@pytest.mark.parametrize("command", sorted(HARNESS_COMMANDS))
def test_a_harness_command_that_trains_nothing_imports_no_torch(command, tmp_path):
    # a sweep of one point that never started: --status reads its directory (the run's status, its lock)
    (tmp_path / "sweep.json").write_text('{"points": ["seed=1"], "max_iters": {"seed=1": 10}}')
    program, *args = command.replace("SWEEP", str(tmp_path)).split()
    proc = subprocess.run([sys.executable, "-X", "importtime", os.path.join(REPO, program), *args], cwd=REPO,
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": REPO}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    loaded = importtime_modules(proc.stderr)
    assert HARNESS_COMMANDS[command] in loaded
    torch = [m for m in loaded if m == "torch" or m.startswith("torch.")]
    assert torch == [], f"{command} imports torch ({len(torch)} of its modules)"


@pytest.mark.slow
def test_every_module_of_the_analysis_and_the_experiments_imports_no_torch():
    # the rooms that read runs' records and plan studies; measuring a model is the evaluation room's
    rooms = ("nonlinear_queries.analysis.", "nonlinear_queries.experiments.")
    names = sorted(name for name in repo_modules() if name.startswith(rooms))
    assert {"nonlinear_queries.analysis.comparison", "nonlinear_queries.experiments.sweeps"} <= set(names), names
    code = (f"import importlib, sys\nfor name in {names!r}:\n    importlib.import_module(name)\n"
            f"print('torch' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": REPO}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout == "False\n", f"importing {names} loads torch"
