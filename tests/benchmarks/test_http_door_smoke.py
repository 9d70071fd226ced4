"""`python -m benchmarks.http_door` runs end to end with tiny settings against real Triton and
the bridge's HTTP door, and prints its table. Only the shape of the output is checked, never
speed."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.oracle
def test_tiny_http_door_benchmark() -> None:
    command = [
        sys.executable,
        "-m",
        "benchmarks.http_door",
        "--sizes=4,1000",
        "--requests=4",
        "--rounds=2",
        "--ignore-load",
    ]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "| FP32 × n | triton | bridge | bridge ÷ triton |" in done.stdout
    rows = re.findall(r"^\| (\d+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|$", done.stdout, re.M)
    assert [row[0] for row in rows] == ["4", "1000"], done.stdout
