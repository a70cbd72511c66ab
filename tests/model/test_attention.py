"""The explicit attention path, the SDPA masking cases, and GQA against repeated-KV MHA."""

import pytest
import torch

from model import GPT, ModelConfig
from model.attention import explicit_attention, sdpa_attention
from model.gpt import CausalSelfAttention


def qkv(t, s, h=8, hkv=2, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(2, h, t, d, generator=g),
        torch.randn(2, hkv, s, d, generator=g),
        torch.randn(2, hkv, s, d, generator=g),
    )


@pytest.mark.parametrize(("t", "s"), [(24, 24), (1, 24), (9, 24)], ids=["no-cache", "decode", "chunked"])
@pytest.mark.parametrize("hkv", [8, 2, 1], ids=["mha", "gqa", "mqa"])
def test_explicit_path_reproduces_sdpa(t, s, hkv):
    q, k, v = qkv(t, s, hkv=hkv)
    out, probs = explicit_attention(q, k, v)
    assert (out - sdpa_attention(q, k, v)).abs().max().item() <= 1e-5
    assert probs.shape == (2, 8, t, s)
    assert torch.allclose(probs.sum(-1), torch.ones(2, 8, t), atol=1e-6)
    # Query i sits at absolute position s - t + i: every key after it must get exactly zero weight.
    above = torch.ones(t, s, dtype=torch.bool).triu(diagonal=s - t + 1)
    assert probs[..., above].eq(0).all()
    assert probs[..., ~above].gt(0).all()


def test_top_left_causal_flag_would_be_wrong_for_chunks():
    # Guards the reason for the explicit chunk mask: is_causal=True hides keys the chunk is allowed to see.
    q, k, v = qkv(9, 24)
    top_left = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    assert (top_left - sdpa_attention(q, k, v)).abs().max().item() > 1e-2


def test_gqa_layer_equals_mha_layer_with_repeated_kv_weights():
    torch.manual_seed(0)
    gqa_cfg = ModelConfig(vocab_size=50, block_size=32, n_layer=1, n_head=8, n_kv_head=2, n_embd=64)
    mha_cfg = ModelConfig(vocab_size=50, block_size=32, n_layer=1, n_head=8, n_kv_head=8, n_embd=64)
    gqa, mha = CausalSelfAttention(gqa_cfg), CausalSelfAttention(mha_cfg)
    d, c = gqa_cfg.head_dim, gqa_cfg.n_embd
    wq, wk, wv = gqa.qkv.weight.split([8 * d, 2 * d, 2 * d])
    repeat = lambda w: w.view(2, d, c).repeat_interleave(4, dim=0).reshape(8 * d, c)  # noqa: E731
    with torch.no_grad():
        mha.qkv.weight.copy_(torch.cat([wq, repeat(wk), repeat(wv)]))
        mha.proj.weight.copy_(gqa.proj.weight)
    x = torch.randn(3, 20, c)
    cos, sin = gqa_cfg.rope.tables(0, 20)
    assert (gqa(x, cos, sin) - mha(x, cos, sin)).abs().max().item() <= 1e-5


def test_attention_maps_are_the_models_own():
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=50, block_size=32, n_layer=3, n_head=4, n_kv_head=2, n_embd=32)
    model = GPT(config).eval()
    with torch.no_grad():  # large weights, so every residual branch moves the later layers' maps
        for name, param in model.named_parameters():
            param.normal_(1.0, 0.3) if name.endswith("norm.weight") else param.normal_(0.0, 0.3)
    idx = torch.randint(0, 50, (2, 17))
    maps = model.attention_maps(idx)
    assert maps.shape == (3, 2, 4, 17, 17)
    assert torch.allclose(maps.sum(-1), torch.ones(3, 2, 4, 17), atol=1e-5)
    # Capture what each attention layer receives in the ordinary (SDPA) forward pass, then rebuild that
    # layer's output from its map and the layer's own V: every layer's map must give the SDPA output.
    inputs = []
    record = lambda _, args: inputs.append(args[0])  # noqa: E731
    hooks = [block.attn.register_forward_pre_hook(record) for block in model.blocks]
    with torch.no_grad():
        model(idx)
    for hook in hooks:
        hook.remove()
    cos, sin = config.rope.tables(0, 17)
    for layer, (block, x) in enumerate(zip(model.blocks, inputs, strict=True)):
        q, k, v = block.attn.project(x, cos, sin)
        from_map = maps[layer] @ v.repeat_interleave(2, dim=1)
        assert (from_map - sdpa_attention(q, k, v)).abs().max().item() <= 1e-4, layer


def test_explained_steps_match_the_attention_maps():
    from inspection.writers import attention_steps

    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=50, block_size=32, n_layer=2, n_head=4, n_kv_head=2, n_embd=32)).eval()
    idx = torch.randint(0, 50, (1, 9))
    steps = attention_steps(model, idx, layer=1, head=3)
    assert torch.allclose(steps["probs"], model.attention_maps(idx)[1, 0, 3], atol=1e-6)
    above = torch.ones(9, 9, dtype=torch.bool).triu(1)
    assert torch.isneginf(steps["masked"][above]).all()
    assert torch.equal(steps["masked"][~above], steps["scores"][~above])
