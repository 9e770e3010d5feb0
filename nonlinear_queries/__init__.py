"""
The library shared by the programs at the repo's root (train.py, sample.py, eval.py,
export.py, compare.py, analyze.py, sweep.py, study.py); the model itself is the root's model.py,
which imports nothing from here. One concern per module:

- configurator, train_config: config files parsed (never executed), `--key=value`, the checked TrainConfig
- runtime: device, dtype, process group, DDP/FSDP2 wrapping, compile, MFU
- kernels: res_gelu's f and the cross-entropy as Triton custom ops, with a PyTorch path (TrainConfig's kernels)
- batches: token memmaps and the fixed-seed index streams every variant shares
- training: one optimizer step, evaluation, the learning-rate schedule, divergence
- optimizers: AdamW (and Muon for the modern recipe), μP's per-group rates
- coord_check, width: μP's coordinate check; the best rate and the gap to the baseline across widths, and
  compare.py's --width_transfer and --width_ladder reports
- checkpoint: train.py's Checkpointer (which checkpoint to resume, its checks and restore, when to save),
  atomic single-file and sharded (DCP) checkpoints: the training state alone;
  `python -m nonlinear_queries.weights.checkpoint --out_dir=RUN` makes a sharded one a single file
- checkpoint_file: a checkpoint file read (the one torch.load, weights only), for checkpoint and pretrained
- start: how train.py's run starts (from scratch, resuming or fine-tuning: init_from resolved once into a
  Start), its out_dir held, its model built, and the command that resumes it
- pretrained: load_model, every program's loader of any source (a run's checkpoint, GPT-2, Hugging Face,
  the official code's), and weights out (Hugging Face GPT-2 format)
- runs: the run directory's one owner (RunDir: its file names, its checkpoints' included, the header and
  config.json, its status, replacing a run), its metrics.jsonl written (and wandb) and read, sweep
  directories (runs.finished: whether a run is over)
- arms, stats, plots: runs grouped into comparison arms (labels, pooled and paired runs, the common step);
  Welch, paired and Holm tests, tables; the figures
- table1: compare.py's Table 1, its columns, cells and footer
- sweeps, slurm: a sweep's points and their claims, the one local scheduler (sweeps.schedule: claiming, starting,
  polling, ending and recording points on GPU and thread slots, signals forwarded; sweep.py's fixed list and
  study.py's stages both run through it) and SLURM jobs (slurm)
- launch: the command that starts a run's processes on one node (python, or torchrun with its signals)
- comparison: compare.py's report (Table 1 and its tests, the width reports), which study.py's tables call too
- protocol: a study file and the held-out protocol's next runs (study.py runs them through sweeps' scheduler)
- design, looks, power, sequential: declared tests, group-sequential looks and their boundaries, power planning
  and the designs' operating characteristics (study.py --dry_run and its looks)
- diagnostics: per-layer attention-logit, entropy and query statistics
- downstream: lm-evaluation-harness on this repo's models
- corpus, tokenizer, hub: documents -> GPT-2 tokens -> train.bin/val.bin; the hub, offline-aware
- atomic: every file the repo writes appears whole or not at all
- lock: one training run per out_dir at a time (flock), and the sweep's claim on a point
- stopping: a signal stops a run at the next step boundary (every rank at the same one), or at once
- budget: a run's memory floor and CPU step time, known before its first step
- cli: a program piped into one that stops reading (`| head`) ends quietly
- interrupt: Ctrl-C at any moment, torch's import included, ends a program with one line
- errors: SetupError and CheckpointError, which torch-free modules (lock, runs) raise too
"""
