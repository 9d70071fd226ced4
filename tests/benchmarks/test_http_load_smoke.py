"""`python -m benchmarks.http_load` runs end to end with tiny settings against real Triton and
the triton door's HTTP port: every answer is a 200 carrying the input back (the benchmark checks
it), and the table has a row per size and concurrency. Only the output's shape is checked,
never speed."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.oracle
def test_tiny_http_load_benchmark() -> None:
    command = [sys.executable, "-m", "benchmarks.http_load", "--sizes=4,1000"]
    command += ["--concurrency=1,4", "--seconds=0.3", "--rounds=1", "--ignore-load"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = re.findall(r"^\| (\d+) \| (\d+) \| ([\d,]+) \| ([\d,]+) \|", done.stdout, re.M)
    assert [(size, c) for size, c, _, _ in rows] == [
        ("4", "1"),
        ("4", "4"),
        ("1000", "1"),
        ("1000", "4"),
    ], done.stdout
    assert all(int(rate.replace(",", "")) > 0 for row in rows for rate in row[2:]), rows
