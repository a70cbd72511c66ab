"""An interactive attention explorer as one self-contained HTML file (inline JS and CSS, no network), kept small
(docs/attention.md): per head, its map's lower triangle quantised row by row to uint8, deflated with zlib's
run-length strategy and decoded by the browser only when the head is opened, and two max-pooled thumbnails.
"""

from __future__ import annotations

import base64
import functools
import html
import json
import zlib
from collections.abc import Mapping, Sequence
from importlib import resources

import numpy as np
import torch

from inspection.attention_image import colour_table, printable_label
from inspection.attention_stats import STATISTICS, Formation, head_statistics

THUMB_SIZE = 48  # thumbnail side in pixels: 12 heads fit a laptop screen's width next to the detail view
STATISTIC_TITLES = {  # name in head_statistics -> column title in the explorer
    "entropy": "entropy (nats)",
    "sink_mass": "sink",
    "previous_token": "previous token",
    "induction": "induction",
}
STATISTIC_MEANINGS = {  # shown under the table, for a reader who has not met these words yet
    "entropy": "how spread out a query's attention is, averaged over queries: 0 when every query looks at one "
    "key; high for a head that looks everywhere a little (log of the number of keys if uniform)",
    "sink_mass": "the share of attention on the first token: many heads park weight there when nothing else "
    "is useful (an attention sink)",
    "previous_token": "the share of attention on the token just before the query: 1 for a head that always "
    "looks one step back",
    "induction": "on a random sequence repeated twice, the share of attention on the token that followed the "
    "earlier copy of the query's token: high for an induction head, which copies what came next last time",
}


def quantise_rows(probs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(T, T) causal softmax rows (else ValueError) -> (row maxima (T,), lower triangle uint8 row by row).
    Row i keeps keys 0..i as round(255 p / row_max); the maxima are float16 as stored (normal up to T = 16384)."""
    t = probs.shape[-1]
    rows, cols = _lower_triangle(t)
    lower = probs[rows, cols]  # (T (T + 1) / 2,) keys 0..i of row i, row after row
    row_starts = np.arange(t) * (np.arange(t) + 1) // 2
    # 1 only for rows summing to 1 over keys 0..i and over all keys: nothing above the diagonal.
    row_sums = np.minimum(np.add.reduceat(lower, row_starts), 2.0 - probs.sum(axis=1))
    if not np.allclose(row_sums, 1.0, atol=1e-3):
        worst = int(np.abs(row_sums - 1.0).argmax())
        raise ValueError(
            f"row {worst} of an attention map sums to {row_sums[worst]:.4f} over keys 0..{worst}; the explorer "
            "needs causal softmax probabilities (rows summing to 1, nothing above the diagonal)"
        )
    row_max = probs.max(axis=1).astype(np.float16).astype(np.float32)  # (T,), as stored
    scaled = np.rint(lower / np.maximum(row_max, np.finfo(np.float16).smallest_subnormal)[rows] * 255.0)
    return row_max, np.minimum(scaled, 255.0).astype(np.uint8)  # a maximum rounded down gives 255.1


@functools.lru_cache(maxsize=4)
def _lower_triangle(t: int) -> tuple[np.ndarray, np.ndarray]:
    return np.tril_indices(t)


def max_pool(image: np.ndarray, size: int) -> np.ndarray:
    """(T, T) -> (size, size) block maxima, with block edges at round(k * T / size); size <= T."""
    t = image.shape[0]
    edges = np.floor(np.arange(size) * t / size).astype(np.int64)
    return np.maximum.reduceat(np.maximum.reduceat(image, edges, axis=0), edges, axis=1)


def build_explorer(
    maps: torch.Tensor,
    tokens: Sequence[str],
    statistics: Mapping[str, torch.Tensor],
    *,
    title: str = "attention explorer",
    step: int | None = None,
    history: Sequence[tuple[int, Mapping[str, torch.Tensor]]] = (),
    formations: Sequence[Formation] = (),
    threshold: float | None = None,
    prompt_len: int | None = None,
) -> str:
    """The explorer's HTML for `maps` (L, H, T, T) of one text, its `tokens` (T strings) and `statistics` (each
    name in STATISTICS -> (L, H)); `history` holds (step, statistics) pairs, `formations` the induction heads."""
    maps = _checked_maps(maps, tokens)
    n_layer, n_head, t, _ = maps.shape
    thumb = min(t, THUMB_SIZE)
    head_blocks, thumbs_prob, thumbs_row = [], [], []
    for head_map in maps.reshape(n_layer * n_head, t, t):  # layer after layer
        row_max, triangle = quantise_rows(head_map)
        head_blocks.append(_pack(row_max.astype("<f2").tobytes() + triangle.tobytes()))
        relative = np.zeros((t, t), dtype=np.uint8)
        relative[_lower_triangle(t)] = triangle
        thumbs_row.append(max_pool(relative, thumb))
        thumbs_prob.append(np.rint(max_pool(head_map, thumb) * 255.0).astype(np.uint8))
    meta = {
        "version": 1,
        "title": title,
        "step": step,
        "n_layer": n_layer,
        "n_head": n_head,
        "n_tokens": t,
        "thumb": thumb,
        "tokens": list(tokens),
        "labels": [printable_label(x, 16) for x in tokens],
        "statistics": {name: STATISTIC_TITLES[name] for name in STATISTICS},
        "meanings": {name: STATISTIC_MEANINGS[name] for name in STATISTICS},
        "prompt_len": prompt_len,
        "initial_head": most_telling_head(statistics),
        "stats": _listed(statistics),
        "history": [{"step": int(s), "stats": _listed(values)} for s, values in history],
        "formations": [
            {"layer": f.layer, "head": f.head, "step": f.step, "score": f.score} for f in formations
        ],
        "threshold": threshold,
        "colours": colour_table().tolist(),
    }
    thumbs = np.stack(thumbs_prob + thumbs_row)  # (2 * L * H, thumb, thumb)
    data = [_script("explorer-meta", "application/json", _json_for_html(meta))]
    data.append(_script("explorer-thumbs", "application/octet-stream", _pack(thumbs.tobytes())))
    for i, block in enumerate(head_blocks):
        data.append(_script(f"explorer-head-{i}", "application/octet-stream", block))
    template = _asset("explorer.html")
    return (
        template.replace("{{TITLE}}", html.escape(title))
        .replace("/*{{CSS}}*/", _asset("explorer.css"))
        .replace("{{DATA}}", "\n".join(data))
        .replace("/*{{JS}}*/", _asset("explorer.js"))
    )


def most_telling_head(statistics: Mapping[str, torch.Tensor]) -> list[int]:
    """[layer, head] shown first: the highest induction or previous-token score shows a stripe at a glance."""
    score = torch.maximum(statistics["induction"], statistics["previous_token"])  # (L, H)
    best = int(score.flatten().argmax())
    return [best // score.shape[1], best % score.shape[1]]


def probe_attention(
    model: torch.nn.Module,
    ids: torch.Tensor,
    induction_period: int,
    *,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The maps (L, 1, H, T, T) of `model` on ids (1, T) and the per-head statistics."""
    with torch.no_grad():
        maps = model.attention_maps(ids).float()
        period = min(induction_period, model.config.block_size // 2)
        stats = head_statistics(model, ids, period, generator=generator, probe_maps=maps)
    return maps, stats


def _checked_maps(maps: torch.Tensor, tokens: Sequence[str]) -> np.ndarray:
    if maps.dim() != 4 or maps.shape[-1] != maps.shape[-2]:
        raise ValueError(f"expected attention maps (L, H, T, T), got {tuple(maps.shape)}")
    if len(tokens) != maps.shape[-1]:
        raise ValueError(f"got {len(tokens)} tokens for maps over {maps.shape[-1]} positions")
    return maps.detach().float().cpu().numpy()


def _listed(statistics: Mapping[str, torch.Tensor]) -> dict[str, list[list[float]]]:
    return {name: statistics[name].detach().double().cpu().tolist() for name in STATISTICS}


def _pack(raw: bytes) -> str:
    deflate = zlib.compressobj(6, zlib.DEFLATED, zlib.MAX_WBITS, 8, zlib.Z_RLE)
    return base64.b64encode(deflate.compress(raw) + deflate.flush()).decode("ascii")


def _json_for_html(value: object) -> str:
    # "<" escaped as \u003c, so a token such as "</script>" cannot end the data block early.
    return json.dumps(value, ensure_ascii=False, allow_nan=False).replace("<", "\\u003c")


def _script(element_id: str, kind: str, body: str) -> str:
    return f'<script id="{element_id}" type="{kind}">{body}</script>'


def _asset(name: str) -> str:
    return resources.files("inspection").joinpath("explorer_assets", name).read_text(encoding="utf-8")
