"""Contracts every package shares: the user-error base class with the exit codes, and atomic file writes.

Imports only the standard library, so `model/` and `data/` can both depend on it.
"""
