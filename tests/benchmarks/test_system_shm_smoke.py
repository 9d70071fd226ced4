"""`python -m benchmarks.system_shm` runs end to end with tiny settings (the door only, so it
needs no oracle) and prints its table; every turn's output region was checked. Only the shape of
the output is checked, never speed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_tiny_system_shm_benchmark(tmp_path: Path) -> None:
    results = tmp_path / "results.json"
    command = [
        sys.executable,
        "-m",
        "benchmarks.system_shm",
        "--servers=door",
        "--seconds=1",
        "--rounds=2",
        "--pin=off",
        f"--json={results}",
    ]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, done.stderr[-2000:]
    for workload in ("shm", "raw"):
        assert f"| {workload} | door |" in done.stdout
        cell = json.loads(results.read_text())["results"][workload]["door"]
        assert cell["throughput"] > 0 and cell["errors"] == 0
        assert len(cell["turn_p50_ms"]) == 2  # the two rounds, interleaved
    assert not list(Path("/dev/shm").glob("bench_shm_door_*"))  # its objects are removed
