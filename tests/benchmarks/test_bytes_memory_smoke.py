"""`python -m benchmarks.bytes_memory` runs end to end with tiny settings and prints its table.
Only the shape of the output is checked, never memory or speed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_tiny_bytes_memory_benchmark() -> None:
    command = [
        sys.executable,
        "-m",
        "benchmarks.bytes_memory",
        "--wires=grpc,json",
        "--rounds=1",
        "--clients=2",
        "--elements=2000",
    ]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| grpc |")]
    assert len(rows) == 1 and "| json |" in done.stdout, done.stdout
