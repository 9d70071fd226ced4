"""`python -m benchmarks.composition` runs end to end with tiny settings (bridge and in-process,
so it needs no oracle) and prints its table. Only the shape of the output is checked."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODELS = ("direct", "bls_sync", "bls_async", "ensemble_1", "ensemble_3")


def test_tiny_composition_benchmark(tmp_path: Path) -> None:
    results = tmp_path / "results.json"
    command = [
        sys.executable,
        "-m",
        "benchmarks.composition",
        "--servers=bridge,in-process",
        "--seconds=0.6",
        "--rounds=2",
        f"--json={results}",
    ]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "| model | server | requests |" in done.stdout
    data = json.loads(results.read_text())["results"]
    for model in MODELS:
        assert f"| {model} | bridge |" in done.stdout
        for server in ("bridge", "in-process"):
            cell = data[model][server]
            # Every answer was checked against the value the chain must compute.
            assert cell["requests"] > 0 and cell["errors"] == 0, (model, server, cell)
            assert len(cell["turn_p50_ms"]) == 2  # the two rounds, interleaved
            if model != "direct":
                # Paired per round against `direct` on the same server.
                overhead = cell["overhead_ms"]
                assert overhead["n"] == 2 and overhead["min"] <= overhead["median"]
