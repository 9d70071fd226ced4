"""`python -m benchmarks.request_plane` runs end to end with a few round trips over the real
request plane and prints one row per message shape, with a latency and each process's CPU time.
Only the shape of the output is checked, never speed."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ROW = re.compile(
    r"^\| (?P<message>[^|]+) \| (?P<p50>[\d.]+) \| (?P<p90>[\d.]+) \| \d+ \+ \d+ \| \d+ \+ \d+ \|$"
)


def test_tiny_request_plane_benchmark() -> None:
    command = [sys.executable, "-m", "benchmarks.request_plane", "--requests", "20"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [m for line in done.stdout.splitlines() if (m := ROW.match(line))]
    assert [m["message"] for m in rows] == [
        "fp32_4 (bytes inline)",
        "fp32_100k (a region's handle)",
    ]
    assert all(0 < float(m["p50"]) <= float(m["p90"]) for m in rows)
