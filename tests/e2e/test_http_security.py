"""The triton door's HTTP port at the door: TLS and mutual TLS (certificates made here with
`openssl`, as tests/e2e/test_triton_door.py does for gRPC), TLS files checked at start-up, and
model loading guarded against web pages on the main port as on the control port.

The restricted API groups are compared with Triton in tests/differential/test_diff_http_security.py;
the control port's guards are tests/e2e/test_control_security.py's.
"""

from __future__ import annotations

import ssl
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.e2e.reload_support import copy_models
from tests.e2e.support import SERVING
from tests.e2e.test_triton_door import certs  # noqa: F401 (the fixture)
from tests.harness import BridgeServer

DOOR = ("--frontend", "triton")


def tls_args(paths: dict[str, Path], *more: str) -> list[str]:
    return [*DOOR, "--http-use-ssl", f"--http-server-cert={paths['server_cert']}",
            f"--http-server-key={paths['server_key']}", *more]  # fmt: skip


def https(server: BridgeServer, paths: dict[str, Path], who: str | None) -> httpx.Client:
    context = ssl.create_default_context(cafile=str(paths["ca"]))
    if who is not None:
        context.load_cert_chain(str(paths[f"{who}_cert"]), str(paths[f"{who}_key"]))
    return httpx.Client(base_url=f"https://{server.http_url}", verify=context, timeout=30)


def test_http_over_tls(certs, bridge_server) -> None:  # noqa: F811
    server = bridge_server(SERVING, *tls_args(certs))
    with https(server, certs, None) as client:
        assert client.get("/v2/health/ready").status_code == 200
        answer = client.post(
            "/v2/models/echo/infer",
            json={"inputs": [{"name": "INPUT0", "shape": [2], "datatype": "FP32", "data": [1, 2]}]},
        )
        assert answer.status_code == 200 and answer.json()["outputs"][0]["data"] == [1.0, 2.0]
    # tritonclient.http over TLS.
    client = httpclient.InferenceServerClient(
        server.http_url,
        ssl=True,
        ssl_context_factory=lambda: ssl.create_default_context(cafile=str(certs["ca"])),
    )
    given = httpclient.InferInput("INPUT0", [2], "FP32")
    given.set_data_from_numpy(np.array([3.0, 4.0], dtype=np.float32))
    assert client.infer("echo", [given]).as_numpy("OUTPUT0").tolist() == [3.0, 4.0]
    client.close()
    # Plain HTTP on a TLS port gets no answer.
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://{server.http_url}/v2/health/ready", timeout=10)


def test_http_mutual_tls(certs, bridge_server) -> None:  # noqa: F811
    server = bridge_server(
        SERVING, *tls_args(certs, "--http-use-ssl-mutual", f"--http-root-cert={certs['ca']}")
    )
    with https(server, certs, "client") as client:
        assert client.get("/v2/health/live").status_code == 200
    for who in (None, "stranger"):  # no client certificate; one from another CA
        with https(server, certs, who) as client, pytest.raises(httpx.HTTPError):
            client.get("/v2/health/live")


def test_unreadable_http_certificate_fails_start_up(tmp_path) -> None:
    server = BridgeServer(
        SERVING,
        *DOOR,
        "--http-use-ssl",
        f"--http-server-cert={tmp_path / 'missing.crt'}",
        f"--http-server-key={tmp_path / 'missing.key'}",
        log_path=tmp_path / "bridge.log",
    )
    with pytest.raises(RuntimeError, match="exited with code 1"):
        server.start()
    assert "--http-server-cert: cannot read" in server.log_text


def test_loads_from_web_pages_are_refused_on_the_http_port(bridge_server, tmp_path) -> None:
    repo = copy_models(tmp_path, "plain")
    server = bridge_server(repo, *DOOR, "--model-control-mode=explicit")
    url = f"http://{server.http_url}/v2/repository/models/plain/load"
    for headers, status in (
        ({"Origin": "https://attacker.example", "Content-Type": "text/plain"}, 403),
        ({"Origin": "null"}, 403),
        ({"Host": "attacker.example"}, 403),  # DNS rebinding, on a loopback door
        ({"Content-Type": "text/plain"}, 415),
        (
            {"Sec-Fetch-Site": "cross-site", "Content-Type": "application/x-www-form-urlencoded"},
            403,
        ),
    ):
        answer = httpx.post(url, content=b"{}", headers=headers, timeout=30)
        assert answer.status_code == status, (headers, answer.text)
    assert not server.client().is_model_ready("plain")
    # Reading is not guarded; the door's own origin loads.
    own = {"Origin": f"http://localhost:{server.http_port}"}
    assert httpx.post(url, content=b"{}", headers=own, timeout=60).status_code == 200
    assert server.client().is_model_ready("plain")
