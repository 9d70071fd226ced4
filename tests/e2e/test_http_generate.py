"""The triton door's generate and generate_stream on a real bridge: a client that goes away
(mid-stream, or while waiting for a generate answer) stops its request, as Triton cancels it;
the other requests are untouched.

What the routes answer is compared with the real Triton in
tests/differential/test_diff_http_generate.py; this is what the oracle cannot show.
"""

from __future__ import annotations

import json

import httpx
import pytest

from tests.e2e.support import REPOSITORIES
from tests.e2e.test_streaming import read_report

STREAMING = REPOSITORIES / "streaming"
GENERATE = REPOSITORIES / "http_generate"


def test_client_gone_mid_stream_cancels_the_request(shared_bridge_server, tmp_path) -> None:
    bridge = shared_bridge_server(STREAMING, "--frontend=triton")
    report = tmp_path / "report.json"
    url = f"http://{bridge.http_url}/v2/models/cancellable/generate_stream"
    body = {"IN": 0, "parameters": {"report": str(report)}}
    with httpx.Client(timeout=30) as client:
        with client.stream("POST", url, json=body) as response:
            assert response.status_code == 200
            events = []
            for line in response.iter_lines():
                if line.startswith("data: "):
                    events.append(json.loads(line[6:]))
                if len(events) == 3:
                    break
        # Leaving the block without reading the rest closes the connection.
    assert [e["OUT"] for e in events] == [0, 1, 2]
    seen = read_report(report)
    assert seen["request_cancelled"]
    assert 3 <= seen["steps"] < 1000  # the model did not run to its end

    # The door goes on serving.
    again = httpx.post(
        url, json={"IN": 0, "parameters": {"steps": 2, "interval_ms": 1}}, timeout=30
    )
    assert again.status_code == 200
    events = [json.loads(e[6:]) for e in again.text.split("\n\n") if e.strip()]
    assert [e["OUT"] for e in events] == [0, 1, -1]


def test_client_gone_while_generate_waits_cancels_the_request(shared_bridge_server, tmp_path):
    bridge = shared_bridge_server(GENERATE, "--frontend=triton")
    report = tmp_path / "report.json"
    url = f"http://{bridge.http_url}/v2/models/sleepy/generate"
    body = {"N": 60, "parameters": {"report": str(report)}}
    with pytest.raises(httpx.ReadTimeout):  # the client gives up and closes its connection
        httpx.post(url, json=body, timeout=httpx.Timeout(30, read=1.0))
    assert read_report(report) == {"cancelled": True}  # long before its 60 s
    answer = httpx.post(url, json={"N": 0}, timeout=30)
    assert (answer.status_code, answer.json()["V"]) == (200, 0)
