"""Triton's shared memory extensions over HTTP on the triton door, against the real Triton:
system regions (register, status, unregister, and infer through them with tritonclient.http),
CUDA regions as Triton answers on a host without GPUs, and regions shared by the two wires.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from tests.differential.support import REPOSITORIES
from tests.harness import BridgeServer, TritonOracle

pytestmark = pytest.mark.oracle

REPO = REPOSITORIES / "http_generate"
JSON_PARSER_WORDS = "failed to parse the request JSON buffer: "
HANDLE = base64.b64encode(bytes(64)).decode()  # a cudaIpcMemHandle_t's size


def cases(key: str) -> list[tuple[str, str, str]]:
    """(method, path, body), sent in this order; `key` names a 64-byte object in /dev/shm."""
    sys = "/v2/systemsharedmemory"
    cuda = "/v2/cudasharedmemory"
    region = {"key": key, "offset": 0, "byte_size": 64}
    return [
        ("GET", f"{sys}/status", ""),
        ("POST", f"{sys}/status", ""),
        ("POST", f"{sys}/region/r1/register", json.dumps(region)),
        ("POST", f"{sys}/region/r1/register", json.dumps(region)),
        ("POST", f"{sys}/region/r2/register", json.dumps(region | {"key": "/no_such_key"})),
        ("POST", f"{sys}/region/r3/register", json.dumps({"key": key, "byte_size": 64})),
        ("POST", f"{sys}/region/r3/register", json.dumps(region | {"offset": "0"})),
        ("POST", f"{sys}/region/r3/register", json.dumps(region | {"offset": -1})),
        ("POST", f"{sys}/region/r3/register", json.dumps(region | {"offset": 32})),
        ("POST", f"{sys}/region/r3/register", json.dumps(region | {"offset": 16, "byte_size": 8})),
        ("POST", f"{sys}/region/r3/register", json.dumps({"offset": 0, "byte_size": 64})),
        ("POST", f"{sys}/region/r3/register", json.dumps({"key": key, "offset": 0})),
        ("POST", f"{sys}/region/r3/register", json.dumps(region | {"key": 5})),
        ("POST", f"{sys}/region/r3/register", "[1]"),
        ("POST", f"{sys}/region/r3/register", "{bad"),
        ("POST", f"{sys}/region/r3/register", ""),
        ("POST", f"{sys}/region/r4/register", json.dumps(region | {"key": key.lstrip("/")})),
        ("POST", f"{sys}/unregister", ""),
        # Each check of a region on an object no other region uses.
        ("POST", f"{sys}/region/r5/register", json.dumps({"key": key, "byte_size": 64})),
        ("POST", f"{sys}/region/r5/unregister", ""),
        ("POST", f"{sys}/region/r6/register", json.dumps(region | {"offset": 16, "byte_size": 8})),
        ("POST", f"{sys}/region/r6/register", json.dumps(region | {"byte_size": 65})),
        (
            "POST",
            f"{sys}/region/r6/register",
            json.dumps(region | {"offset": 4096, "byte_size": 8}),
        ),
        ("POST", f"{sys}/region/r1/register", json.dumps(region)),
        ("GET", f"{sys}/status", ""),
        ("GET", f"{sys}/region/r1/status", ""),
        ("GET", f"{sys}/region/zz/status", ""),
        ("POST", f"{sys}/region/zz/unregister", ""),
        ("POST", f"{sys}/region/r1/unregister", "{bad"),
        ("GET", f"{sys}/status", ""),
        ("POST", f"{sys}/unregister", ""),
        ("GET", f"{sys}/status", ""),
        ("GET", f"{sys}/region/r1/unregister", ""),
        ("GET", f"{cuda}/status", ""),
        ("GET", f"{cuda}/region/c1/status", ""),
        (
            "POST",
            f"{cuda}/region/c1/register",
            '{"raw_handle":{"b64":"AAAA"},"device_id":0,"byte_size":64}',
        ),
        (
            "POST",
            f"{cuda}/region/c1/register",
            json.dumps({"raw_handle": {"b64": HANDLE}, "device_id": 0, "byte_size": 64}),
        ),
        (
            "POST",
            f"{cuda}/region/c1/register",
            json.dumps({"raw_handle": {"b64": HANDLE}, "byte_size": 64}),
        ),
        ("POST", f"{cuda}/region/c1/register", '{"device_id":0,"byte_size":64}'),
        ("POST", f"{cuda}/region/c1/register", '{"raw_handle":5,"device_id":0,"byte_size":64}'),
        ("POST", f"{cuda}/region/c1/register", "{bad"),
        ("POST", f"{cuda}/region/c1/unregister", ""),
        ("POST", f"{cuda}/unregister", ""),
        ("GET", f"{cuda}/region/c1/register", ""),
    ]


@pytest.fixture(scope="module")
def servers(oracle_server, shared_bridge_server) -> tuple[TritonOracle, BridgeServer]:
    # Triton 2.51 takes clients' regions by default; the bridge, as 2.70 on, when told.
    bridge = shared_bridge_server(REPO, "--frontend=triton", "--allow-client-shm")
    return oracle_server(REPO), bridge


@pytest.fixture
def key() -> Iterator[str]:
    key = f"/bridge_http_shm_{os.getpid()}"
    handle = shm.create_shared_memory_region("probe", key, 64)
    yield key
    shm.destroy_shared_memory_region(handle)


def answer(url: str, method: str, path: str, body: str) -> tuple[int, str, Any]:
    response = httpx.request(method, f"http://{url}{path}", content=body.encode(), timeout=60)
    try:
        parsed: Any = json.loads(response.text) if response.text else None
    except ValueError:
        parsed = response.text
    if isinstance(parsed, dict) and str(parsed.get("error", "")).startswith(JSON_PARSER_WORDS):
        parsed = {"error": JSON_PARSER_WORDS + "<the parser's words>"}  # RapidJSON's vs Python's
    return response.status_code, response.headers.get("content-type", ""), parsed


def test_shared_memory_routes_match_triton(servers, key) -> None:
    oracle, bridge = servers
    for method, path, body in cases(key):
        triton = answer(oracle.http_url, method, path, body)
        assert answer(bridge.http_url, method, path, body) == triton, (method, path, body)


def test_infer_through_system_shared_memory_matches_triton(servers) -> None:
    values = np.array([1.5, -2.0, 0.25], dtype=np.float16)
    size = values.nbytes
    results = []
    for server in servers:
        tag = f"{os.getpid()}_{server.http_port}"
        inputs = shm.create_shared_memory_region("in", f"/bridge_in_{tag}", size)
        outputs = shm.create_shared_memory_region("out", f"/bridge_out_{tag}", size)
        try:
            shm.set_shared_memory_region(inputs, [values])
            client = httpclient.InferenceServerClient(server.http_url)
            client.register_system_shared_memory("in", f"/bridge_in_{tag}", size)
            client.register_system_shared_memory("out", f"/bridge_out_{tag}", size)
            given = httpclient.InferInput("H", [3], "FP16")
            given.set_shared_memory("in", size)
            wanted = httpclient.InferRequestedOutput("O")
            wanted.set_shared_memory("out", size)
            result = client.infer("halves", [given], outputs=[wanted])
            out = result.get_output("O")
            got = shm.get_contents_as_numpy(outputs, np.float16, [3])
            results.append((out, got.tolist(), client.get_system_shared_memory_status()))
            client.unregister_system_shared_memory()
        finally:
            shm.destroy_shared_memory_region(inputs)
            shm.destroy_shared_memory_region(outputs)
    (triton_out, triton_values, triton_status), (out, got, status) = results
    assert got == triton_values == values.tolist()
    assert out == triton_out  # the output names its region, no data
    assert [r["name"] for r in status] == [r["name"] for r in triton_status] == ["in", "out"]


def test_regions_are_shared_by_both_wires(servers, key) -> None:
    bridge = servers[1]
    http = httpclient.InferenceServerClient(bridge.http_url)
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{bridge.grpc_port}")
    http.register_system_shared_memory("both", key, 64)
    assert list(grpc.get_system_shared_memory_status(as_json=True)["regions"]) == ["both"]
    grpc.unregister_system_shared_memory("both")
    assert http.get_system_shared_memory_status() == []


# -- keys that are no shm_open name (issue 22, finding 1) -------------------------------------

# Where the door answers a key differently from the oracle on purpose (see bridge/frontends/
# triton/shm.py), by name: why. `bridge_answer_by_difference` says what the door answers.
KEY_DIFFERENCES: dict[str, str] = {
    "slashes_only": "a key of slashes alone (or empty): Triton ≥ 2.61's ValidateSharedMemoryKey "
    "answers INVALID_ARG 'invalid shm key'; the oracle predates it (its shm_open fails: INTERNAL)",
    "reserved_prefix": "Triton ≥ 2.61 refuses its python backend's reserved prefix; the oracle "
    "predates that and maps the object",
    "nul_in_key": "a NUL in the key: Triton opens the name up to the NUL (C strings); the door "
    "refuses the key",
}


def key_cases(made: list[str], tmp: str) -> list[tuple[str, str | None]]:
    """(key, the KEY_DIFFERENCES entry that applies or None); objects and links made in
    /dev/shm are appended to `made`."""
    tag = f"{os.getpid()}_{len(made)}"
    good, link, folder = (
        f"bridge_diff_key_{tag}",
        f"bridge_diff_link_{tag}",
        f"bridge_diff_dir_{tag}",
    )
    reserved = f"triton_python_backend_shm_region_bridge_{tag}"
    secret = os.path.join(tmp, "secret")
    with open(secret, "wb") as out:
        out.write(b"S" * 64)
    for name in (good, reserved):
        with open(f"/dev/shm/{name}", "wb") as out:
            out.write(bytes(64))
    os.symlink(secret, f"/dev/shm/{link}")
    os.mkdir(f"/dev/shm/{folder}")
    with open(f"/dev/shm/{folder}/object", "wb") as out:
        out.write(bytes(64))
    made += [f"/dev/shm/{name}" for name in (good, reserved, link, f"{folder}/object", folder)]
    outside = os.path.relpath(secret, "/dev/shm")
    return [
        (outside, None),
        ("/" + outside, None),
        (f"/{folder}/object", None),
        (f"{good}/", None),
        (f"/{folder}", None),
        (f"/{link}", None),
        ("..", None),
        ("/.", None),
        ("/" + "a" * 256, None),
        (f"//{good}", None),
        (good, None),
        ("", "slashes_only"),
        ("/", "slashes_only"),
        ("///", "slashes_only"),
        (f"/{reserved}", "reserved_prefix"),
        (reserved, "reserved_prefix"),
        (f"/{good}\0x", "nul_in_key"),
    ]


def grpc_register(client: grpcclient.InferenceServerClient, key: str, size: int) -> tuple[str, str]:
    try:
        client.register_system_shared_memory("k", key, size)
    except InferenceServerException as exc:
        return (str(exc.status()), str(exc.message()))
    return ("OK", "")


def bridge_answer_by_difference(
    difference: str, key: str
) -> tuple[tuple[str, str], tuple[int, str, Any]]:
    """The door's (gRPC, HTTP) answer where KEY_DIFFERENCES[difference] applies."""
    if difference == "slashes_only":
        text = f"cannot register shared memory region 'k' - invalid shm key '{key}'"
        return ("StatusCode.INVALID_ARGUMENT", text), (400, "application/json", {"error": text})
    if difference == "reserved_prefix":
        text = (
            f"cannot register shared memory region 'k' with key '{key}' as the key contains "
            "the reserved prefix 'triton_python_backend_shm_region_'"
        )
        return ("StatusCode.INVALID_ARGUMENT", text), (400, "application/json", {"error": text})
    assert difference == "nul_in_key"
    text = f"Unable to open shared memory region: '{key}'"
    return ("StatusCode.INTERNAL", text), (500, "application/json", {"error": text})


def test_keys_that_are_no_shm_open_name_match_triton(servers, tmp_path) -> None:
    """Traversal, symlinks, inner slashes, folders and names too long: Triton's answers on both
    wires (its shm_open refuses them all). The differences are KEY_DIFFERENCES, each checked
    against the oracle too, so an oracle upgrade shows here."""
    oracle, bridge = servers
    made: list[str] = []
    try:
        cases = key_cases(made, str(tmp_path))
        applied = set()
        for key, difference in cases:
            answers = []
            for server in servers:
                grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
                try:
                    by_grpc = grpc_register(grpc, key, 64)
                    grpc.unregister_system_shared_memory()
                finally:
                    grpc.close()
                region = json.dumps({"key": key, "offset": 0, "byte_size": 64})
                path = "/v2/systemsharedmemory/region/k/register"
                by_http = answer(server.http_url, "POST", path, region)
                answer(server.http_url, "POST", "/v2/systemsharedmemory/unregister", "")
                answers.append((by_grpc, by_http))
            (triton_grpc, triton_http), (bridge_grpc, bridge_http) = answers
            if difference is None:
                assert (bridge_grpc, bridge_http) == (triton_grpc, triton_http), repr(key)
                continue
            applied.add(difference)
            assert (bridge_grpc, bridge_http) == bridge_answer_by_difference(difference, key)
            if difference == "slashes_only":
                text = f"Unable to open shared memory region: '{key}'"
                assert triton_grpc == ("StatusCode.INTERNAL", text), repr(key)
            else:  # the oracle maps the object
                assert triton_grpc == ("OK", ""), repr(key)
        assert applied == set(KEY_DIFFERENCES)
        assert (tmp_path / "secret").read_bytes() == b"S" * 64
    finally:
        for path in made:
            if os.path.isdir(path) and not os.path.islink(path):
                os.rmdir(path)
            else:
                os.unlink(path)


def test_an_empty_region_matches_triton(servers, key) -> None:
    region = json.dumps({"key": key, "offset": 0, "byte_size": 0})
    path = "/v2/systemsharedmemory/region/empty/register"
    triton = answer(servers[0].http_url, "POST", path, region)
    assert triton[0] == 400
    assert answer(servers[1].http_url, "POST", path, region) == triton
