"""Attention grid images: sane size, real content, a PNG that opens, and labels that survive odd tokens."""

import numpy as np
import pytest
import torch
from PIL import Image

from inspection.attention_image import (
    colour_table,
    draw_attention_grid,
    printable_label,
    save_attention_png,
    to_colours,
)


def causal_probs(h=4, t=10, seed=0):
    scores = torch.randn(h, t, t, generator=torch.Generator().manual_seed(seed))
    mask = torch.ones(t, t, dtype=torch.bool).tril()
    return scores.masked_fill(~mask, float("-inf")).softmax(dim=-1)  # (H, T, T)


def test_grid_is_an_rgb_image_of_sane_size_with_content():
    image = draw_attention_grid(causal_probs(h=5), None, "layer 0")
    assert image.mode == "RGB"
    assert 200 <= image.width <= 2000 and 200 <= image.height <= 2000
    pixels = np.asarray(image)
    assert pixels.dtype == np.uint8 and pixels.std() > 0
    assert image.width > image.height  # 5 heads in 3 columns and 2 rows, plus the colour bar


def test_selected_heads_only():
    one, all_heads = (
        draw_attention_grid(causal_probs(), None, "x", heads=[2]),
        draw_attention_grid(causal_probs(), None, "x"),
    )
    assert one.width < all_heads.width
    with pytest.raises(ValueError, match="heads"):
        draw_attention_grid(causal_probs(), None, "x", heads=[4])


def test_weird_token_labels_do_not_crash_and_add_axes():
    labels = ["", "\n", " ", "😀", "日本", "tab\there", "\\", "a" * 40, "é", "\x00"]
    labelled = draw_attention_grid(causal_probs(), labels, "odd tokens")
    plain = draw_attention_grid(causal_probs(), None, "odd tokens")
    assert labelled.width > plain.width and labelled.height > plain.height
    with pytest.raises(ValueError, match="token labels"):
        draw_attention_grid(causal_probs(), labels[:3], "too few")


def test_long_sequences_drop_labels_that_would_not_fit():
    probs = causal_probs(h=1, t=64)
    labelled = draw_attention_grid(probs, [str(i) for i in range(64)], "long")
    assert labelled.size == draw_attention_grid(probs, None, "long").size


@pytest.mark.parametrize(
    ("token", "shown"),
    [
        ("\n", "\\n"),
        (" the", "·the"),
        ("", '""'),
        ("😀", "\\U0001f600"),
        ("a\\b", "a\\\\b"),
        ("x" * 20, "x" * 8 + ".."),
    ],
)
def test_labels_make_whitespace_and_non_ascii_visible(token, shown):
    assert printable_label(token) == shown


def test_colours_are_uint8_and_map_zero_and_one_to_the_ends_of_the_table():
    table = colour_table()
    assert table.shape == (256, 3) and table.dtype == np.uint8
    colours = to_colours(np.array([0.0, 1.0, 2.0]), vmax=1.0)
    assert (
        (colours[0] == table[0]).all() and (colours[1] == table[-1]).all() and (colours[2] == table[-1]).all()
    )
    brightness = table.astype(float) @ [0.299, 0.587, 0.114]
    assert (np.diff(brightness) >= -1.0).all()  # perceptual ramp: brighter for larger weights


def test_png_round_trip(tmp_path):
    image = draw_attention_grid(causal_probs(), None, "layer 1")
    path = save_attention_png(image, tmp_path / "maps" / "layer1.png")
    with Image.open(path) as reopened:
        assert reopened.format == "PNG" and reopened.size == image.size
        assert np.array_equal(np.asarray(reopened.convert("RGB")), np.asarray(image))
    assert [p.name for p in path.parent.iterdir()] == ["layer1.png"]  # no temporary file left behind
