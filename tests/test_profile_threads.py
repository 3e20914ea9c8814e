"""scripts/profile_threads.py's arithmetic: what an operation costs beyond perfect two-thread scaling, and the
split into matrix products and the rest. No timing is asserted; the inputs are made up."""

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

from profile_threads import summarise  # noqa: E402


def test_excess_is_the_time_beyond_half_and_rows_come_largest_first():
    one = {"aten::mm": 100.0, "aten::cat": 10.0, "aten::add": 4.0, "aten::bmm": 8.0}
    two = {"aten::mm": 52.0, "aten::cat": 9.0, "aten::bmm": 4.0, "aten::random_": 3.0}
    groups, rows = summarise(one, two)
    assert [r[0] for r in rows] == ["aten::cat", "aten::random_", "aten::mm", "aten::bmm", "aten::add"]
    excess = {r[0]: r[3] for r in rows}
    assert excess == {"aten::cat": 4.0, "aten::random_": 3.0, "aten::mm": 2.0, "aten::bmm": 0.0, "aten::add": -2.0}
    assert groups == {"matrix products": (108.0, 56.0), "everything else": (14.0, 12.0)}
    # The two groups hold every operation once: their excess adds up to the rows'.
    total = sum(two - one / 2 for one, two in groups.values())
    assert total == sum(excess.values())
