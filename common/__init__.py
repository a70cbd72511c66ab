"""Contracts every package shares: the user-error base class with the exit codes, atomic file
writes, and the special token the tokenizer and the export share.

Imports only the standard library, so `model/` and `data/` can both depend on it.
"""
