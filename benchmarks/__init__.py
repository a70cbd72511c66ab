"""Measurements that print a ratio against a baseline measured in the same run.

Run each from the repository root as a module, with underscore flags like the other commands:
`python -m benchmarks.decode --prompt_len 64`.
"""
