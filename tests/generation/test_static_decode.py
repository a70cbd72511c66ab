"""The compiled static-shape decode step gives the eager tokens, with one graph for every position.

CPU inductor compiles cost tens of seconds, so one test compiles with inductor (GQA) and the other head
layouts trace with the "aot_eager" backend: the same Dynamo graph capture (fullgraph, recompile guards), so
token equality and the recompile count are checked for every layout, without generating kernels three times.
Models run in float64 so a reordered reduction cannot flip a near-tied argmax.
"""

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters

from generation import static_decode
from generation.sampling import GREEDY, generate
from generation.static_decode import (
    OneRowLinears,
    StaticDecoder,
    one_query_attention,
    static_cache_length,
    static_decoder,
)
from model import KVCache
from tests.model.lively import lively_model

LAYOUTS = {"mha": (4, "aot_eager"), "gqa": (2, "inductor"), "mqa": (1, "aot_eager")}


def graphs_compiled() -> int:
    return counters["stats"]["unique_graphs"]


@pytest.mark.parametrize(("n_kv_head", "backend"), LAYOUTS.values(), ids=LAYOUTS.keys())
def test_compiled_greedy_matches_eager_across_window_jumps_without_recompiling(
    n_kv_head, backend, monkeypatch
):
    monkeypatch.setattr(static_decode, "BACKEND", backend)
    model = lively_model(n_kv_head, block_size=32)
    prompt = torch.randint(0, 101, (2, 10), generator=torch.Generator().manual_seed(1))
    eager = generate(model, prompt, 110, sampler=GREEDY)  # block_size 32: the window jumps 5 times
    assert all(row.unique().numel() >= 8 for row in eager[:, 10:]), (
        "degenerate model: the test would prove nothing"
    )
    before = graphs_compiled()
    compiled = generate(model, prompt, 110, sampler=GREEDY, compile=True)
    assert graphs_compiled() - before == 1  # compiled once, then reused at ~100 positions
    assert torch.equal(compiled, eager)
    again = generate(model, prompt.flip(1), 110, sampler=GREEDY, compile=True)
    assert graphs_compiled() - before == 1  # a second call reuses the graph and the cache
    assert torch.equal(again, generate(model, prompt.flip(1), 110, sampler=GREEDY))


def test_static_step_logits_and_cache_match_the_eager_step():
    model = lively_model(2, block_size=24)
    idx = torch.randint(0, 101, (3, 20), generator=torch.Generator().manual_seed(2))
    eager_cache = KVCache.allocate(model.config, 3, 24, dtype=torch.float64)
    static = StaticDecoder(model, KVCache.allocate(model.config, 3, 24, dtype=torch.float64), compile=False)
    with torch.no_grad():
        model(idx[:, :8], eager_cache)
        static.prefill(idx[:, :8])
        for t in range(8, 20):
            want = model(idx[:, t : t + 1], eager_cache)[:, -1]
            got = static.decode(idx[:, t])
            assert (got - want).abs().max().item() < 1e-9
    assert static.cache.pos == eager_cache.pos == 20
    assert torch.equal(static.cache.k, eager_cache.k) and torch.equal(static.cache.v, eager_cache.v)


def test_the_static_step_and_the_eager_cache_refuse_a_full_cache_in_the_same_words():
    model = lively_model(2, block_size=8)
    idx = torch.randint(0, 101, (1, 8), generator=torch.Generator().manual_seed(3))
    static = StaticDecoder(model, KVCache.allocate(model.config, 1, 8, dtype=torch.float64), compile=False)
    eager_cache = KVCache.allocate(model.config, 1, 8, dtype=torch.float64)
    with torch.no_grad():
        static.prefill(idx)
        model(idx, eager_cache)
        with pytest.raises(ValueError) as from_static:
            static.decode(idx[:, 0])
        with pytest.raises(ValueError) as from_eager:
            model(idx[:, :1], eager_cache)
    assert str(from_static.value) == str(from_eager.value)
    assert str(from_static.value).startswith("KVCache is full: writing 1 token(s) at position 8")


def test_compile_needs_the_cache():
    model = lively_model(2, block_size=32)
    with pytest.raises(ValueError, match="use_cache"):
        generate(model, torch.zeros(1, 3, dtype=torch.long), 4, compile=True, use_cache=False)


def test_cpu_step_compiles_linear_layers_at_batch_one_and_attention_as_reductions_with_the_eager_tokens():
    """On the CPU the step's attention becomes multiply-and-sum, and at batch 1 its linear layers do too."""
    graphs = []

    def recording_backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    model = lively_model(1, block_size=32)
    ops = []
    for batch in (1, 2):
        decoder = StaticDecoder(model, KVCache.allocate(model.config, batch, 32, dtype=torch.float64),
                                backend=recording_backend)  # fmt: skip
        with torch.no_grad():
            decoder.prefill(torch.zeros(batch, 3, dtype=torch.long))
            decoder.decode(torch.zeros(batch, dtype=torch.long))
        ops.append(graph_ops(graphs[-1]))
    assert not any("linear" in op or "scaled_dot_product" in op for op in ops[0]), ops[0]
    assert any("linear" in op for op in ops[1]), ops[1]
    assert not any("scaled_dot_product" in op for op in ops[1]), ops[1]

    prompt = torch.randint(0, 101, (1, 10), generator=torch.Generator().manual_seed(3))
    eager = generate(model, prompt, 110, sampler=GREEDY)
    assert eager[0, 10:].unique().numel() >= 8, "degenerate model: the test would prove nothing"
    assert torch.equal(generate(model, prompt, 110, sampler=GREEDY, compile=True), eager)


def graph_ops(gm: torch.fx.GraphModule) -> set[str]:
    """The ops of a graph and of the subgraphs it calls (the blocks' region)."""
    return {str(node.target) for module in gm.modules() if isinstance(module, torch.fx.GraphModule)
            for node in module.graph.nodes}  # fmt: skip


def test_the_compiled_step_traces_one_block_for_every_layer(monkeypatch):
    """The blocks are one region (`Block.forward`): traced and lowered once, called once per layer, with each
    layer's weights and cache; the tokens stay the eager ones."""
    graphs = []

    def recording_backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    monkeypatch.setattr(static_decode, "BACKEND", recording_backend)
    model = lively_model(2, block_size=32, n_layer=3)
    prompt = torch.randint(0, 101, (1, 10), generator=torch.Generator().manual_seed(4))
    eager = generate(model, prompt, 40, sampler=GREEDY)
    assert eager[0, 10:].unique().numel() >= 8, "degenerate model: the test would prove nothing"
    assert torch.equal(generate(model, prompt, 40, sampler=GREEDY, compile=True), eager)
    assert len(graphs) == 1
    calls = [node for node in graphs[0].graph.nodes if node.target is torch.ops.higher_order.invoke_subgraph]
    assert len(calls) == 3 and len({node.args[0].target for node in calls}) == 1, graphs[0].code
    block = getattr(graphs[0], calls[0].args[0].target)
    assert not any("linear" in op for op in graph_ops(block))  # the one-row reductions reach the region


def test_the_reductions_give_the_linear_layers_values():
    layer = torch.nn.Linear(16, 24, bias=False).double()
    row, rows = torch.randn(1, 1, 16, dtype=torch.float64), torch.randn(3, 16, dtype=torch.float64)
    with OneRowLinears():
        got_row, got_rows = layer(row), layer(rows)
    assert got_row.shape == (1, 1, 24)
    assert (got_row - layer(row)).abs().max().item() < 1e-12
    assert torch.equal(got_rows, layer(rows))  # more than one row keeps the matrix product


@pytest.mark.parametrize("n_kv_head", [4, 2, 1], ids=["mha", "gqa", "mqa"])
def test_the_reductions_give_the_masked_attentions_values(n_kv_head):
    torch.manual_seed(0)
    q = torch.randn(2, 4, 1, 8, dtype=torch.float64)
    k, v = (torch.randn(2, n_kv_head, 12, 8, dtype=torch.float64) for _ in range(2))
    visible = (torch.arange(12) <= 6).view(1, 1, 1, 12)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=visible, enable_gqa=True)
    got = one_query_attention(q, k, v, visible)
    assert got.shape == expected.shape
    assert (got - expected).abs().max().item() < 1e-12
    unmasked = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    assert (expected - unmasked).abs().max().item() > 0.01  # the mask matters


def test_the_attention_reduction_keeps_bf16_as_accurate_as_the_fused_kernel():
    """Scores and probabilities are float32 inside, as in SDPA: bf16 rounding them would double the error."""
    torch.manual_seed(0)
    q = torch.randn(3, 12, 1, 64, dtype=torch.float64)
    k, v = (torch.randn(3, 4, 1024, 64, dtype=torch.float64) for _ in range(2))
    visible = (torch.arange(1024) <= 700).view(1, 1, 1, 1024)
    exact = F.scaled_dot_product_attention(q, k, v, attn_mask=visible, enable_gqa=True)
    q, k, v = q.bfloat16(), k.bfloat16(), v.bfloat16()
    fused = F.scaled_dot_product_attention(q, k, v, attn_mask=visible, enable_gqa=True)
    rewritten = one_query_attention(q, k, v, visible)
    assert rewritten.dtype == torch.bfloat16
    fused_error = (fused.double() - exact).abs().max().item()
    assert (rewritten.double() - exact).abs().max().item() <= 1.3 * fused_error


def test_the_static_cache_is_sized_to_the_request_with_one_static_graph_per_length(monkeypatch):
    """Short, long, short again: two cache lengths, two graphs, none with a symbolic (dynamic) shape."""
    graphs = []

    def recording_backend(gm, example_inputs):
        graphs.append(example_inputs)
        return gm.forward

    monkeypatch.setattr(static_decode, "BACKEND", recording_backend)
    model = lively_model(2, block_size=1024)
    prompt = torch.randint(0, 101, (1, 10), generator=torch.Generator().manual_seed(4))
    lengths = []
    for new_tokens in (20, 300, 20):  # prompt + new: 30 -> 256 positions, 310 -> 512, 30 reuses 512
        compiled = generate(model, prompt, new_tokens, sampler=GREEDY, compile=True)
        eager = generate(model, prompt, new_tokens, sampler=GREEDY)
        assert eager[0, 10:].unique().numel() >= 8, "degenerate model: the test would prove nothing"
        assert torch.equal(compiled, eager)
        lengths.append(static_decoder(model, 1, length=1).cache.max_len)  # the kept one
    assert lengths == [256, 512, 512]
    assert len(graphs) == len(set(lengths)) == 2
    for inputs in graphs:  # a cache length made dynamic would show as a SymInt input or dimension
        assert all(isinstance(x, torch.Tensor) for x in inputs), inputs
        assert all(isinstance(d, int) for x in inputs for d in x.shape)
    assert [{x.shape[2] for x in inputs if x.dim() == 4} for inputs in graphs] == [{256}, {512}]  # k/v views


def test_static_cache_length_rounds_up_to_a_power_of_two_within_256_and_block_size():
    assert [static_cache_length(n, 8192) for n in (1, 128, 256, 257, 4000, 4097, 8192, 9000)] == [
        256, 256, 256, 512, 4096, 8192, 8192, 8192
    ]  # fmt: skip
    assert static_cache_length(100, 32) == 32  # a context shorter than 256 caps it
