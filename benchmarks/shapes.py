"""The model shapes the benchmarks share, declared once.

GPT2_SMALL is the 124 M shape of configs/gpt2-small.yaml: GPT-2 small's widths (12 layers, 768 wide) with
12 query / 4 key-value heads, our 32768-token BPE and a 1024-token context. The GPU decode check and the tests
that count its FLOPs and memory by hand use it; tests/training/test_flops.py checks it against the YAML.
DECODE_CONFIGS are the random models that benchmarks.decode_vs_hf and decode_vs_llamacpp decode.
"""

from model import ModelConfig

GPT2_SMALL = ModelConfig(vocab_size=32768, block_size=1024, n_layer=12, n_head=12, n_kv_head=4, n_embd=768)
DECODE_CONFIGS = {
    "small": ModelConfig(vocab_size=1024, block_size=512, n_layer=4, n_head=8, n_kv_head=2, n_embd=256),
    "large": ModelConfig(vocab_size=1024, block_size=512, n_layer=12, n_head=12, n_kv_head=4, n_embd=768),
    "large32k": ModelConfig(
        vocab_size=32000, block_size=1024, n_layer=12, n_head=12, n_kv_head=4, n_embd=768
    ),
}
