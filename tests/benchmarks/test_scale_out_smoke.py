"""`python -m benchmarks.scale_out` runs end to end with tiny settings and prints its tables.

Only the shape of the output and the absence of errors are checked, never how fast anything was.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(180)
def test_one_and_two_workers_and_the_hop(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.scale_out",
            "--concurrency=4",
            "--work-ms=2",
            "--seconds=0.5",
            "--warmup=0.2",
            "--sizes=4",
            "--latency-seconds=0.3",
            "--rounds=1",
            f"--json={out}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "throughput, 2 workers / 1 worker:" in done.stdout
    assert "| frontend + 2 workers |" in done.stdout
    assert "| 4 |" in done.stdout
    result = json.loads(out.read_text())
    for key in ("embedded", "1", "2"):
        assert result["throughput"][key]["errors"] == 0, result["throughput"][key]
        assert result["throughput"][key]["throughput"] > 0
    # Both workers answered in the two-worker row.
    assert set(map(int, result["throughput"]["2"]["per_process"])) == set(result["worker_pids"])
    assert result["latency"]["4"]["split"]["requests"] > 0
