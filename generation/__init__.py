"""What generate.py runs around model/sampling.py's one decode loop: the streaming printer, the chat
conversation (one KV cache throughout), the kept compiled step and the `--benchmark` speed report."""
