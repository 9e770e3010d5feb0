"""
The library shared by the programs at the repo's root (train.py, sample.py, eval.py,
export.py, compare.py, analyze.py, sweep.py, study.py); the model itself is the root's model.py,
which imports nothing from here. This is the package's one map: a room a concern, a module a line.

The rooms are listed bottom-up: a room imports only rooms listed before it (tests/test_imports.py holds
the order), so the shell and the config come first, then the run record and the data, the trainer, the
weights, the evaluation of models, the analysis of runs and the experiments. The analysis and the
experiments import no torch; they load it only where they check a config (configurator.train_config_class:
TrainConfig's model fields are model.py's), so sweep.py --help and --status, study.py --help and compare.py
--help run without the training stack (tests/test_imports.py holds both).

cli, interrupt (modules at the top)
- cli: a program piped into one that stops reading (`| head`) ends quietly
- interrupt: Ctrl-C at any moment, torch's import included, ends a program with one line

config: what a run is told
- configurator: config files parsed (never executed), `--key=value`, each error naming the key, file and line
- train_config: the checked TrainConfig, train.py's every setting and its default

record: the run directory and every file written
- atomic: every file the repo writes appears whole or not at all
- runs: the run directory's one owner (RunDir: every file name in it, the checkpoints' among them, the header and
  config.json, its status, replacing a run), its metrics.jsonl written (and wandb) and read, sweep directories
- lock: one training run per out_dir at a time (flock), and the sweep's claim on a point
- errors: SetupError and CheckpointError, the setup's errors, torch-free so the record raises them too

data: tokens in
- hub: the Hugging Face hub, offline-aware, and DataError
- tokenizer, corpus: documents -> GPT-2 tokens -> train.bin/val.bin
- batches: token memmaps and the fixed-seed index streams every variant shares

trainer: the training step and what runs around it
- runtime: device, dtype, process group, DDP/FSDP2 wrapping, compile, MFU
- kernels: res_gelu's f and the cross-entropy as Triton custom ops, with a PyTorch path (TrainConfig's kernels)
- training: one optimizer step, evaluation, the learning-rate schedule, divergence
- optimizers: AdamW (and Muon for the modern recipe), μP's per-group rates
- diagnostics: per-layer attention-logit, entropy and query statistics
- stopping: a signal stops a run at the next step boundary (every rank at the same one), or at once
- budget: a run's memory floor and CPU step time, known before its first step

weights: models and training states in and out
- checkpoint: train.py's Checkpointer (which checkpoint to resume, its checks and restore, when to save),
  atomic single-file and sharded (DCP) checkpoints: the training state alone;
  `python -m nonlinear_queries.weights.checkpoint --out_dir=RUN` makes a sharded one a single file
- checkpoint_file: a checkpoint file read (the one torch.load, weights only), for checkpoint and pretrained
- pretrained: load_model, every program's loader of any source (a run's checkpoint, GPT-2, Hugging Face,
  the official code's), and weights out (Hugging Face GPT-2 format)
- start: where a run's weights come from, resolved once from init_from (scratch, resume or fine-tune), its
  out_dir held, its model built

evaluation: models measured, with torch
- downstream: lm-evaluation-harness on this repo's models (eval.py, train.py's eval_tasks)
- coord_check: μP's coordinate check of a config's widths (analyze.py --coord_check)

analysis: what runs say, read from their records
- arms, stats, plots: runs grouped into comparison arms (labels, pooled and paired runs, the common step);
  Welch, paired and Holm tests, tables; the figures
- table1: compare.py's Table 1, its columns, cells and footer
- comparison: compare.py's report (Table 1 and its tests, the width reports)
- width: the best rate and the gap to the baseline across widths
- power, sequential: power planning; group-sequential boundaries (alpha spending)

experiments: sweeps and studies
- sweeps, slurm: a sweep's points and their claims, the one local scheduler (claiming, starting, polling, ending
  and recording points on GPU and thread slots, signals forwarded) and SLURM jobs
- launch: the command that starts train.py's processes on one node (python, or torchrun)
- protocol: a study file and the held-out protocol's next runs
- declaration: a study's declaration, recorded with its fingerprint and fixed from its first recorded decision
- design, looks: declared tests, the looks of a group-sequential study, and the designs' operating characteristics
"""
