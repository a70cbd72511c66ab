"""What generate.py runs around the model: the streaming printer, sampling defaults a model folder sets, the
chat conversation (one KV cache throughout) and the `--benchmark` speed report.

The decoding itself is model/sampling.py's one loop; this package turns it into text and figures. Nothing in
it knows command-line flags: generate.py words those.
"""
