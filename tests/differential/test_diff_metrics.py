"""Triton's nv_inference_* counters and a model's custom metrics against real Triton: the same
known traffic (tests/e2e/metrics_support.py) to both, each in a fresh server, then the scraped
values compared. Durations differ by machine and are only checked to be there."""

from __future__ import annotations

import time

import pytest

from tests.e2e.metrics_support import METRICS, scrape, send_known_traffic, value
from tests.harness.oracle import TritonOracle

pytestmark = pytest.mark.oracle

M = {"model": "counted", "version": "1"}
COMPARED = [
    ("nv_inference_request_success", M),
    *[("nv_inference_request_failure", {**M, "reason": r})
      for r in ("REJECTED", "CANCELED", "BACKEND", "OTHER")],
    ("nv_inference_count", M),
    ("nv_inference_exec_count", M),
    ("nv_inference_pending_request_count", M),
    ("nv_inference_request_summary_us_count", M),
    ("counted_requests", {"kind": "ok"}),
    ("counted_requests", {"kind": "failed"}),
    ("counted_last_batch", {}),
    ("counted_rows_count", {}),
    ("counted_rows_sum", {}),
    *[("counted_rows_bucket", {"le": le}) for le in ("1", "2", "4", "+Inf")],
]  # fmt: skip
SETTLE_S = 1.0
ARGS = ("--model-control-mode=explicit", "--load-model=counted", "--metrics-config",
        "summary_latencies=true")  # fmt: skip


def _observe(server) -> tuple[list[str], dict]:
    outcomes = send_known_traffic(server.grpc_url)
    # A request whose `execute` raised is counted when the server has released it, which may be
    # after its client already has the error (on either server): let both settle first.
    time.sleep(SETTLE_S)
    samples = scrape(server.metrics_port)
    return outcomes, {f"{n}{sorted(labels.items())}": value(samples, n, **labels)
                      for n, labels in COMPARED}  # fmt: skip


def test_counters_after_the_same_traffic(bridge_server, repository, tmp_path) -> None:
    root = repository(METRICS)  # one copy for both servers
    with TritonOracle(root, *ARGS, log_path=tmp_path / "tritonserver.log") as oracle:
        oracle_outcomes, expected = _observe(oracle)
    outcomes, observed = _observe(bridge_server(root, *ARGS))
    assert [o == "ok" for o in outcomes] == [o == "ok" for o in oracle_outcomes]
    assert observed == expected
    assert expected["nv_inference_request_success[('model', 'counted'), ('version', '1')]"] == 4
