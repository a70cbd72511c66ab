"""The 124 M shape of configs/gpt2-small.yaml, declared once: GPT-2 small's widths (12 layers, 768 wide) with
12 query / 4 key-value heads, our 32768-token BPE and a 1024-token context. The GPU decode check and the tests
that count its FLOPs and memory by hand use it; tests/training/test_flops.py checks it against the YAML."""

from model import ModelConfig

GPT2_SMALL = ModelConfig(vocab_size=32768, block_size=1024, n_layer=12, n_head=12, n_kv_head=4, n_embd=768)
