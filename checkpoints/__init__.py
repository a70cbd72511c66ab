"""Checkpoints and run directories: the format, which checkpoint a folder means, saving, resuming, clean-up.
Nothing is imported here: run_dir, format and resume need no Lightning, so generate.py and interop start fast."""
