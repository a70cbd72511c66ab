"""generate.py as a newcomer meets it: the prompt echoed, defaults in --help, a note on unknown bytes, Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import generate as cli
from data.tokenizer import Tokenizer
from tests.conftest import run_generate as run_cli
from tests.tiny_models import make_model, tokenizer_json  # noqa: F401 (fixtures)

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("num_samples", ["1", "2"], ids=["streamed", "batch"])
def test_the_prompt_is_echoed_before_the_continuation_unless_no_echo(ckpt, capsys, num_samples):
    args = [
        "--checkpoint",
        ckpt,
        "--prompt",
        "KING RICHARD:",
        "--max_new_tokens",
        "5",
        "--num_samples",
        num_samples,
    ]
    _, echoed, _ = run_cli(capsys, *args)
    _, bare, _ = run_cli(capsys, *args, "--no_echo")
    if num_samples == "1":
        assert echoed == "KING RICHARD:" + bare
    else:
        assert echoed == bare.replace("---\n", "---\nKING RICHARD:")
        assert echoed.count("---\nKING RICHARD:") == 2


def test_help_shows_defaults(capsys):
    with pytest.raises(SystemExit):
        cli.parse_args(["--help"])
    out = capsys.readouterr().out
    assert "(default: 200)" in out and "(default: 0.8)" in out and "(default: 1337)" in out
    assert "(default: None)" not in out and "(default: False)" not in out


def test_a_prompt_of_bytes_never_merged_gets_a_note(ckpt, capsys, monkeypatch):
    code, _, err = run_cli(
        capsys, "--checkpoint", ckpt, "--prompt", "\U0001f642\U0001f642", "--max_new_tokens", "2"
    )
    assert code == 0 and err.count("note: the prompt is made only of bytes") == 1
    _, _, err = run_cli(
        capsys, "--checkpoint", ckpt, "--prompt", "ROMEO: \U0001f642", "--max_new_tokens", "2"
    )
    assert "note:" not in err  # familiar text around the emoji: the model has something to go on
    # An ASCII prompt cannot be such bytes: the table of every token's bytes (a second of a 49k vocabulary's
    # start) is not built for it.
    monkeypatch.setattr(Tokenizer, "token_bytes", lambda self: pytest.fail("an ASCII prompt built the table"))
    code, _, err = run_cli(capsys, "--checkpoint", ckpt, "--prompt", "ROMEO:", "--max_new_tokens", "2")
    assert code == 0 and "note:" not in err


def test_ctrl_c_while_streaming_ends_the_line_and_exits_130(ckpt):
    proc = subprocess.Popen(
        # --ignore_eos: a sampled end-of-text token would end the run before the signal arrives.
        [sys.executable, "generate.py", "--checkpoint", ckpt, "--prompt", "ROMEO:", "--max_new_tokens", "1000000",
         "--ignore_eos", "--device", "cpu"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ),
        # As from a terminal: a runner started in the background (`cmd &` in a script) ignores SIGINT, its
        # children inherit that, and Python then installs no KeyboardInterrupt handler.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    assert proc.stdout.read(len("ROMEO:")) == "ROMEO:"  # streaming has begun
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130
    assert err.strip() == "interrupted (Ctrl-C)"
    assert out.endswith("\n")


@pytest.mark.parametrize("flag", [[], ["--ignore_eos"]], ids=["stops", "ignore_eos"])
def test_ignore_eos_decodes_past_the_end_of_text_token(ckpt, capsys, monkeypatch, flag):
    seen = {}
    real_generate = cli.generate

    def spy(*args, **kwargs):
        seen.update(kwargs)
        return real_generate(*args, **kwargs)

    monkeypatch.setattr(cli, "generate", spy)
    code, _, _ = run_cli(capsys, "--checkpoint", ckpt, "--prompt", "ROMEO:", "--max_new_tokens", "2", *flag)
    assert code == 0
    eos_ids = cli.load(ckpt).tokenizer.eos_ids
    assert seen["eos_id"] == (None if flag else eos_ids) and eos_ids


@pytest.mark.parametrize("device", ["gpu", "cuda", "cuda:7", "mps"])
def test_a_device_this_machine_lacks_is_one_line_before_loading(tmp_path, capsys, device):
    import torch

    if device.startswith("cuda") and torch.cuda.device_count() > int(device.partition(":")[2] or 0):
        pytest.skip(f"{device} exists here")
    if device == "mps" and torch.backends.mps.is_available():
        pytest.skip("mps exists here")
    # A missing checkpoint: the device is refused first, with the fix, before anything is read.
    code, out, err = run_cli(
        capsys, "--checkpoint", str(tmp_path / "none.ckpt"), "--prompt", "a", "--device", device
    )
    assert code == 2 and out == "" and err.count("\n") == 1
    assert f"--device {device} is not available" in err and "use --device cpu" in err


def test_a_layer_the_model_lacks_is_refused_before_generating(ckpt, capsys, monkeypatch, tmp_path):
    called = []
    monkeypatch.setattr(cli, "generate", lambda *args, **kwargs: called.append(1))
    png = str(tmp_path / "map.png")
    code, out, err = run_cli(
        capsys, "--checkpoint", ckpt, "--prompt", "a", "--attention_map", png, "--layer", "5"
    )
    assert code == 2 and out == "" and err.count("\n") == 1 and "--layer must be in 0..1" in err
    assert called == []  # nothing was generated (or streamed) before the refusal


def test_benchmark_measures_the_compiled_step_when_asked(ckpt, capsys, monkeypatch):
    import generation.speed
    from generation import static_decode
    from generation.sampling import generate

    asked = []

    def traced(*args, compile=False, **kwargs):
        asked.append(compile)
        return generate(*args, compile=compile, **kwargs)

    # aot_eager traces the same static step as inductor, without generating kernels (a CPU compile is slow).
    monkeypatch.setattr(static_decode, "BACKEND", "aot_eager")
    monkeypatch.setattr(generation.speed, "generate", traced)
    monkeypatch.setattr(cli, "compiled_step", lambda *args: True)  # as if built (tests/generation/)
    code, out, _ = run_cli(capsys, "--checkpoint", ckpt, "--prompt", "a b", "--benchmark", "--compile",
                           "--max_new_tokens", "4")  # fmt: skip
    assert code == 0 and True in asked and False in asked
    assert "compiled:" in out and "cached:" in out and "speed-up of the compiled step" in out
    assert "too short for a rate" in out  # a 2-token prefill gets a time, not a rate


def test_generate_stops_at_any_of_several_eos_ids():
    import torch

    from generation.sampling import GREEDY, generate
    from model import GPT, ModelConfig

    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=64, block_size=32, n_layer=1, n_head=2, n_kv_head=1, n_embd=16)).eval()
    prompt = torch.tensor([[1, 2, 3]])
    free = generate(model, prompt, 12, sampler=GREEDY)[0, 3:].tolist()
    stop = free[4]
    first = free.index(stop)
    unused = next(i for i in range(64) if i not in free)
    out = generate(model, prompt, 12, sampler=GREEDY, eos_id=(unused, stop))[0, 3:].tolist()
    assert out == free[: first + 1]  # the second id of the collection stops it
    assert (
        generate(model, prompt, 12, sampler=GREEDY, eos_id=stop)[0, 3:].tolist() == out
    )  # an int still works


def test_threads_flag_sets_torch_threads_before_loading(capsys):
    import torch

    before = torch.get_num_threads()
    try:
        code, _, err = run_cli(
            capsys, "--checkpoint", "no/such-model.ckpt", "--prompt", "x", "--threads", "1"
        )
        assert code == 2 and torch.get_num_threads() == 1, err  # applied before the (missing) model is read
        code, _, err = run_cli(
            capsys, "--checkpoint", "no/such-model.ckpt", "--prompt", "x", "--threads", "0"
        )
        assert code == 2 and err.strip() == "error: threads must be at least 1, got 0 (--threads)"
    finally:
        torch.set_num_threads(before)


@pytest.fixture
def gguf_of(make_model, tokenizer_json, tmp_path):  # noqa: F811
    """A tiny float32 GGUF of a model, after `edit(model)` (e.g. a NaN in one weight)."""
    pytest.importorskip("gguf")
    from interop.export_gguf import export_gguf

    def write(edit=lambda model: None):
        model = make_model()
        with torch.no_grad():
            edit(model)
        return str(export_gguf(model, Tokenizer.from_json(tokenizer_json), tmp_path / "model.gguf"))

    return write


@pytest.mark.parametrize(
    "picking",
    [[], ["--temperature", "0"], ["--prompt_lookup"], ["--prompt_lookup", "--temperature", "0"]],
    ids=["sampled", "greedy", "speculative-sampled", "speculative-greedy"],
)
def test_a_model_with_a_nan_weight_is_one_line_naming_the_model_and_the_layer(gguf_of, capsys, picking):
    path = gguf_of(lambda model: model.blocks[1].attn_norm.weight.fill_(float("nan")))
    code, _, err = run_cli(capsys, "--checkpoint", path, "--prompt", "a b", "--max_new_tokens", "3", *picking)
    assert code == 2 and err.count("\n") == 1 and err.startswith("error:"), err
    assert path in err and "blocks.1.attn_norm.weight (layer 1) holds NaN" in err, err  # refused on loading


def test_keep_quantized_on_a_float_gguf_says_so_in_one_line(gguf_of, capsys):
    code, _, err = run_cli(capsys, "--checkpoint", gguf_of(), "--prompt", "a", "--max_new_tokens", "2",
                           "--keep_quantized")  # fmt: skip
    notes = [line for line in err.splitlines() if line.startswith("note:")]
    kept_types = "Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/Q4_K/Q5_K/Q6_K"
    assert code == 0 and len(notes) == 1 and f"no {kept_types} matrix to keep" in notes[0], err


def test_compile_builds_the_step_before_the_first_token(ckpt, capsys, monkeypatch, tmp_path):
    """The note says the build comes before the first token: the compiled step must run before any is printed."""
    monkeypatch.setenv("GQA_GPT_COMPILED_DIR", str(tmp_path))  # the step it keeps is for this test only
    import generation.static_decode as static_decode
    from generation.text import TextStream

    events, real_stream = [], TextStream.__call__
    real_warm_up, compile = static_decode.StaticDecoder.warm_up, torch.compile
    # aot_eager only traces (no C++ build); the warm-up is the step's first run, which must precede every token.
    monkeypatch.setattr(
        torch, "compile", lambda fn, **kw: compile(fn, **kw | {"backend": "aot_eager", "mode": None})
    )
    monkeypatch.setattr(
        static_decode.StaticDecoder, "warm_up", lambda self: events.append("step") or real_warm_up(self)
    )
    monkeypatch.setattr(
        TextStream, "__call__", lambda self, token: events.append("token") or real_stream(self, token)
    )
    code, _, err = run_cli(
        capsys, "--checkpoint", ckpt, "--prompt", "a b", "--max_new_tokens", "4", "--compile"
    )
    assert code == 0 and "compiling the decode step" in err, err
    assert events[0] == "step" and events.count("token") == 4, events


def forcing_token(monkeypatch, pick) -> None:
    """Make the model generate.py loads put all its probability on `pick(tokenizer)`, at every position."""
    real_load = cli.load

    def load(*args, **kwargs):
        loaded = real_load(*args, **kwargs)
        token = pick(loaded.tokenizer)

        def forced(module, inputs, logits):
            return torch.full_like(logits, -30.0).index_fill_(-1, torch.tensor([token]), 30.0)

        loaded.model.register_forward_hook(forced)
        return loaded

    monkeypatch.setattr(cli, "load", load)


def lead_byte(tokenizer: Tokenizer) -> int:
    """The token of byte 0xC3 alone: the start of a two-byte UTF-8 character that no later token completes."""
    return tokenizer.token_bytes().index(b"\xc3")


@pytest.mark.parametrize("decoding", [[], ["--prompt_lookup"]], ids=["plain", "speculative"])
def test_a_stream_ending_in_a_partial_character_prints_it_at_the_end(gguf_of, capsys, monkeypatch, decoding):
    forcing_token(monkeypatch, lead_byte)
    path = gguf_of()
    code, out, err = run_cli(capsys, "--checkpoint", path, "--prompt", "hi", "--max_new_tokens", "3",
                             "--temperature", "0", *decoding)  # fmt: skip
    tokenizer = cli.load(path).tokenizer
    assert code == 0, err
    assert out == "hi" + tokenizer.decode([lead_byte(tokenizer)] * 3) + "\n" and "\ufffd" in out, out


def test_a_tiny_temperature_picks_the_greedy_tokens(gguf_of, capsys):
    args = ["--checkpoint", gguf_of(), "--prompt", "a b", "--max_new_tokens", "8", "--temperature"]
    code, tiny, err = run_cli(capsys, *args, "1e-45")
    assert code == 0 and tiny == run_cli(capsys, *args, "0")[1], err
