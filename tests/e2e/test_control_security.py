"""The control port (--control-port) under hostile or broken clients, on a real bridge process.

- Nothing escapes: a model name that is not one folder name, a `file:` key or a
  `default_model_filename` leading out of the model folder is refused, and nothing is written
  outside; override folders (`dynamo-bridge-override-*` in the bridge's TMPDIR) are gone after
  a failed load, an unload and malformed keys.
- Nobody unasked loads code: a foreign Origin, a non-loopback Host, a non-JSON body and (with
  `--http-restricted-api`) a request without the key are refused before any model code runs.
- The HTTP layer holds: a stalled client (silent, inside a request head, or inside a body) is
  dropped while others are served, an oversized body is Triton's 400, a chunked body loads, a
  malformed request is a 400 and a fault of ours a 500. The control port is the HTTP wire's
  repository and health routes (bridge/control/port.py); the guards are http/security.py's.
"""

from __future__ import annotations

import base64
import http.client
import json
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.reload_support import MODELS, control, copy_models, loader_call
from tests.e2e.support import WAIT_S, fp32_input, wait_until
from tests.e2e.test_model_control import CONFIG, DOUBLER, POLL_FAILED, api_error
from tests.harness.bridge_server import PROJECT_ROOT
from tests.harness.ports import free_port

TRAVERSAL = "invalid model name '{}', model name must not contain path traversal characters"
OVERRIDE_PREFIX = "dynamo-bridge-override-"
FORM = "application/x-www-form-urlencoded"
# Writes a file named "ran" beside itself when imported: proof that a load ran model code.
PROBE = (
    "import os\nopen(os.path.join(os.path.dirname(__file__), 'ran'), 'w').close()\n"
    + (MODELS / "plain" / "1" / "model.py").read_text()
)


def post(
    port: int,
    path: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
    raw: bytes | None = None,
) -> tuple[int, Any]:
    """One POST with exactly these headers (http.client adds Host and Content-Length)."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else b"")
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=WAIT_S)
    try:
        conn.request("POST", path, body=data, headers=headers or {})
        response = conn.getresponse()
        payload = response.read()
    finally:
        conn.close()
    return response.status, (json.loads(payload) if payload else None)


def load_body(model_py: str = DOUBLER, config: str = CONFIG, **files: str) -> dict[str, Any]:
    encoded = {k: base64.b64encode(v.encode()).decode() for k, v in files.items()}
    if model_py:
        encoded.setdefault("file:1/model.py", base64.b64encode(model_py.encode()).decode())
    return {"parameters": {"config": config, **encoded}}


def overrides(tmp: Path) -> list[Path]:
    return sorted(tmp.glob(f"{OVERRIDE_PREFIX}*"))


def snapshot(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


@pytest.fixture
def setup(bridge_server, tmp_path):
    """(bridge, control port, repo, the bridge's TMPDIR): explicit mode, `plain` and `loader`
    serving, `probe` (marks when its code runs) in the repository but not loaded."""
    repo = copy_models(tmp_path, "plain", "loader")
    shutil.copytree(repo / "plain", repo / "probe")
    (repo / "probe" / "config.pbtxt").write_text(
        (repo / "plain" / "config.pbtxt").read_text().replace('"plain"', '"probe"')
    )
    (repo / "probe" / "1" / "model.py").write_text(PROBE)
    tmp = tmp_path / "bridge-tmp"
    tmp.mkdir()
    port = free_port()
    server = bridge_server(
        repo,
        "--model-control-mode=explicit",
        "--load-model=plain",
        "--load-model=loader",
        f"--control-port={port}",
        env={"TMPDIR": str(tmp)},
    )
    return server, port, repo, tmp


def test_model_names_that_are_not_one_folder_name_are_refused(setup, tmp_path) -> None:
    server, port, repo, tmp = setup
    live = snapshot(repo)
    names = [
        "../escaped_dir",
        str(repo / "plain"),  # absolute: once overwrote the live model's model.py
        "..",
        ".",
        "a\0b",
        "x" * 256,
        " ",
    ]
    client = server.client()
    for name in names:  # through pb_utils.load_model (the same manager.load as the routes)
        answer = loader_call(client, op="load", target=name, config=CONFIG, file_model_py=DOUBLER)
        assert "invalid model name" in answer or "cannot be empty" in answer, (name, answer)
    for name in ("..", ".", "x" * 256):  # over HTTP, as sent (the path is not decoded)
        status, answer = post(port, f"/v2/repository/models/{name}/load", load_body())
        assert status == 400, (name, answer)
        assert "invalid model name" in answer["error"], (name, answer)
    # "\\" is one more character of a POSIX folder name; a Python model's stub refuses it.
    status, answer = post(port, "/v2/repository/models/a\\b/load", load_body())
    assert status == 400, answer
    assert "Invalid stub name: contains invalid characters" in answer["error"], answer
    # The path is taken as sent, as Triton takes it [V]: `..%2Fescaped_dir` is that one folder
    # name, loaded from its files like any other, inside the override folder.
    escaped = "/v2/repository/models/..%2Fescaped_dir"
    assert post(port, f"{escaped}/load", load_body()) == (200, None)
    assert client.is_model_ready("..%2Fescaped_dir")
    assert post(port, f"{escaped}/unload") == (200, None)
    assert loader_call(
        client, op="load", target="../escaped_dir", config=CONFIG, file_model_py=DOUBLER
    ) == api_error("load", TRAVERSAL.format("../escaped_dir"))

    assert not list(tmp_path.rglob("escaped_dir"))
    assert snapshot(repo) == live
    assert overrides(tmp) == []
    assert client.infer("plain", [fp32_input([5.0])]).as_numpy("OUTPUT0").tolist() == [5.0]


def test_override_files_stay_inside_and_are_removed(setup, tmp_path) -> None:
    server, port, repo, tmp = setup
    live = snapshot(repo)
    outside = repo / "plain" / "1" / "model.py"
    bad_keys = [
        {"file:../../escaped.py": "x"},
        {"file:1/../../escaped.py": "x"},
        {"file:": "x"},  # the model folder itself
        {"file:1": "a file where the version folder goes", "file:1/x.py": "x"},
    ]
    for files in bad_keys:
        assert post(port, "/v2/repository/models/esc/load", load_body(**files)) == (
            500,
            {"error": POLL_FAILED.format("esc")},
        ), files
        assert overrides(tmp) == [], files  # malformed keys leave no folder behind
    assert not list(tmp_path.rglob("escaped.py"))
    assert snapshot(repo) == live

    # A key with a leading slash names a file inside the model folder, as Triton joins it
    # (issue 40 bug 3): the repository's own file of that path is untouched.
    answer = post(port, "/v2/repository/models/esc/load", load_body(**{f"file:{outside}": "new"}))
    assert answer == (200, None)
    assert snapshot(repo) == live
    assert post(port, "/v2/repository/models/esc/unload") == (200, None)
    assert overrides(tmp) == []

    # A failed load removes its files.
    status, _ = post(port, "/v2/repository/models/broken/load", load_body("def oops(:\n"))
    assert status == 400
    assert overrides(tmp) == []

    # A loaded override keeps its folder while it serves; unload removes it.
    assert post(port, "/v2/repository/models/doubler/load", load_body()) == (200, None)
    assert len(overrides(tmp)) == 1
    client = server.client()
    assert client.infer("doubler", [fp32_input([2.0])]).as_numpy("OUTPUT0").tolist() == [4.0]
    assert post(port, "/v2/repository/models/doubler/unload") == (200, None)
    assert overrides(tmp) == []


def test_default_model_filename_cannot_leave_the_model_folder(setup, tmp_path) -> None:
    server, port, repo, tmp = setup
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "model.py").write_text(PROBE)
    marker = elsewhere / "ran"
    for filename in (str(elsewhere / "model.py"), "../../../elsewhere/model.py"):
        config = json.loads(CONFIG) | {"default_model_filename": filename}
        # With files (an override folder) and without (the repository's `plain`).
        for name, body in (
            ("evil", load_body(config=json.dumps(config))),
            ("plain", {"parameters": {"config": json.dumps(config)}}),
        ):
            status, answer = post(port, f"/v2/repository/models/{name}/load", body)
            assert status == 400, answer
            assert "invalid default_model_filename" in answer["error"]
            assert not marker.exists()
    assert overrides(tmp) == []
    assert server.client().is_model_ready("plain")


def test_browser_requests_and_non_json_bodies_run_no_code(setup) -> None:
    server, port, repo, tmp = setup
    ran = repo / "probe" / "1" / "ran"
    load = "/v2/repository/models/probe/load"
    refusals = [
        # A page's "simple" cross-origin POST: no preflight, the body labelled text/plain.
        ({"Origin": "https://attacker.example", "Content-Type": "text/plain"}, 403),
        ({"Origin": "https://attacker.example"}, 403),
        ({"Origin": "null"}, 403),
        ({"Origin": f"http://127.0.0.1:{port + 1}"}, 403),  # another local site
        ({"Host": f"attacker.example:{port}"}, 403),  # DNS rebinding
        ({"Content-Type": "text/plain"}, 415),
        ({"Content-Type": "multipart/form-data; boundary=x"}, 415),
        # A browser's form label: refused (curl's and libcurl's same label is served).
        ({"Origin": "https://attacker.example", "Content-Type": FORM}, 403),
        ({"Sec-Fetch-Site": "cross-site", "Content-Type": FORM}, 403),
    ]
    for headers, expected in refusals:
        status, answer = post(port, load, {"parameters": {}}, headers=headers)
        assert status == expected, (headers, answer)
        assert not ran.exists(), headers
    assert not server.client().is_model_ready("probe")
    # The server's own origin, a JSON body, and a body with no Content-Type (tritonclient.http
    # sends none) are served.
    own = {"Origin": f"http://localhost:{port}", "Content-Type": "application/json"}
    assert post(port, load, {"parameters": {}}, headers=own) == (200, None)
    assert ran.exists()
    assert post(port, load, raw=b"{}") == (200, None)
    # libcurl's label (Triton's C++ client, perf_analyzer, curl -d), from no browser.
    assert post(port, load, raw=b"{}", headers={"Content-Type": FORM}) == (200, None)


def test_restricted_api_requires_its_header(bridge_server, tmp_path) -> None:
    repo = copy_models(tmp_path, "plain")
    port = free_port()
    server = bridge_server(
        repo,
        "--model-control-mode=explicit",
        f"--control-port={port}",
        "--http-restricted-api=model-repository:admin-key=s3cret",
    )
    refused = (403, {"error": "This API is restricted, expecting header 'admin-key'"})
    assert post(port, "/v2/repository/index") == refused
    # A path no route takes (routes match the path as sent) is a 404, as on Triton [V].
    assert post(port, "/v2/repository/index?x=1") == refused
    for path in ("/v2/%72epository/index", "//v2/repository/index"):
        assert post(port, path) == (404, {"error": "Not Found"})
    assert post(port, "/v2/repository/models/plain/load") == refused
    assert post(port, "/v2/repository/models/plain/load", headers={"admin-key": "wrong"}) == refused
    assert not server.client().is_model_ready("plain")
    assert post(port, "/v2/repository/models/plain/load", headers={"Admin-Key": "s3cret"}) == (
        200,
        None,
    )
    assert server.client().is_model_ready("plain")


def test_restricted_api_flag_is_checked_at_start(tmp_path) -> None:
    for value, text in (
        ("model-repository", "option format is '<config name>:<setting>=<value>'"),
        ("models:k=v", "unknown restricted api 'models'"),
    ):
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "bridge",
                "--model-repository",
                str(tmp_path),
                f"--http-restricted-api={value}",
            ],
            cwd=PROJECT_ROOT,
            capture_output=True,
            text=True,
            timeout=WAIT_S,
        )
        assert done.returncode == 2 and text in done.stderr, done.stderr


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (bounded by WAIT_S)."""
    sock.settimeout(WAIT_S)
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def test_http_robustness(setup) -> None:
    server, port, repo, tmp = setup
    # A client that sends half a request and stalls, and one that sends nothing: both are
    # dropped, and a whole request is served meanwhile.
    stalled = socket.create_connection(("127.0.0.1", port))
    stalled.sendall(
        b"POST /v2/repository/index HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
        b"\r\nContent-Length: 100\r\n\r\n{"
    )
    silent = socket.create_connection(("127.0.0.1", port))
    half_head = socket.create_connection(("127.0.0.1", port))
    half_head.sendall(b"POST /v2/repository/index HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-")
    assert control(port, "/v2/repository/index")[0] == 200
    started = time.monotonic()
    assert read_until_closed(stalled).startswith(b"HTTP/1.1 408 ")
    assert read_until_closed(silent) == b""
    # A request begun and not finished in time is told so (a connection that sent nothing is
    # not): http/connections.py.
    assert read_until_closed(half_head).startswith(b"HTTP/1.1 408 ")
    assert time.monotonic() - started < WAIT_S  # dropped, not kept forever
    stalled.close()
    silent.close()
    half_head.close()

    # Over the limit: refused from the header, before the body is sent.
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(
            b"POST /v2/repository/models/x/load HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: 268435457\r\n\r\n"
        )
        answer = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 400 ")  # Triton's status and text (http/limits.py)
    assert b"request JSON size of 268435457 bytes exceeds the maximum allowed input size" in answer

    # `Expect: 100-continue` (curl sends it for bodies over 1 KiB): the body is asked for.
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.settimeout(WAIT_S)
        sock.sendall(
            b"POST /v2/repository/index HTTP/1.1\r\nHost: localhost\r\nExpect: 100-continue\r\n"
            b"Content-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n"
        )
        assert sock.recv(65536).startswith(b"HTTP/1.1 100 ")
        sock.sendall(b"{}")
        assert read_until_closed(sock).startswith(b"HTTP/1.1 200 ")

    # A chunked body is read whole.
    body = json.dumps(load_body()).encode()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=WAIT_S)
    conn.request(
        "POST",
        "/v2/repository/models/doubler/load",
        body=iter([body[:100], body[100:]]),
        headers={"Content-Type": "application/json"},
        encode_chunked=True,
    )
    response = conn.getresponse()
    assert (response.status, response.read()) == (200, b"")
    # ... and the connection is kept for the next request.
    conn.request("POST", "/v2/repository/index")
    response = conn.getresponse()
    assert response.status == 200 and {"name": "doubler", "version": "1", "state": "READY"} in (
        json.loads(response.read())
    )
    conn.close()
    assert server.client().infer("doubler", [fp32_input([3.0])]).as_numpy("OUTPUT0").tolist() == [
        6.0
    ]

    # A malformed request is the client's fault (400) ...
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"NOT AN HTTP REQUEST\r\n\r\n")
        assert read_until_closed(sock).startswith(b"HTTP/1.1 400 ")
    # (Triton's answer to `parameters` that are no object is a 500 with RapidJSON's words [V].)
    assert post(port, "/v2/repository/models/x/load", {"parameters": ["not", "a map"]}) == (
        500,
        {"error": "attempt to get members for non-object"},
    )
    # ... a fault of the server (its repository vanished) is a 500, and it serves on.
    repo.rename(repo.with_name("gone"))
    status, answer = post(port, "/v2/repository/index")
    assert status == 500 and "does not exist" in answer["error"], answer
    repo.with_name("gone").rename(repo)
    wait_until(lambda: post(port, "/v2/repository/index")[0] == 200, "index answered again")


def test_max_input_size_holds_beside_dynamos_frontend(bridge_server, tmp_path) -> None:
    # `--http-max-input-size` is the control port's limit whatever the front door: Dynamo's
    # frontend has no HTTP wire of ours to carry it.
    repo = copy_models(tmp_path, "plain")
    port = free_port()
    bridge_server(
        repo,
        "--frontend=dynamo",
        "--model-control-mode=explicit",
        f"--control-port={port}",
        "--http-max-input-size=1024",
    )
    # Over the limit: refused from the header, before the body is sent.
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(
            b"POST /v2/repository/models/x/load HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: 2048\r\n\r\n"
        )
        answer = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 400 ")  # Triton's status and text (http/limits.py)
    assert (
        b"request JSON size of 2048 bytes exceeds the maximum allowed input size of 1024 bytes. "
        b"Use --http-max-input-size to increase the limit."
    ) in answer
    # Under the limit, the same port serves.
    assert post(port, "/v2/repository/index")[0] == 200
