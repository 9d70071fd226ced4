"""The triton door's generate_stream (Server-Sent Events) on a real bridge: a client that goes
away mid-stream stops its request, as Triton cancels it; the other requests are untouched.

What the routes answer is compared with the real Triton in
tests/differential/test_diff_http_generate.py; this is what the oracle cannot show.
"""

from __future__ import annotations

import json

import httpx

from tests.e2e.support import REPOSITORIES
from tests.e2e.test_streaming import read_report

STREAMING = REPOSITORIES / "streaming"


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
