"""
The library shared by the programs at the repo's root (train.py, sample.py, eval.py,
export.py, compare.py, analyze.py, sweep.py, study.py); the model itself is the root's model.py,
which imports nothing from here. This is the package's one map: a room a concern, a module a line.

The rooms are listed bottom-up: a room imports only rooms listed before it (tests/test_imports.py holds
the order), so the shell, the errors and the config come first, then the run record and the data, the model's
ops and the process runtime, the trainer, the weights, the evaluation of models, the analysis of runs and the
experiments. The analysis and the experiments import no torch; they load it only where they check a config
(configurator.train_config_class: TrainConfig's model fields are model.py's), so sweep.py --help and --status,
study.py --help and compare.py --help run without the training stack (tests/test_imports.py holds both).

cli, interrupt, errors (modules at the top)
- cli: a program piped into one that stops reading (`| head`) ends quietly; this process's own command line
  rebuilt (run_command, resume_command)
- interrupt: Ctrl-C at any moment, torch's import included, ends a program with one line
- errors: the package's errors in one place, one class a concern (setup, out_dir, checkpoint, config, data, eval,
  pretrained, runs, studies, pilots), importing nothing, so every room, the torch-free ones too, raises them from here

config: what a run is told
- configurator: config files parsed (never executed), `--key=value`, each error naming the key, file and line
- train_config: the checked TrainConfig, train.py's every setting and its default

record: the run directory and every file written
- atomic: every file the repo writes appears whole or not at all
- runs: the run directory's one owner (RunDir: every file name in it, the checkpoints' among them, the header and
  config.json, its status, replacing a run), its metrics.jsonl written (and wandb) and read, sweep directories
- lock: one training run per out_dir at a time (flock), train.py's run taking its out_dir (hold_run_dir: the lock
  is a file of the run directory, so it stands with the record), and the sweep's claim on a point

data: tokens in
- hub: the Hugging Face hub, offline-aware
- tokenizer, corpus: documents -> GPT-2 tokens -> train.bin/val.bin
- batches: token memmaps and the fixed-seed index streams every variant shares

ops: the model's own ops, beside the model they serve (model.py calls them through its hooks)
- kernels: res_gelu's f and the cross-entropy as Triton custom ops, with a PyTorch path (TrainConfig's kernels)

runtime: a process's setup and teardown, which every program that runs a model stands on
- processes: device, dtype, process group, DDP/FSDP2 wrapping, compile, MFU

trainer: the training step and what runs around it
- training: one optimizer step, evaluation, the learning-rate schedule, divergence
- optimizers: AdamW (and Muon for the modern recipe), μP's per-group rates
- stopping: a signal stops a run at the next step boundary (every rank at the same one), or at once
- budget: a run's memory floor and CPU step time, known before its first step

weights: models and training states in and out
- checkpoint: train.py's Checkpointer (which checkpoint to resume, its checks and restore, when to save),
  atomic single-file and sharded (DCP) checkpoints: the training state alone;
  `python -m nonlinear_queries.weights.checkpoint --out_dir=RUN` makes a sharded one a single file
- checkpoint_file: a checkpoint file read (the one torch.load, weights only), for checkpoint and pretrained
- pretrained: load_model, every program's loader of any source (a run's checkpoint, GPT-2, Hugging Face,
  the official code's), and weights out (Hugging Face GPT-2 format)
- start: where a run's weights come from, resolved once from init_from (scratch, resume or fine-tune), and its
  model built

evaluation: models measured, with torch
- downstream: lm-evaluation-harness on this repo's models (eval.py, train.py's eval_tasks)
- coord_check: μP's coordinate check of a config's widths (analyze.py --coord_check)
- diagnostics: per-layer attention-logit, entropy and query statistics: a model measured, any model (analyze.py),
  not only the one in training (train.py's evaluations)

analysis: what runs say, read from their records
- arms, stats, plots: runs grouped into comparison arms (labels, pooled and paired runs, the common step);
  Welch, paired and Holm tests, tables; the figures
- table1: compare.py's Table 1, its columns, cells and footer
- comparison: compare.py's report (Table 1 and its tests, the width reports)
- width: the best rate and the gap to the baseline across widths
- power, sequential: power planning; group-sequential boundaries (alpha spending), a look's test, a family of
  tests' covariance and simulated operating characteristics

experiments: sweeps and studies
- sweeps, slurm: a sweep's points and their claims, the one local scheduler (claiming, starting, polling, ending
  and recording points on GPU and thread slots, signals forwarded) and SLURM jobs
- launch: the command that starts train.py's processes on one node (python, or torchrun)
- protocol: a study file and the held-out protocol's next runs
- declaration: a study's declaration, recorded with its fingerprint and fixed from its first recorded decision
- design, looks: declared tests read at the looks of a group-sequential study and recorded, and the candidate
  designs compared (the numbers are analysis's power and sequential)
"""
