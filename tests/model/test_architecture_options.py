"""Each pretrained-architecture option (Qwen2's q/k/v biases, Qwen3's per-head q/k RMSNorm with a head_dim of
its own, Llama 3's RoPE scaling) in every path: the KV cache, the compiled step, the explicit attention maps and
the flash reference. Parity with transformers is in tests/interop/test_hf_architectures.py."""

import pytest
import torch
from torch._dynamo.utils import counters

from common.errors import UserError
from generation import static_decode
from generation.sampling import GREEDY, generate
from model import GPT, KVCache, ModelConfig
from model.attention import sdpa_attention
from model.flash_reference import flash_attention

OPTIONS = {
    "qkv-bias": {"qkv_bias": True},
    "qk-norm-head-dim": {"qk_norm": True, "head_dim": 12},
    "llama3-rope": {"rope_type": "llama3", "rope_original_context": 16, "rope_theta": 500.0},
}


def lively_model(options: dict, block_size: int = 32) -> GPT:
    """A float64 model with large random weights, biases and gains: greedy output is not one repeated token."""
    torch.manual_seed(0)
    config = ModelConfig(
        vocab_size=101, block_size=block_size, n_layer=2, n_head=4, n_kv_head=2, n_embd=32, **options
    )
    model = GPT(config).double().eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.uniform_(0.5, 2.0) if "norm" in name else param.normal_(0.0, 0.6)
    return model


@pytest.mark.parametrize("options", OPTIONS.values(), ids=OPTIONS.keys())
def test_cached_decode_equals_the_full_forward(options):
    model = lively_model(options, block_size=48)
    idx = torch.randint(0, 101, (2, 40), generator=torch.Generator().manual_seed(1))
    full = model(idx)
    cache = KVCache.allocate(model.config, 2, 48, dtype=torch.float64)
    steps = [model(idx[:, :9], cache), model(idx[:, 9:20], cache)]  # a prefill, then a chunk
    steps += [model(idx[:, t : t + 1], cache) for t in range(20, 40)]
    assert (torch.cat(steps, dim=1) - full).abs().max().item() <= 1e-9


@pytest.mark.parametrize("options", OPTIONS.values(), ids=OPTIONS.keys())
def test_compiled_greedy_equals_eager_with_one_graph(options, monkeypatch):
    # aot_eager: the same fullgraph capture (and CPU reductions, the bias included) without generating kernels.
    monkeypatch.setattr(static_decode, "BACKEND", "aot_eager")
    model = lively_model(options)
    prompt = torch.randint(0, 101, (1, 10), generator=torch.Generator().manual_seed(2))
    eager = generate(model, prompt, 60, sampler=GREEDY)  # block_size 32: the window jumps
    assert eager[0, 10:].unique().numel() >= 8, "degenerate model: the test would prove nothing"
    before = counters["stats"]["unique_graphs"]
    assert torch.equal(generate(model, prompt, 60, sampler=GREEDY, compile=True), eager)
    assert counters["stats"]["unique_graphs"] - before == 1


@pytest.mark.parametrize("options", OPTIONS.values(), ids=OPTIONS.keys())
def test_attention_maps_and_flash_reference_give_each_layers_sdpa_output(options):
    model = lively_model(options)
    idx = torch.randint(0, 101, (2, 17), generator=torch.Generator().manual_seed(3))
    maps = model.attention_maps(idx)
    inputs = []
    hooks = [b.attn.register_forward_pre_hook(lambda _, args: inputs.append(args[:3])) for b in model.blocks]
    with torch.no_grad():
        model(idx)
    for hook in hooks:
        hook.remove()
    for layer, (block, args) in enumerate(zip(model.blocks, inputs, strict=True)):
        q, k, v = block.attn.project(*args)  # the option lives here, so every attention path sees it
        fused = sdpa_attention(q, k, v)
        from_map = maps[layer].double() @ v.repeat_interleave(2, dim=1)  # the maps are float32 by design
        assert (from_map - fused).abs().max().item() <= 1e-4, layer
        tiled = flash_attention(q, k, v, block_size_q=5, block_size_k=4)  # accumulates in float32 by design
        assert (tiled - fused).abs().max().item() <= 1e-4, layer


def test_each_option_changes_the_logits():
    """Guards the options above against being silently ignored (then every path would agree trivially)."""
    idx = torch.randint(0, 101, (1, 30), generator=torch.Generator().manual_seed(4))
    for name, options in OPTIONS.items():
        plain = lively_model({k: v for k, v in options.items() if k in ("head_dim", "rope_theta")})
        model = lively_model(options)
        model.load_state_dict(plain.state_dict(), strict=False)  # shared weights; the option's own stay
        assert not torch.allclose(model(idx), plain(idx)), name


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"head_dim": 0}, "model.head_dim"),
        ({"head_dim": 7}, "model.head_dim"),
        ({"rope_type": "yarn"}, "model.rope_type"),
        ({"rope_type": "llama3", "rope_factor": 0.0}, "model.rope_factor"),
        ({"rope_type": "llama3", "rope_high_freq_factor": 1.0}, "model.rope_high_freq_factor"),
    ],
)
def test_bad_option_is_one_line_naming_the_field(kwargs, field):
    with pytest.raises(UserError) as err:
        ModelConfig(**kwargs)
    assert field in str(err.value) and "\n" not in str(err.value)


def test_explicit_head_dim_needs_no_divisible_width_and_the_dict_keeps_a_derived_one_open():
    config = ModelConfig(n_embd=100, n_head=8, n_kv_head=2, head_dim=24)
    assert config.head_dim == 24 and ModelConfig(**config.to_dict()) == config
    derived = ModelConfig(n_embd=256, n_head=8)
    assert derived.head_dim == 32 and derived.to_dict()["head_dim"] is None  # an edited n_embd re-derives it
    assert ModelConfig(**(derived.to_dict() | {"n_embd": 512})).head_dim == 64
