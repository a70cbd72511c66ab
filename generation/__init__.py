"""Decoding, the loop around the network: the sampler and the one decode loop (sampling.py), speculative
decoding, the compiled static step; and what generate.py runs around them: the streaming printer, the chat
conversation (one KV cache throughout), the kept compiled step and the `--benchmark` speed report.

Decoding lives here, not in model/ (as in gpt-fast): the network is what a learner reads, and the compiled
step calls the C++ kernels (cpu_kernels/), which model/ never imports."""
