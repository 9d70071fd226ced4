"""Bounded waits: a close, a finalize or a drain shares one deadline across its steps."""

from __future__ import annotations

import time


def remaining(deadline: float | None) -> float | None:
    """Seconds left until `deadline` (a time.monotonic() value), never negative; None if none."""
    return None if deadline is None else max(0.0, deadline - time.monotonic())
