"""scripts/benchmark_translate_ab.py's command line, as its docstring writes it."""

from __future__ import annotations

from pathlib import Path

from scripts.benchmark_translate_ab import parse_args


def test_overrides_after_the_options_reach_both_checkouts():
    args = parse_args(["best.pt", "--baseline", "/tmp/old", "--rounds", "3", "--", "quantize=int8", "workers=1"])
    assert args.checkpoint == Path("best.pt") and args.baseline == Path("/tmp/old") and args.rounds == 3
    assert args.extra == ["quantize=int8", "workers=1"]
    assert parse_args(["best.pt", "--baseline", "/tmp/old", "length_penalty=1.0"]).extra == ["length_penalty=1.0"]
    assert parse_args(["best.pt", "--baseline", "/tmp/old"]).extra == []
