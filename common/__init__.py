"""Contracts every package shares: user errors and exit codes, atomic writes, model files, thread counts, and the
one door to other libraries' private parts (library_internals.py). Standard library only at import, so `model/`
and `data/` can both depend on it."""
