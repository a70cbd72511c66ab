"""Chat fine-tuning: the loss, the validation score and the fit summary count the assistant's tokens only, a
resumed chat run is bit-identical to the uninterrupted one, and train.py refuses a bad conversation in one line.

The data is the shipped conversations through the tiny Llama 2 chat template (tests/data/test_data_chat.py).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from data.batches import IGNORE_INDEX, masked_pair
from model import GPT, ModelConfig
from tests.data.test_data_chat import chat_data, chat_module, chat_tokenizer, pirate_rows, write_rows  # noqa: F401
from tests.training.test_one_line_errors import assert_one_line
from tests.training.test_resume import assert_same_weights
from tests.training.test_resume import fit as resume_fit
from training import LitGPT
from training.fit_summary import FitSummary, score_validation

MODEL = dict(vocab_size=300, block_size=32, n_layer=2, n_head=4, n_kv_head=2, n_embd=32)


def first_position(mask: np.ndarray, value: int) -> int:
    """A window position k whose target (token k + 1) has mask `value`."""
    return int(np.flatnonzero(mask[1:] == value)[0])


def test_only_the_assistant_targets_move_the_loss(chat_module):  # noqa: F811 (the imported fixture)
    data, _ = chat_module
    torch.manual_seed(0)
    module = LitGPT(**MODEL)
    start = first_position(np.asarray(data.train_mask), 1) // 32 * 32  # a window with both kinds of targets
    window = np.array(data.train_tokens[start : start + 33])
    mask = np.array(data.train_mask[start : start + 33])
    x, y = masked_pair(window, mask)
    base = module.loss(x[None], y[None])
    for value, moves in ((0, False), (1, True)):
        changed = window.copy()
        k = first_position(mask, value)
        changed[k + 1] = (changed[k + 1] + 1) % 300  # another target; the input x stays the same
        loss = module.loss(x[None], masked_pair(changed, mask)[1][None])
        assert (not torch.equal(loss, base)) is moves, (value, k)
    assert torch.isfinite(
        module.loss(x[None], torch.full_like(y, IGNORE_INDEX)[None])
    )  # no target: 0, not NaN


@pytest.mark.parametrize("block_size", [64, 8], ids=["one-window", "windows-and-tail"])
def test_the_validation_score_counts_the_assistant_tokens_only(block_size):
    torch.manual_seed(0)
    model = GPT(ModelConfig(**MODEL)).eval()
    tokens = torch.randint(4, 300, (21,))
    mask = (torch.arange(21) % 3 == 0).to(torch.uint8)
    tokenizer = chat_tokenizer()
    scores = score_validation(model, tokenizer, tokens.numpy(), block_size, mask=mask.numpy())
    with torch.no_grad():  # each window of block_size targets sees only its own tokens
        nats = torch.cat([
            F.cross_entropy(model(tokens[None, s : min(s + block_size, 20)])[0], tokens[s + 1 : s + block_size + 1],
                            reduction="none")
            for s in range(0, 20, block_size)
        ])  # fmt: skip
    kept = mask[1:].bool()
    assert scores["tokens"] == int(kept.sum())
    assert scores["nats_per_token"] == pytest.approx(float(nats[kept].mean()), rel=1e-5)
    assert scores["chars"] == len(tokenizer.decode(tokens[1:][kept].tolist()))


def fit(data, root, max_steps, **kwargs):
    """test_resume's fit on the chat data, the tiny Llama's vocabulary, validating every 3 steps."""
    torch.manual_seed(0)
    module = LitGPT(**MODEL, warmup_steps=2, learning_rate=3e-3)
    kwargs |= {"limit_val_batches": 2, "val_check_interval": 3}
    return resume_fit(None, None, root, max_steps, model=module, data=data, **kwargs)


# Streaming: 10 held-out conversations are the validation set; 2 workers resume from each one's stream position.
STREAMING = {"token-cache": {}, "stream": {"streaming": True, "val_docs": 10}}
STREAMING["stream-2-workers"] = {**STREAMING["stream"], "num_workers": 2}


@pytest.mark.filterwarnings("ignore::UserWarning")  # Lightning's notes about workers and iterable loaders
@pytest.mark.parametrize("source", list(STREAMING))
def test_a_resumed_chat_run_equals_the_uninterrupted_one(source, tmp_path, capsys):
    files = write_rows(tmp_path / "chat.jsonl", pirate_rows(80))

    def data():
        return chat_data(files, tmp_path / "cache", chat_tokenizer(), batch_size=4, **STREAMING[source])

    straight_data = data()
    straight, straight_losses = fit(straight_data, tmp_path / "straight", 6, callbacks=[FitSummary()])
    metrics = straight.trainer.callback_metrics
    # val/loss and the summary's score: nats per assistant token, over the scored windows / the whole text
    windows = [straight_data.val_dataloader().dataset[i] for i in range(8)]  # limit_val_batches=2 of 4
    with torch.no_grad():
        expected = straight.eval().loss(
            torch.stack([x for x, _ in windows]), torch.stack([y for _, y in windows])
        )
    assert float(metrics["val/loss"]) == pytest.approx(float(expected), rel=1e-5)
    scored = int(np.asarray(straight_data.val_mask)[1:].sum())
    out = capsys.readouterr().out
    assert f"chat with it: python generate.py --checkpoint {tmp_path / 'straight'} --chat" in out
    line = next(line for line in out.splitlines() if line.startswith("validation text"))
    assert line.startswith("validation text (all of it: ") and f" characters, {scored:,} tokens)" in line
    fit(data(), tmp_path / "parts", 6, stop_at=4)
    resumed, resumed_losses = fit(
        data(), tmp_path / "parts", 6, ckpt_path=tmp_path / "parts/checkpoints/last.ckpt"
    )
    assert_same_weights(straight, resumed)
    assert {step: loss for step, loss in straight_losses.items() if step > 4} == resumed_losses
    assert torch.isfinite(metrics["val/loss"])


@pytest.mark.slow
@pytest.mark.parametrize(
    "streaming", [[], ["--data.streaming", "true", "--data.val_docs", "2", "--data.num_workers", "2"]],
    ids=["token-cache", "stream"],
)  # fmt: skip
def test_train_py_refuses_a_bad_conversation_in_one_line(streaming, script, tmp_path):
    from tests.interop.conftest import save_llama

    transformers = pytest.importorskip("transformers")
    save_llama(transformers, tmp_path / "llama", shard=False)
    rows = pirate_rows(20)
    rows[3] = {"messages": [{"role": "captain", "content": "hi"}, {"role": "assistant", "content": "Arr!"}]}
    result = script(
        "train.py", "fit", "--config", "configs/sft-smollm2.yaml", "--model.init_from", str(tmp_path / "llama"),
        "--data.data_files", str(write_rows(tmp_path / "bad.jsonl", rows)), "--data.cache_dir",
        str(tmp_path / "cache"), "--data.block_size", "32", "--trainer.default_root_dir", str(tmp_path / "runs"),
        "--trainer.logger", "false", *streaming, check=False,
    )  # fmt: skip
    assert_one_line(result, "data.chat_column: row 3 of the train split", "role 'captain'")


def test_the_recipe_samples_a_chat_prompt():
    import yaml

    from tests.training.config_cases import CONFIGS

    recipe = yaml.safe_load((CONFIGS / "sft-smollm2.yaml").read_text())
    assert recipe["data"]["chat_column"] == "messages"
    assert all(p.endswith("<|im_start|>assistant\n") for p in recipe["samples"]["prompts"])
    rows = [
        json.loads(line) for line in open(CONFIGS.parent / recipe["data"]["data_files"], encoding="utf-8")
    ]
    answers = [m["content"] for row in rows for m in row["messages"] if m["role"] == "assistant"]
    assert 300 <= len(rows) and all(a.startswith("Arr! ") and a.endswith(". Yo ho!") for a in answers)
