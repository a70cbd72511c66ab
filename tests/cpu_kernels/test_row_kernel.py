"""The C++ row product on kept blocks (cpu_kernels/row_kernel.cpp): the block sums of the row at 16 bits, close to
the float path, the same on any thread count, NaN kept, called inside compiled graphs, and off with one note."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from cpu_kernels import library as row_kernel
from cpu_kernels.quantized import KERNEL_ROWS, QuantizedLinear
from generation.static_decode import OneRowLinears, one_query_attention
from tests.conftest import ROOT

# (bits, with a minimum (else an offset), outputs, inputs, block): Q4_1, Q4_0, Q8_0, an 8-bit kind with a
# minimum (a fused layer of mixed types), Q5_1 / Q5_K, Q5_0, Q6_K (blocks of 16) and a 6-bit kind with a minimum;
# output counts off a multiple of 8 reach the scalar tail.
KINDS = [(4, True, 61, 96, 32), (4, False, 576, 576, 32), (8, False, 61, 64, 32), (8, False, 1030, 576, 32),
         (8, True, 40, 64, 32), (5, True, 61, 96, 32), (5, False, 576, 256, 32), (6, False, 61, 96, 16),
         (6, False, 576, 256, 16), (6, True, 40, 64, 16)]  # fmt: skip


def kernel():
    if row_kernel.unusable_reason() is not None:
        message = f"the row kernel cannot run here: {row_kernel.unusable_reason()}"
        if (
            os.environ.get("CI", "").lower() == "true"
        ):  # CI has a compiler and AVX2: the kernel must be tested
            pytest.fail(message)
        pytest.skip(message)
    op = row_kernel.row_product_op()
    assert op is not None, "the row kernel should build on this machine"
    return op


def random_layer(bits: int, with_minimum: bool, out: int, inp: int, block: int = 32, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 2**bits, (out, inp), generator=g)  # every code, the top one included
    scale = torch.rand(out, inp // block, generator=g) * 0.02
    minimum = -torch.rand(out, inp // block, generator=g) * 0.1 if with_minimum else None
    return QuantizedLinear(codes, scale, minimum, bits, block, 0 if with_minimum else 2 ** (bits - 1))


def sixteen_bit_reference(layer: QuantizedLinear, x: torch.Tensor) -> torch.Tensor:
    """What the kernel computes, in float64: each block of 32 inputs rounded to amax / 32767 steps (as the
    kernel rounds them, in float32) against scale * code, plus minimum times the block's exact sum."""
    blocks = x.view(-1, 32)
    step = blocks.abs().amax(1, keepdim=True) / 32767
    codes = torch.round(blocks * torch.where(step > 0, 1 / step, 0))
    rounded = (codes.double() * step.double()).view(1, -1)
    weight = layer.dequantize().double()
    if layer.minimum is None:
        return rounded @ weight.T
    minimum = layer.minimum.t().double()  # (out, in / block)
    sums = x.view(-1, layer.block).double().sum(1)
    return (rounded @ (weight - minimum.repeat_interleave(layer.block, 1)).T) + sums @ minimum.T


def run(op, layer: QuantizedLinear, x: torch.Tensor) -> torch.Tensor:
    return op(x, layer.words, layer.scale, layer.minimum, layer.offset)


@pytest.mark.parametrize("bits, with_minimum, out, inp, block", KINDS)
def test_the_kernel_sums_the_blocks_of_the_16_bit_row(bits, with_minimum, out, inp, block):
    op, layer = kernel(), random_layer(bits, with_minimum, out, inp, block)
    x = torch.randn(1, inp, generator=torch.Generator().manual_seed(1))
    got = run(op, layer, x)
    expected = sixteen_bit_reference(layer, x)
    assert got.shape == (1, out) and got.dtype == torch.float32 and got.std() > 0.5
    # float32 rounding of the block products only: the integer sums are exact
    assert (got.double() - expected).abs().max().item() <= 2e-6 * expected.abs().max().item()
    # and against the float path of the same weights, the 16-bit row's rounding: a few in 1e5 of the largest
    exact = F.linear(x.double(), layer.dequantize().double())
    assert (got.double() - exact).abs().max().item() <= 1e-4 * exact.abs().max().item()


@pytest.mark.parametrize("bits, with_minimum, out, inp, block", KINDS)
def test_the_float_path_sums_the_same_weights(monkeypatch, bits, with_minimum, out, inp, block):
    """Where the kernel cannot run (no AVX2, another device), one row takes the float sum over blocks."""
    layer, x = random_layer(bits, with_minimum, out, inp, block), torch.randn(1, inp)
    monkeypatch.setattr(row_kernel, "_loaded", {"op": None})
    exact = F.linear(x.double(), layer.dequantize().double())
    assert (layer(x).double() - exact).abs().max().item() <= 1e-5 * exact.abs().max().item()


@pytest.mark.parametrize("bits, with_minimum, out, inp, block", KINDS)
def test_several_rows_give_each_rows_own_product(bits, with_minimum, out, inp, block):
    """Rows share the reads of each block (in tiles of 16): 37 rows reach a partial tile."""
    op, layer = kernel(), random_layer(bits, with_minimum, out, inp, block)
    rows = torch.randn(37, inp, generator=torch.Generator().manual_seed(4))
    assert torch.equal(run(op, layer, rows), torch.cat([run(op, layer, row[None]) for row in rows]))


def test_the_layer_uses_the_kernel_up_to_kernel_rows():
    op, layer = kernel(), random_layer(4, True, 64, 96)
    rows = torch.randn(KERNEL_ROWS + 1, 96, generator=torch.Generator().manual_seed(2))
    assert torch.equal(layer(rows[:1]), run(op, layer, rows[:1]))
    assert torch.equal(layer(rows[None, :1]).view(1, -1), layer(rows[:1]))  # (1, 1, in): one row too
    few = rows[:KERNEL_ROWS].view(2, -1, 96)  # (batch, time, in): a short prompt of two samples
    assert torch.equal(layer(few), run(op, layer, few))
    several = layer(rows)  # more rows: the matrix product of the dequantised weights
    assert not torch.equal(several[:1], run(op, layer, rows[:1]))
    torch.testing.assert_close(several, F.linear(rows, layer.dequantize()), rtol=0, atol=1e-5)


def test_threads_split_the_outputs_without_changing_them():
    op, layer = kernel(), random_layer(8, False, 4096, 576)
    x = torch.randn(1, 576, generator=torch.Generator().manual_seed(3))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = run(op, layer, x)
        torch.set_num_threads(2)
        two = run(op, layer, x)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two)  # each output is one thread's, summed in the same order
    # and the split happens: built without OpenMP, at::parallel_for is a plain call on one thread
    assert b"GOMP_parallel" in row_kernel.library_path().read_bytes()


@pytest.mark.parametrize("bits, with_minimum, block", [(4, True, 32), (8, False, 32), (6, False, 16)])
def test_a_nan_input_gives_nan_outputs(bits, with_minimum, block):
    op, layer = kernel(), random_layer(bits, with_minimum, 16, 64, block)
    x = torch.randn(1, 64)
    x[0, 40] = float("nan")
    assert run(op, layer, x).isnan().all()
    x[0, 40] = float("inf")
    assert not run(op, layer, x).isfinite().any()


def test_compiled_graphs_call_the_kernel():
    kernel()
    layer = random_layer(4, True, 64, 96)
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm.code)
        return gm.forward

    x = torch.randn(1, 96)
    with torch.inference_mode():
        got = torch.compile(layer, backend=record, fullgraph=True)(x)
    assert torch.equal(got, layer(x))
    assert len(graphs) == 1 and "gqa_quant.row_product" in graphs[0]


@pytest.mark.parametrize("cause", ["cpu", "build"])
def test_without_the_kernel_the_float_path_runs_after_one_note(monkeypatch, capsys, cause):
    layer, x = random_layer(4, True, 64, 96), torch.randn(1, 96)
    monkeypatch.setattr(row_kernel, "_loaded", {})  # as in a fresh process
    if cause == "cpu":
        monkeypatch.setattr(row_kernel, "unusable_reason", lambda: "this CPU has no AVX2")
    else:
        monkeypatch.setattr(row_kernel, "unusable_reason", lambda: None)

        def fail(path):
            raise RuntimeError("Error building extension 'gqa_row_kernel'\nc++: fatal error: killed")

        monkeypatch.setattr(row_kernel, "_open_or_build", fail)
    first, second = layer(x), layer(x)
    float_path = F.linear(x, layer.dequantize())
    assert (first - float_path).abs().max().item() <= 1e-5 and torch.equal(first, second)
    err = capsys.readouterr().err
    assert err.count("note:") == 1 and err.count("\n") == 1, err
    assert "C++ row kernels are off" in err
    assert ("no AVX2" if cause == "cpu" else "its build failed: c++: fatal error: killed") in err


LOAD_AND_RUN = (
    "import torch; from cpu_kernels import library as row_kernel; "
    "op = row_kernel.row_product_op(); assert op is not None; "
    "print(op(torch.ones(1, 32), torch.zeros(1, 4, 8, dtype=torch.int32), torch.ones(1, 8), None, 0).sum().item())"
)


@pytest.mark.slow
def test_a_second_process_loads_the_built_kernel_and_a_damaged_one_is_rebuilt(tmp_path):
    kernel()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TORCH_EXTENSIONS_DIR": str(tmp_path)}

    def run() -> str:
        done = subprocess.run([sys.executable, "-c", LOAD_AND_RUN], env=env, capture_output=True, text=True)
        assert done.returncode == 0 and done.stdout.strip() == "0.0", done.stderr
        return done.stderr

    assert "compiling the C++ row kernels" in run()
    (library,) = tmp_path.glob("gqa_row_kernel_*/gqa_row_kernel_*.so")
    assert run() == ""  # loaded, not compiled: no note at all
    library.write_bytes(b"not a library")
    assert "compiling the C++ row kernels" in run()
    assert run() == ""


@pytest.mark.parametrize("out, inp, rows", [(70, 96, 1), (576, 576, 3), (9, 7, 2)])
def test_the_float_kernel_gives_the_linear_layers_values_on_any_thread_count(out, inp, rows):
    """float_rows: the compiled step's one-row float32 product (inputs off a multiple of 32 reach its tail)."""
    kernel()
    g = torch.Generator().manual_seed(5)
    weight, x = torch.randn(out, inp, generator=g), torch.randn(rows, inp, generator=g)
    op, before = row_kernel.float_rows_op(), torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = op(x, weight)
        torch.set_num_threads(2)
        two = op(x, weight)
    finally:
        torch.set_num_threads(before)
    exact = F.linear(x.double(), weight.double())
    assert one.shape == (rows, out) and torch.equal(one, two)
    assert (one.double() - exact).abs().max().item() <= 1e-5 * exact.abs().max().item()


def test_compiled_one_row_float_linears_call_the_float_kernel():
    kernel()
    layer, x = torch.nn.Linear(96, 70), torch.randn(1, 96)  # float32, with a bias
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm.code)
        return gm.forward

    def step(x):
        with OneRowLinears():
            return layer(x)

    with torch.inference_mode():
        got = torch.compile(step, backend=record, fullgraph=True)(x)
        torch.testing.assert_close(got, layer(x), rtol=1e-5, atol=1e-5)
    assert len(graphs) == 1 and "gqa_quant.float_rows" in graphs[0]


BOTH_BUILDS = (
    "import sys, torch; from tests.cpu_kernels.test_row_kernel import KINDS, random_layer, run; "
    "from cpu_kernels import library as row_kernel; op = row_kernel.row_product_op(); "
    "x = torch.randn(3, 576, generator=torch.Generator().manual_seed(6)); "
    "torch.save([run(op, random_layer(*kind), x[:, : kind[3]]) for kind in KINDS], sys.argv[1])"
)


@pytest.mark.slow
def test_the_avx2_build_gives_the_avx512_builds_values(tmp_path):
    """Where the CPU has AVX-512 VNNI the kernel is built for it (16 outputs a vector, dpwssd); the AVX2 build,
    the only one a CPU without it gets, must give the same outputs (every integer sum is exact, and each output's
    float steps are the same)."""
    op = kernel()
    if "-mavx512vnni" not in row_kernel.flags():
        pytest.skip("this CPU has no AVX-512 VNNI: only the AVX2 build runs here")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GQA_ROW_KERNEL_ISA": "avx2"}
    out = tmp_path / "avx2.pt"
    done = subprocess.run(
        [sys.executable, "-c", BOTH_BUILDS, str(out)], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    x = torch.randn(3, 576, generator=torch.Generator().manual_seed(6))
    avx2 = torch.load(out)
    for kind, other in zip(KINDS, avx2, strict=True):
        assert torch.equal(run(op, random_layer(*kind), x[:, : kind[3]]), other), kind


@pytest.mark.parametrize("n_head, n_kv_head", [(4, 4), (9, 3), (4, 1)], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("batch_mask", [False, True])
def test_the_attention_kernel_gives_the_masked_attentions_values(n_head, n_kv_head, batch_mask):
    """The compiled CPU step's one-query attention in float32: SDPA's values over the visible positions, read
    from a cache layer laid out (B, S, Hkv, D) and viewed as (B, Hkv, S, D), as strided views of a buffer are."""
    kernel()
    g = torch.Generator().manual_seed(n_head + n_kv_head)
    q = torch.randn(2, n_head, 1, 20, generator=g)
    k, v = (torch.randn(2, 37, n_kv_head, 20, generator=g).transpose(1, 2) for _ in range(2))
    visible = torch.rand(2 if batch_mask else 1, 1, 1, 37, generator=g) < 0.6
    visible[..., 0] = True
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=visible, enable_gqa=True)
    got = one_query_attention(q, k, v, visible)
    assert got.shape == expected.shape and (got - expected).abs().max().item() <= 1e-6
    assert (expected - F.scaled_dot_product_attention(q, k, v, enable_gqa=True)).abs().max().item() > 0.01
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm.code)
        return gm.forward

    compiled = torch.compile(one_query_attention, backend=record, fullgraph=True)(q, k, v, visible)
    assert torch.equal(compiled, got) and "gqa_quant.one_query_attention" in graphs[0]
