"""GGUF matrices kept in their K-quant blocks (Q4_K, Q5_K, Q6_K, and Q5_0 / Q5_1, llama.cpp's stand-ins for rows
that are not whole super-blocks of 256): bit for bit the `gguf` package's weights, the float32 load's logits and
greedy tokens, a fraction of float32's memory.

The gguf package writes no K-quants, so the files come from llama.cpp's own llama-quantize, built by
tools/llamacpp/build.sh (cached under ~/.cache). Outside CI a missing build skips those tests with the command to
run; with CI=true or GQA_REQUIRE_LLAMACPP=1 (.ci/run sets it) it fails them. The block layouts themselves are
checked without it, on random bytes.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from cpu_kernels.quantized import QuantizedLinear
from generation.sampling import GREEDY, generate
from generation.static_decode import StaticDecoder
from interop import load
from interop.export_gguf import export_gguf
from interop.gguf_blocks import read_blocks, stacked
from interop.names import row
from model.cache import KVCache
from tests.interop.test_gguf_llamacpp import llamacpp_binary

gguf = pytest.importorskip("gguf")
NEW_TYPES = ["Q4_K", "Q5_K", "Q6_K", "Q5_0", "Q5_1"]
# Byte offsets of each type's float16 super-block (or block) scales; every other byte may hold anything.
HALVES = {"Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,)}
# What a matrix of each type becomes: (code bits, codes per block, whether a block has a minimum, code offset).
OURS = {
    "Q4_0": (4, 32, False, 8),
    "Q4_1": (4, 32, True, 0),
    "Q5_0": (5, 32, False, 16),
    "Q5_1": (5, 32, True, 0),
    "Q8_0": (8, 32, False, 128),
    "Q4_K": (4, 32, True, 0),
    "Q5_K": (5, 32, True, 0),
    "Q6_K": (6, 16, False, 32),
}
# llama-quantize's file types and the matrix types each gives (Q4_K_M and Q5_K_M store the output layer and some
# layers' v and down as Q6_K).
FILE_TYPES = {"Q4_K_M": {"Q4_K", "Q6_K"}, "Q5_K_M": {"Q5_K", "Q6_K"}, "Q6_K": {"Q6_K"}}
BOUND = 1e-4  # logits of the kept blocks against the float32 load: float32 sums in another order
ROW_BOUND = 5e-3  # one row goes through the row kernel (cpu_kernels/quantized.py), which rounds the row to 16 bits per block


def random_blocks(type_name: str, rows: int, inputs: int, seed: int = 0) -> np.ndarray:
    """Raw bytes (rows, bytes per row) of `type_name`: random codes and sub-block scales (every bit pattern), the
    float16 scales finite, normal and subnormal, of either sign."""
    qtype = getattr(gguf.GGMLQuantizationType, type_name)
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (rows, inputs // block, size), dtype=np.uint8)
    for offset in HALVES[type_name]:
        magnitude = 10.0 ** rng.integers(-7, -1, (rows, inputs // block, 1))  # below 6e-5 is subnormal
        half = (rng.standard_normal(magnitude.shape) * magnitude).astype(np.float16)
        raw[..., offset : offset + 2] = half.view(np.uint8)
    return raw.reshape(rows, -1)


def dequantized(raw: np.ndarray, type_name: str) -> torch.Tensor:
    """The gguf package's float32 weights of raw blocks."""
    weights = gguf.quants.dequantize(raw, getattr(gguf.GGMLQuantizationType, type_name))
    return torch.from_numpy(weights.reshape(raw.shape[0], -1).astype(np.float32))


@pytest.mark.parametrize("type_name", NEW_TYPES)
def test_blocks_hold_the_gguf_packages_weights(type_name):
    raw = random_blocks(type_name, 24, 512)
    expected = dequantized(raw, type_name)
    layer = QuantizedLinear(*read_blocks(raw, type_name))
    assert (layer.bits, layer.block, layer.minimum is not None, layer.offset) == OURS[type_name]
    assert torch.equal(layer.dequantize(), expected)  # bit for bit
    rows = torch.randn(5, 512, generator=torch.Generator().manual_seed(0))
    scale = F.linear(rows, expected).abs().max().item()
    assert scale > 0
    # A few rows on the CPU go through the row kernel (cpu_kernels/quantized.py), which rounds each row to 16 bits per
    # block of 32 (~2e-5); its blocks' sums are block-sized (Q6_K's 16).
    got = layer(rows)
    assert got.shape == (5, 24) and (got - F.linear(rows, expected)).abs().max().item() <= 1e-4 * scale


def test_matrices_of_different_types_stack_into_one_layer_with_their_weights():
    """A fused layer whose parts have different types (Q4_K_M's q and k as Q4_K, v as Q6_K) holds each part's
    very weights: the widest codes, the shortest blocks, a minimum of -offset * scale where a part has none."""
    types = ["Q4_K", "Q6_K", "Q5_1", "Q8_0"]
    raws = [random_blocks(t, 8 * (i + 1), 256, seed=i) for i, t in enumerate(types)]
    layer = QuantizedLinear(*stacked([read_blocks(raw, t) for raw, t in zip(raws, types, strict=True)]))
    assert (layer.bits, layer.block, layer.minimum is not None) == (8, 16, True)
    expected = torch.cat([dequantized(raw, t) for raw, t in zip(raws, types, strict=True)])
    assert torch.equal(layer.dequantize(), expected)
    x = torch.randn(1, 256, generator=torch.Generator().manual_seed(1))
    scale = F.linear(x, expected).abs().max().item()
    # one row: the row kernel's 16-bit row (~2e-5, twice that where unsigned codes meet a minimum), or the float path
    assert (layer(x) - F.linear(x, expected)).abs().max().item() <= 1e-4 * scale
    same = stacked([read_blocks(raws[1], "Q6_K")] * 2)  # parts of one offset keep it, without a minimum
    assert (same.bits, same.block, same.minimum, same.offset) == (6, 16, None, 32)


def test_a_block_size_the_layer_cannot_hold_is_refused():
    codes = torch.zeros(4, 64, dtype=torch.int8)
    with pytest.raises(ValueError, match="blocks of 16 or 32"):
        QuantizedLinear(codes, torch.ones(4, 8), None, 8, block=8)
    with pytest.raises(ValueError, match="one scale per block of 16"):
        QuantizedLinear(codes, torch.ones(4, 2), None, 8, block=16)


@pytest.fixture(scope="module")
def llama_quantize() -> Path:
    """llama.cpp's llama-quantize binary."""
    return llamacpp_binary("llama-quantize")


@pytest.fixture(scope="module")
def kquant_files(llama_quantize, make_model, tokenizer, tmp_path_factory) -> dict[tuple[str, bool], Path]:
    """(file type, tied) -> a GGUF llama-quantize made from our float32 export of a tiny model whose rows are
    whole super-blocks of 256 (n_embd 256, MLP 512; 2 layers, so Q4_K_M / Q5_K_M give layer 1's v and down
    Q6_K)."""
    folder = tmp_path_factory.mktemp("kquants")
    files = {}
    for tie in (False, True):
        model = make_model(n_embd=256, mlp_hidden=512, tie=tie)
        f32 = export_gguf(model, tokenizer, folder / f"f32-{tie}.gguf")
        for file_type in FILE_TYPES:
            out = folder / f"{file_type}-{tie}.gguf"
            done = subprocess.run(
                [str(llama_quantize), str(f32), str(out), file_type, "1"],
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert done.returncode == 0, done.stderr[-3000:]
            files[file_type, tie] = out
    return files


def stored_types(path: Path) -> dict[str, str]:
    """Each tensor's name in the file -> its type name."""
    return {t.name: t.tensor_type.name for t in gguf.GGUFReader(path).tensors}


def matrix_types(model, types: dict[str, str]) -> dict[str, list[str]]:
    """Our linear layer name -> the stored types of its parts (three for qkv, two for gate_up); the kept
    embedding's table is `wte.table` (a tied lm_head is that module)."""
    out = {}
    for name, module in model.named_modules():
        if isinstance(module, (torch.nn.Linear, QuantizedLinear)):
            ours = "wte.weight" if name == "wte.table" else f"{name}.weight"
            parts, i = row(ours)
            out[name] = [types[part.gguf.format(i=i)] for part in parts]
    return out


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("file_type", list(FILE_TYPES))
def test_a_kquant_file_keeps_its_blocks_with_the_same_logits_and_tokens(kquant_files, file_type, tie):
    path = kquant_files[file_type, tie]
    types = stored_types(path)
    matrices = {name: t for name, t in types.items() if not name.endswith("norm.weight")}
    assert set(matrices.values()) == FILE_TYPES[file_type], matrices  # what llama-quantize was asked for
    assert all(t == "F32" for name, t in types.items() if name.endswith("norm.weight"))
    plain, kept = load(path).model, load(path, keep_quantized=True).model
    for name, parts in matrix_types(kept, types).items():
        layer = kept.get_submodule(name)
        assert isinstance(layer, QuantizedLinear), name
        # The float32 load is the gguf package's dequantisation: the kept blocks hold those weights exactly.
        assert torch.equal(layer.dequantize(), plain.get_parameter(f"{name}.weight".replace(".table", ""))), (
            parts
        )
    assert not any(
        isinstance(m, torch.nn.Linear | torch.nn.Embedding) for m in kept.modules()
    )  # no float32 copy
    assert (kept.lm_head is kept.wte.table) == tie
    idx = torch.randint(plain.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours, theirs = kept(idx), plain(idx)
        one, one_plain = kept(idx[:1, :1]), plain(idx[:1, :1])  # one row: the sums over blocks
    assert ours.std() > 0.5 and (ours - theirs).abs().max().item() <= BOUND
    assert (one - one_plain).abs().max().item() <= ROW_BOUND
    prompt = idx[:1, :8]
    with torch.inference_mode():
        tokens = generate(plain, prompt, 16, sampler=GREEDY)
        assert torch.equal(generate(kept, prompt, 16, sampler=GREEDY), tokens)
    assert len(set(tokens[0, 8:].tolist())) > 1  # greedy keeps changing token: a near-tie would show


def bits_per_weight(types) -> float:
    """Our bits per weight for a layer whose parts have these stored types: the widest codes, the shortest blocks,
    a float32 minimum if any part has one or their offsets differ, besides each block's float32 scale."""
    bits, block = max(OURS[t][0] for t in types), min(OURS[t][1] for t in types)
    minimum = any(OURS[t][2] for t in types) or len({OURS[t][3] for t in types}) > 1
    return bits + 32 * (2 if minimum else 1) / block


def test_kept_kquants_take_the_memory_their_types_imply(kquant_files):
    """Each kept layer's buffers are the bytes its stored types imply, and their sum a fraction of float32's no
    larger than the widest mix of the file's types."""
    for (file_type, _), path in kquant_files.items():
        kept = load(path, keep_quantized=True).model
        kept_bytes = float32_bytes = 0
        for name, parts in matrix_types(kept, stored_types(path)).items():
            layer = kept.get_submodule(name)
            weights = layer.in_features * layer.out_features
            got = sum(b.numel() * b.element_size() for b in layer.buffers())
            assert got == weights * bits_per_weight(parts) / 8, (file_type, name, parts)
            kept_bytes, float32_bytes = kept_bytes + got, float32_bytes + 4 * weights
        assert kept_bytes / float32_bytes <= bits_per_weight(FILE_TYPES[file_type]) / 32 < 1, file_type


@pytest.mark.slow
def test_the_compiled_step_reads_kquant_blocks_with_the_same_logits(kquant_files):
    """Q4_K_M (4-bit blocks of 32, and layer 1's qkv and down widened to 8-bit blocks of 16) through the compiled
    decode step."""
    path = kquant_files["Q4_K_M", False]
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
        assert got.std() > 0.5 and max(diffs) <= ROW_BOUND, diffs
        tokens = generate(plain, prompt, 16, sampler=GREEDY)
        assert torch.equal(generate(kept, prompt, 16, sampler=GREEDY, compile=True), tokens)
