"""Attention maps as a picture: one uint8 RGB image per layer with a grid of heads, built with Pillow only (wandb
renders a float array nearly black)."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFont

from common.files import atomic_write

# A viridis-like ramp whose lightness rises monotonically: larger weights look brighter, also in greyscale and for
# most colour-vision deficiencies.
_ANCHORS = np.array(
    [(68, 1, 84), (65, 68, 135), (42, 120, 142), (34, 168, 132), (122, 209, 81), (253, 231, 37)]
)
HEATMAP_PIXELS = 192  # target side of one head's heatmap before it is rounded to whole pixels per token
MAX_LABELLED_TOKENS = 32  # beyond this, token labels would overlap or be too small to read
MAX_LABEL_CHARS = 10
PAD = 6
AXES_NOTE = "rows: query, columns: key"  # which way a map reads: query token i attends to key token j
BACKGROUND, INK = (255, 255, 255), (0, 0, 0)


def colour_table() -> np.ndarray:
    """(256, 3) uint8 lookup table interpolating the anchors."""
    anchor_levels = np.linspace(0.0, 1.0, len(_ANCHORS))
    levels = np.linspace(0.0, 1.0, 256)
    channels = [np.interp(levels, anchor_levels, _ANCHORS[:, c]) for c in range(3)]
    return np.stack(channels, axis=1).round().astype(np.uint8)


def to_colours(values: np.ndarray, vmax: float) -> np.ndarray:
    """Values in [0, vmax] (clipped) to uint8 RGB colours (..., 3)."""
    levels = np.clip(values / vmax, 0.0, 1.0) * 255.0
    return colour_table()[levels.round().astype(np.int64)]


def printable_label(token: str, max_chars: int = MAX_LABEL_CHARS) -> str:
    """A token made visible in ASCII: spaces as '·', newlines and tabs as \\n and \\t, others escaped."""
    # The default font lacks most non-Latin glyphs (they would draw as boxes), so escape them instead.
    visible = "".join(
        "·" if c in " ·" else c if 32 <= ord(c) < 127 and c != "\\" else c.encode("unicode_escape").decode()
        for c in token
    )
    if not visible:
        return '""'
    return visible if len(visible) <= max_chars else visible[: max_chars - 2] + ".."


def draw_attention_grid(
    probs_layer: torch.Tensor,
    token_labels: Sequence[str] | None,
    title: str,
    heads: Sequence[int] | None = None,
) -> Image.Image:
    """One RGB image of a layer's heads (H, T, S) in a grid; weight 1 is brightest, so images compare."""
    probs = _checked_probs(probs_layer, token_labels)
    heads = list(range(probs.shape[0])) if heads is None else list(heads)
    if not heads or not all(0 <= h < probs.shape[0] for h in heads):
        raise ValueError(f"heads must be a non-empty list of indices in 0..{probs.shape[0] - 1}, got {heads}")
    font = ImageFont.load_default()
    labels = token_labels if token_labels is not None and probs.shape[-1] <= MAX_LABELLED_TOKENS else None
    cells = [_head_cell(probs[h], labels, f"head {h}", font) for h in heads]
    return _assemble(cells, title, _colour_bar(cells[0].height, font), font)


def save_attention_png(image: Image.Image, path: str | os.PathLike[str]) -> Path:
    """Write `image` as PNG atomically."""
    return atomic_write(path, lambda f: image.save(f, format="PNG"))


def _checked_probs(probs_layer: torch.Tensor, token_labels: Sequence[str] | None) -> np.ndarray:
    if probs_layer.dim() != 3 or probs_layer.shape[-2] > probs_layer.shape[-1]:
        raise ValueError(
            f"expected one layer's probabilities (H, T, S) with T <= S, got {tuple(probs_layer.shape)}"
        )
    if token_labels is not None and len(token_labels) != probs_layer.shape[-1]:
        raise ValueError(f"got {len(token_labels)} token labels for {probs_layer.shape[-1]} key positions")
    return probs_layer.detach().float().cpu().numpy()


def _head_cell(
    probs: np.ndarray, labels: Sequence[str] | None, title: str, font: ImageFont.ImageFont
) -> Image.Image:
    t, s = probs.shape
    line = _text_height(font)
    # Whole pixels per token keep every token a crisp square; with labels a row must be a line of text high.
    scale = max(1, math.ceil(HEATMAP_PIXELS / s), line + 1 if labels else 1)
    heatmap = Image.fromarray(to_colours(probs, 1.0)).resize((s * scale, t * scale), Image.Resampling.NEAREST)
    left = below = None
    if labels:
        left = _label_strip([printable_label(x) for x in labels[s - t :]], scale, font)
        below = _label_strip([printable_label(x) for x in labels], scale, font).rotate(90, expand=True)
    margin_left = left.width if left else 0
    height = line + PAD + heatmap.height + (below.height if below else 0)
    cell = Image.new("RGB", (margin_left + heatmap.width, height), BACKGROUND)
    draw = ImageDraw.Draw(cell)
    # Positions are computed by hand: text anchors only work with FreeType fonts, not the bitmap fallback.
    draw.text((margin_left + (heatmap.width - font.getlength(title)) // 2, 0), title, fill=INK, font=font)
    cell.paste(heatmap, (margin_left, line + PAD))
    if left:
        cell.paste(left, (0, line + PAD))
    if below:
        cell.paste(below, (margin_left, line + PAD + heatmap.height))
    return cell


def _label_strip(labels: Sequence[str], row_height: int, font: ImageFont.ImageFont) -> Image.Image:
    """Labels right-aligned, one per row; rotated 90° it becomes an x axis."""
    width = PAD + max(math.ceil(font.getlength(label)) for label in labels)
    strip = Image.new("RGB", (width, row_height * len(labels)), BACKGROUND)
    draw = ImageDraw.Draw(strip)
    line = _text_height(font)
    for i, label in enumerate(labels):
        x = width - PAD // 2 - font.getlength(label)
        draw.text((x, i * row_height + (row_height - line) // 2), label, fill=INK, font=font)
    return strip


def _colour_bar(height: int, font: ImageFont.ImageFont) -> Image.Image:
    line = _text_height(font)
    ramp_height = max(height - 2 * line - 2 * PAD, 16)
    ramp = to_colours(np.linspace(1.0, 0.0, ramp_height)[:, None].repeat(16, axis=1), 1.0)  # (rows, 16, 3)
    bar = Image.new("RGB", (16 + 2 * PAD + math.ceil(font.getlength("1")), height), BACKGROUND)
    bar.paste(Image.fromarray(ramp), (PAD, line + PAD))
    draw = ImageDraw.Draw(bar)
    draw.text((PAD, 0), "1", fill=INK, font=font)
    draw.text((PAD, line + 2 * PAD + ramp_height), "0", fill=INK, font=font)
    return bar


def _assemble(
    cells: list[Image.Image], title: str, bar: Image.Image, font: ImageFont.ImageFont
) -> Image.Image:
    """Cells in a near-square grid under the title lines, the colour bar on the right."""
    cols = math.ceil(math.sqrt(len(cells)))
    rows = math.ceil(len(cells) / cols)
    cell_w, cell_h = max(c.width for c in cells) + PAD, max(c.height for c in cells) + PAD
    lines = [*title.splitlines(), AXES_NOTE]
    top = len(lines) * _text_height(font) + 2 * PAD
    width = max(PAD + cols * cell_w + bar.width, 2 * PAD + math.ceil(max(map(font.getlength, lines))))
    image = Image.new("RGB", (width, top + rows * cell_h), BACKGROUND)
    draw = ImageDraw.Draw(image)
    for i, line in enumerate(lines):
        draw.text((PAD, PAD + i * _text_height(font)), line, fill=INK, font=font)
    for i, cell in enumerate(cells):
        image.paste(cell, (PAD + (i % cols) * cell_w, top + (i // cols) * cell_h))
    image.paste(bar, (PAD + cols * cell_w, top))
    return image


def _text_height(font: ImageFont.ImageFont) -> int:
    """So layouts scale with whatever font load_default returns."""
    return int(font.getbbox("Hg")[3]) + 1
