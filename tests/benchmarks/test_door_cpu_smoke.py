"""`python -m benchmarks.door_cpu` runs end to end with tiny settings and prints a CPU figure
per door variant and round. Only the shape of the output is checked, never speed."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_tiny_door_cpu_benchmark(tmp_path: Path) -> None:
    command = [
        sys.executable,
        "-m",
        "benchmarks.door_cpu",
        "--variants=door,arenas:MALLOC_ARENA_MAX=1",
        "--workload=fp32_4",
        "--concurrency=2",
        "--rounds=2",
        "--requests=40",
        "--pin=off",
        f"--log-dir={tmp_path}",
    ]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=200)
    assert done.returncode == 0, done.stderr[-2000:]
    rounds = re.findall(
        r"^round (\d) (door|arenas) +(\d+) µs/request .* errors (\d+)", done.stdout, re.M
    )
    assert sorted((turn, path) for turn, path, _, _ in rounds) == [
        ("0", "arenas"),
        ("0", "door"),
        ("1", "arenas"),
        ("1", "door"),
    ]
    assert all(errors == "0" for *_, errors in rounds)
    assert "median over rounds:" in done.stdout
