"""Spread over rounds: the median of per-round figures with their range, and paired ratios.

Every benchmark here takes turns (round 1: A, B, C; round 2: A, B, C; ...) so a burst of load
from elsewhere hits every side alike. A comparison is then made per round (A's figure over B's
in the same round: a paired ratio, or difference) and summed up as the median over rounds with
its range, so a reader sees how far one round disagrees with the next.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence


def spread(values: Sequence[float | None]) -> dict[str, float | int] | None:
    """{"median", "min", "max", "n"} of the values that are not None; None if there are none."""
    kept = [v for v in values if v is not None]
    if not kept:
        return None
    return {"median": statistics.median(kept), "min": min(kept), "max": max(kept), "n": len(kept)}


def paired(
    a: Sequence[float | None], b: Sequence[float | None], how: str = "ratio"
) -> list[float | None]:
    """Per round: a ÷ b ("ratio") or a − b ("difference"); None where a side has no figure."""
    out: list[float | None] = []
    for x, y in zip(a, b, strict=False):
        if x is None or y is None or (how == "ratio" and not y):
            out.append(None)
        else:
            out.append(x / y if how == "ratio" else x - y)
    return out


def number(value: float | None, digits: int = 2) -> str:
    if value is None:
        return "n/a"
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.{digits}f}"


def format_spread(summary: dict[str, float | int] | None, digits: int = 2) -> str:
    """`median [min–max]`, or n/a."""
    if summary is None:
        return "n/a"
    median, low, high = summary["median"], summary["min"], summary["max"]
    return f"{number(median, digits)} [{number(low, digits)}–{number(high, digits)}]"


def comparison_lines(measure: str, comparisons: dict[str, dict]) -> list[str]:
    """The paired comparisons as table rows after a blank line (none without comparisons):
    `measure` ratio (e.g. "throughput", "p50"), median [range] over rounds."""
    if not comparisons:
        return []
    lines = ["", f"| {measure} ratio, paired per round | median [range] |", "|---|---|"]
    return lines + [f"| {name} | {format_spread(s)} |" for name, s in comparisons.items()]
