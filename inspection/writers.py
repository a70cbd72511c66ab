"""What generate.py writes about attention: a PNG of one layer (--attention_map), the interactive explorer
(--attention_html) and the step-by-step tables of one head (--explain_attention)."""

from __future__ import annotations

import sys
from argparse import Namespace
from pathlib import Path

import torch

from common.errors import UserError
from common.files import atomic_write, refuse_existing
from inspection.attention_image import (
    MAX_LABELLED_TOKENS,
    draw_attention_grid,
    printable_label,
    save_attention_png,
)
from inspection.explorer import build_explorer, probe_attention
from model.attention import attention_scores, causal_mask
from model.gpt import GPT

# Three tables of 16 x 16 cells of 8 characters fit a 140-column terminal (64 tokens: 500-character lines).
EXPLAIN_TOKENS = 16
# The file each picture flag writes, by the suffix a viewer opens it by.
OUTPUT_SUFFIXES = {"attention_map": (".png",), "attention_html": (".html", ".htm")}


def check_outputs(args: Namespace) -> None:
    """Refuse an --attention_map / --attention_html path that cannot be written, before the model loads."""
    for flag, suffixes in OUTPUT_SUFFIXES.items():
        if getattr(args, flag):
            path = Path(getattr(args, flag)).expanduser()
            refuse_existing(path, args.force, file=True, flag=f"--{flag}", suffixes=suffixes)


def check_layer_and_head(config, layer: int | None, head: int) -> None:
    """Refuse a --layer or --head the model does not have, before anything is generated."""
    for flag, value, count in (("--layer", layer, config.n_layer), ("--head", head, config.n_head)):
        if value is not None and not 0 <= value < count:
            raise UserError(f"{flag} must be in 0..{count - 1} (the model has {count}), got {value}")


def token_labels(tokenizer, ids: list[int]) -> list[str]:
    return [tokenizer.decode([i]) for i in ids]


def map_title(layer: int, shown: int, total: int) -> str:
    """The PNG's title: the layer, and which tokens it shows when that is not simply all of them."""
    title = f"layer {layer}, {shown} tokens"
    if shown < total:
        title = f"layer {layer}, the last {shown} of {total} tokens (the model's context window)"
    if shown > MAX_LABELLED_TOKENS:
        title += (
            f"\ntoo many to label (labels up to {MAX_LABELLED_TOKENS} tokens); --attention_html labels all"
        )
    return title


def write_attention_map(model, tokenizer, ids: torch.Tensor, path: str, layer: int | None) -> None:
    """Draw every head of `layer` (default: the last) over ids (1, T), cropped to the context window."""
    layer = model.config.n_layer - 1 if layer is None else layer
    total = ids.shape[1]
    ids = ids[:, -model.config.block_size :]
    probs = model.float().attention_maps(ids)[layer, 0]  # (H, T, T)
    title = map_title(layer, ids.shape[1], total)
    save_attention_png(draw_attention_grid(probs, token_labels(tokenizer, ids[0].tolist()), title), path)
    print(f"wrote {path} ({title.replace(chr(10), '; ')})", file=sys.stderr)


def write_attention_html(model, tokenizer, ids: torch.Tensor, path: str, prompt_len: int) -> None:
    """The explorer of the sequence ids (1, T), whose first `prompt_len` tokens are the prompt."""
    total = ids.shape[1]
    ids = ids[:, -model.config.block_size :]
    generator = torch.Generator().manual_seed(0)  # the induction probe, as in training: comparable scores
    maps, stats = probe_attention(model.float(), ids, induction_period=32, generator=generator)
    page = build_explorer(
        maps[:, 0], token_labels(tokenizer, ids[0].tolist()), stats, title="generate.py",
        prompt_len=max(0, prompt_len - (total - ids.shape[1])),
    )  # fmt: skip
    atomic_write(path, page)  # the path was checked before generating (check_outputs)
    print(f"wrote {path} (attention explorer, {ids.shape[1]} tokens)", file=sys.stderr)


def explain_attention(model, tokenizer, text: str, layer: int, head: int) -> None:
    """Print the scores, the causal mask and the softmax of one head over the last EXPLAIN_TOKENS tokens of text."""
    ids = tokenizer.encode(text)
    if not ids:
        raise UserError("--explain_attention text is empty; pass a short sentence")
    kept = ids[-min(EXPLAIN_TOKENS, model.config.block_size) :]
    labels = [printable_label(label, max_chars=7) for label in token_labels(tokenizer, kept)]
    device = next(model.parameters()).device
    steps = attention_steps(model.float(), torch.tensor([kept], device=device), layer, head)
    what = f"{len(kept)} tokens"
    if len(kept) < len(ids):
        what = f"the last {len(kept)} of {len(ids)} tokens (kept short so that the tables stay readable)"
    print(f"layer {layer}, head {head}, {what}")
    print(steps_as_text(steps, labels))


@torch.no_grad()
def attention_steps(model: GPT, idx: torch.Tensor, layer: int, head: int) -> dict[str, torch.Tensor]:
    """For idx (1, T), from the layer's own projections: scores q·kᵀ/sqrt(D), masked, softmax, each (T, T)."""
    attn = model.blocks[layer].attn
    inputs: list[tuple] = []
    hook = attn.register_forward_pre_hook(lambda _, args: inputs.append(args[:3]))  # (x, cos, sin)
    try:
        model(idx, last_only=True)
    finally:
        hook.remove()
    q, k, _ = attn.project(*inputs[0])
    t = idx.shape[1]
    scores = attention_scores(q, k)[0, head]  # (T, T)
    masked = scores.masked_fill(~causal_mask(t, t, idx.device), float("-inf"))
    return {"scores": scores, "masked": masked, "probs": masked.softmax(dim=-1)}


STEP_TITLES = {
    "scores": "1. scaled scores q·kᵀ / sqrt(d)  (row = query token, column = key token)",
    "masked": "2. causal mask: a token may not look at later tokens (-inf above the diagonal)",
    "probs": "3. softmax over each row: attention probabilities (each row sums to 1)",
}


def steps_as_text(steps: dict[str, torch.Tensor], labels: list[str], width: int = 8) -> str:
    """The three matrices of `attention_steps` as titled text tables, one token label per row and column."""
    return "\n".join(f"\n{title}\n{_matrix(steps[key], labels, width)}" for key, title in STEP_TITLES.items())


def _matrix(values: torch.Tensor, labels: list[str], width: int) -> str:
    rows = [" " * width + "".join(f"{label:>{width}}" for label in labels)]
    for label, row in zip(labels, values.tolist(), strict=True):
        cells = "".join(f"{'-inf' if v == float('-inf') else f'{v:.3f}':>{width}}" for v in row)
        rows.append(f"{label:>{width}}{cells}")
    return "\n".join(rows)
