"""The GGUF file holds our exact weights and hyperparameters, its RoPE layout is equivalent, and the CLI fails
in one line without overwriting anything. llama.cpp itself is exercised in test_gguf_llamacpp.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

import interop.gguf_file as gguf_file
from common.errors import UserError, run_command
from data.tokenizer import Tokenizer
from interop.export_gguf import export_gguf, main
from interop.names import from_interleaved_rope, to_interleaved_rope
from interop.tokenizer_files import GGUF_CONTROL, GGUF_NORMAL, GGUF_UNUSED
from model.attention import Rope, apply_rope
from tests.interop.test_hf_export_cli import write_checkpoint

gguf = pytest.importorskip("gguf", reason='the GGUF export needs pip install -e ".[gguf]"')


def read_gguf(path: Path) -> tuple[dict[str, torch.Tensor], dict]:
    """Every tensor (as float32 torch tensors in our row-major shapes) and every metadata value of a file."""
    reader = gguf.GGUFReader(path)
    tensors = {}
    for tensor in reader.tensors:
        data = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        tensors[tensor.name] = torch.from_numpy(data.astype("float32").copy())
    fields = {name: field.contents() for name, field in reader.fields.items()}
    return tensors, fields


def our_state_from_gguf(tensors: dict[str, torch.Tensor], model) -> dict[str, torch.Tensor]:
    """Our state_dict rebuilt from the GGUF tensors: q/k rows back to rotate-half, projections fused again."""
    c = model.config
    state = {"wte.weight": tensors["token_embd.weight"], "norm.weight": tensors["output_norm.weight"]}
    for i in range(c.n_layer):
        blk, ours = f"blk.{i}.", f"blocks.{i}."
        q = from_interleaved_rope(tensors[blk + "attn_q.weight"], c.n_head)
        k = from_interleaved_rope(tensors[blk + "attn_k.weight"], c.n_kv_head)
        state |= {
            ours + "attn_norm.weight": tensors[blk + "attn_norm.weight"],
            ours + "attn.qkv.weight": torch.cat([q, k, tensors[blk + "attn_v.weight"]]),
            ours + "attn.proj.weight": tensors[blk + "attn_output.weight"],
            ours + "mlp_norm.weight": tensors[blk + "ffn_norm.weight"],
            ours + "mlp.gate_up.weight": torch.cat(
                [tensors[blk + "ffn_gate.weight"], tensors[blk + "ffn_up.weight"]]
            ),
            ours + "mlp.down.weight": tensors[blk + "ffn_down.weight"],
        }
    state["lm_head.weight"] = tensors.get("output.weight", state["wte.weight"])
    return state


@pytest.mark.parametrize(
    "n_kv_head,tie", [(4, True), (2, True), (1, False)], ids=["mha", "gqa-tied", "mqa-untied"]
)
def test_f32_round_trip_gives_back_every_tensor(make_model, tokenizer, tmp_path, n_kv_head, tie):
    model = make_model(n_kv_head=n_kv_head, tie=tie)
    tensors, _ = read_gguf(export_gguf(model, tokenizer, tmp_path / "m.gguf"))
    assert ("output.weight" in tensors) == (not tie)  # llama.cpp reuses token_embd when output is absent
    expected = model.state_dict()
    rebuilt = our_state_from_gguf(tensors, model)
    assert rebuilt.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.equal(rebuilt[name], tensor), name
    n_tensors = 2 + 9 * model.config.n_layer + (not tie)
    assert len(tensors) == n_tensors  # nothing extra, nothing twice


def test_metadata_declares_our_shapes_and_tokenizer(make_model, tokenizer_json, tokenizer, tmp_path):
    model = make_model(n_kv_head=2, vocab_size=333)  # a larger embedding than the tokenizer's 320 ids
    _, fields = read_gguf(export_gguf(model, tokenizer, tmp_path / "m.gguf"))
    c, spec = model.config, json.loads(tokenizer_json)
    expected = {
        "general.architecture": "llama",
        "llama.block_count": c.n_layer,
        "llama.embedding_length": c.n_embd,
        "llama.feed_forward_length": c.hidden_dim,
        "llama.attention.head_count": c.n_head,
        "llama.attention.head_count_kv": 2,
        "llama.rope.dimension_count": c.head_dim,
        "llama.context_length": c.block_size,
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "gpt-2",
        "tokenizer.ggml.add_bos_token": False,
        "tokenizer.ggml.add_space_prefix": False,
    }
    assert {key: fields[key] for key in expected} == expected
    assert fields["llama.rope.freq_base"] == pytest.approx(c.rope_theta)
    assert fields["llama.attention.layer_norm_rms_epsilon"] == pytest.approx(c.norm_eps)
    eos = next(t["id"] for t in spec["added_tokens"] if t["content"] == "<|endoftext|>")
    # Our BPE's one rule (data/tokenizer.py): <|endoftext|> ends a text and there is no BOS.
    assert fields["tokenizer.ggml.eos_token_id"] == eos and "tokenizer.ggml.bos_token_id" not in fields
    tokens, types = fields["tokenizer.ggml.tokens"], fields["tokenizer.ggml.token_type"]
    assert len(tokens) == len(types) == 333
    assert all(tokens[i] == token for token, i in spec["model"]["vocab"].items())
    assert (
        types[eos] == GGUF_CONTROL
        and types[:320].count(GGUF_NORMAL) == 319
        and set(types[320:]) == {GGUF_UNUSED}
    )
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    assert fields["tokenizer.ggml.merges"] == merges and len(merges) > 20


def interleaved_rope(x: torch.Tensor, theta: float, positions: torch.Tensor) -> torch.Tensor:
    """RoPE as llama.cpp's `llama` arch applies it: dimensions (2i, 2i+1) rotate by theta^(-2i/D)."""
    d = x.shape[-1]
    angles = positions[:, None].float() * theta ** (-torch.arange(0, d, 2).float() / d)  # (T, D/2)
    even, odd = x[..., 0::2], x[..., 1::2]
    out = torch.stack(
        [even * angles.cos() - odd * angles.sin(), even * angles.sin() + odd * angles.cos()], -1
    )
    return out.flatten(-2)


def test_permuted_rows_under_interleaved_rope_give_our_attention_scores():
    torch.manual_seed(0)
    n_heads, d, c, t, theta = 3, 8, 16, 5, 500.0
    wq, wk, h = torch.randn(n_heads * d, c), torch.randn(n_heads * d, c), torch.randn(t, c)
    cos, sin = Rope(d, theta).tables(0, t)

    def heads(w):
        return (h @ w.T).reshape(t, n_heads, d).transpose(0, 1)  # (H, T, D)

    ours = apply_rope(heads(wq), cos, sin) @ apply_rope(heads(wk), cos, sin).transpose(-1, -2)
    positions = torch.arange(t)
    q = interleaved_rope(heads(to_interleaved_rope(wq, n_heads)), theta, positions)
    k = interleaved_rope(heads(to_interleaved_rope(wk, n_heads)), theta, positions)
    torch.testing.assert_close(q @ k.transpose(-1, -2), ours, rtol=1e-4, atol=1e-4)
    assert torch.equal(from_interleaved_rope(to_interleaved_rope(wq, n_heads), n_heads), wq)


@pytest.mark.parametrize("dtype,tolerance", [("f16", 1e-3), ("bf16", 1e-2), ("q8_0", 2e-2)])
def test_smaller_dtypes_keep_norms_f32_and_weights_close(make_model, tokenizer, tmp_path, dtype, tolerance):
    model = make_model()
    path = export_gguf(model, tokenizer, tmp_path / f"m-{dtype}.gguf", dtype=dtype)
    kinds = {t.name: t.tensor_type.name for t in gguf.GGUFReader(path).tensors}
    assert kinds["output_norm.weight"] == "F32" and kinds["blk.0.attn_q.weight"] == dtype.upper()
    rebuilt = our_state_from_gguf(read_gguf(path)[0], model)
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(rebuilt[name], tensor, atol=tolerance * 5, rtol=tolerance, msg=name)


def test_refuses_to_overwrite_and_force_replaces(make_model, tokenizer, tmp_path):
    out = tmp_path / "m.gguf"
    out.write_bytes(b"precious")
    with pytest.raises(UserError, match="--force"):
        export_gguf(make_model(), tokenizer, out)
    assert out.read_bytes() == b"precious"
    export_gguf(make_model(), tokenizer, out, force=True)
    assert out.read_bytes()[:4] == b"GGUF"


def test_interrupted_export_leaves_the_old_file_and_no_temporary(
    make_model, tokenizer, tmp_path, monkeypatch
):
    out = tmp_path / "m.gguf"
    out.write_bytes(b"old")

    def disk_full(self, *args, **kwargs):
        raise OSError("No space left on device")

    monkeypatch.setattr(gguf.GGUFWriter, "write_tensors_to_file", disk_full)
    with pytest.raises(OSError, match="No space"):
        export_gguf(make_model(), tokenizer, out, force=True)
    assert [p.name for p in tmp_path.iterdir()] == ["m.gguf"] and out.read_bytes() == b"old"


@pytest.mark.parametrize(
    "edit,field",
    [
        (lambda s: s["pre_tokenizer"].update(add_prefix_space=True), "add_prefix_space"),
        (lambda s: s.update(normalizer={"type": "NFC"}), "normalizer"),
        (lambda s: s.update(pre_tokenizer={"type": "Whitespace"}), "pre_tokenizer.type"),
    ],
)
def test_a_tokenizer_llamacpp_would_split_differently_is_refused(
    make_model, tokenizer_json, tmp_path, edit, field
):
    spec = json.loads(tokenizer_json)
    edit(spec)
    with pytest.raises(UserError, match=field):
        export_gguf(make_model(), Tokenizer.from_json(json.dumps(spec)), tmp_path / "m.gguf")
    assert list(tmp_path.iterdir()) == []


def test_missing_gguf_package_is_one_line_naming_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "gguf", None)  # makes `import gguf` raise ImportError
    with pytest.raises(UserError, match=r'pip install -e "\.\[gguf\]"'):
        gguf_file.import_gguf()


def run_cli(capsys, *args: str) -> tuple[int, str]:
    """Exit code and stderr of the command, run in-process through the same handler as `python -m`."""
    code = run_command(lambda: main(list(args)))
    return code, capsys.readouterr().err


def test_cli_exports_a_checkpoint_and_refuses_in_one_line(make_model, tokenizer_json, tmp_path, capsys):
    ckpt = write_checkpoint(make_model(), tokenizer_json, tmp_path / "run" / "checkpoints" / "last.ckpt")
    assert run_cli(capsys, "--checkpoint", str(tmp_path / "run"), "--out", str(tmp_path / "m.gguf"))[0] == 0
    assert (tmp_path / "m.gguf").read_bytes()[:4] == b"GGUF"
    again = run_cli(capsys, "--checkpoint", str(ckpt), "--out", str(tmp_path / "m.gguf"))
    missing = run_cli(capsys, "--checkpoint", str(tmp_path / "nope.ckpt"), "--out", str(tmp_path / "n.gguf"))
    for (code, err), words in [(again, "--force"), (missing, "nope.ckpt")]:
        assert code == 2 and err.count("\n") == 1 and err.startswith("error:") and words in err, err
    assert not (tmp_path / "n.gguf").exists()


def test_cli_force_never_overwrites_what_it_reads(make_model, tokenizer_json, tmp_path, capsys):
    """The checkpoint itself (not a .gguf), a .gguf source, and a symlink to the source are refused."""
    ckpt = write_checkpoint(make_model(), tokenizer_json, tmp_path / "run" / "checkpoints" / "last.ckpt")
    assert run_cli(capsys, "--checkpoint", str(ckpt), "--out", str(tmp_path / "m.gguf"))[0] == 0
    (tmp_path / "link.gguf").symlink_to(tmp_path / "m.gguf")
    (tmp_path / "run" / "old.gguf").write_bytes(b"kept")
    before = {p: p.read_bytes() for p in [ckpt, tmp_path / "m.gguf", tmp_path / "run" / "old.gguf"]}
    cases = [
        (ckpt, ckpt, ": expected a .gguf file"),
        (tmp_path / "m.gguf", tmp_path / "m.gguf", " is "),
        (tmp_path / "m.gguf", tmp_path / "link.gguf", " is "),
        (tmp_path / "run", tmp_path / "run" / "old.gguf", " is inside "),
    ]
    for source, out, words in cases:
        code, err = run_cli(capsys, "--checkpoint", str(source), "--out", str(out), "--force")
        assert code == 2 and err.count("\n") == 1 and err.startswith(f"error: --out {out}{words}"), err
    assert {p: p.read_bytes() for p in before} == before and (tmp_path / "link.gguf").is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.gguf", "m.gguf", "run"]
    new = tmp_path / "run" / "new.gguf"  # a new file in the source's folder reads nothing it replaces
    assert run_cli(capsys, "--checkpoint", str(tmp_path / "run"), "--out", str(new))[0] == 0 and new.is_file()


def test_out_must_end_in_gguf(make_model, tokenizer_json, tokenizer, tmp_path, capsys):
    ckpt = write_checkpoint(make_model(), tokenizer_json, tmp_path / "x.ckpt")
    code, err = run_cli(capsys, "--checkpoint", str(ckpt), "--out", str(tmp_path / "t.bin"))
    assert code == 2 and err == f"error: --out {tmp_path / 't.bin'}: expected a .gguf file, e.g. t.gguf\n"
    with pytest.raises(UserError, match="expected a .gguf file"):
        export_gguf(make_model(), tokenizer, tmp_path / "t.bin")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.ckpt"]
