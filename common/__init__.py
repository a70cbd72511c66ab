"""Contracts every package shares: user errors and exit codes, atomic writes, model files, thread counts.
Standard library only, so `model/` and `data/` can both depend on it."""
