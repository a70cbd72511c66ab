"""generate.py --attention_html: the explorer of prompt + output, and one line for a path it cannot write."""

from __future__ import annotations

import json
import re

import torch

import generate as cli
from checkpoints.format import load_checkpoint
from data.tokenizer import Tokenizer
from generation.sampling import GREEDY, generate
from inspection.attention_stats import head_statistics


def test_attention_html_holds_prompt_and_output_with_their_statistics(tiny_run, tmp_path, capsys):
    ckpt, html = str(tiny_run / "checkpoints" / "last.ckpt"), tmp_path / "out" / "explorer.html"
    code = cli.main(["--checkpoint", ckpt, "--prompt", "To be or not", "--max_new_tokens", "6", "--temperature",
                     "0", "--attention_html", str(html)])  # fmt: skip
    assert code == 0 and f"wrote {html}" in capsys.readouterr().err
    page = html.read_text(encoding="utf-8")
    meta = json.loads(
        re.search(r'<script id="explorer-meta" type="application/json">(.*?)</script>', page, re.S)[1]
    )
    loaded = load_checkpoint(ckpt)
    tokenizer = Tokenizer.from_json(loaded.tokenizer_json)
    prompt = tokenizer.encode("To be or not")
    assert meta["tokens"][: len(prompt)] == [tokenizer.decode([i]) for i in prompt]
    assert len(meta["tokens"]) == len(prompt) + 6
    model = loaded.model.eval()
    ids = generate(model, torch.tensor([prompt]), 6, sampler=GREEDY)  # greedy: the text generate.py wrote
    assert meta["tokens"] == [tokenizer.decode([i]) for i in ids[0].tolist()]
    expected = head_statistics(model, ids, 32, generator=torch.Generator().manual_seed(0))
    for name, values in expected.items():
        assert torch.allclose(torch.tensor(meta["stats"][name], dtype=torch.float64), values.double()), name


def test_attention_html_to_a_folder_is_one_line(tiny_run, tmp_path, capsys):
    ckpt = str(tiny_run / "checkpoints" / "last.ckpt")
    code = cli.main(
        ["--checkpoint", ckpt, "--prompt", "a", "--max_new_tokens", "2", "--attention_html", str(tmp_path)]
    )
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "--attention_html" in err
