"""The HTTP door's request rules in-process: the Host rule (`--http-allowed-hosts`), the JSON
nesting limit, bounded inflation and the JSON encoder that never raises (http/security.py,
limits.py, status.py), and the gRPC wire's texts (grpc/error_status.py). Over real HTTP:
tests/e2e/test_http_guard.py."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb

from bridge.cli import (
    build_parser,
    parse_with_environment,
    resolve_http,
    resolve_http_limits,
    resolve_max_input_size,
)
from bridge.codec import TO_DYNAMO
from bridge.frontends.triton.door_error import DoorError
from bridge.frontends.triton.grpc.error_status import wire_text
from bridge.frontends.triton.http.error_status import encode_json
from bridge.frontends.triton.http.infer import _decompress
from bridge.frontends.triton.http.limits import NESTING_TOO_DEEP, check_depth
from bridge.frontends.triton.http.security import HostRule, parse_allowed_hosts
from bridge.frontends.triton.http.tensors import (
    InferPlan,
    parse_json,
    to_bridge_request,
    to_response,
)
from model_repository_loader.pb_utils.errors import ErrorCode


def test_loopback_door_answers_only_to_loopback_names() -> None:
    rule = HostRule.for_address("127.0.0.1")
    for host in ("localhost:8000", "127.0.0.1", "127.0.0.1:1", "[::1]:8000", "LOCALHOST"):
        assert rule.allows(host) and rule.trusted(host), host
    for host in ("attacker.example", "attacker.example:8000", "10.0.0.1:8000", "127.0.0.1.nip.io"):
        assert not rule.allows(host), host


def test_the_host_check_keeps_few_and_short_answers() -> None:
    """Each request's Host is checked against the loopback names with a cache of answers; a
    client varying its Host cannot grow it past its count, nor fill it with long names."""
    from bridge.frontends.triton.http import security

    rule = HostRule.for_address("127.0.0.1")
    for i in range(1000):
        assert not rule.allows(f"host{i}.example:8000")
    assert security._is_loopback.cache_info().currsize <= 256
    security._is_loopback.cache_clear()
    for long_name in ("localhost" + "x" * 300, "[" + "0:" * 200 + ":1]", "a" * 60_000):
        assert not rule.allows(long_name)
    assert security._is_loopback.cache_info().currsize == 0  # never kept
    assert rule.allows(" 127.0.0.1 ") and rule.allows("LOCALHOST.")
    assert security._is_loopback.cache_info().currsize == 2


def test_other_addresses_answer_to_any_host_but_trust_only_listed_names() -> None:
    open_rule = HostRule.for_address("0.0.0.0")
    assert open_rule.allows("attacker.example:8000")
    assert not open_rule.trusted("attacker.example:8000")  # a page there is not our origin
    listed = HostRule.for_address(
        "0.0.0.0", parse_allowed_hosts("infer.corp, gpu1:8000, [fd00::1]")
    )
    assert listed.allows("infer.corp:8000") and listed.trusted("INFER.corp")
    assert listed.allows("gpu1:8000") and not listed.allows("gpu1:9000")
    assert listed.allows("[fd00::1]:8000")
    assert listed.allows("localhost:8000")  # loopback names always
    assert not listed.allows("attacker.example")
    star = HostRule.for_address("127.0.0.1", ["*"])
    assert star.allows("anything.example") and not star.trusted("anything.example")


def test_allowed_hosts_flag_and_its_environment_form(monkeypatch) -> None:
    monkeypatch.delenv("DYN_BRIDGE_FRONTEND", raising=False)
    parser = build_parser()
    args = parse_with_environment(
        parser,
        ["--model-repository", "/m", "--frontend", "triton", "--http-max-input-size=1024"],
        {"DYN_BRIDGE_HTTP_ALLOWED_HOSTS": "a.example,b.example:9000"},
    )
    size = resolve_max_input_size(parser, args)
    options = resolve_http(parser, args, {}, resolve_http_limits(parser, args), size)
    assert options is not None
    assert options.allowed_hosts == ("a.example", "b.example:9000")
    assert options.max_input_size == 1024
    fresh = build_parser()  # the environment's values became the first parser's defaults
    plain = parse_with_environment(fresh, ["--model-repository", "/m", "--frontend", "triton"], {})
    size = resolve_max_input_size(fresh, plain)
    default = resolve_http(fresh, plain, {}, resolve_http_limits(fresh, plain), size)
    assert default is not None and default.max_input_size == 1 << 26
    assert default.allowed_hosts is None
    with pytest.raises(ValueError, match="not a host name"):
        parse_allowed_hosts("good.example,http://bad.example/")


def test_nesting_past_tritons_limit_is_its_400_before_parsing() -> None:
    check_depth(b"[" * 100 + b"]" * 100)
    check_depth(b'["' + b"[" * 5000 + b'"]')  # brackets in a string do not nest
    check_depth(b"[" + b"[1],[2]," * 10_000 + b"[3]]")  # many, shallow
    for deep in (b"[" * 101 + b"]" * 101, b'{"a":' * 101 + b"1" + b"}" * 101, b"[" * 200_000):
        with pytest.raises(DoorError) as caught:
            check_depth(deep)
        assert caught.value.code == ErrorCode.INVALID_ARG
        assert caught.value.message == "JSON nesting depth exceeds maximum allowed limit (100)"
    with pytest.raises(DoorError, match=r"nesting depth exceeds maximum allowed limit \(100\)"):
        parse_json(b'{"inputs":[{"name":"x","data":' + b"[" * 100 + b"]" * 100 + b"}]}")
    assert NESTING_TOO_DEEP.endswith("(100)")


def test_inflation_stops_at_the_limit() -> None:
    packed = gzip.compress(b"\0" * (8 << 20))
    assert len(_decompress(packed, "gzip", limit=8 << 20)) == 8 << 20
    with pytest.raises(DoorError, match="Decompressed data size exceeds the maximum allowed value"):
        _decompress(packed, "gzip", limit=(8 << 20) - 1)


def test_json_answers_never_raise_on_surrogates_or_bytes() -> None:
    body = encode_json({"error": "input '\ud800' and byte \udcff and é"})
    assert body == b'{"error":"input \'\\ud800\' and byte \xff and \xc3\xa9"}'
    decoded = json.loads(body.decode("utf-8", "surrogateescape"))
    assert decoded["error"].startswith("input '\ud800'")


def test_grpc_texts_with_surrogates_can_be_sent() -> None:
    """The gRPC wire's edge: a status's details and a stream's error message are built from
    `wire_text`, which protobuf and grpc can encode (the raw text raises)."""
    message = "input 'IN\udcff' and '\ud800'"
    with pytest.raises(UnicodeEncodeError):
        pb.ModelStreamInferResponse(error_message=message)
    sent = pb.ModelStreamInferResponse(error_message=wire_text(message))
    assert sent.error_message == "input 'IN\\udcff' and '\\ud800'"
    assert wire_text("plain é") == "plain é"


def test_long_json_tensors_are_packed_and_rendered_in_slices_alike() -> None:
    """Past a slice (and past 1 MB for an answer) the work is done in steps, so the event loop's
    thread can take the GIL between them; the bytes are the same as in one step."""
    count = 600_000  # over two slices
    values = np.random.default_rng(1).random(count).astype(np.float32)
    ints = list(range(-300, count - 300))
    document = {
        "inputs": [
            {"name": "F", "shape": [count], "datatype": "FP32", "data": values.tolist()},
            {"name": "I", "shape": [count], "datatype": "INT8", "data": ints},
            {
                "name": "B",
                "shape": [count],
                "datatype": "BOOL",
                "data": [True, False] * (count // 2),
            },
        ]
    }
    bridge, _ = to_bridge_request(document, memoryview(b""), "m", "")
    packed = {t["metadata"]["name"]: t["data"]["values"] for t in bridge["tensors"]}
    assert packed["F"] == values.tobytes()
    assert packed["I"] == np.array(ints, np.int64).astype(np.int8).tobytes()  # wraps
    assert packed["B"] == np.array([True, False] * (count // 2)).tobytes()
    with pytest.raises(DoorError, match="non-signed-integer"):
        too_big = {"name": "I", "shape": [count], "datatype": "INT8", "data": [*ints[:-1], 2**63]}
        to_bridge_request({"inputs": [too_big]}, memoryview(b""), "m", "")
    special = np.concatenate([values, np.array([np.nan, np.inf, -0.0], np.float32)])
    item = {
        "model_version": "1",
        "tensors": [
            {
                "metadata": {
                    "name": "OUT",
                    "data_type": TO_DYNAMO["FP32"],
                    "shape": [len(special)],
                },
                "data": {"values": special.tobytes()},
            }
        ],
    }
    head, _ = to_response("m", item, InferPlan(request_id="r"), None)
    whole = {"name": "OUT", "datatype": "FP32", "shape": [len(special)], "data": special.tolist()}
    expected = {"id": "r", "model_name": "m", "model_version": "1", "outputs": [whole]}
    assert head == json.dumps(expected, separators=(",", ":")).encode()
