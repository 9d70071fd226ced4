"""The triton door's HTTP request rules on a real bridge, over real HTTP (http/security.py,
limits.py, error_status.py; issue 22 findings 1, 6 and 10).

- Every state-changing route (load, unload, shared memory, logging, trace settings, infer,
  generate, generate_stream) refuses what a web page can send without a preflight (a foreign
  Origin, a cross-site Sec-Fetch-Site, a text/plain or multipart body), and changes nothing;
  the real clients are served: tritonclient.http (no Content-Type), tritonclient.http.aio
  (application/octet-stream), curl -d (libcurl's form label, as Triton's C++ client and
  perf_analyzer send), JSON with its label.
- DNS rebinding: a Host the door was not told it has is refused, and an Origin equal to such
  a Host is no pass; `--http-allowed-hosts` names admit their own origin.
- Triton's limits (`--http-max-input-size`, JSON nesting 100) with its texts; a decompression
  bomb is refused under a memory limit and the server serves on.
- A lone surrogate in an input name or id is Triton's parse failure (400 on infer, as every
  unparsable infer body here), a byte that is not UTF-8 comes back as itself: never a 500 with
  a traceback in the log.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import resource
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
import tritonclient.http.aio as aiohttpclient
import tritonclient.utils.shared_memory as shm

from tests.e2e.support import SERVING, WAIT_S
from tests.harness import BridgeServer

DOOR = ("--frontend", "triton", "--model-control-mode=explicit", "--load-model=echo")
RAISE_IT = "Use --http-max-input-size to increase the limit."
ECHO_JSON = {"inputs": [{"name": "INPUT0", "shape": [2], "datatype": "FP32", "data": [1, 2]}]}
JSON = "application/json"
SIMPLE_TYPES = (
    "text/plain",
    "application/x-www-form-urlencoded",
    "multipart/form-data; boundary=x",
)


@pytest.fixture(scope="module")
def door(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BridgeServer]:
    log = tmp_path_factory.mktemp("guard") / "bridge.log"
    server = BridgeServer(
        SERVING, *DOOR, "--http-allowed-hosts=infer.example", "--allow-client-shm", log_path=log
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()


def post(server: BridgeServer, path: str, body: bytes, headers: dict[str, str]) -> httpx.Response:
    return httpx.post(
        f"http://{server.http_url}{path}", content=body, headers=headers, timeout=WAIT_S
    )


def routes(region_key: str) -> list[tuple[str, Any]]:
    """Every state-changing route with a body that would change something."""
    return [
        ("/v2/repository/models/pool/load", {}),
        ("/v2/repository/models/echo/unload", {}),
        ("/v2/repository/index", {}),
        (
            "/v2/systemsharedmemory/region/guarded/register",
            {"key": region_key, "offset": 0, "byte_size": 8},
        ),
        ("/v2/systemsharedmemory/region/guarded/unregister", {}),
        ("/v2/cudasharedmemory/region/guarded/unregister", {}),
        ("/v2/logging", {"log_info": False}),
        ("/v2/trace/setting", {"trace_rate": "7"}),
        ("/v2/models/echo/trace/setting", {"trace_rate": "7"}),
        ("/v2/models/echo/infer", ECHO_JSON),
        ("/v2/models/echo/generate", {"INPUT0": [1.0]}),
        ("/v2/models/echo/generate_stream", {"INPUT0": [1.0]}),
    ]


def test_web_pages_cannot_post_to_any_state_changing_route(door) -> None:
    region = shm.create_shared_memory_region("guarded", "/dynamo_bridge_guard_test", 8)
    try:
        port = door.http_port
        before = httpx.get(f"http://{door.http_url}/v2/logging", timeout=WAIT_S).json()
        page = "https://attacker.example"
        for path, document in routes("/dynamo_bridge_guard_test"):
            body = json.dumps(document).encode()
            refusals: list[tuple[dict[str, str], int]] = [
                *(({"Origin": page, "Content-Type": kind}, 403) for kind in SIMPLE_TYPES),
                ({"Origin": page, "Content-Type": "application/json"}, 403),
                ({"Origin": "null"}, 403),
                ({"Origin": f"http://localhost:{port + 1}"}, 403),  # another local site
                ({"Sec-Fetch-Site": "cross-site", "Content-Type": SIMPLE_TYPES[1]}, 403),
                ({"Content-Type": "text/plain"}, 415),
                ({"Content-Type": SIMPLE_TYPES[2]}, 415),
                # A rebinding page: Origin == Host, the Host not one of the door's.
                ({"Host": f"evil.example:{port}", "Origin": f"http://evil.example:{port}"}, 403),
                # An https page on the door's own port, claiming the scheme by a header that
                # a proxy would set: the scheme is the connection's.
                ({"Origin": f"https://127.0.0.1:{port}", "X-Forwarded-Proto": "https"}, 403),
            ]  # fmt: skip
            for headers, status in refusals:
                answer = post(door, path, body, headers)
                assert answer.status_code == status, (path, headers, answer.text)
                assert answer.headers["content-type"] == "application/json"
                assert answer.json()["error"], (path, headers)
        # Nothing changed.
        client = httpclient.InferenceServerClient(door.http_url)
        assert not client.is_model_ready("pool") and client.is_model_ready("echo")
        assert client.get_system_shared_memory_status() == []
        assert httpx.get(f"http://{door.http_url}/v2/logging", timeout=WAIT_S).json() == before
        assert client.get_trace_settings()["trace_rate"] != "7"
    finally:
        shm.destroy_shared_memory_region(region)


def echo_input(binary: bool) -> list[httpclient.InferInput]:
    given = httpclient.InferInput("INPUT0", [2], "FP32")
    given.set_data_from_numpy(np.array([1.5, 2.5], dtype=np.float32), binary_data=binary)
    return [given]


def test_the_real_clients_are_served(door) -> None:
    region = shm.create_shared_memory_region("served", "/dynamo_bridge_guard_served", 8)
    client = httpclient.InferenceServerClient(door.http_url)
    try:
        # tritonclient.http: no Content-Type at all.
        for binary in (False, True):
            result = client.infer("echo", echo_input(binary))
            assert result.as_numpy("OUTPUT0").tolist() == [1.5, 2.5]
        result = client.infer("echo", echo_input(False), request_compression_algorithm="gzip")
        assert result.as_numpy("OUTPUT0").tolist() == [1.5, 2.5]
        client.register_system_shared_memory("served", "/dynamo_bridge_guard_served", 8)
        client.unregister_system_shared_memory("served")
        client.update_log_settings({"log_info": True})
        client.update_trace_settings(settings={"trace_rate": "1000"})
        client.load_model("pool")
        client.unload_model("pool")
        # tritonclient.http.aio labels every body application/octet-stream.
        asyncio.run(aio_client_calls(door.http_url))
        # The door's own origin, on a name it was told it has.
        name = f"infer.example:{door.http_port}"
        own = {"Host": name, "Origin": f"http://{name}"}
        answer = post(door, "/v2/models/echo/infer", json.dumps(ECHO_JSON).encode(), own)
        assert answer.status_code == 200, answer.text
        local = {"Origin": f"http://127.0.0.1:{door.http_port}", "Content-Type": "application/json"}
        answer = post(door, "/v2/models/echo/generate", b'{"INPUT0":[3.0]}', local)
        assert answer.status_code == 200 and answer.json()["OUTPUT0"] == 3.0, answer.text
        # curl -d (libcurl labels the body form-urlencoded, as Triton's C++ client does), as
        # Triton's docs show for the logging and trace settings; and curl -H json for infer.
        url = f"http://{door.http_url}"
        for path, body, extra in (
            ("/v2/logging", '{"log_verbose_level":0}', []),
            ("/v2/trace/setting", '{"trace_rate":"1000"}', []),
            ("/v2/models/echo/infer", json.dumps(ECHO_JSON), ["-H", "Content-Type: " + JSON]),
        ):  # fmt: skip
            done = subprocess.run(
                ["curl", "-s", "-w", "\n%{http_code}", "-d", body, *extra, url + path],
                capture_output=True, text=True, timeout=WAIT_S, check=True,
            )  # fmt: skip
            assert done.stdout.rsplit("\n", 1)[1] == "200", (path, done.stdout)
        # Reading is not guarded by Origin.
        read = httpx.get(
            f"{url}/v2/models/echo/config", headers={"Origin": "https://x.example"}, timeout=WAIT_S
        )
        assert read.status_code == 200
    finally:
        client.close()
        shm.destroy_shared_memory_region(region)


async def aio_client_calls(url: str) -> None:
    client = aiohttpclient.InferenceServerClient(url)
    try:
        given = aiohttpclient.InferInput("INPUT0", [2], "FP32")
        given.set_data_from_numpy(np.array([4.0, 5.0], dtype=np.float32))
        result = await client.infer("echo", [given])
        assert result.as_numpy("OUTPUT0").tolist() == [4.0, 5.0]
        await client.update_log_settings({"log_info": True})
        await client.load_model("pool")
        await client.unload_model("pool")
    finally:
        await client.close()


def test_dns_rebinding_hosts_are_refused(door) -> None:
    url = f"http://127.0.0.1:{door.http_port}"
    for path in ("/v2/health/live", "/v2/models/echo/config"):
        answer = httpx.get(url + path, headers={"Host": "attacker.example"}, timeout=WAIT_S)
        assert answer.status_code == 403, answer.text
        assert answer.json() == {"error": "refused: Host 'attacker.example' is not an allowed host"}
        for host in ("localhost", f"127.0.0.1:{door.http_port}", "infer.example:80"):
            assert httpx.get(url + path, headers={"Host": host}, timeout=WAIT_S).status_code == 200


def triton_error(answer: httpx.Response) -> tuple[int, str]:
    return answer.status_code, answer.json()["error"]


def test_limits_with_tritons_texts(door) -> None:
    url = f"http://{door.http_url}"
    limit = 1 << 26
    # A body over the limit, refused from its Content-Length before it is sent.
    status, error = raw_post(
        door.http_port,
        b"POST /v2/models/echo/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Length: %d\r\n\r\n" % (limit + 1),
    )
    assert (status, error) == (
        400,
        f"request JSON size of {limit + 1} bytes exceeds the maximum allowed input size of "
        f"{limit} bytes. {RAISE_IT}",
    )
    # Nested past 100.
    deep = b'{"inputs":[{"name":"INPUT0","shape":[1],"datatype":"FP32","data":' + b"[" * 100
    deep += b"1" + b"]" * 100 + b"}]}"
    nesting = "JSON nesting depth exceeds maximum allowed limit (100)"
    assert triton_error(httpx.post(f"{url}/v2/models/echo/infer", content=deep)) == (400, nesting)
    too_deep = b'{"log_info":' + b"[" * 150 + b"]" * 150 + b"}"
    assert triton_error(httpx.post(f"{url}/v2/logging", content=too_deep)) == (400, nesting)
    # A JSON input whose bytes (from its shape) pass the limit.
    shape = [limit // 4 + 1]
    big = {"inputs": [{"name": "INPUT0", "shape": shape, "datatype": "FP32", "data": [0]}]}
    assert triton_error(httpx.post(f"{url}/v2/models/echo/infer", json=big, timeout=WAIT_S)) == (
        400,
        f"JSON input 'INPUT0' has a byte_size ({limit + 4} bytes) that exceeds the maximum "
        f"allowed value of {limit} bytes. {RAISE_IT}",
    )


def raw_post(port: int, request: bytes) -> tuple[int, str]:
    """(status, Triton's error text) of a request sent as these bytes; the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) as sock:
        sock.sendall(request)
        answer = b""
        while data := sock.recv(65536):
            answer += data
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)["error"]


def test_chunked_body_over_a_raised_limit(bridge_server) -> None:
    server = bridge_server(SERVING, *DOOR, "--http-max-input-size=100000")
    chunk = b" " * 60_000
    status, error = raw_post(
        server.http_port,
        b"POST /v2/models/echo/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
        + (b"%x\r\n" % len(chunk) + chunk + b"\r\n") * 2
        + b"0\r\n\r\n",
    )
    assert (status, error) == (
        400,
        "request JSON size of more than 100000 bytes exceeds the maximum allowed input size of "
        f"100000 bytes. {RAISE_IT}",
    )
    # Under the raised limit, served.
    url = f"http://{server.http_url}/v2/models/echo/infer"
    assert httpx.post(url, json=ECHO_JSON, timeout=WAIT_S).status_code == 200


def address_space(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmSize")


def test_a_decompression_bomb_is_refused_and_the_server_serves_on(door) -> None:
    assert door.process is not None
    pid = door.process.pid
    # Room for ordinary work, not for the 1 GB this body inflates to: a regression fails with
    # MemoryError instead of filling the machine.
    cap = address_space(pid) + (768 << 20)
    old = resource.prlimit(pid, resource.RLIMIT_AS, (cap, resource.RLIM_INFINITY))
    try:
        bomb = gzip.compress(b"\0" * (1 << 30), 9)
        assert len(bomb) < 2 << 20
        answer = httpx.post(
            f"http://{door.http_url}/v2/models/echo/infer",
            content=bomb,
            headers={"Content-Encoding": "gzip"},
            timeout=WAIT_S,
        )
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"] == (
            f"Decompressed data size exceeds the maximum allowed value of {1 << 26} bytes. "
            f"{RAISE_IT}"
        )
        client = httpclient.InferenceServerClient(door.http_url)
        assert client.infer("echo", echo_input(True)).as_numpy("OUTPUT0").tolist() == [1.5, 2.5]
        client.close()
        assert door.client().is_server_live()  # gRPC too
    finally:
        resource.prlimit(pid, resource.RLIMIT_AS, old)


def test_lone_surrogates_and_stray_bytes_never_raise(door) -> None:
    url = f"http://{door.http_url}/v2/models/echo"
    surrogate = "failed to parse the request JSON buffer: The surrogate pair in string is invalid."
    named = b'{"inputs":[{"name":"\\ud800","shape":[1],"datatype":"FP32","data":[1]}]}'
    for _ in range(3):  # Triton's text [V]; 400 as every unparsable infer body here
        answer = httpx.post(f"{url}/infer", content=named, timeout=WAIT_S)
        assert triton_error(answer) == (400, f"{surrogate} at 20")
    with_id = b'{"id":"\\ud800x","inputs":[{"name":"INPUT0","shape":[1],"datatype":"FP32",'
    with_id += b'"data":[1]}]}'
    assert triton_error(httpx.post(f"{url}/infer", content=with_id)) == (400, f"{surrogate} at 7")
    generate = httpx.post(f"{url}/generate", content=b'{"id":"\\udfff","INPUT0":[1.0]}')
    assert triton_error(generate) == (500, f"{surrogate} at 7")  # Triton's parse failure [V]
    logging = httpx.post(f"http://{door.http_url}/v2/logging", content=b'{"log_info":"\\ud800"}')
    assert triton_error(logging) == (500, f"{surrogate} at 13")
    # A name that is not UTF-8 comes back as its bytes, in the client's 400.
    stray = b'{"inputs":[{"name":"IN\xff","shape":[1],"datatype":"FP32","data":[1]}]}'
    answer = httpx.post(f"{url}/infer", content=stray, timeout=WAIT_S)
    assert answer.status_code == 400 and b"'IN\xff'" in answer.content, answer.content
    # A valid pair is a character like any other.
    paired = b'{"id":"\\ud83d\\ude00","inputs":[{"name":"INPUT0","shape":[1],"datatype":"FP32",'
    paired += b'"data":[1]}]}'
    answer = httpx.post(f"{url}/infer", content=paired, timeout=WAIT_S)
    assert answer.status_code == 200 and answer.json()["id"] == "\U0001f600", answer.text
    assert "Traceback" not in door.log_text
    assert "UnicodeEncodeError" not in door.log_text
