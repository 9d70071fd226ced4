"""`python -m benchmarks.door_processes` runs end to end with tiny settings: every server it
starts answers the workload without an error and the table names them (its speed is not
checked)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_one_door_two_doors_and_their_table() -> None:
    command = [sys.executable, "-m", "benchmarks.door_processes", "--workload=fp32_4"]
    command += ["--concurrency=4", "--processes=2", "--seconds=0.5", "--rounds=1"]
    env = {k: v for k, v in os.environ.items() if k != "DYNAMO_BRIDGE_ORACLE_PYTHON"}
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    rates = dict(re.findall(r"^\| (door ×\d) \| ([\d,]+) \|$", done.stdout, re.M))
    assert set(rates) == {"door ×1", "door ×2"}, done.stdout
    assert all(int(rate.replace(",", "")) > 0 for rate in rates.values()), rates
