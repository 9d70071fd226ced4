"""The HTTP door's pieces in-process: flags, error statuses, protobuf → Triton's JSON, the JSON /
binary tensor conversion both ways, classification, and the embedded uvicorn server."""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import struct
import zlib

import httpx
import numpy as np
import pytest
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2 as pb

from bridge.cli import (
    build_parser,
    parse_with_environment,
    resolve_http,
    resolve_http_limits,
    resolve_max_input_size,
)
from bridge.frontends.triton.classification import classify
from bridge.frontends.triton.door_error import DoorError
from bridge.frontends.triton.http.error_status import HTTP_STATUS, http_status
from bridge.frontends.triton.http.infer import _decompress
from bridge.frontends.triton.http.models import message_json
from bridge.frontends.triton.http.server import HttpConfigError, HttpOptions, HttpServer
from bridge.frontends.triton.http.tensors import (
    parse_json,
    region_input_bytes,
    split_body,
    to_bridge_request,
    to_response,
)
from model_repository_loader.pb_utils.errors import ErrorCode


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch) -> None:
    for name in ("DYN_BRIDGE_FRONTEND", "DYN_BRIDGE_HTTP_PORT", "DYN_BRIDGE_HTTP_ADDRESS"):
        monkeypatch.delenv(name, raising=False)


# -- flags ----------------------------------------------------------------------------------------


def http_options(*argv: str):
    parser = build_parser()
    args = parse_with_environment(parser, ["--model-repository", "m", *argv], os.environ)
    limits = resolve_http_limits(parser, args)
    return resolve_http(parser, args, {}, limits, resolve_max_input_size(parser, args))


def test_http_flags_and_their_environment_forms(monkeypatch) -> None:
    assert http_options() == HttpOptions(8000, "127.0.0.1")  # the triton door, the default
    assert http_options("--frontend", "dynamo") is None  # Dynamo's frontend: no HTTP/REST API
    options = http_options("--frontend", "triton", "--http-port", "0", "--http-address", "::1")
    assert options == HttpOptions(0, "::1")
    monkeypatch.setenv("DYN_BRIDGE_HTTP_PORT", "9100")
    monkeypatch.setenv("DYN_BRIDGE_HTTP_ADDRESS", "0.0.0.0")
    assert http_options("--frontend", "triton") == HttpOptions(9100, "0.0.0.0")
    assert http_options("--frontend", "triton", "--http-port", "9200").port == 9200


# -- statuses -------------------------------------------------------------------------------------


def test_every_error_code_has_triton_s_http_status() -> None:
    assert set(HTTP_STATUS) == set(ErrorCode)
    assert http_status(ErrorCode.INVALID_ARG) == 400
    assert http_status(ErrorCode.NOT_FOUND) == 404
    assert http_status(ErrorCode.INTERNAL) == 500
    assert http_status(ErrorCode.UNSUPPORTED) == 501
    assert http_status(ErrorCode.UNAVAILABLE) == 503


# -- protobuf → JSON ------------------------------------------------------------------------------


def test_message_json_writes_64_bit_integers_as_numbers_in_declared_order() -> None:
    config = mc.ModelConfig(name="m", max_batch_size=4)
    config.dynamic_batching.max_queue_delay_microseconds = 2**40
    config.input.add(name="X", data_type=mc.TYPE_FP32, dims=[-1, 3])
    config.parameters["p"].string_value = "v"
    document = message_json(config)
    assert list(document)[:4] == ["name", "platform", "backend", "runtime"]
    assert document["dynamic_batching"]["max_queue_delay_microseconds"] == 2**40
    assert document["input"][0]["dims"] == [-1, 3]
    assert document["input"][0]["data_type"] == "TYPE_FP32"
    assert document["parameters"] == {"p": {"string_value": "v"}}
    assert "sequence_batching" not in document  # unset sub-messages are not printed
    stats = pb.ModelStatisticsResponse()
    stats.model_stats.add(name="m", version="1", inference_count=2**50)
    assert message_json(stats)["model_stats"][0]["inference_count"] == 2**50


# -- request --------------------------------------------------------------------------------------


def _request(document: dict, binary: bytes = b"") -> tuple[dict, object]:
    return to_bridge_request(document, memoryview(binary), "m", "")


def _values(document: dict) -> bytes:
    body, _ = _request(document)
    return body["tensors"][0]["data"]["values"]


def _tensor(datatype: str, shape: list[int], data: list) -> dict:
    return {"inputs": [{"name": "X", "shape": shape, "datatype": datatype, "data": data}]}


@pytest.mark.parametrize(
    "datatype,data,expected",
    [
        ("INT8", [1, 300, -129], np.array([1, 44, 127], np.int8)),
        ("UINT8", [256, 511], np.array([0, 255], np.uint8)),
        ("UINT64", [2**64 - 1], np.array([2**64 - 1], np.uint64)),
        ("INT64", [-(2**63)], np.array([-(2**63)], np.int64)),
        ("FP32", [1e300, 16777217, 1], np.array([np.inf, 16777216, 1], np.float32)),
        ("FP64", [0.1, -0.0], np.array([0.1, -0.0], np.float64)),
        ("BOOL", [True, False], np.array([True, False])),
    ],
)
def test_json_values_cast_as_triton_casts_them(datatype, data, expected) -> None:
    assert _values(_tensor(datatype, [len(data)], data)) == expected.tobytes()


def test_nested_json_data_is_read_in_row_major_order() -> None:
    expected = np.array([1, 2, 3, 4], np.int32).tobytes()
    assert _values(_tensor("INT32", [2, 2], [[1, 2], [3, [4]]])) == expected


def test_json_bytes_are_length_prefixed_utf8() -> None:
    packed = _values(_tensor("BYTES", [2], ["ü", ""]))
    assert packed == struct.pack("<I", 2) + "ü".encode() + struct.pack("<I", 0)


@pytest.mark.parametrize(
    "datatype,data,text",
    [
        ("INT32", [1.5], "non-signed-integer as signed-integer"),
        ("INT32", [True], "non-signed-integer as signed-integer"),
        ("UINT8", [-1], "non-unsigned-integer as unsigned-integer"),
        ("INT64", [2**63], "non-signed-integer as signed-integer"),
        ("FP32", ["1"], "non-number as double"),
        ("FP32", [True], "non-number as double"),
        ("BOOL", [1], "non-boolean as boolean"),
        ("BYTES", [1], "non-string as string"),
        ("FP16", [1.0], "receiving FP16 data via JSON is not supported"),
        ("BF16", [1.0], "receiving BF16 data via JSON is not supported"),
        ("FLOAT", [1.0], "invalid datatype for input X"),
    ],
)
def test_json_values_of_the_wrong_kind(datatype, data, text) -> None:
    with pytest.raises(DoorError) as info:
        _request(_tensor(datatype, [len(data)], data))
    assert info.value.code == ErrorCode.INVALID_ARG
    assert text in info.value.message


def test_request_parameters_and_id() -> None:
    body, plan = _request(
        {
            "id": "r",
            "parameters": {"binary_data_output": True, "a": 1, "b": 1.5, "c": "x", "d": False},
            "inputs": [
                {
                    "name": "X",
                    "shape": [1],
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": 4, "k": 2**64 - 1},
                }
            ],
            "outputs": [{"name": "Y", "parameters": {"classification": 2, "binary_data": True}}],
        },
        b"\0" * 4,
    )
    assert body["id"] == "r"
    assert body["parameters"] == {
        "a": {"int64": 1},
        "b": {"double": 1.5},
        "c": {"string": "x"},
        "d": {"bool": False},
    }
    assert body["tensors"][0]["metadata"]["parameters"] == {"k": {"uint64": 2**64 - 1}}
    assert body["outputs"] == [{"name": "Y"}]  # the wire's own parameters stay at the door
    assert plan.binary_default is True
    assert plan.output("Y").classes == 2 and plan.output("Y").binary is True
    assert plan.output("Z").binary is True  # not named: binary_data_output


def test_region_input_bytes_adds_up_the_spans_inputs_name_and_ignores_what_is_malformed() -> None:
    """What decides whether converting a request reads its regions off the event loop."""
    region = {"shared_memory_region": "r", "shared_memory_byte_size": 3 << 20}
    document = {
        "inputs": [
            {"name": "A", "parameters": region},
            {"name": "B", "parameters": {**region, "shared_memory_byte_size": 7}},
            {"name": "C", "data": [1]},
            {"name": "D", "parameters": {**region, "shared_memory_byte_size": "9"}},
            {"name": "E", "parameters": {**region, "shared_memory_byte_size": -4}},
            "not an object",
        ],
        "outputs": [{"name": "O", "parameters": {**region, "shared_memory_byte_size": 1 << 30}}],
    }
    assert region_input_bytes(document) == (3 << 20) + 7
    for malformed in ([], {"inputs": {}}, {"inputs": [{"parameters": []}]}, "x", None):
        assert region_input_bytes(malformed) == 0


def test_binary_inputs_take_their_sizes_in_order() -> None:
    header = {
        "inputs": [
            {"name": "A", "shape": [2], "datatype": "INT32", "parameters": {"binary_data_size": 8}},
            {"name": "B", "shape": [1], "datatype": "FP32", "parameters": {"binary_data_size": 4}},
        ]
    }
    data = np.array([1, 2], np.int32).tobytes() + np.array([3], np.float32).tobytes()
    body, _ = _request(header, data)
    assert [t["data"]["values"] for t in body["tensors"]] == [data[:8], data[8:]]


@pytest.mark.parametrize(
    "binary,text",
    [
        (b"\0" * 8, "expecting 4 additional bytes"),
        (b"\0" * 16, "unexpected additional input data"),
    ],
)
def test_binary_sizes_that_do_not_add_up(binary: bytes, text: str) -> None:
    header = {
        "inputs": [
            {"name": "X", "shape": [3], "datatype": "FP32", "parameters": {"binary_data_size": 12}}
        ]
    }
    with pytest.raises(DoorError) as info:
        _request(header, binary)
    assert text in info.value.message


def test_huge_shapes_cost_nothing() -> None:
    header = {
        "inputs": [
            {
                "name": "X",
                "shape": [2**62, 2**62],
                "datatype": "FP32",
                "parameters": {"binary_data_size": 4},
            }
        ]
    }
    with pytest.raises(DoorError) as info:
        _request(header, b"\0" * 4)
    assert "input byte size mismatch" in info.value.message
    with pytest.raises(DoorError):
        _request(_tensor("FP32", [2**62], [1.0]))


@pytest.mark.parametrize(
    "length,body_size,ok",
    [("5", 10, True), ("10", 10, True), ("11", 10, False), ("0", 10, False), ("x", 10, False)],
)
def test_header_length(length: str, body_size: int, ok: bool) -> None:
    body = b"h" * body_size
    if ok:
        header, binary = split_body(body, length)
        assert len(header) == int(length) and len(binary) == body_size - int(length)
    else:
        with pytest.raises(DoorError) as info:
            split_body(body, length)
        assert "inference header size should be in range" in info.value.message


def test_json_parsing_stops_after_the_first_value() -> None:
    assert parse_json(b'{"a": 1}\xff\x00garbage') == {"a": 1}
    for text in (b"[1]", b"", b"{", b"[" * 100_000):
        with pytest.raises(DoorError) as info:
            parse_json(text)
        assert info.value.code == ErrorCode.INVALID_ARG


# -- response -------------------------------------------------------------------------------------


def _item(datatype: str, shape: list[int], values: bytes) -> dict:
    from bridge.codec import TO_DYNAMO

    metadata = {"name": "Y", "data_type": TO_DYNAMO[datatype], "shape": shape}
    return {"model_version": "1", "tensors": [{"metadata": metadata, "data": {"values": values}}]}


def test_response_json_and_binary() -> None:
    _, plan = _request({"id": "q", "inputs": []})
    values = np.array([1.5, -2], np.float32).tobytes()
    head, chunks = to_response("m", _item("FP32", [2], values), plan, None)
    assert json.loads(head) == {
        "id": "q",
        "model_name": "m",
        "model_version": "1",
        "outputs": [{"name": "Y", "datatype": "FP32", "shape": [2], "data": [1.5, -2.0]}],
    }
    assert chunks == []
    plan.binary_default = True
    head, chunks = to_response("m", _item("FP32", [2], values), plan, None)
    assert json.loads(head)["outputs"][0]["parameters"] == {"binary_data_size": 8}
    assert chunks == [values]


def test_a_large_output_rendered_as_json_in_slices_is_spliced_into_its_place() -> None:
    """Over a MiB, an output's JSON is rendered apart and put where a placeholder stood; a
    request id that looks like one stays as the client sent it."""
    _, plan = _request({"id": ":0", "inputs": []})
    array = np.arange(300_000, dtype=np.int32)  # 1.2 MB: rendered in slices
    item = _item("INT32", [300_000], array.tobytes())
    small = _item("INT32", [2], np.array([7, 8], np.int32).tobytes())["tensors"][0]
    small["metadata"]["name"] = "Z"
    item["tensors"].append(small)
    head, chunks = to_response("m", item, plan, None)
    document = json.loads(head)
    assert document["id"] == ":0"
    assert document["outputs"][0]["data"] == array.tolist()
    assert document["outputs"][1] == {
        "name": "Z",
        "datatype": "INT32",
        "shape": [2],
        "data": [7, 8],
    }
    assert chunks == []


def test_response_bytes_that_are_not_utf8_go_out_as_they_are() -> None:
    _, plan = _request({"inputs": []})
    values = struct.pack("<I", 2) + b"\xff\xfe"
    head, _ = to_response("m", _item("BYTES", [1], values), plan, None)
    assert b'"data":["\xff\xfe"]' in head


def test_fp16_output_as_json_is_refused() -> None:
    _, plan = _request({"inputs": []})
    with pytest.raises(DoorError) as info:
        to_response("m", _item("FP16", [1], b"\0\0"), plan, None)
    assert "sending FP16 data via JSON is not supported" in info.value.message


# -- classification -------------------------------------------------------------------------------


def _elements(raw: bytes) -> list[bytes]:
    out, offset = [], 0
    while offset < len(raw):
        (n,) = struct.unpack_from("<I", raw, offset)
        out.append(raw[offset + 4 : offset + 4 + n])
        offset += 4 + n
    return out


def test_classification_top_k_per_batch_entry() -> None:
    values = np.array([3, 1, 2, -1, 5, 5], np.float32).tobytes()
    datatype, shape, raw = classify("FP32", [2, 3], values, 2, batching=True)
    assert (datatype, shape) == ("BYTES", [2, 2])
    assert _elements(raw) == [b"3.000000:0", b"2.000000:2", b"5.000000:1", b"5.000000:2"]
    _, shape, raw = classify("FP32", [2, 3], values, 2, batching=False)
    assert shape == [2] and _elements(raw) == [b"5.000000:4", b"5.000000:5"]
    _, shape, raw = classify("INT32", [1, 3], np.array([3, 1, 2], np.int32).tobytes(), 9, True)
    assert shape == [1, 3] and _elements(raw) == [b"3:0", b"2:2", b"1:1"]


# -- the embedded server --------------------------------------------------------------------------


class _Service:
    """Only what the health routes ask of a TritonService; model readiness fails."""

    async def server_ready(self) -> bool:
        return False

    async def model_ready(self, name: str, version: str) -> bool:
        raise RuntimeError("a bug")


def test_server_runs_in_the_running_loop_and_stops() -> None:
    async def scenario() -> None:
        server = HttpServer(_Service(), HttpOptions(port=0))  # type: ignore[arg-type]
        await server.start()
        assert server.port > 0
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}") as client:
            assert (await client.get("/v2/health/live")).status_code == 200
            assert (await client.get("/v2/health/ready")).status_code == 400
            missing = await client.get("/v2/none")
            assert (missing.status_code, missing.json()) == (404, {"error": "Not Found"})
            broken = await client.get("/v2/models/m/ready")
            assert (broken.status_code, broken.json()) == (500, {"error": "internal error: a bug"})
        with pytest.raises(HttpConfigError):  # the same port again
            await HttpServer(_Service(), HttpOptions(port=server.port)).start()  # type: ignore[arg-type]
        await server.stop(grace=1.0)
        async with httpx.AsyncClient() as client:
            with pytest.raises(httpx.ConnectError):
                await client.get(f"http://127.0.0.1:{server.port}/v2/health/live")

    asyncio.run(scenario())


def test_response_parameters_follow_the_version_without_the_stream_flag() -> None:
    _, plan = _request({"inputs": []})
    item = _item("INT32", [1], np.array([1], np.int32).tobytes())
    item["parameters"] = {
        "triton_final_response": {"bool": True},
        "count": {"int64": 3},
        "tag": {"string": "x"},
    }
    head, _ = to_response("m", item, plan, None)
    document = json.loads(head)
    assert list(document) == ["model_name", "model_version", "parameters", "outputs"]
    assert document["parameters"] == {"count": 3, "tag": "x"}


# -- compressed bodies ----------------------------------------------------------------------------


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_a_compressed_body_is_bounded_once_inflated(encoding: str):
    """A small body that inflates past the bound is refused without inflating it all."""
    data = b"\0" * 1_000_000
    packed = gzip.compress(data) if encoding == "gzip" else zlib.compress(data)
    assert _decompress(packed, encoding) == data
    with pytest.raises(DoorError) as caught:
        _decompress(packed, encoding, limit=4096)
    assert caught.value.code == ErrorCode.INVALID_ARG
    assert caught.value.message == (
        "Decompressed data size exceeds the maximum allowed value of 4096 bytes. Use "
        "--http-max-input-size to increase the limit."
    )
    with pytest.raises(DoorError, match="cut short"):
        _decompress(packed[: len(packed) // 2], encoding)


def test_an_inference_body_is_not_kept_by_the_request() -> None:
    """Issue 38, finding 7: Starlette's `Request.body()` keeps the body for the handler's life,
    beside the decoded inputs while the model runs; the door reads it without that."""
    from starlette.requests import ClientDisconnect, Request

    from bridge.frontends.triton.http.bodies import read_body

    messages = [
        {"type": "http.request", "body": b"abc", "more_body": True},
        {"type": "http.request", "body": b"def", "more_body": False},
    ]

    async def receive() -> dict:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def read() -> tuple[bytes, BaseException | None]:
        request = Request({"type": "http", "method": "POST", "headers": []}, receive)
        body = await read_body(request)
        try:
            await request.body()  # nothing kept: the stream is consumed
        except (RuntimeError, ClientDisconnect) as exc:
            return body, exc
        return body, None

    body, refused = asyncio.run(read())
    assert body == b"abcdef"
    assert refused is not None
