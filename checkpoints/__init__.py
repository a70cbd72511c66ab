"""Checkpoints and run directories: the format, which checkpoint a folder means, saving, resuming, clean-up.

run_dir, format and resume read checkpoints without Lightning (generate.py and interop import only these).
Nothing is imported here, so `import checkpoints.format` never pulls in Lightning.
"""
