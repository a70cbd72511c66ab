"""GGUF matrices kept in their Q4_0 / Q4_1 / Q8_0 blocks: the gguf package's weights, the same logits and tokens
eagerly and in the compiled step, one line for what cannot be kept."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from cpu_kernels.quantized import QuantizedLinear
from generation.sampling import GREEDY, generate
from generation.static_decode import StaticDecoder
from interop import PretrainedError, load
from interop.export_gguf import export_gguf
from interop.export_hf import export_hf
from interop.gguf_blocks import read_blocks
from model.cache import KVCache
from tests.conftest import run_generate
from tests.interop.gguf_by_hand import write_gguf

gguf = pytest.importorskip("gguf")
TYPES = ["Q4_0", "Q4_1", "Q8_0"]
# One row (a decode step) goes through the C++ kernel where it runs (cpu_kernels/quantized.py), which rounds the row
# to 16 bits per block of 32: a few in 1e5 of a product's largest output, and on these tiny models logits up to
# ~6e-4 from the float32 load's (measured; float rounding alone stays under 1e-5). The bound leaves room for
# other seeds; the tokens stay equal.
ONE_ROW_LOGITS = 2e-3
LINEARS = ["attn.qkv", "attn.proj", "mlp.gate_up", "mlp.down"]


def quantized_gguf(path, model, tokenizer, type_name: str):
    """A GGUF of `model` whose matrices (embedding included) are stored as `type_name`, norms as float32."""
    qtype = getattr(gguf.GGMLQuantizationType, type_name)
    return write_gguf(
        path,
        model,
        tokenizer,
        lambda name, a: (gguf.quants.quantize(a, qtype), qtype) if a.ndim == 2 else (a, None),
    )


def test_a_kept_layer_keeps_its_bias(make_model, tokenizer, tmp_path):
    # Qwen2's q/k/v biases: the kept q/k/v layer adds them as the float one does (they were once dropped).
    model = make_model(qkv_bias=True)
    with torch.no_grad():
        for block in model.blocks:
            block.attn.qkv.bias.normal_(0.0, 1.0)
    path = quantized_gguf(tmp_path / "q.gguf", model, tokenizer, "Q8_0")
    plain, kept = load(path).model, load(path, keep_quantized=True).model
    assert isinstance(kept.blocks[0].attn.qkv, QuantizedLinear)
    assert torch.equal(kept.blocks[0].attn.qkv.bias, plain.blocks[0].attn.qkv.bias)
    idx = torch.randint(plain.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert (kept(idx) - plain(idx)).abs().max().item() <= 1e-4
        assert (kept(idx[:1, :1]) - plain(idx[:1, :1])).abs().max().item() <= ONE_ROW_LOGITS


@pytest.mark.parametrize("type_name", TYPES)
def test_blocks_hold_the_gguf_packages_weights(type_name):
    qtype = getattr(gguf.GGMLQuantizationType, type_name)
    weight = np.random.default_rng(0).standard_normal((48, 96)).astype(np.float32)
    raw = gguf.quants.quantize(weight, qtype)
    expected = torch.from_numpy(gguf.quants.dequantize(raw, qtype).reshape(48, 96).astype(np.float32))
    layer = QuantizedLinear(*read_blocks(raw, type_name))
    assert torch.equal(layer.dequantize(), expected)  # bit for bit
    # A decode step's one row and a short prompt's few: the products of those weights with each row rounded to
    # 16 bits per block of 32 (cpu_kernels/row_kernel.cpp); longer prompts take the float GEMM (test_row_kernel.py).
    rows = torch.randn(5, 96, generator=torch.Generator().manual_seed(0))
    got, float_rows = layer(rows), F.linear(rows, expected)
    assert got.shape == (5, 48) and got.std() > 1.0
    assert (got - float_rows).abs().max().item() <= 1e-4 * float_rows.abs().max().item()


@pytest.mark.parametrize("type_name", ["Q4_1", "Q8_0"])
@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
def test_a_quantized_file_keeps_its_blocks_with_the_same_logits(
    make_model, tokenizer, tmp_path, type_name, tie
):
    path = quantized_gguf(tmp_path / "q.gguf", make_model(tie=tie), tokenizer, type_name)
    plain, kept = load(path).model, load(path, keep_quantized=True).model
    layers = [f"blocks.{i}.{name}" for i in range(plain.config.n_layer) for name in LINEARS] + ["lm_head"]
    for name in layers:
        layer = kept.get_submodule(name)
        assert isinstance(layer, QuantizedLinear), name
        assert torch.equal(layer.dequantize(), plain.get_submodule(name).weight), name
    assert not any(isinstance(m, torch.nn.Linear) for m in kept.modules())  # no float32 copy is left
    idx = torch.randint(plain.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours, theirs = kept(idx), plain(idx)
        one, one_plain = kept(idx[:1, :1]), plain(idx[:1, :1])  # one row: the sums over blocks
    assert ours.std() > 0.5 and (ours - theirs).abs().max().item() <= 1e-4
    assert (one - one_plain).abs().max().item() <= ONE_ROW_LOGITS


@pytest.mark.parametrize("type_name", TYPES)
def test_the_compiled_step_reads_the_blocks_with_the_same_logits(make_model, tokenizer, tmp_path, type_name):
    path = quantized_gguf(tmp_path / "q.gguf", make_model(), tokenizer, type_name)
    plain, kept = load(path).model, load(path, keep_quantized=True).model
    prompt = torch.randint(plain.config.vocab_size, (1, 12), generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        reference = StaticDecoder(plain, KVCache.allocate(plain.config, 1, 32), compile=False)
        compiled = StaticDecoder(kept, KVCache.allocate(kept.config, 1, 32), compile=True)
        expected, got = reference.prefill(prompt), compiled.prefill(prompt)
        diffs = [(expected - got).abs().max().item()]
        for token in torch.randint(
            plain.config.vocab_size, (16,), generator=torch.Generator().manual_seed(3)
        ):
            expected, got = reference.decode(token[None]), compiled.decode(token[None])
            diffs.append((expected - got).abs().max().item())
        assert got.std() > 0.5 and max(diffs) <= ONE_ROW_LOGITS, diffs
        tokens = generate(plain, prompt, 16, sampler=GREEDY)
        assert torch.equal(generate(kept, prompt, 16, sampler=GREEDY, compile=True), tokens)
        assert torch.equal(generate(kept, prompt, 16, sampler=GREEDY), tokens)


def test_generate_keep_quantized_compiled_prints_the_same_text(make_model, tokenizer, tmp_path, capsys, monkeypatch):  # fmt: skip
    monkeypatch.setenv("GQA_GPT_COMPILED_DIR", str(tmp_path))  # the step it keeps is for this test only
    path = str(quantized_gguf(tmp_path / "q.gguf", make_model(), tokenizer, "Q8_0"))
    argv = ["--checkpoint", path, "--prompt", "the cat", "--temperature", "0", "--max_new_tokens", "12"]
    code, plain, err = run_generate(capsys, *argv)
    assert code == 0, err
    code, kept, err = run_generate(capsys, *argv, "--keep_quantized", "--compile")
    assert code == 0, err
    assert kept == plain and len(plain) > len("the cat") + 5
    assert "note: 9 of 9 linear layers kept in their GGUF blocks" in err  # 2 x (qkv, o, gate_up, down) + head
    assert "note: compiling the decode step" in err
    code, eager, err = run_generate(capsys, *argv, "--keep_quantized")  # the eager step too
    assert code == 0 and eager == plain


def test_generate_keeps_a_ggufs_blocks_by_default_on_the_cpu(
    make_model, tokenizer, tmp_path, capsys, monkeypatch
):
    import generate as cli

    path = str(quantized_gguf(tmp_path / "q.gguf", make_model(), tokenizer, "Q4_1"))
    loaded, load_it = [], cli.load
    monkeypatch.setattr(cli, "load", lambda *args: loaded.append(load_it(*args)) or loaded[-1])
    argv = ["--checkpoint", path, "--prompt", "the cat", "--temperature", "0", "--max_new_tokens", "4"]
    notes = []
    for extra in ([], ["--dequantize"], ["--dtype", "bfloat16"]):
        code, _, err = run_generate(capsys, *argv, *extra)
        assert code == 0, err
        notes.append([line for line in err.splitlines() if line.startswith("note:")])
    # What decodes is said without asking: the default keeps the blocks and says so, the others keep none.
    assert notes == [["note: 9 of 9 linear layers kept in their GGUF blocks (0 MB)"], [], []], notes
    kept = [any(isinstance(m, QuantizedLinear) for m in one.model.modules()) for one in loaded]
    assert kept == [True, False, False]  # bfloat16: the kernel computes in float32
    code, _, err = run_generate(capsys, *argv, "--keep_quantized", "--dequantize")
    assert code == 2 and err.count("\n") == 1 and "--keep_quantized and --dequantize" in err


def test_what_cannot_be_kept_is_one_line(make_model, tokenizer, tmp_path, capsys):
    model = make_model()
    f32 = export_gguf(model, tokenizer, tmp_path / "f32.gguf")  # no blocks: float32 layers stay
    assert not any(isinstance(m, QuantizedLinear) for m in load(f32, keep_quantized=True).model.modules())
    with pytest.raises(PretrainedError, match="keep_quantized computes in float32") as error:
        load(f32, dtype=torch.bfloat16, keep_quantized=True)
    assert "\n" not in str(error.value)
    q8 = load(quantized_gguf(tmp_path / "q.gguf", model, tokenizer, "Q8_0"), keep_quantized=True)
    with pytest.raises(TypeError, match="rounding its scales would change the weights"):
        q8.model.half()
    assert q8.model.lm_head.scale.dtype == torch.float32
    folder = export_hf(model, tokenizer, tmp_path / "hf")
    code, out, err = run_generate(capsys, "--checkpoint", str(folder), "--prompt", "x", "--keep_quantized")
    assert code != 0 and out == ""
    assert "keep_quantized needs a .gguf file" in err and len(err.strip().splitlines()) == 1
