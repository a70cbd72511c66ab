"""export_hf then interop.load_hf gives back the same tensors; folders we cannot run are refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from interop import load_hf
from interop.export_hf import export_hf
from model import GPT


@pytest.fixture(params=[True, False], ids=["tied", "untied"])
def exported(request, make_model, tokenizer, tmp_path):
    model = make_model(n_kv_head=2, tie=request.param)
    return model, export_hf(model, tokenizer, tmp_path / "hf")


def assert_same_weights(a: GPT, b: GPT) -> None:
    assert a.config == b.config
    state_a, state_b = a.state_dict(), b.state_dict()
    assert state_a.keys() == state_b.keys()
    for name, tensor in state_a.items():
        assert torch.equal(tensor, state_b[name]), name


def test_round_trip_gives_identical_weights(exported):
    model, out = exported
    loaded = load_hf(out)
    assert_same_weights(model, loaded)
    assert (loaded.lm_head.weight is loaded.wte.weight) == model.config.tie_embeddings
    assert not loaded.training


def test_tied_export_stores_the_embedding_once(exported):
    model, out = exported
    with safe_open(out / "model.safetensors", "pt") as f:
        names = set(f.keys())
    layer = ["input_layernorm", "post_attention_layernorm", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]
    layer += [f"self_attn.{p}_proj" for p in "qkvo"]
    expected = {f"model.layers.{i}.{n}.weight" for i in range(model.config.n_layer) for n in layer}
    expected |= {"model.embed_tokens.weight", "model.norm.weight"}
    assert names - {"lm_head.weight"} == expected
    assert ("lm_head.weight" in names) != model.config.tie_embeddings


def test_bfloat16_export_round_trips(make_model, tokenizer, tmp_path):
    model = make_model(tie=False).to(torch.bfloat16)
    out = export_hf(model, tokenizer, tmp_path / "hf")
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "bfloat16"
    assert_same_weights(model, load_hf(out))


def test_sharded_folder_written_by_transformers_loads(transformers, make_model, tokenizer, tmp_path):
    model = make_model(tie=False)
    hf = transformers.AutoModelForCausalLM.from_pretrained(export_hf(model, tokenizer, tmp_path / "hf"))
    hf.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    assert_same_weights(model, load_hf(tmp_path / "sharded"))


def edit_config(out: Path, **changes) -> None:
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(config | changes))


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"attention_bias": True}, "attention_bias"),
        ({"mlp_bias": True}, "mlp_bias"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "rope_scaling"),
        ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 1e4, "factor": 8.0}}, "rope_parameters"),
        ({"head_dim": 15}, "head_dim"),  # odd: RoPE rotates pairs (an even head_dim of its own is supported)
        ({"model_type": "gemma"}, "model_type"),
    ],
)
def test_unsupported_config_is_refused_naming_the_field(exported, changes, field):
    _, out = exported
    edit_config(out, **changes)
    with pytest.raises(ValueError, match=field) as err:
        load_hf(out)
    assert "\n" not in str(err.value)


def test_default_rope_scaling_is_accepted(exported):
    model, out = exported
    edit_config(
        out, rope_scaling={"type": "default"}, rope_parameters=None, rope_theta=model.config.rope_theta
    )
    assert_same_weights(model, load_hf(out))


@pytest.mark.parametrize("name", ["model.layers.1.mlp.up_proj.weight", "model.norm.weight"])
def test_missing_tensor_is_refused_naming_it(exported, name):
    _, out = exported
    tensors = load_file(out / "model.safetensors")
    del tensors[name]
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=name.replace(".", r"\.")) as err:
        load_hf(out)
    assert "\n" not in str(err.value)


def test_untied_config_without_lm_head_is_refused(make_model, tokenizer, tmp_path):
    out = export_hf(make_model(tie=True), tokenizer, tmp_path / "hf")
    edit_config(out, tie_word_embeddings=False)
    with pytest.raises(ValueError, match="lm_head.weight"):
        load_hf(out)


def test_unexpected_tensor_and_wrong_shape_are_refused(exported):
    _, out = exported
    tensors = load_file(out / "model.safetensors")
    save_file(tensors | {"model.layers.0.self_attn.q_proj.bias": torch.zeros(64)}, out / "model.safetensors")
    with pytest.raises(ValueError, match="q_proj.bias"):
        load_hf(out)
    tensors["model.layers.0.mlp.down_proj.weight"] = torch.zeros(64, 95)
    tensors["model.layers.1.self_attn.k_proj.weight"] = torch.zeros(32, 63)
    save_file(tensors, out / "model.safetensors")
    with pytest.raises(ValueError, match="down_proj") as err:
        load_hf(out)
    assert "\n" not in str(err.value)


def test_folder_without_config_or_weights_is_refused(exported, tmp_path):
    _, out = exported
    with pytest.raises(ValueError, match="config.json"):
        load_hf(tmp_path / "nowhere")
    (out / "model.safetensors").unlink()
    with pytest.raises(ValueError, match="model.safetensors"):
        load_hf(out)


def test_damaged_weights_file_is_one_line(exported):
    _, out = exported
    (out / "model.safetensors").write_bytes(b"\x00" * 64)
    with pytest.raises(ValueError, match="model.safetensors") as err:
        load_hf(out)
    assert "\n" not in str(err.value) and str(err.value).count(str(out)) == 1
