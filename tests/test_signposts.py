"""The signposts are true: what the docs, comments and docstrings point a reader to exists (a README
section, a file, a function of the package or of the model), and every module of the package is on
its one map (nonlinear_queries/__init__.py), every room of it in the README's layout."""

import ast
import importlib
import io
import os
import re
import subprocess
import sys
import tokenize

import scipy.stats

from helpers import REPO

MODEL_NAMES = ("GPT", "GPTConfig")
FILE_EXTENSIONS = ("py", "md", "html", "conf", "json", "jsonl", "toml", "log", "pt", "bin", "txt")
# {module: its dotted name} of the package's modules, in its rooms or at its top
PACKAGE = {f[:-3]: ".".join((*os.path.relpath(folder, REPO).split(os.sep), f[:-3]))
           for folder, _, files in os.walk(os.path.join(REPO, "nonlinear_queries"))
           for f in files if f.endswith(".py") and f != "__init__.py"}
ROOMS = sorted(f for f in os.listdir(os.path.join(REPO, "nonlinear_queries"))
               if os.path.isfile(os.path.join(REPO, "nonlinear_queries", f, "__init__.py")))


def tracked(*patterns):
    """The repo's tracked files matching the git pathspecs, this file left out (its examples name nothing)."""
    return [path for path in subprocess.run(["git", "ls-files", *patterns], cwd=REPO, capture_output=True,
                                            text=True, check=True).stdout.split()
            if path != "tests/test_signposts.py"]


def prose(path):
    """What a reader reads in `path`: a markdown file whole; of a Python file, its comments and docstrings."""
    with open(os.path.join(REPO, path)) as f:
        source = f.read()
    if path.endswith(".md"):
        return source
    parts = [t.string for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            parts.append(ast.get_docstring(node) or "")
    return "\n".join(parts)


def sections(readme):
    """The headings of the markdown file `readme` (a path from the repo root)."""
    with open(os.path.join(REPO, readme)) as f:
        return {m[1].strip() for m in re.finditer(r"^#+ (.+)$", f.read(), re.MULTILINE)}


def model_instance_attributes():
    """Attributes that GPT's methods set on self (GPT.mup_roles and the like), which the class itself lacks."""
    with open(os.path.join(REPO, "model.py")) as f:
        return set(re.findall(r"\bself\.(\w+) =", f.read()))


def exists(reference, instance_attributes):
    """Whether `module.name` (a module of the package, with or without its dotted path) or `GPT.name` /
    `GPTConfig.name` names something real. `stats.name` may also be scipy.stats's, which the results READMEs
    cite by that name."""
    owner, name = re.sub(r"^nonlinear_queries\.(?:(?:" + "|".join(ROOMS) + r")\.)?", "", reference).split(".")[:2]
    if owner in MODEL_NAMES:
        cls = getattr(importlib.import_module("model"), owner)
        return hasattr(cls, name) or name in getattr(cls, "__dataclass_fields__", {}) or name in instance_attributes
    module = importlib.import_module(PACKAGE[owner])
    return hasattr(module, name) or (owner == "stats" and hasattr(scipy.stats, name))


def test_every_readme_section_a_file_cites_exists():
    # README "X", README's "X", or results/NAME/README.md, "X": a section of that README
    cited = r'((?:[\w-]+/)*README(?:\.md)?)(?:\'s)?,? "([^"]+)"'
    missing = []
    for path in tracked("*.py", "*.md", "*.toml"):
        if path.endswith(".toml"):
            with open(os.path.join(REPO, path)) as f:
                text = f.read()
        else:
            text = prose(path)
        for readme, section in re.findall(cited, text):
            readme = readme if readme.endswith(".md") else f"{readme}.md"
            if not os.path.exists(os.path.join(REPO, readme)) or section not in sections(readme):
                missing.append((path, readme, section))
    assert not missing, f"README sections that do not exist: {missing}"


def test_every_function_a_doc_or_comment_names_exists():
    names = (r"(?<![\w.])((?:nonlinear_queries\.(?:(?:" + "|".join(ROOMS) + r")\.)?)?(?:"
             + "|".join((*MODEL_NAMES, *PACKAGE)) + r")\.[A-Za-z_]\w*)")
    instance_attributes, missing = model_instance_attributes(), []
    for path in tracked("*.py", "*.md"):
        for m in re.finditer(names, prose(path)):
            suffix = m[1].rsplit(".", 1)[1]
            if suffix in FILE_EXTENSIONS or exists(m[1], instance_attributes):  # slurm.conf is a file
                continue
            missing.append((path, m[1]))
    assert not missing, f"functions and attributes that do not exist: {missing}"


def test_every_file_a_markdown_link_points_to_exists():
    missing = []
    for path in tracked("*.md"):
        with open(os.path.join(REPO, path)) as f:
            for target in re.findall(r"\]\(([^)\s]+)\)", f.read()):
                target = target.split("#")[0]
                if target and not target.startswith(("http://", "https://")) and not os.path.exists(
                        os.path.join(REPO, os.path.dirname(path), target)):
                    missing.append((path, target))
    assert not missing, f"links to files that do not exist: {missing}"


def test_every_module_of_the_package_is_on_its_map_and_every_room_in_the_readme():
    with open(os.path.join(REPO, "nonlinear_queries", "__init__.py")) as f:
        docstring = ast.get_docstring(ast.parse(f.read()))
    # the __init__ docstring's "- a, b: what" lines; the README layout's indented "  room/   what" lines
    listed_init = {n.strip() for line in re.findall(r"^- ([\w, ]+):", docstring, re.MULTILINE)
                   for n in line.split(",")}
    with open(os.path.join(REPO, "README.md")) as f:
        readme = f.read()
    layout = readme[readme.index("## Layout"):]
    listed_readme = set(re.findall(r"^  (\w+)/  ", layout, re.MULTILINE))
    assert set(PACKAGE) == listed_init, "nonlinear_queries/__init__.py's map and the package's modules differ"
    assert set(ROOMS) == listed_readme, "the README's layout and the package's rooms differ"


def test_no_two_modules_of_the_package_define_one_public_name():
    # a reader who meets `read_checkpoint` or `run` knows which one it is
    defined = {}
    for module, dotted in PACKAGE.items():
        with open(os.path.join(REPO, *dotted.split(".")) + ".py") as f:
            for node in ast.parse(f.read()).body:
                if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
                    defined.setdefault(node.name, []).append(module)
    assert {name: modules for name, modules in defined.items() if len(modules) > 1} == {}


def test_ci_runs_the_readme_s_test_command_and_the_suite_refuses_a_distribution_that_splits_its_groups():
    with open(os.path.join(REPO, "README.md")) as f:
        readme = f.read()
    with open(os.path.join(REPO, ".ci", "run")) as f:
        ci = f.read()
    command = re.search(r"Then the tests:\n\n```bash\n(.+)\n```", readme).group(1)
    assert command.startswith("python -m pytest") and "--dist loadgroup" in command and command in ci.splitlines()
    # -n without --dist loadgroup would spread the SLURM cluster's tests over workers (tests/conftest.py)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "--collect-only", "tests/test_lint.py"],
                          cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 4 and "--dist load: run the suite with -n N --dist loadgroup" in proc.stderr


def test_the_checkpoint_format_is_described_once_and_lists_every_key_a_checkpoint_needs():
    # the one description, nonlinear_queries/weights/checkpoint.py's docstring, which the docs link to
    from nonlinear_queries.weights import checkpoint
    listed = set(re.findall(r"^    (\w+) {2,}\S", checkpoint.__doc__, re.MULTILINE))
    assert checkpoint.CHECKPOINT_KEYS | {"config", "grad_scaler"} == listed
