"""`python -m benchmarks.instances` runs end to end with tiny settings (bridge only, so it needs
no oracle) and prints its table. Only the shape of the output is checked, never speed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_tiny_instances_benchmark(tmp_path: Path) -> None:
    results = tmp_path / "results.json"
    command = [
        sys.executable,
        "-m",
        "benchmarks.instances",
        "--servers=bridge",
        "--concurrency=2",
        "--seconds=0.6",
        "--rounds=2",
        "--work-ms=1",
        f"--json={results}",
    ]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "| instances | bridge threads req/s |" in done.stdout
    data = json.loads(results.read_text())
    for kind in ("thread", "process"):
        for count in (1, 2, 4):
            cell = data["results"][f"cpu_{kind}_{count}"]["bridge"]
            assert cell["throughput"] > 0 and cell["errors"] == 0, cell
            assert len(cell["turn_throughput"]) == 2  # the two rounds, interleaved
    for count in (1, 2, 4):
        ratio = data["paired"][f"{count} instances: bridge processes ÷ threads"]
        assert ratio["n"] == 2 and ratio["min"] <= ratio["median"] <= ratio["max"]
    assert "| 2 instances: bridge processes ÷ threads |" in done.stdout
