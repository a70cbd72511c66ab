"""Bad model files and names: one line naming the file and key (or the path), exit 2, before any work."""

from __future__ import annotations

import json

import huggingface_hub
import pytest
from huggingface_hub.errors import LocalEntryNotFoundError

from common.errors import UserError
from interop import load, read_config
from interop.export_hf import export_hf
from interop.tokenizer_files import read_generation_config
from tests.conftest import run_generate


@pytest.fixture
def folder(make_model, tokenizer, tmp_path):
    return export_hf(make_model(), tokenizer, tmp_path / "hf")


def edit(path, change) -> None:
    path.write_text(json.dumps(change(json.loads(path.read_text()))))


def one_line(call, *words) -> str:
    with pytest.raises(UserError) as error:
        call()
    message = str(error.value)
    assert "\n" not in message and all(word in message for word in words), message
    return message


CONFIG_EDITS = {
    "list": (lambda c: [c], "holds a JSON list"),
    "tie-yes": (lambda c: c | {"tie_word_embeddings": "yes"}, "tie_word_embeddings='yes'"),
    "rope-theta-null": (lambda c: c | {"rope_theta": None}, "rope_theta=None"),
    "rope-parameters-theta-null": (
        lambda c: c | {"rope_parameters": {"rope_type": "default", "rope_theta": None}},
        "rope_theta=None",
    ),
    "layers-text": (lambda c: c | {"num_hidden_layers": "2"}, "num_hidden_layers='2'"),
    "no-model-type": (lambda c: {k: v for k, v in c.items() if k != "model_type"}, "lacks 'model_type'"),
}


@pytest.mark.parametrize(("change", "words"), CONFIG_EDITS.values(), ids=list(CONFIG_EDITS))
def test_a_bad_config_json_field_is_one_line_naming_file_and_key(folder, change, words):
    edit(folder / "config.json", change)
    one_line(lambda: read_config(folder), str(folder / "config.json"), words)
    one_line(lambda: load(folder), str(folder / "config.json"), words)


def test_a_broken_config_json_names_the_file(folder):
    (folder / "config.json").write_text('{"model_type": "llama",')
    one_line(lambda: load(folder), str(folder / "config.json"), "not valid JSON")


def test_a_bad_generation_config_field_is_one_line_and_exit_2(folder, capsys):
    edit(folder / "generation_config.json", lambda c: c | {"temperature": "hot", "do_sample": True})
    path = str(folder / "generation_config.json")
    one_line(lambda: read_generation_config(folder), path, "temperature='hot'")
    code, _, err = run_generate(capsys, "--checkpoint", str(folder), "--prompt", "x", "--max_new_tokens", "1")
    assert code == 2 and err.count("\n") == 1 and "temperature='hot'" in err, err
    edit(folder / "generation_config.json", lambda c: c | {"temperature": 0.5, "eos_token_id": "two"})
    one_line(lambda: read_generation_config(folder), path, "eos_token_id='two'")


def test_an_hf_folder_without_config_json_says_so(folder):
    (folder / "config.json").unlink()
    message = one_line(lambda: load(folder), str(folder), "no config.json")
    assert "no checkpoints" not in message


@pytest.mark.parametrize("name", ["runs/shakespear", "./shakespear", "tiny/last.ckpt", "EXISTING/typo"])
def test_a_path_shaped_name_that_does_not_exist_never_asks_the_hub(name, tmp_path, monkeypatch):
    (tmp_path / "EXISTING").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda *a, **k: pytest.fail("asked the Hub"))
    message = one_line(lambda: load(name), "no such file or folder")
    assert "Hugging Face cache" not in message


@pytest.mark.parametrize("offline", [None, "1"], ids=["online", "offline"])
def test_the_offline_hint_names_hf_hub_offline_only_when_set(offline, monkeypatch):
    def not_cached(*args, **kwargs):
        raise LocalEntryNotFoundError("not in the cache")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", not_cached)
    if offline is None:
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    else:
        monkeypatch.setenv("HF_HUB_OFFLINE", offline)
    message = one_line(lambda: load("some-org/some-model"), "some-org/some-model", "Hugging Face cache")
    assert ("unset HF_HUB_OFFLINE" in message) == (offline is not None)
    assert "hf_folder" not in message


def test_messages_name_kinds_in_words(folder):
    message = one_line(lambda: load(folder, keep_quantized=True), "a Hugging Face folder")
    assert "hf_folder" not in message
