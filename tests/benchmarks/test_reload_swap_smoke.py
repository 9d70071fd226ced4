"""`python -m benchmarks.reload_swap` runs end to end with tiny settings and reports no failure.

Only the shape of the output and the failure count are checked, never how fast a swap was.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(120)
def test_two_swaps_under_load(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.reload_swap",
            "--swaps=2",
            "--clients=2",
            "--max-seconds=60",
            f"--json={out}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "save -> new version answering: median" in done.stdout
    result = json.loads(out.read_text())
    assert result["swaps_seen"] == 2
    assert len(result["save_to_new_version_ms"]) == 2
    assert result["requests_ok"] > 0
    assert result["requests_failed"] == 0, result["failures"]
