"""Checkpoints and run directories: the format, which checkpoint a folder means, saving, resuming, clean-up.

Read without Lightning (generate.py, interop and the exports import only these):
    run_dir     the names of a run directory's parts (`RunDir`) and of the files in its checkpoints/ folder;
                which checkpoint a folder means: the newest whole one, with a warning for each bad newer one;
                CheckpointError and NoGoodCheckpointError, the one-line errors of reading checkpoints
    format      what a checkpoint holds; reading, validating and loading one (`load_checkpoint`)
    resume      `--ckpt_path` checks right after parsing; what can continue a run; `fit --ckpt_path <run dir>`
Training only (Lightning):
    atomic_io       step files written atomically, `last.ckpt` linked to the newest, older ones pruned
    background_io   the same writes on a background thread
    save_on_stop    `last.ckpt` at SIGTERM, Ctrl-C and the end of training; Ctrl-C as a clean stop
    settings        the `checkpoint.*` keys, the CheckpointIO they select, the resume choice
    run_lock        one writer per run directory: the lock, then the sweep of killed writers' temp files

Nothing is imported here, so `import checkpoints.format` never pulls in Lightning.
"""
