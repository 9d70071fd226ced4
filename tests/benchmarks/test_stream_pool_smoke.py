"""`python -m benchmarks.stream_pool` runs end to end with tiny settings. What it shows is
checked, not its speed: idle streams on the server's own pool leave no thread for a unary call,
and on a pool of their own they take nothing from the unary calls."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def rows(*flags: str) -> list[tuple[int, int, int]]:
    """(idle streams, calls/s, unanswered) per row of the table."""
    command = [sys.executable, "-m", "benchmarks.stream_pool", "--seconds=1", "--clients=2"]
    command += ["--unary-threads=2", *flags]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    found = re.findall(r"^\| (\d+) \| (\d+) \| (\d+) \|", done.stdout, re.M)
    return [(int(idle), int(per_s), int(unanswered)) for idle, per_s, unanswered in found]


def test_idle_streams_on_the_servers_pool_starve_unary_calls() -> None:
    (row,) = rows("--idle-streams=2", "--shared")
    assert row[0] == 2 and row[1] == 0 and row[2] > 0


def test_idle_streams_on_a_pool_of_their_own_do_not() -> None:
    (row,) = rows("--idle-streams=20", "--stream-threads=32")
    assert row[0] == 20 and row[1] > 0 and row[2] == 0
