"""The one timing rule of the speed benchmarks, and what generate.py --benchmark says about a short prompt."""

from __future__ import annotations

from generation.speed import MIN_PREFILL_TOKENS, prefill_line
from generation.timing import alternate_medians, wall_seconds


def test_runs_alternate_after_a_warm_up_round_and_medians_are_taken():
    calls: list[str] = []
    scripted = {
        "a": iter([100.0, 5.0, 1.0, 3.0]),
        "b": iter([(9.0, 1.0), (2.0, 7.0), (4.0, 8.0), (6.0, 9.0)]),
    }

    def run(name: str):
        def measure():
            calls.append(name)
            return next(scripted[name])

        return measure

    medians = alternate_medians({"a": run("a"), "b": run("b")}, repeats=3)
    assert calls == ["a", "b"] * 4  # one warm-up round, then a, b, a, b, ...: a load spike hits both alike
    assert medians == {"a": 3.0, "b": (4.0, 8.0)}  # the warm-up (100, (9, 1)) is not counted


def test_wall_seconds_keeps_the_output_of_the_latest_run():
    outputs: dict = {}
    results = iter(["first", "second"])
    run = wall_seconds(lambda: next(results), outputs, "side")
    assert run() >= 0 and outputs["side"] == "first"
    run()
    assert outputs["side"] == "second"


def test_prefill_speed_of_a_tiny_prompt_is_shown_as_a_time_only():
    short = prefill_line(2, 0.0005)
    assert (
        "tokens/s" not in short.split("(")[0]
        and "0.5 ms" in short
        and f"prompt of {MIN_PREFILL_TOKENS}+ tokens" in short
    )
    long = prefill_line(256, 0.01)
    assert "(25,600 tokens/s)" in long
