"""The shipped example client works against the bridge serving the example repository."""

from __future__ import annotations

import subprocess
import sys

from tests.harness.bridge_server import PROJECT_ROOT

EXAMPLES = PROJECT_ROOT / "examples"


def test_example_client_runs(bridge_server) -> None:
    server = bridge_server(EXAMPLES / "model_repository")
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "client.py"), "--url", server.grpc_url],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    # A few values the example models must produce (arithmetic on the client's inputs).
    assert "[[5.0, 5.0, 5.0, 5.0], [11.0, 21.0, 31.0, 41.0]]" in out  # add_sub sum
    assert "['HELLO', 'WÖRLD']" in out  # text_case
    assert "strict_divide QUOTIENT: [[3.0, 3.0]]" in out
    assert "strict_divide error:" in out  # division by zero is that request's error
    assert "auto_shape   Y: [[1.0, 4.0, 9.0]]" in out
