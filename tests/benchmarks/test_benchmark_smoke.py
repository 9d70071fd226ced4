"""`python -m benchmarks.run` works end to end with tiny settings, so it cannot rot.

Only the shape and sanity of the output are checked, never how fast anything was.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness.oracle import ORACLE_PYTHON_ENV, oracle_unavailable_reason

ROOT = Path(__file__).resolve().parents[2]


def run_benchmark(
    output: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    environ = dict(os.environ)
    environ.update(env or {})
    command = [sys.executable, "-m", "benchmarks.run", "--output-dir", str(output), *args]
    return subprocess.run(
        command, cwd=ROOT, env=environ, capture_output=True, text=True, timeout=150
    )


@pytest.mark.timeout(180)
def test_tiny_run_writes_table_and_results(tmp_path: Path) -> None:
    servers = ["bridge", "echo"]
    if oracle_unavailable_reason() is None:
        servers.insert(0, "triton")
    done = run_benchmark(
        tmp_path,
        "--workloads=fp32_4",
        "--concurrency=1",
        "--max-requests=20",
        "--max-seconds=60",  # a bound, not a measurement: 20 requests finish long before
        "--rounds=1",
        "--warmup=1",
        f"--servers={','.join(servers)}",
    )
    assert done.returncode == 0, done.stdout + done.stderr

    # The table: one column per server, the ratios, and a row for the cell.
    assert "| workload | load |" in done.stdout
    assert "bridge ÷ echo p50, median [range] of rounds" in done.stdout
    assert "| fp32_4 | 1 |" in done.stdout
    assert (tmp_path / "results.md").read_text().startswith("| workload | load |")
    # The plot is optional (matplotlib is the `bench` extra); without it, the run says so.
    assert (tmp_path / "plot.png").exists() or "plot skipped: matplotlib" in done.stdout

    results = json.loads((tmp_path / "results.json").read_text())
    assert results["settings"]["max_requests"] == 20
    assert all(results["servers"][name]["available"] for name in servers)
    (cell,) = results["cells"]
    assert (cell["workload"], cell["concurrency"]) == ("fp32_4", 1)
    for name in servers:
        result = cell["results"][name]
        assert result["errors"] == 0, result["first_error"]
        assert result["requests"] == 20  # every answer arrived and was checked correct
        assert 0 < result["p50_ms"] <= result["p99_ms"]
        assert result["rps"] > 0
    assert cell["ratios"]["bridge/echo"]["p50_ms"] > 0
    # One round: the per-round spread is that round's ratio.
    rounds = cell["ratios"]["bridge/echo"]["rounds"]["p50_ms"]
    assert rounds["n"] == 1 and rounds["min"] == rounds["median"] == rounds["max"] > 0
    assert cell["results"]["bridge"]["client_cpu_ms"] > 0
    assert results["placement"]


@pytest.mark.timeout(240)
def test_open_loop_and_the_aa_pair(tmp_path: Path) -> None:
    """Open loop at a fixed rate, next to closed loop, with the second bridge (the A/A pair):
    every cell has the bridge2 ÷ bridge ratio with its spread over the two rounds."""
    done = run_benchmark(
        tmp_path,
        "--workloads=fp32_4",
        "--concurrency=2",
        "--mode=both",
        "--rates=40",
        "--max-requests=16",
        "--max-seconds=60",
        "--rounds=2",
        "--warmup=1",
        "--servers=bridge,bridge2,echo",
        "--pin=off",
        "--no-plot",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "| fp32_4 | 40/s |" in done.stdout
    assert "bridge2 ÷ bridge p50, median [range] of rounds" in done.stdout
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["placement"].startswith("not pinned")
    closed, opened = results["cells"]
    assert (closed["mode"], closed["concurrency"], closed["rate"]) == ("closed", 2, None)
    assert (opened["mode"], opened["concurrency"], opened["rate"]) == ("open", None, 40.0)
    for cell in (closed, opened):
        for name in ("bridge", "bridge2", "echo"):
            result = cell["results"][name]
            assert result["errors"] == 0, result["first_error"]
            # 8 per round, every answer checked; the closed loop's drain is not measured.
            assert result["requests"] + result["drained"] == 16
            assert len(result["turn_p50_ms"]) == 2
        aa = cell["ratios"]["bridge2/bridge"]["rounds"]["p50_ms"]
        assert aa["n"] == 2 and aa["min"] <= aa["median"] <= aa["max"]


@pytest.mark.timeout(180)
def test_missing_oracle_is_reported_not_fatal(tmp_path: Path) -> None:
    # Triton cannot start without the oracle env: its column is n/a and the run goes on.
    # The streaming workload also shows that a decoupled model is measured end to end.
    done = run_benchmark(
        tmp_path,
        "--workloads=stream_100",
        "--concurrency=1",
        "--max-requests=5",
        "--rounds=1",
        "--warmup=1",
        "--servers=triton,echo",
        "--no-plot",
        env={ORACLE_PYTHON_ENV: str(tmp_path / "no-such-venv" / "bin" / "python")},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["servers"]["triton"]["available"] is False
    assert ORACLE_PYTHON_ENV in results["servers"]["triton"]["reason"]
    (cell,) = results["cells"]
    assert cell["results"]["triton"] is None
    assert cell["results"]["echo"]["requests"] == 5
    assert cell["results"]["echo"]["errors"] == 0
    assert "| stream_100 | 1 | n/a |" in done.stdout
    assert not (tmp_path / "plot.png").exists()


@pytest.mark.timeout(300)
def test_door_preset_measures_issue_13s_table(tmp_path: Path) -> None:
    """`--preset door`: the six cells of issue 13's table on the embedded and the split triton
    door (the split one only where the table has a target; Dynamo's frontend and the echo worker
    on the c=1 rows), every answer checked, among them
    100-response streams sharing one ModelStreamInfer call; then the issue's ratio table."""
    done = run_benchmark(
        tmp_path,
        "--preset=door",
        "--max-requests=6",
        "--max-seconds=60",
        "--rounds=1",
        "--warmup=1",
        "--pin=off",
        "--no-plot",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "| workload | embedded default, `--frontend triton` |" in done.stdout
    assert "| stream_100_shared, c=32 throughput |" in done.stdout
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["settings"]["preset"] == "door"
    assert results["servers"]["door"]["available"], results["servers"]["door"]["reason"]
    assert results["servers"]["door_split"]["available"], results["servers"]["door_split"]
    cells = [(c["workload"], c["concurrency"]) for c in results["cells"]]
    assert cells == [
        ("fp32_4", 1),
        ("fp32_100k", 1),
        ("fp32_1m", 1),
        ("add_sub", 32),
        ("fp32_100k", 32),
        ("stream_100_shared", 32),
    ]
    for cell in results["cells"]:
        c1 = cell["concurrency"] == 1
        servers = ["door", "door_split", "bridge", "echo"] if c1 else ["door"]
        for name in servers:
            result = cell["results"][name]
            assert result["errors"] == 0, (cell["workload"], name, result["first_error"])
            assert result["requests"] + result["drained"] >= 6
        if not c1:
            for name in ("door_split", "bridge", "echo"):
                assert cell["results"][name] is None  # no target there: not measured


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    "servers",
    [
        # benchmarks/grpc_floor.py: their figures are a floor of the same work, not of less.
        ["floor_aio", "floor_aio_hop", "floor_sync", "floor_sync_hop"],
        # benchmarks/door_sync.py: the real loader behind a synchronous gRPC server.
        ["door_sync"],
    ],
    ids=["floors", "door_sync"],
)
def test_the_lab_servers_answer_right(tmp_path: Path, servers: list[str]) -> None:
    """Each lab server answers every request of both workloads correctly (the client checks
    each answer's bytes)."""
    done = run_benchmark(
        tmp_path,
        "--workloads=fp32_4,add_sub",
        "--concurrency=2",
        "--max-requests=12",
        "--max-seconds=60",
        "--rounds=1",
        "--warmup=1",
        f"--servers={','.join(servers)}",
        "--pin=off",
        "--no-plot",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads((tmp_path / "results.json").read_text())
    assert [cell["workload"] for cell in results["cells"]] == ["fp32_4", "add_sub"]
    for cell in results["cells"]:
        for name in servers:
            result = cell["results"][name]
            assert result["errors"] == 0, result["first_error"]
            assert result["requests"] + result["drained"] == 12
