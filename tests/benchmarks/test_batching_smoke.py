"""`python -m benchmarks.batching` runs end to end with tiny settings (the door only, so it needs
no oracle) and prints its table. Only the shape of the output is checked, never speed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_tiny_batching_benchmark(tmp_path: Path) -> None:
    results = tmp_path / "results.json"
    command = [
        sys.executable,
        "-m",
        "benchmarks.batching",
        "--servers=door",
        "--concurrency=4",
        "--seconds=1",
        "--rounds=2",
        f"--json={results}",
    ]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "| no_batching | door |" in done.stdout
    assert "| dynamic_batching | door |" in done.stdout
    data = json.loads(results.read_text())
    for model in ("no_batching", "dynamic_batching"):
        cell = data["results"][model]["door"]
        assert cell["throughput"] > 0 and cell["errors"] == 0
        assert len(cell["turn_throughput"]) == 2  # the two rounds, interleaved
    # Without dynamic_batching every execute call holds exactly one request of one row.
    assert data["results"]["no_batching"]["door"]["rows_per_call"] == 1.0
    # The gain from batching, paired per round: both rounds, as median and range.
    gain = data["paired"]["door: dynamic ÷ no batching"]
    assert gain["n"] == 2 and gain["min"] <= gain["median"] <= gain["max"]
    assert "| door: dynamic ÷ no batching |" in done.stdout
