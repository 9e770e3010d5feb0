"""
Downstream evaluation through EleutherAI's lm-evaluation-harness (lm-eval 0.4; Gao et al.,
"A framework for few-shot language model evaluation", Zenodo 2023): any of its
tasks, or tasks defined from local files, for any model pretrained.load_model loads (eval.py)
or for the model being trained (train.py's eval_tasks). The tasks, their prompts and their
metrics are lm-eval's; this module only scores text with our GPT.

- GPTLM is our GPT as an lm-eval model (`lm_eval.api.model.TemplateLM`), registered under
  MODEL_NAME, so once this module is imported
      lm_eval.simple_evaluate(model="nonlinear-queries", model_args="pretrained=out-quickstart", tasks=[...])
  works as for lm-eval's own models. It encodes with the run's own tokenizer (tokenizer.py).
- Offline use: lm-eval's stock tasks load their data from the Hugging Face hub. A hub that
  does not answer within seconds puts this process in offline mode (local tasks and the
  local Hugging Face cache still work), and a task that then needs the hub is an EvalError
  that says how to define a local task instead (docs/evaluation.md).
- DownstreamEval runs eval_tasks inside train.py and turns lm-eval's results into
  `downstream` records of metrics.jsonl.

Imported only by eval.py and by train.py when eval_tasks is set: lm-eval takes about a
second to import, and the index of its ~15,000 stock tasks about 9 s to build on a CPU
(skipped when every task named is a local one).
"""

import copy
import datetime
import difflib
import os
import random
import sys
from contextlib import contextmanager

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.defaults import DEFAULT_MAX_GEN_TOKS, DEFAULT_OTHER_SEED, DEFAULT_RANDOM_SEED
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
from tqdm import tqdm

from model import GPT
from nonlinear_queries.data.hub import check_hub_reachable, hub_endpoint, hub_offline
from nonlinear_queries.data.tokenizer import run_tokenizer
from nonlinear_queries.errors import DataError, EvalError
from nonlinear_queries.runtime.processes import setup
from nonlinear_queries.trainer.training import should_eval
from nonlinear_queries.weights.pretrained import load_model

MODEL_NAME = "nonlinear-queries"  # the name lm-eval knows GPTLM by
# tokens generated between two checks for a stop sequence: each chunk runs the prompt once more,
# so smaller chunks cost prompt passes and larger ones tokens generated past the stop
GENERATE_CHUNK = 32
HUB_TIMEOUT = 5.0  # seconds the hub has to answer before this process goes offline
# How long the other ranks of a multi-process run wait for rank 0's tasks (DownstreamEval.evaluate): far beyond any
# task list. A rank 0 that fails instead ends the run at once: torchrun stops every process when one fails.
TASKS_TIMEOUT = datetime.timedelta(hours=24)
LOCAL_TASK_HINT = (
    "To run a task without the hub, copy its data files over and define it as a local task: a YAML file with "
    "`dataset_path: json` and `dataset_kwargs: {data_files: {validation: FILE.jsonl}}` in a directory passed with "
    "--include_path (eval.py) or eval_tasks_include_path (train.py), as tasks/example_mc.yaml is; docs/evaluation.md "
    "shows HellaSwag")
unreachable_hub = None  # why prepare_hub put this process offline, if it did


class TasksStopped(Exception):
    """A stop request (GPTLM's should_stop) gave the tasks up between two batches."""


@register_model(MODEL_NAME)
class GPTLM(TemplateLM):
    """Our GPT as an lm-eval model, for the three request types of lm_eval.api.model.LM.

    pretrained: a source pretrained.load_model reads (a run's out_dir, a checkpoint, gpt2, a Hugging
    Face or export.py directory), whose tokenizer is the run's own (tokenizer.run_tokenizer); or a
    GPT object, with its `tokenizer` (the model in training). batch_size: sequences per forward
    pass. device, dtype: as processes.setup ('auto': CUDA with bfloat16 autocast if available, else
    the CPU in float32). max_gen_toks: generate_until's length limit when a task sets none.
    progress: whether to show progress bars.

    - loglikelihood: log P(continuation | context) in nats, the sum of the continuation tokens'
      log-softmax, and whether greedy decoding gives exactly those tokens. Context and
      continuation are encoded together (lm-eval's TemplateLM), the context is cut from the left
      so that the input fits block_size, and an empty context is the end-of-text token.
    - loglikelihood_rolling: the log-likelihood of a whole text after the end-of-text token,
      in lm-eval's windows (lm_eval.utils.get_rolling_token_windows with context_len=1 and
      make_disjoint_window): consecutive non-overlapping blocks of block_size predicted tokens,
      each token scored once, with the context inside its own block only; the last block's
      input is the block_size tokens before its end, of which it scores only the new ones.
    - generate_until: the KV-cache generate() (model.py) from the context's last block_size
      tokens, greedy unless the task asks for do_sample; the text up to the first stop sequence
      (`until`, and GPT-2's end-of-text), at most max_gen_toks tokens.

    Raises ValueError for a bad batch_size or a continuation longer than block_size, and
    PretrainedError or SetupError for a source or device that cannot be used.
    """

    def __init__(self, pretrained, batch_size=8, device="auto", dtype="auto", tokenizer=None,
                 max_gen_toks=DEFAULT_MAX_GEN_TOKS, progress=True, should_stop=None):
        super().__init__()
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
        runtime = setup(device, dtype, join_process_group=False)
        if isinstance(pretrained, GPT):
            if tokenizer is None:
                raise ValueError("a GPT object needs its tokenizer: GPTLM(model, tokenizer=run_tokenizer(...))")
            model = pretrained
        else:
            model = load_model(str(pretrained)).to(runtime.device).eval()
            tokenizer = tokenizer or run_tokenizer(model.loaded_from.run_config)
        self.model, self.tokenizer, self.autocast = model, tokenizer, runtime.autocast
        self._device = torch.device(runtime.device)
        self.batch_size, self.max_gen_toks, self.progress = batch_size, max_gen_toks, progress
        self.should_stop = should_stop or (lambda: False)  # asked before each batch: True raises TasksStopped

    @property
    def eot_token_id(self):
        return self.tokenizer.eot_token

    @property
    def max_length(self):
        return self.model.config.block_size

    @property
    def tokenizer_name(self):
        return self.tokenizer.name

    def tok_encode(self, string, add_special_tokens=None, **kwargs):
        try:
            return self.tokenizer.encode(string)
        except ValueError as e:  # a character-level model and a character its data does not have
            raise EvalError(f"a task's text has {e}") from None

    def get_model_info(self):
        """What lm-eval records as the model in its results' config."""
        loaded = getattr(self.model, "loaded_from", None)
        return {"source": loaded.path if loaded else "the model in training", "kind": loaded.kind if loaded else None,
                "step": loaded.step if loaded else None, "query_mode": self.model.config.query_mode,
                "block_size": self.max_length, "tokenizer": self.tokenizer.name}

    def loglikelihood(self, requests, disable_tqdm=False):
        return super().loglikelihood(requests, disable_tqdm or not self.progress)

    @torch.no_grad()
    def _loglikelihood_tokens(self, requests, disable_tqdm=False):
        """requests: [(cache key or None, context ids, continuation ids)]; returns [(log-likelihood, is_greedy)].
        Inputs are sorted longest first, so that a batch holds similar lengths; shorter rows are padded on the
        right, which the causal attention keeps from every real position."""
        T = self.max_length
        rows = []
        for _, context, continuation in requests:
            if len(continuation) > T:
                raise ValueError(f"a continuation of {len(continuation)} tokens does not fit block_size {T}")
            rows.append(((context + continuation)[-(T + 1) :][:-1], continuation))
        order = sorted(range(len(rows)), key=lambda i: -len(rows[i][0]))
        results = [None] * len(rows)
        for start in tqdm(range(0, len(order), self.batch_size), disable=disable_tqdm or not self.progress,
                          desc="loglikelihood batches"):
            if self.should_stop():
                raise TasksStopped
            batch = order[start : start + self.batch_size]
            idx = torch.zeros((len(batch), len(rows[batch[0]][0])), dtype=torch.long)
            for r, i in enumerate(batch):
                idx[r, : len(rows[i][0])] = torch.tensor(rows[i][0])
            # position p predicts token p + 1, so the last len(continuation) positions predict the continuation;
            # only their logits are computed
            spans = [(len(rows[i][0]) - len(rows[i][1]), len(rows[i][0])) for i in batch]
            with self.autocast:
                hidden = self.model.hidden_states(idx.to(self.device))
                logits = self.model.logits(torch.cat([hidden[r, a:b] for r, (a, b) in enumerate(spans)]))
            logprobs = F.log_softmax(logits.float(), dim=-1).split([b - a for a, b in spans])
            for i, lp in zip(batch, logprobs):
                target = torch.tensor(rows[i][1], device=self.device)
                results[i] = (lp.gather(-1, target[:, None]).sum().item(), bool((lp.argmax(dim=-1) == target).all()))
                if requests[i][0] is not None:
                    self.cache_hook.add_partial("loglikelihood", requests[i][0], results[i])
        return results

    def loglikelihood_rolling(self, requests, disable_tqdm=False):
        windows, owner = [], []
        for i, request in enumerate(requests):
            (text,) = request.args
            for context, continuation in map(make_disjoint_window, get_rolling_token_windows(
                    self.tok_encode(text), self.prefix_token_id, self.max_length, context_len=1)):
                windows.append((None, context, continuation))
                owner.append(i)
        totals = [0.0] * len(requests)
        for i, (loglikelihood, _) in zip(owner, self._loglikelihood_tokens(windows, disable_tqdm)):
            totals[i] += loglikelihood
        for request, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", request.args, total)
        return totals

    def generate_until(self, requests, disable_tqdm=False):
        texts = []
        for request in tqdm(requests, disable=disable_tqdm or not self.progress, desc="generate_until"):
            if self.should_stop():
                raise TasksStopped
            context, gen_kwargs = request.args
            settings = dict(gen_kwargs)
            until = settings.pop("until", None) or []
            until = [until] if isinstance(until, str) else list(until)
            max_gen_toks = int(settings.pop("max_gen_toks", self.max_gen_toks))
            sample = settings.pop("do_sample", False)
            temperature = float(settings.pop("temperature", 0.0))
            top_k = settings.pop("top_k", None)
            if settings:
                raise ValueError(f"generation settings {sorted(settings)} are not supported; this model takes until, "
                                 f"max_gen_toks, do_sample, temperature and top_k")
            if self.tokenizer.name == "gpt2":  # a GPT-2 text ends at end-of-text
                until.append(self.tokenizer.decode([self.eot_token_id]))
            text = self.generate(context, until, max_gen_toks, temperature if sample else 0.0, top_k)
            self.cache_hook.add_partial("generate_until", request.args, text)
            texts.append(text)
        return texts

    @torch.no_grad()
    def generate(self, context, until, max_gen_toks, temperature=0.0, top_k=None):
        """The text the model generates after `context` up to the first of the strings `until`, at most
        max_gen_toks tokens; temperature 0 is greedy."""
        prompt = self.tok_encode(context)[-self.max_length :] or [self.prefix_token_id]
        idx, text = torch.tensor([prompt], device=self.device), ""
        while idx.size(1) - len(prompt) < max_gen_toks:
            with self.autocast:
                idx = self.model.generate(idx, min(GENERATE_CHUNK, max_gen_toks - (idx.size(1) - len(prompt))),
                                          temperature=temperature, top_k=top_k)
            text = self.tokenizer.decode(idx[0, len(prompt) :].tolist())
            stops = [text.index(s) for s in until if s in text]
            if stops:
                return text[: min(stops)]
        return text


def task_names(tasks):
    """The names in a comma-separated list of lm-eval task, group or tag names (or task YAML files)."""
    names = [n.strip() for n in tasks.split(",") if n.strip()]
    if not names:
        raise EvalError(f"no task named in {tasks!r}; name lm-eval tasks, e.g. hellaswag,arc_easy")
    return names


def prepare_hub(timeout=HUB_TIMEOUT):
    """Ask the Hugging Face hub for an answer within `timeout` seconds, unless offline mode is set; if it gives
    none, put this process in offline mode, so that datasets reads local files and its cache at once instead of
    retrying the hub for half a minute per task. Prints what it did. Returns whether the process is offline."""
    global unreachable_hub
    if hub_offline():
        return True
    try:
        check_hub_reachable(timeout)
        return False
    except DataError as e:
        unreachable_hub = f"{hub_endpoint()} ({e.__cause__})"
    print(f"the Hugging Face hub does not answer at {unreachable_hub}: running offline, on local tasks and the local "
          f"Hugging Face cache", file=sys.stderr)
    os.environ["HF_HUB_OFFLINE"] = os.environ["HF_DATASETS_OFFLINE"] = "1"
    # both libraries read the variables once, at import; set their flags too where they are imported already
    for module, flag in (("huggingface_hub.constants", "HF_HUB_OFFLINE"), ("datasets.config", "HF_HUB_OFFLINE")):
        if module in sys.modules:
            setattr(sys.modules[module], flag, True)
    return True


def task_manager(names, include_path=""):
    """lm-eval's TaskManager for the tasks `names`: only include_path's YAML files if they define every one (fast),
    else lm-eval's stock tasks too. Raises EvalError for a name neither defines, with the closest names."""
    from lm_eval.tasks import TaskManager

    if include_path and not os.path.isdir(include_path):
        raise EvalError(f"include_path {include_path!r} is not a directory; pass the directory of your task YAMLs")
    if include_path:
        local = TaskManager(include_path=include_path, include_defaults=False)
        if all(n in local.all_tasks or os.path.isfile(n) for n in names):
            return local
    manager = TaskManager(include_path=include_path or None)
    for name in names:
        if name not in manager.all_tasks and not os.path.isfile(name):
            close = difflib.get_close_matches(name, manager.all_tasks, n=3)
            raise EvalError(f"unknown task {name!r}" + (f" (did you mean {' or '.join(close)}?)" if close else "")
                            + f": neither one of lm-eval's {len(manager.all_tasks):,} tasks, groups and tags nor a "
                            f"YAML file" + (f", and {include_path} defines no such task" if include_path else "")
                            + ". `lm-eval ls tasks` lists them; a local task is a YAML file in a directory passed "
                            "with --include_path")
    return manager


@contextmanager
def task_errors():
    """Turn the errors of loading a task's data into an EvalError that says what to do."""
    try:
        yield
    except ConnectionError as e:  # datasets' OfflineModeIsEnabled, or the hub going away
        why = (f"does not answer at {unreachable_hub}" if unreachable_hub else "is off (HF_HUB_OFFLINE or "
               "HF_DATASETS_OFFLINE)" if hub_offline() else "cannot be reached")
        raise EvalError(f"a task's data is on the Hugging Face hub, which {why}, and not in the local cache ({e}). "
                        f"{LOCAL_TASK_HINT}") from None
    except FileNotFoundError as e:  # a local data file, or a data set the hub does not have
        raise EvalError(f"a task's data was not found: {e}. Check dataset_path and data_files in the task's YAML "
                        f"(relative paths are from the current directory)") from None


@contextmanager
def preserved_rng():
    """Leave Python's, NumPy's and torch's random generators as they were: run_tasks seeds all three."""
    python_state, numpy_state = random.getstate(), np.random.get_state()
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        yield
    random.setstate(python_state)
    np.random.set_state(numpy_state)


def load_tasks(names, manager):
    """Load the tasks once, data included, so that a missing file or an unreachable hub is an EvalError now."""
    with task_errors():
        manager.load(names)


def run_tasks(lm, names, manager, limit=0, num_fewshot=None, bootstrap_iters=100000):
    """lm-eval's evaluation of the GPTLM `lm` on the tasks `names` of `manager` (task_manager), as
    lm_eval.simple_evaluate runs it: its seeds (Python 0, NumPy and torch 1234, few-shot sampling 1234), and
    num_fewshot (None keeps each task's own, 0 where it has none; a task that fixes 0 keeps 0), then
    lm_eval.evaluate. What simple_evaluate adds besides, a report of the environment that takes seconds, is left
    to eval.py. limit > 0 takes each task's first `limit` examples; bootstrap_iters 0 skips the standard errors that
    need resampling. Returns lm-eval's results dict. Raises EvalError (task_errors)."""
    from lm_eval.evaluator import evaluate

    with task_errors(), preserved_rng():
        random.seed(DEFAULT_RANDOM_SEED)
        np.random.seed(DEFAULT_OTHER_SEED)
        torch.manual_seed(DEFAULT_OTHER_SEED)
        loaded = manager.load(names)
        for task in loaded["tasks"].values():
            if num_fewshot is not None and task.get_config("num_fewshot") != 0:
                task.set_config(key="num_fewshot", value=num_fewshot)
            elif task.get_config("num_fewshot") is None:
                task.set_config(key="num_fewshot", value=0)
            task.set_fewshot_seed(seed=DEFAULT_OTHER_SEED)
        return evaluate(lm=lm, task_dict=loaded, limit=limit or None, bootstrap_iters=bootstrap_iters,
                        log_samples=False)


def task_scores(results):
    """{task: {metric: value}} from lm-eval's results: each metric under its own name when its filter is 'none'
    (lm-eval's 'acc,none' -> 'acc'), else as 'metric,filter'; standard errors left out; `examples`, the number
    of examples scored."""
    scores = {}
    for task, values in results["results"].items():
        scores[task] = {k.removesuffix(",none"): v for k, v in values.items()
                        if "," in k and "_stderr," not in k and isinstance(v, (int, float))}
        if task in results.get("n-samples", {}):
            scores[task]["examples"] = results["n-samples"][task]["effective"]
    return scores


class DownstreamEval:
    """train.py's eval_tasks: lm-eval's tasks on the model in training, on the master rank.

    cfg: the TrainConfig (eval_tasks, eval_tasks_interval, eval_tasks_limit, eval_tasks_include_path, batch_size,
    dataset, data_dir); runtime: the Runtime. Built before the run starts, on every rank, it checks the task names and
    loads their data once: EvalError for a task that cannot run. In a process group it also makes a gloo group of
    all the ranks (a collective: every rank builds it), whose barrier keeps the others waiting while rank 0 runs
    the tasks (evaluate).
    """

    def __init__(self, cfg, runtime):
        self.names = task_names(cfg.eval_tasks)
        prepare_hub()
        self.manager = task_manager(self.names, cfg.eval_tasks_include_path)
        load_tasks(self.names, self.manager)
        # the schedule of should_eval, at its own interval: a copy of the checked config (nothing checked again)
        self.schedule = copy.copy(cfg)
        self.schedule.eval_interval = cfg.eval_tasks_interval or cfg.eval_interval
        self.tokenizer = run_tokenizer({"dataset": cfg.dataset, "data_dir": cfg.data_dir})
        self.cfg, self.runtime = cfg, runtime
        self.group = dist.new_group(backend="gloo", timeout=TASKS_TIMEOUT) if runtime.distributed else None

    def due(self, step, start_step, resumed_after_eval, stopping):
        """Whether to run the tasks at `step`: as should_eval (training.py) with eval_tasks_interval."""
        return should_eval(step, self.schedule, start_step, resumed_after_eval, stopping)

    def evaluate(self, model, step, should_stop=None):
        """Run the tasks on `model` (the GPT, not a DDP or compiled wrapper) in eval mode, under the run's autocast,
        leaving it in training mode and every random generator as it was. Call it on every rank: rank 0 runs the
        tasks while the others wait for it at the barrier of a gloo group (torch.distributed.monitored_barrier,
        time-out TASKS_TIMEOUT), not in the next step's collective, whose time-out (NCCL's 10 minutes by default)
        a long task list would exceed. Returns, on rank 0, one record per task (and group): {"type": "downstream",
        "step", "task", <metric>: value, "examples"}; [] on the other ranks. should_stop: asked by rank 0 before
        each batch; once it says True the tasks are given up and rank 0 returns None (a signal: stopping.py; the
        ranks then agree on the stop through the training step's vote)."""
        records = []
        if self.runtime.master:
            lm = GPTLM(model, batch_size=self.cfg.batch_size, device=self.runtime.device, dtype=self.runtime.dtype,
                       tokenizer=self.tokenizer, progress=False, should_stop=should_stop)
            model.eval()
            try:
                results = run_tasks(lm, self.names, self.manager, self.cfg.eval_tasks_limit, bootstrap_iters=0)
                records = [{"type": "downstream", "step": step, "task": task, **metrics}
                           for task, metrics in task_scores(results).items()]
            except TasksStopped:
                records = None
            finally:
                model.train()
        if self.group is not None:
            dist.monitored_barrier(self.group, timeout=TASKS_TIMEOUT)
        return records

    @staticmethod
    def describe(record):
        """A downstream record as one line of the training log."""
        values = ", ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in record.items()
                           if k not in ("type", "step", "task"))
        return f"step {record['step']}: {record['task']}: {values}"
