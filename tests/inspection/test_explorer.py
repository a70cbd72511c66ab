"""The explorer's data without a browser: quantisation, thumbnails, escaping, statistics, size, phase changes."""

import re
from html.parser import HTMLParser

import numpy as np
import pytest
import torch

from inspection.attention_stats import Formation, PhaseChangeDetector, head_statistics
from inspection.explorer import build_explorer, max_pool, probe_attention, quantise_rows


def stats_for(maps: torch.Tensor) -> dict[str, torch.Tensor]:
    n_layer, n_head = maps.shape[:2]
    return {
        name: torch.rand(n_layer, n_head) for name in ("entropy", "sink_mass", "previous_token", "induction")
    }


def dequantise_rows(row_max: np.ndarray, triangle: np.ndarray) -> np.ndarray:
    """What the page's script does: (T, T) float32 with zeros above the diagonal, p = q / 255 * row_max."""
    t = row_max.shape[0]
    out = np.zeros((t, t), dtype=np.float32)
    out[np.tril_indices(t)] = triangle.astype(np.float32) / 255.0
    return out * row_max[:, None]


def test_quantised_rows_keep_each_weight_within_half_a_step(explorer_kit):
    probs = explorer_kit.noisy_maps(1, 1, 40)[0, 0].numpy()
    row_max, triangle = quantise_rows(probs)
    assert triangle.shape == (40 * 41 // 2,) and triangle.dtype == np.uint8
    assert np.array_equal(row_max, probs.max(axis=1).astype(np.float16).astype(np.float32))  # as stored
    back = dequantise_rows(row_max, triangle)
    assert np.all(np.abs(back - probs) <= row_max[:, None] / 510 + 1e-7)
    assert np.all(np.triu(back, k=1) == 0)


def test_maps_that_are_not_causal_softmax_rows_are_refused(explorer_kit):
    maps = explorer_kit.noisy_maps(1, 2, 8)
    maps[0, 1, 2, 5] = 0.3  # weight on a later key
    with pytest.raises(ValueError, match="causal softmax"):
        build_explorer(maps, [str(i) for i in range(8)], stats_for(maps))
    with pytest.raises(ValueError, match="9 tokens"):
        build_explorer(explorer_kit.noisy_maps(1, 1, 8), [str(i) for i in range(9)], stats_for(maps))


def test_thumbnails_are_block_maxima():
    image = np.random.default_rng(0).random((10, 10))
    pooled = max_pool(image, 4)  # blocks start at 0, 2, 5, 7
    edges = [0, 2, 5, 7, 10]
    expected = [
        [image[edges[r] : edges[r + 1], edges[c] : edges[c + 1]].max() for c in range(4)] for r in range(4)
    ]
    assert np.array_equal(pooled, np.array(expected))


class TagCollector(HTMLParser):
    """Every start tag with its attributes, as a browser's tokenizer sees them (script bodies are raw text)."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict]] = []

    def handle_starttag(self, tag, attrs) -> None:
        self.tags.append((tag, dict(attrs)))


def test_page_is_self_contained_and_tokens_cannot_break_out(explorer_kit):
    maps = explorer_kit.noisy_maps(1, 2, 6)
    evil = ['</script><img src="https://example.com/x.png">', "a", "\n", "<!--", "é", " "]
    page = build_explorer(maps, evil, stats_for(maps), title="<b>title</b>")
    collector = TagCollector()
    collector.feed(page)
    tags = [tag for tag, _ in collector.tags]
    assert "img" not in tags and "<title>&lt;b&gt;title&lt;/b&gt;</title>" in page
    # Nothing the browser could fetch: no src attribute, no link but the empty inline favicon.
    assert not any("src" in attrs for _, attrs in collector.tags)
    assert [attrs["href"] for tag, attrs in collector.tags if "href" in attrs] == ["data:,"]
    assert explorer_kit.meta(page)["tokens"] == evil
    code = page.split('<script id="explorer-meta"')[0] + page.split("</script>")[-2]  # head, CSS and the JS
    assert not re.search(r"https?://|url\(|@import|fetch\(|XMLHttpRequest", code)


def test_statistics_in_the_page_are_head_statistics(explorer_kit):
    model = explorer_kit.sharp_model()
    ids = torch.randint(64, (1, 20), generator=torch.Generator().manual_seed(1))
    maps, stats = probe_attention(model, ids, 8, generator=torch.Generator().manual_seed(3))
    page = build_explorer(maps[:, 0], [str(i) for i in range(20)], stats)
    expected = head_statistics(model, ids, 8, generator=torch.Generator().manual_seed(3))
    meta = explorer_kit.meta(page)
    for name, values in expected.items():
        assert torch.equal(torch.tensor(meta["stats"][name], dtype=torch.float64), values.double()), name


def test_phase_change_is_reported_once_at_the_first_crossing():
    detector = PhaseChangeDetector(threshold=0.5)
    sequence = {  # step -> induction scores (L=2, H=2)
        100: [[0.1, 0.2], [0.3, 0.5]],  # 0.5 is not above the threshold
        200: [[0.1, 0.2], [0.6, 0.4]],  # L1H0 crosses
        300: [[0.1, 0.2], [0.4, 0.7]],  # L1H0 dips (still formed), L1H1 crosses
        400: [[0.1, 0.2], [0.8, 0.9]],  # both above again: nothing new
    }
    reported = {step: detector.update(step, torch.tensor(scores)) for step, scores in sequence.items()}
    assert reported[100] == [] and reported[400] == []
    assert reported[200] == [Formation(1, 0, 200, pytest.approx(0.6))]
    assert [f.name for f in reported[300]] == ["L1H1"]
    assert [f.message() for f in detector.formations] == [
        "induction head L1H0 formed at step 200 (score 0.60)",
        "induction head L1H1 formed at step 300 (score 0.70)",
    ]


def test_the_page_opens_on_the_head_with_the_highest_induction_or_previous_token_score(explorer_kit):
    maps = explorer_kit.noisy_maps(2, 3, 8)
    stats = {name: torch.zeros(2, 3) for name in ("entropy", "sink_mass", "previous_token", "induction")}
    stats["entropy"][0, 0] = 5.0  # a near-uniform head: high entropy is not what makes a head telling
    stats["previous_token"][0, 2] = 0.6
    stats["induction"][1, 1] = 0.8
    meta = explorer_kit.meta(build_explorer(maps, [str(i) for i in range(8)], stats))
    assert meta["initial_head"] == [1, 1]
    stats["previous_token"][0, 2] = 0.9
    assert explorer_kit.meta(build_explorer(maps, [str(i) for i in range(8)], stats))["initial_head"] == [
        0,
        2,
    ]


def test_the_page_explains_its_statistics_axes_and_prompt(explorer_kit):
    maps = explorer_kit.noisy_maps(1, 2, 6)
    page = build_explorer(maps, list("abcdef"), stats_for(maps), prompt_len=4)
    meta = explorer_kit.meta(page)
    assert meta["prompt_len"] == 4
    assert (
        set(meta["meanings"])
        == set(meta["statistics"])
        == {"entropy", "sink_mass", "previous_token", "induction"}
    )
    assert (
        "first token" in meta["meanings"]["sink_mass"] and "just before" in meta["meanings"]["previous_token"]
    )
    assert "rows: query" in page and "columns: key" in page
