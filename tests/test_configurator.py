"""configurator.py: config files are parsed, never executed; `base = FILE` inheritance, and
errors that name the file and the line."""

import glob
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, fields
from types import SimpleNamespace

import pytest

from helpers import REPO
from model import GPTConfig
from nonlinear_queries.config.configurator import parse_config, read_config_file
from nonlinear_queries.config.train_config import TrainConfig
from nonlinear_queries.errors import ConfigError
from nonlinear_queries.weights.start import RESUME, SCRATCH, Start, build_model


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path)


def test_every_config_in_the_repo_is_plain_assignments():
    paths = glob.glob(os.path.join(REPO, "config", "**", "*.py"), recursive=True)
    assert len(paths) >= 10
    for path in paths:
        parse_config(TrainConfig, [path])  # no exec: anything but assignments would be an error
        assert "exec(" not in open(path).read(), path


def test_base_is_read_first_relative_to_the_file(tmp_path):
    write(tmp_path / "base.py", '"""A docstring."""\nlearning_rate = 6e-4\nmin_lr = learning_rate / 10\nn_layer = 2\n')
    child = write(tmp_path / "arms" / "child.py", 'base = "../base.py"\n# a comment\nn_layer = 4\n'
                  'weight_decay = 2**-5\n_width = 64\nn_embd = _width * 2\n')
    assert read_config_file(child) == {"learning_rate": 6e-4, "min_lr": 6e-4 / 10, "n_layer": 4, "weight_decay": 2**-5,
                                       "n_embd": 128}
    cfg, files = parse_config(TrainConfig, [child, "--n_layer=6", "--n_head=4"])
    assert (cfg.n_layer, cfg.min_lr, cfg.n_embd, files) == (6, 6e-4 / 10, 128, [child])
    # the paper's configs: res_gelu differs from the baseline only where Table 1 says
    base, res = (read_config_file(os.path.join(REPO, "config", f"{n}.py")) for n in ("baseline", "res_gelu"))
    assert {k for k in res if res[k] != base.get(k)} == {"out_dir", "query_mode", "learning_rate", "min_lr",
                                                          "weight_decay"}


@pytest.mark.parametrize("files, message", [
    ({"a.py": 'base = "b.py"\n', "b.py": 'base = "a.py"\n'}, "config files inherit from each other in a cycle: "),
    ({"a.py": 'n_layer = 2\nbase = "b.py"\n', "b.py": ""}, "a.py, line 2: `base = \"FILE\"` must be the first"),
    ({"a.py": 'base = "missing.py"\n'}, "a.py, line 1: base config 'missing.py' not found"),
    ({"a.py": "import os\nn_layer = 2\n"}, "a.py, line 1: a config file holds only assignments `key = value`"),
    ({"a.py": "n_layer = int('2')\n"}, "a.py, line 1: \"int('2')\" is not a value"),
    ({"a.py": "n_layer = n_head\n"}, "a.py, line 1: 'n_head' is not a value"),
    ({"a.py": "n_layer = = 2\n"}, "a.py, line 1: invalid syntax"),
    ({"a.py": "learning_rate = 1e-3\nn_layers = 4\n"}, "a.py, line 2: unknown config key 'n_layers'; did you mean "
                                                       "'n_layer'?"),
    ({"a.py": 'n_layer = "four"\n'}, "a.py, line 1: n_layer must be int, got str 'four'"),
])
def test_bad_config_files_name_the_file_and_line(tmp_path, files, message):
    for name, text in files.items():
        write(tmp_path / name, text)
    with pytest.raises(ConfigError) as e:
        parse_config(TrainConfig, [str(tmp_path / "a.py")])
    assert message in str(e.value), str(e.value)


def test_a_list_of_bases_applies_them_in_order(tmp_path):
    write(tmp_path / "size.py", "n_layer = 2\nn_embd = 64\nlearning_rate = 1e-3\n")
    write(tmp_path / "recipe.py", "norm = 'rmsnorm'\nlearning_rate = 3e-3\n")
    child = write(tmp_path / "child.py", 'base = ["size.py", "recipe.py"]\nmin_lr = learning_rate / 10\n')
    assert read_config_file(child) == {"n_layer": 2, "n_embd": 64, "learning_rate": 3e-3, "norm": "rmsnorm",
                                       "min_lr": 3e-3 / 10}
    # the modern recipe is written once: GPT-2 small's and the CPU size's modern baselines both take it as a base
    modern, mini = (read_config_file(os.path.join(REPO, "config", *p)) for p in (("modern", "baseline.py"),
                                                                                 ("mini", "modern_baseline.py")))
    recipe = read_config_file(os.path.join(REPO, "config", "modern", "recipe.py"))
    assert all(modern[k] == mini[k] == v for k, v in recipe.items()) and modern["n_layer"] == 12 > mini["n_layer"]
    bad = write(tmp_path / "bad.py", 'base = ["size.py", 3]\n')
    with pytest.raises(ConfigError, match=r"bad.py, line 1: `base = \"FILE\"` must be the first assignment, naming "
                                          r"a config file \(or a list"):
        read_config_file(bad)


def test_a_bad_key_in_a_base_names_the_base(tmp_path):
    write(tmp_path / "base.py", "n_layer = 2\nlearnig_rate = 1e-3\n")
    child = write(tmp_path / "child.py", 'base = "base.py"\nn_layer = 3\n')
    with pytest.raises(ConfigError, match=r"base.py, line 2: unknown config key 'learnig_rate'"):
        parse_config(TrainConfig, [child])


# arithmetic whose result no setting could need, some of which would compute for hours or fill the memory
TOO_LARGE = {
    "_x = 9 ** 9 ** 9\n": "a.py, line 1: _x = 9 ** 9 ** 9 would be about 10**369693100, beyond 2**4096 (about "
                          "10**1233), the largest int a config value may be; write the value itself",
    "n_layer = 2\n_x = [0] * 10 ** 12\n": "a.py, line 2: _x = [0] * 10 ** 12 would hold 1,000,000,000,000 items, "
                                          "more than the 100,000 a config value may hold",
    "_a = 'ab' * 50000\n_b = _a + _a\n": "a.py, line 2: _b = _a + _a holds 200,000 items, more than the 100,000",
    "_x = 2 ** 4000 * 2 ** 100\n": "a.py, line 1: _x = 2 ** 4000 * 2 ** 100 is about 10**1234, beyond 2**4096",
    "eval_tasks = '%0999999999d' % 1\n": "a.py, line 1: eval_tasks = '%0999999999d' % 1 is not arithmetic on numbers",
    "min_lr = 1e-3 * (1 + 1 / 0)\n": "a.py, line 1: min_lr = 0.001 * (1 + 1 / 0): 1 / 0 cannot be computed: division "
                                    "by zero",
    "_x = 10.0 ** 400\n": "a.py, line 1: _x = 10.0 ** 400 cannot be computed: Numerical result out of range",
}


def test_arithmetic_too_large_for_a_setting_is_refused_at_once(tmp_path):
    # in a child process with a time limit: before the bound, `9 ** 9 ** 9` computed for hours
    paths = [write(tmp_path / str(i) / "a.py", text) for i, text in enumerate(TOO_LARGE)]
    child = ("import json, sys\n"
             "from nonlinear_queries.config.configurator import parse_config\n"
             "from nonlinear_queries.config.train_config import TrainConfig\n"
             "from nonlinear_queries.errors import ConfigError\n"
             "errors = []\n"
             "for path in sys.argv[1:]:\n"
             "    try:\n"
             "        parse_config(TrainConfig, [path])\n"
             "        errors.append(None)\n"
             "    except ConfigError as e:\n"
             "        errors.append(str(e))\n"
             "print(json.dumps(errors))\n")
    start = time.time()
    proc = subprocess.run([sys.executable, "-c", child, *paths], cwd=REPO, capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": REPO})
    assert proc.returncode == 0, proc.stderr
    assert time.time() - start < 30
    for path, message, error in zip(paths, TOO_LARGE.values(), json.loads(proc.stdout)):
        assert error is not None and error.startswith(path.removesuffix("a.py")) and message in error, error
    # what a config needs still computes: the largest int, a long string, a float's power
    write(tmp_path / "ok.py", "_big = 2 ** 4095 + (2 ** 4095 - 1)\n_b = 'x' * 100000\nweight_decay = 2.0 ** -5\n"
                              "n_layer = _big // 2 ** 4093\n")
    assert read_config_file(str(tmp_path / "ok.py")) == {"weight_decay": 2**-5, "n_layer": 7}


def test_no_committed_config_deletes_a_run(tmp_path):
    # overwrite deletes the run in out_dir: a config someone builds on with their own --out_dir must not carry it
    paths = glob.glob(os.path.join(REPO, "config", "**", "*.py"), recursive=True)
    assert not [p for p in paths if "overwrite" in read_config_file(p)]
    quick = write(tmp_path / "quick.py", 'base = "' + os.path.join(REPO, "config", "quickstart.py") + '"\n'
                  'overwrite = True\n')
    with pytest.raises(ConfigError) as e:
        parse_config(TrainConfig, [quick, "--out_dir=mine"])
    assert str(e.value) == (f"{quick}, line 2: overwrite cannot be set in a config file: it deletes the run already "
                            f"in out_dir; pass --overwrite=True on the command line where you mean it")
    cfg, _ = parse_config(TrainConfig, [os.path.join(REPO, "config", "quickstart.py")])
    assert cfg.overwrite is False
    assert parse_config(TrainConfig, [os.path.join(REPO, "config", "quickstart.py"), "--overwrite=True"])[0].overwrite


def test_a_model_key_set_to_its_default_is_a_setting(tmp_path):
    # --query_mode=linear asks for the linear query even though linear is the default: resuming a res_gelu
    # checkpoint with it must be refused (checkpoint.check_resumable), not read as "unset"
    cfg, _ = parse_config(TrainConfig, ["--query_mode=linear", "--learning_rate=1e-3"])
    assert cfg.model_settings() == {"query_mode": "linear"}
    from_file = write(tmp_path / "c.py", 'query_mode = "linear"\nn_layer = 12\nn_embd = 96\n')
    assert parse_config(TrainConfig, [from_file])[0].model_settings() == {"query_mode": "linear", "n_layer": 12,
                                                                          "n_embd": 96}
    assert parse_config(TrainConfig, [])[0].model_settings() == {}
    # a config built in code has no record of what was set: the keys that differ from the defaults
    assert TrainConfig(query_mode="linear", n_embd=96).model_settings() == {"n_embd": 96}


def test_the_models_config_is_made_and_checked_once_and_is_what_the_model_holds(monkeypatch):
    made = []  # the class of each config that GPTConfig's checks ran on
    check = GPTConfig.__post_init__
    monkeypatch.setattr(GPTConfig, "__post_init__", lambda self: made.append(type(self)) or check(self))
    cfg, _ = parse_config(TrainConfig, ["--query_mode=res_gelu", "--n_layer=2", "--n_head=2", "--n_embd=32",
                                        "--block_size=16", "--vocab_size=64"])
    assert made == [GPTConfig]  # the model's config, made once; the TrainConfig's own checks skip the model's
    model_config = cfg.model_config()
    assert asdict(model_config) == {f.name: getattr(cfg, f.name) for f in fields(GPTConfig)}
    runtime = SimpleNamespace(device="cpu")
    # from scratch the GPT holds that same object, which the checkpoint records; the run's config is unchanged
    run_cfg, model = build_model(cfg, runtime, Start(SCRATCH), {})
    assert made == [GPTConfig] and run_cfg is cfg and model.config is model_config
    # resumed: the checkpoint's settings over the config's make the one config more, the model's, which the
    # run's config then says (config.json, the metrics header), its set_keys kept; `cfg` itself is left as it was
    run_cfg, model = build_model(cfg, runtime, Start(RESUME, "ckpt.pt"), {"n_layer": 3, "query_rank": 8})
    assert made == [GPTConfig, GPTConfig] and run_cfg.model_config() is model.config
    assert (run_cfg.n_layer, run_cfg.query_rank, cfg.n_layer, cfg.query_rank) == (3, 8, 2, 0)
    assert asdict(run_cfg) == {**asdict(cfg), "n_layer": 3, "query_rank": 8} and run_cfg.set_keys == cfg.set_keys
    # the training settings are checked against a model's settings it takes: μP is not fine-tuned
    with pytest.raises(ValueError, match="parametrization='mup' trains a model from scratch"):
        TrainConfig(init_from="gpt2").with_model(GPTConfig(parametrization="mup"))


@pytest.mark.parametrize("arg, message", [
    ("--max_iters=-5", "max_iters must be >= 0, got -5"),
    ("--learning_rate=-1e-3", "learning_rate must be >= 0, got -0.001"),
    ("--beta2=1.5", "AdamW's beta1 and beta2 must be in [0, 1), got 0.9 and 1.5"),
    ("--data_seed=-1", "data_seed must be >= 0, got -1"),
    ("--n_head=0", "n_head must be >= 1, got 0"),
    ("--block_size=-8", "block_size must be >= 1, got -8"),
    ("--dropout=1.0", "dropout must be in [0, 1) and mlp_ratio > 0, got 1.0 and 4.0"),
])
def test_a_value_out_of_range_names_the_key_and_the_rule(arg, message):
    with pytest.raises(ConfigError) as e:
        parse_config(TrainConfig, [arg])
    assert str(e.value) == message
