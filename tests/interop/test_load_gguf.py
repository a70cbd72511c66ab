"""GGUF files load back through interop: our own export with its logits and token ids, bad files in one line."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import torch

from interop import PretrainedError, load, load_hf
from interop.export_gguf import export_gguf
from tests.interop.gguf_by_hand import write_gguf
from tests.interop.test_hf_architectures import save_tiny
from tests.interop.test_hf_parity import TEXTS

gguf = pytest.importorskip("gguf")


@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
def test_our_export_loads_back_with_the_same_logits(make_model, tokenizer, tmp_path, tie):
    model = make_model(n_kv_head=2, tie=tie)
    path = export_gguf(model, tokenizer, tmp_path / "tiny.gguf")
    loaded = load(path)
    assert loaded.source.kind == "gguf" and loaded.model.config == model.config
    idx = torch.randint(model.config.vocab_size, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours, back = model(idx), loaded.model(idx)
    assert ours.std() > 0.5
    assert (ours - back).abs().max().item() <= 1e-4
    original = tokenizer
    for text in TEXTS:
        assert loaded.tokenizer.encode(text) == original.encode(text), text
        assert loaded.tokenizer.decode(original.encode(text)) == text
    assert loaded.tokenizer.eos_ids == (original.eos_id,) and not loaded.tokenizer.add_bos


def test_an_unsupported_tensor_type_is_one_line(make_model, tokenizer, tmp_path):
    write_gguf(
        tmp_path / "ints.gguf",
        make_model(),
        tokenizer,
        lambda name, a: (a.astype(np.int32) if name == "token_embd.weight" else a, None),
    )
    with pytest.raises(PretrainedError, match="token_embd.weight has type I32") as error:
        load(tmp_path / "ints.gguf")
    assert "\n" not in str(error.value) and "ints.gguf" in str(error.value)


def test_an_unsupported_architecture_is_one_line(make_model, tokenizer, tmp_path):
    write_gguf(tmp_path / "gemma.gguf", make_model(), tokenizer, architecture="gemma")
    with pytest.raises(PretrainedError, match="architecture 'gemma' is not supported"):
        load(tmp_path / "gemma.gguf")


def test_a_file_named_gguf_that_is_not_one(tmp_path):
    (tmp_path / "fake.gguf").write_bytes(b"PK\x03\x04 not a gguf")
    with pytest.raises(PretrainedError, match="not a GGUF file"):
        load(tmp_path / "fake.gguf")


@pytest.mark.parametrize("name", ["qwen2", "qwen3"])
def test_a_qwen_gguf_loads_with_the_logits_of_transformers(name, tokenizer, tmp_path):
    """A tiny random Qwen2 (q/k/v biases) or Qwen3 (q/k norms, its own head_dim) written as GGUF by our exporter
    loads through the name table with the logits transformers computes on the Hugging Face folder."""
    hf = save_tiny(name, tmp_path / "hf")
    path = export_gguf(load_hf(tmp_path / "hf"), tokenizer, tmp_path / f"{name}.gguf")
    assert gguf.GGUFReader(path).fields["general.architecture"].contents() == name
    loaded = load(path).model
    idx = torch.randint(320, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        theirs, ours = hf(idx).logits, loaded(idx)
    assert theirs.std() > 0.5 and (ours - theirs).abs().max().item() <= 1e-4


def readable_types() -> list[str]:
    """Every tensor type the gguf package can both write (quantize) and read (dequantize)."""
    sample = np.random.default_rng(0).standard_normal((2, 256)).astype(np.float32)
    readable = []
    for qtype in gguf.GGMLQuantizationType:
        try:
            gguf.quants.dequantize(gguf.quants.quantize(sample, qtype), qtype)
        except (NotImplementedError, TypeError, ValueError):
            continue
        readable.append(qtype.name)
    return readable


@pytest.mark.parametrize("type_name", readable_types())
def test_every_tensor_type_the_gguf_package_reads_loads_bit_exact(make_model, tokenizer, tmp_path, type_name):
    """Matrices stored as `type_name` load as exactly the gguf package's dequantised values (each matrix whose
    rows are not whole blocks stays float32): the same model as a float32 file of those values."""
    qtype = getattr(gguf.GGMLQuantizationType, type_name)
    block = gguf.GGML_QUANT_SIZES[qtype][0]

    def quantized(name, array):
        whole = array.ndim == 2 and array.shape[-1] % block == 0
        return (gguf.quants.quantize(array, qtype), qtype) if whole else (array, None)

    def dequantized(name, array):
        data, raw = quantized(name, array)
        return (array if raw is None else gguf.quants.dequantize(data, raw).reshape(array.shape)), None

    model = make_model(n_embd=256, mlp_hidden=256)
    stored = load(write_gguf(tmp_path / "q.gguf", model, tokenizer, quantized)).model
    expected = load(write_gguf(tmp_path / "f32.gguf", model, tokenizer, dequantized)).model
    for (name, ours), theirs in zip(stored.state_dict().items(), expected.state_dict().values(), strict=True):
        assert torch.equal(ours, theirs), name
    embedding = model.wte.weight.detach().numpy()
    direct = torch.from_numpy(dequantized("token_embd.weight", embedding)[0])  # the gguf package's own values
    assert torch.equal(stored.wte.weight, direct)
    assert not torch.equal(stored.wte.weight, model.wte.weight) or type_name in ("F32", "F16", "BF16")


@pytest.mark.parametrize(("tensor", "layer"), [("blk.1.attn_q.weight", 1), ("blk.0.attn_v.weight", 0),
                                               ("blk.1.ffn_norm.weight", 1)])  # fmt: skip
@pytest.mark.parametrize("kept", [False, True], ids=["float", "kept-q8_0"])
def test_nan_in_a_weight_is_one_line_naming_its_layer(make_model, tokenizer, tmp_path, tensor, layer, kept):
    # torch's CPU attention gives finite outputs for NaN queries: without this check the model decoded text.
    q8_0 = gguf.GGMLQuantizationType.Q8_0

    def store(name, array):
        if name == tensor:
            array = array.copy()
            array.flat[::7] = np.nan
        return (gguf.quants.quantize(array, q8_0), q8_0) if kept and array.ndim == 2 else (array, None)

    path = write_gguf(tmp_path / "nan.gguf", make_model(), tokenizer, store)
    with pytest.raises(PretrainedError) as error:
        load(path, keep_quantized=kept)
    message = str(error.value)
    assert f"(layer {layer}) holds NaN or infinite values" in message and "\n" not in message, message
    assert message.startswith(str(path))


def test_a_layer_count_the_weights_do_not_hold_is_one_line_before_building(make_model, tokenizer, tmp_path):
    import json

    from interop.export_hf import export_hf

    folder = export_hf(make_model(), tokenizer, tmp_path / "hf")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"num_hidden_layers": 5000}))
    with pytest.raises(PretrainedError, match="num_hidden_layers says 5000 layers but the weights hold 2"):
        load(folder)


def test_a_damaged_gguf_file_is_one_line(make_model, tokenizer, tmp_path):
    # The header reader (interop/gguf_header.py) meets every kind of damage as one line naming the file.
    good = export_gguf(make_model(), tokenizer, tmp_path / "good.gguf").read_bytes()
    version_3 = (3).to_bytes(4, "little")
    assert good[4:8] == version_3, "the export's header changed: fix the test"
    cuts = (4, 20, 200, 2000, len(good) // 2, len(good) - 1)
    damages = {
        **{f"cut at {n}": good[:n] for n in cuts},
        "version 9": b"GGUF" + (9).to_bytes(4, "little") + good[8:],
        # No tensors and one field, general.alignment = 0 (a uint32): a division by zero without the check.
        "alignment 0": b"GGUF"
        + version_3
        + struct.pack("<QQQ", 0, 1, 17)
        + b"general.alignment"
        + struct.pack("<II", 4, 0),
    }
    for what, data in damages.items():
        path = tmp_path / "damaged.gguf"
        path.write_bytes(data)
        with pytest.raises(PretrainedError) as error:
            load(path)
        message = str(error.value)
        assert message.startswith(str(path)) and "\n" not in message, (what, message)
