"""generate.py on a checkpoint from a tiny training run: cache parity, seeds, batches, bad input, pictures."""

from __future__ import annotations

import io
import sys

import pytest
import torch
from PIL import Image

import generate as cli
from tests.conftest import run_generate as run_cli


@pytest.fixture(scope="module")
def lively_ckpt(ckpt, tmp_path_factory):
    """The tiny run's checkpoint with large random weights: its greedy text is varied, not one repeated token.

    A 6-step model mostly emits newlines, so a cache bug that does not crash would print the same text on
    both paths. Only the weights change; the checkpoint format and tokenizer stay what training wrote.
    """
    state = torch.load(ckpt, weights_only=True)
    generator, replaced = torch.Generator().manual_seed(0), {}
    for name, tensor in state["state_dict"].items():
        mean, std = (1.0, 0.3) if name.endswith("norm.weight") else (0.0, 0.2)
        # Tied weights share storage under two names: give them one new tensor, so they stay tied.
        storage = tensor.untyped_storage().data_ptr()
        if storage not in replaced:
            replaced[storage] = torch.randn(tensor.shape, generator=generator) * std + mean
        state["state_dict"][name] = replaced[storage]
    path = tmp_path_factory.mktemp("lively") / "lively.ckpt"
    torch.save(state, path)
    return str(path)


def test_greedy_output_with_cache_equals_no_cache(lively_ckpt, capsys):
    from data.tokenizer import Tokenizer

    args = ["--checkpoint", lively_ckpt, "--prompt", "ROMEO:", "--temperature", "0", "--max_new_tokens", "80"]
    code, cached, _ = run_cli(capsys, *args)
    tokenizer = Tokenizer.from_json(torch.load(lively_ckpt, weights_only=True)["gqa_gpt"]["tokenizer_json"])
    assert code == 0 and len(set(tokenizer.encode(cached))) >= 20, cached
    assert run_cli(capsys, *args, "--no_cache")[1] == cached


def test_same_seed_same_sample(ckpt, capsys):
    args = ["--checkpoint", ckpt, "--prompt", "KING:", "--max_new_tokens", "40", "--top_k", "50"]
    first = run_cli(capsys, *args, "--seed", "7")[1]
    assert run_cli(capsys, *args, "--seed", "7")[1] == first
    assert run_cli(capsys, *args, "--seed", "8")[1] != first


def test_num_samples_gives_that_many_continuations(ckpt, capsys):
    code, out, _ = run_cli(
        capsys, "--checkpoint", ckpt, "--prompt", "The", "--num_samples", "3", "--max_new_tokens", "20"
    )
    assert code == 0
    assert [line for line in out.splitlines() if line.startswith("--- sample")] == [
        "--- sample 1 ---",
        "--- sample 2 ---",
        "--- sample 3 ---",
    ]


def test_run_directory_and_stdin_prompt(tiny_run, ckpt, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("ROMEO:"))
    from_dir = run_cli(capsys, "--checkpoint", str(tiny_run), "--max_new_tokens", "8", "--temperature", "0")
    assert from_dir[0] == 0
    assert (
        run_cli(
            capsys, "--checkpoint", ckpt, "--prompt", "ROMEO:", "--max_new_tokens", "8", "--temperature", "0"
        )[1]
        == from_dir[1]
    )


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--prompt", "a", "--temperature", "-1"], "--temperature"),
        (["--prompt", "a", "--top_p", "0"], "--top_p"),
        (["--prompt", "a", "--top_p", "1.5"], "--top_p"),
        (["--prompt", "a", "--top_k", "0"], "--top_k"),
        (["--prompt", "a", "--max_new_tokens", "0"], "--max_new_tokens"),
        (["--prompt", "a", "--temperature", "nan"], "--temperature must be a finite number"),
        (["--prompt", "a", "--repetition_penalty", "nan"], "--repetition_penalty must be a finite number"),
    ],
)
def test_bad_sampling_input_is_one_line(ckpt, capsys, argv, words):
    code, out, err = run_cli(capsys, "--checkpoint", ckpt, *argv)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("error:") and words in err


def test_an_empty_prompt_samples_from_the_end_of_text_token(ckpt, capsys, monkeypatch):
    seen = {}
    real_generate = cli.generate

    def spy(model, idx, *args, **kwargs):
        seen["idx"] = idx
        return real_generate(model, idx, *args, **kwargs)

    monkeypatch.setattr(cli, "generate", spy)
    code, out, err = run_cli(capsys, "--checkpoint", ckpt, "--prompt", "", "--max_new_tokens", "5")
    eos_id = cli.load(ckpt).tokenizer.eos_id
    assert code == 0 and err == "" and seen["idx"].tolist() == [[eos_id]]
    assert "<|endoftext|>" not in out  # the start token is not printed


def test_bad_checkpoints_are_one_line(ckpt, tmp_path, capsys):
    truncated = tmp_path / "truncated.ckpt"
    data = open(ckpt, "rb").read()
    truncated.write_bytes(data[: len(data) // 2])
    tampered = tmp_path / "tampered.ckpt"
    state = torch.load(ckpt, weights_only=True)
    state["gqa_gpt"]["tokenizer_json"] = state["gqa_gpt"]["tokenizer_json"].replace(
        "<|endoftext|>", "<|eot|>"
    )
    torch.save(state, tampered)
    cases = {
        tmp_path / "missing.ckpt": "no such file or folder",
        truncated: "truncated",
        tampered: "sha256",
        tmp_path: "no checkpoints",
    }
    for path, words in cases.items():
        code, _, err = run_cli(capsys, "--checkpoint", str(path), "--prompt", "a")
        assert code == 2 and err.count("\n") == 1 and words in err, err


def test_cli_exit_code_and_no_traceback(tmp_path, script):
    result = script("generate.py", "--checkpoint", str(tmp_path / "nope.ckpt"), "--prompt", "a", check=False)
    assert result.returncode == 2
    assert result.stderr.startswith("error:") and "Traceback" not in result.stderr


def test_generate_never_imports_lightning_or_wandb(ckpt, script):
    code = (
        "import sys, generate; generate.main(['--checkpoint', sys.argv[1], '--prompt', 'a', '--max_new_tokens', '3']);"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'lightning', 'wandb', 'datasets', 'training'}))"
    )
    assert script("-c", code, ckpt).stdout.strip().endswith("[]")


def test_attention_map_png(ckpt, tmp_path, capsys):
    png = tmp_path / "map.png"
    code, _, _ = run_cli(
        capsys,
        "--checkpoint",
        ckpt,
        "--prompt",
        "To be or not",
        "--max_new_tokens",
        "6",
        "--attention_map",
        str(png),
        "--layer",
        "1",
    )
    assert code == 0
    image = Image.open(png)
    assert image.format == "PNG" and image.width > 100
    assert torch.tensor(list(image.convert("L").getdata()), dtype=torch.float).std() > 10


def test_explain_attention_shows_masking_and_softmax(ckpt, capsys):
    code, out, _ = run_cli(
        capsys, "--checkpoint", ckpt, "--explain_attention", "The cat sat down", "--layer", "0", "--head", "1"
    )
    assert code == 0
    sections = out.split("\n\n")
    masked = [line.split()[1:] for line in sections[2].splitlines()[2:]]
    probs = [[float(v) for v in line.split()[1:]] for line in sections[3].splitlines()[2:]]
    assert len(masked) == len(probs) >= 3
    for i, row in enumerate(masked):
        assert all(cell == "-inf" for cell in row[i + 1 :]) and "-inf" not in row[: i + 1]
    for i, row in enumerate(probs):
        assert abs(sum(row) - 1) < 5e-3 and all(v == 0 for v in row[i + 1 :])


def test_benchmark_reports_speed_and_cache_size(ckpt, capsys):
    code, out, _ = run_cli(
        capsys,
        "--checkpoint",
        ckpt,
        "--prompt",
        "a b c",
        "--benchmark",
        "--no_cache",
        "--max_new_tokens",
        "16",
    )
    assert code == 0
    assert "bytes per token" in out and "decode" in out and "speed-up" in out
    # 2 layers x 2 kv heads x head_dim 16 x (k + v) x 4 bytes = 512
    assert "512 bytes per token" in out


def test_stream_prints_text_but_not_the_stop_token(ckpt, capsys):
    from checkpoints.format import load_checkpoint
    from data.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_json(load_checkpoint(ckpt).tokenizer_json)
    stream = cli.TextStream(tokenizer)
    for token in [*tokenizer.encode("Hi there"), tokenizer.eos_id]:
        stream(torch.tensor([token]))
    assert capsys.readouterr().out == "Hi there"
