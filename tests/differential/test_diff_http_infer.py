"""`POST .../infer` on the triton door, compared with real Triton's HTTP port.

Every datatype as JSON and as binary tensor data, both ways, through `tritonclient.http` and
through raw requests; the request id and parameters as the model sees them; classification;
compression; and the errors: unknown model or version, wrong input name, shape, datatype,
batch size, and requests that do not parse or whose sizes do not add up. Where the door answers
differently on purpose, the difference is applied by a named function of http_support.py.
"""

from __future__ import annotations

import gzip
import json
import struct

import ml_dtypes
import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.differential.http_support import (
    HttpPair,
    both,
    expected_bridge_broken_json,
    expected_bridge_parse_error,
    infer_both,
)
from tests.differential.test_diff_dtypes import BYTES_VALUES, NUMERIC, extremes

pytestmark = pytest.mark.oracle


def _client(server) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(server.http_url, network_timeout=60)


def _tc_outcome(server, model: str, inputs, outputs, **kwargs):
    """(response JSON, {output: array}) of a tritonclient.http call, or its error text."""
    try:
        result = _client(server).infer(model, inputs, outputs=outputs, **kwargs)
    except InferenceServerException as exc:
        return ("error", exc.status(), exc.message())
    response = result.get_response()
    arrays = {o["name"]: result.as_numpy(o["name"]) for o in response["outputs"]}
    return response, arrays


def _same_arrays(a: dict, b: dict) -> bool:
    if a.keys() != b.keys():
        return False
    for name in a:
        x, y = a[name], b[name]
        if x.dtype != y.dtype or x.shape != y.shape:
            return False
        if x.dtype == np.object_:
            if list(x.ravel()) != list(y.ravel()):
                return False
        elif x.tobytes() != y.tobytes():  # bit for bit: NaN, -0.0
            return False
    return True


def _assert_same(triton, bridge) -> None:
    if triton[0] == "error" or bridge[0] == "error":
        assert bridge == triton
        return
    # As JSON text: NaN equals NaN there (tritonclient parses each into a new float object).
    assert json.dumps(bridge[0]) == json.dumps(triton[0])
    assert _same_arrays(triton[1], bridge[1])


# -- every datatype through tritonclient.http -----------------------------------------------------


def _numeric_cases() -> list:
    out = []
    for datatype, (dtype, model) in NUMERIC.items():
        for binary in (True, False):
            out.append(pytest.param(model, datatype, dtype, binary, id=f"{model}-{binary=}"))
    return out


@pytest.mark.parametrize("model,datatype,dtype,binary", _numeric_cases())
def test_every_numeric_datatype(http_dtypes: HttpPair, model, datatype, dtype, binary):
    """Extremes of each datatype, a batch of 2; inputs and outputs binary or JSON. FP16/BF16 as
    JSON is Triton's 400 both ways; the rest must come back bit for bit."""
    values = np.array(extremes(dtype), dtype=dtype)
    array = np.stack([values, values[::-1]])
    outcomes = []
    for _, server in http_dtypes.servers():
        tensor = httpclient.InferInput("INPUT0", list(array.shape), datatype)
        if datatype in ("FP16", "BF16") and not binary:
            # tritonclient refuses to build JSON for these: send it raw, as a user of curl would.
            outcomes.append(_raw_json_fp16(server, model, datatype))
            continue
        tensor.set_data_from_numpy(array, binary_data=binary)
        outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)]
        outcomes.append(_tc_outcome(server, model, [tensor], outputs))
    triton, bridge = outcomes
    _assert_same(triton, bridge)
    if binary or datatype not in ("FP16", "BF16"):
        assert triton[0] != "error", triton
        assert triton[1]["OUTPUT0"].shape == array.shape


def _raw_json_fp16(server, model: str, datatype: str):
    from tests.differential.http_support import infer_body, send

    body, headers = infer_body(
        {"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": datatype, "data": [1, 2]}]}
    )
    answer = send(server, "POST", f"/v2/models/{model}/infer", body, headers)
    return ("error", str(answer.status), answer.document["error"])


@pytest.mark.parametrize("binary", [True, False])
@pytest.mark.parametrize("model", ["identity_bytes", "identity_bytes_nobatch"])
def test_bytes(http_dtypes: HttpPair, model: str, binary: bool):
    """BYTES elements: empty, NUL inside, non-UTF-8, multi-byte UTF-8, long. As JSON a
    non-UTF-8 element goes out as the raw bytes Triton writes."""
    strings = np.array(BYTES_VALUES, dtype=np.object_).reshape(2, 3)
    if not binary:  # JSON input is text: leave out the element that is not UTF-8
        strings = np.array([b"", b"a\x00b", b"ok", "wörld ✓".encode(), b"x" * 1000, b"z"], object)
        strings = strings.reshape(2, 3)
    outcomes = []
    for _, server in http_dtypes.servers():
        tensor = httpclient.InferInput("INPUT0", list(strings.shape), "BYTES")
        tensor.set_data_from_numpy(strings, binary_data=binary)
        outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)]
        outcomes.append(_tc_outcome(server, model, [tensor], outputs))
    _assert_same(*outcomes)
    # tritonclient gives a JSON BYTES output as str elements, a binary one as bytes.
    expected = list(strings.ravel()) if binary else [s.decode() for s in strings.ravel()]
    assert list(outcomes[0][1]["OUTPUT0"].ravel()) == expected


def test_non_utf8_bytes_as_json_output(http_dtypes: HttpPair):
    """Binary in, JSON out: Triton writes the element's bytes as they are; so does the door."""
    data = struct.pack("<I", 3) + b"\xff\xfeA" + struct.pack("<I", 0)
    header = {
        "inputs": [
            {
                "name": "INPUT0",
                "shape": [1, 2],
                "datatype": "BYTES",
                "parameters": {"binary_data_size": len(data)},
            }
        ],
        "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": False}}],
    }
    triton, bridge = infer_both(http_dtypes, "identity_bytes", header, data)
    assert triton.status == 200
    assert bridge == triton


# -- raw requests: JSON and binary, what Triton accepts -------------------------------------------


def _fp32(shape, data=None, **parameters) -> dict:
    tensor = {"name": "INPUT0", "shape": shape, "datatype": "FP32"}
    if data is not None:
        tensor["data"] = data
    if parameters:
        tensor["parameters"] = parameters
    return tensor


ACCEPTED = {
    "nested-data": ("identity_fp32", {"inputs": [_fp32([2, 2], [[1, 2], [3, 4]])]}, b""),
    "ragged-nesting": ("identity_fp32", {"inputs": [_fp32([2, 2], [[1, 2, 3], [4]])]}, b""),
    "nan-inf-json": (
        "identity_fp32",
        {"inputs": [_fp32([1, 2], [float("nan"), float("inf")])]},
        b"",
    ),
    "fp32-rounding": ("identity_fp32", {"inputs": [_fp32([1, 2], [1e300, 16777217])]}, b""),
    "fp64": (
        "identity_fp64",
        {
            "inputs": [
                {"name": "INPUT0", "shape": [1, 3], "datatype": "FP64", "data": [0.1, 1e308, -0.0]}
            ]
        },
        b"",
    ),
    "int8-wraps": (
        "identity_int8",
        {
            "inputs": [
                {"name": "INPUT0", "shape": [1, 3], "datatype": "INT8", "data": [1, 300, -129]}
            ]
        },
        b"",
    ),
    "uint8-wraps": (
        "identity_uint8",
        {"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "UINT8", "data": [256, 511]}]},
        b"",
    ),
    "uint64-max": (
        "identity_uint64",
        {
            "inputs": [
                {"name": "INPUT0", "shape": [1, 1], "datatype": "UINT64", "data": [2**64 - 1]}
            ]
        },
        b"",
    ),
    "int64-extremes": (
        "identity_int64",
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "shape": [1, 2],
                    "datatype": "INT64",
                    "data": [-(2**63), 2**63 - 1],
                }
            ]
        },
        b"",
    ),
    "bool-json": (
        "identity_bool",
        {
            "inputs": [
                {"name": "INPUT0", "shape": [1, 2], "datatype": "BOOL", "data": [True, False]}
            ]
        },
        b"",
    ),
    "binary-in-json-out": (
        "identity_fp32",
        {"inputs": [_fp32([1, 3], binary_data_size=12)]},
        struct.pack("<3f", 1, 2.5, -3),
    ),
    "binary-data-output": (
        "identity_fp32",
        {"parameters": {"binary_data_output": True}, "inputs": [_fp32([1, 3], [1, 2, 3])]},
        b"",
    ),
    "named-output-overrides-binary-data-output": (
        "identity_fp32",
        {
            "parameters": {"binary_data_output": True},
            "inputs": [_fp32([1, 3], [1, 2, 3])],
            "outputs": [{"name": "OUTPUT0"}],
        },
        b"",
    ),
    "request-id": ("identity_fp32", {"id": "my-id", "inputs": [_fp32([1, 1], [1])]}, b""),
    "empty-tensor": ("identity_fp32", {"inputs": [_fp32([1, 0], [])]}, b""),
    "empty-binary-tensor": (
        "identity_fp32",
        {"inputs": [_fp32([1, 0], binary_data_size=0)]},
        b"",
    ),
    "same-output-twice": (
        "identity_fp32",
        {"inputs": [_fp32([1, 1], [1])], "outputs": [{"name": "OUTPUT0"}, {"name": "OUTPUT0"}]},
        b"",
    ),
}


@pytest.mark.parametrize("case", list(ACCEPTED))
def test_accepted_requests(http_dtypes: HttpPair, case: str):
    model, header, binary = ACCEPTED[case]
    triton, bridge = infer_both(http_dtypes, model, header, binary)
    assert triton.status == 200, triton
    assert bridge == triton


# -- errors Triton answers with its own texts -----------------------------------------------------


REFUSED = {
    "unknown-model": ("no_such_model", {"inputs": [_fp32([1, 1], [1])]}, b""),
    "unknown-version": ("identity_fp32/versions/9", {"inputs": [_fp32([1, 1], [1])]}, b""),
    "wrong-input-name": (
        "identity_fp32",
        {"inputs": [{"name": "NOPE", "shape": [1, 1], "datatype": "FP32", "data": [1]}]},
        b"",
    ),
    "wrong-datatype": (
        "identity_fp32",
        {"inputs": [{"name": "INPUT0", "shape": [1, 1], "datatype": "INT32", "data": [1]}]},
        b"",
    ),
    "invalid-datatype": (
        "identity_fp32",
        {"inputs": [{"name": "INPUT0", "shape": [1, 1], "datatype": "FLOAT", "data": [1]}]},
        b"",
    ),
    "batch-too-big": ("identity_fp32", {"inputs": [_fp32([9, 1], [1] * 9)]}, b""),
    "no-batch-dimension": ("identity_fp32", {"inputs": [_fp32([3], [1, 2, 3])]}, b""),
    "no-inputs": ("identity_fp32", {"inputs": []}, b""),
    "unknown-output": (
        "identity_fp32",
        {"inputs": [_fp32([1, 1], [1])], "outputs": [{"name": "NOPE"}]},
        b"",
    ),
    "no-data": ("identity_fp32", {"inputs": [_fp32([1, 1])]}, b""),
    "data-and-binary": (
        "identity_fp32",
        {"inputs": [_fp32([1, 1], [1], binary_data_size=4)]},
        b"\0" * 4,
    ),
    "binary-short": ("identity_fp32", {"inputs": [_fp32([1, 3], binary_data_size=12)]}, b"\0" * 8),
    "binary-left-over": (
        "identity_fp32",
        {"inputs": [_fp32([1, 3], binary_data_size=12)]},
        b"\0" * 16,
    ),
    "binary-size-not-the-shape": (
        "identity_fp32",
        {"inputs": [_fp32([1, 3], binary_data_size=8)]},
        b"\0" * 8,
    ),
    "binary-size-under-the-data": (
        "identity_fp32",
        {"inputs": [_fp32([1, 3], binary_data_size=8)]},
        b"\0" * 12,
    ),
    "bytes-count": (
        "identity_bytes",
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "shape": [1, 3],
                    "datatype": "BYTES",
                    "parameters": {"binary_data_size": 9},
                }
            ]
        },
        struct.pack("<I", 1) + b"a" + struct.pack("<I", 0),
    ),
    "bytes-too-many": (
        "identity_bytes",
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "shape": [1, 1],
                    "datatype": "BYTES",
                    "parameters": {"binary_data_size": 10},
                }
            ]
        },
        struct.pack("<I", 1) + b"a" + struct.pack("<I", 1) + b"b",
    ),
    "bytes-element-cut-short": (
        "identity_bytes",
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "shape": [1, 2],
                    "datatype": "BYTES",
                    "parameters": {"binary_data_size": 6},
                }
            ]
        },
        struct.pack("<I", 3) + b"ab",
    ),
    "fp16-as-json": (
        "identity_fp16",
        {"inputs": [{"name": "INPUT0", "shape": [1, 1], "datatype": "FP16", "data": [1]}]},
        b"",
    ),
    "fp16-output-as-json": (
        "identity_fp16",
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "shape": [1, 1],
                    "datatype": "FP16",
                    "parameters": {"binary_data_size": 2},
                }
            ],
            "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": False}}],
        },
        np.array([1.5], np.float16).tobytes(),
    ),
    "bf16-output-as-json": (
        "identity_bf16",
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "shape": [1, 1],
                    "datatype": "BF16",
                    "parameters": {"binary_data_size": 2},
                }
            ],
            "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": False}}],
        },
        np.array([1.5], ml_dtypes.bfloat16).tobytes(),
    ),
    "parameter-of-no-kind": (
        "identity_fp32",
        {"parameters": {"x": None}, "inputs": [_fp32([1, 1], [1])]},
        b"",
    ),
    # qa/L0_parameters parameters_test.py's raw HTTP check (issue 40)
    "reserved-triton-parameter": (
        "identity_fp32",
        {"parameters": {"triton_final_response": "x"}, "inputs": [_fp32([1, 1], [1])]},
        b"",
    ),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_refused_requests(http_dtypes: HttpPair, case: str):
    """Status, `{"error": text}` and media type as Triton's (Triton labels some errors
    text/plain: before the request is parsed, and past the model)."""
    model, header, binary = REFUSED[case]
    triton, bridge = infer_both(http_dtypes, model, header, binary)
    assert triton.status in (400, 404), triton
    assert bridge == triton


def test_header_length_beyond_the_body(http_dtypes: HttpPair):
    body = json.dumps({"inputs": [_fp32([1, 1], [1])]}).encode()
    for length in (str(len(body) + 1000), "-3"):
        headers = {"Inference-Header-Content-Length": length}
        triton, bridge = both(http_dtypes, "POST", "/v2/models/identity_fp32/infer", body, headers)
        assert triton.status == 400
        assert bridge == triton


def test_header_length_that_takes_binary_data(http_dtypes: HttpPair):
    """A header length 5 bytes too long: the JSON ends where it ends, the binary data is then
    5 bytes short (Triton's text)."""
    header = json.dumps({"inputs": [_fp32([1, 3], binary_data_size=12)]}).encode()
    body = header + struct.pack("<3f", 1, 2, 3)
    headers = {"Inference-Header-Content-Length": str(len(header) + 5)}
    triton, bridge = both(http_dtypes, "POST", "/v2/models/identity_fp32/infer", body, headers)
    assert triton.status == 400
    assert bridge == triton


# -- requests that do not parse: Triton's texts, 400 (parse_error_status) -------------------------


UNPARSABLE = {
    "missing-inputs": {},
    "shape-not-a-list": {"inputs": [_fp32(3, [1, 2, 3])]},
    "negative-dimension": {"inputs": [_fp32([1, -3], [1, 2, 3])]},
    "data-count-not-the-shape": {"inputs": [_fp32([1, 4], [1, 2, 3])]},
    "string-in-fp32": {"inputs": [_fp32([1, 2], [1, "a"])]},
    "id-not-a-string": {"id": 5, "inputs": [_fp32([1, 1], [1])]},
    "binary-size-negative": {"inputs": [_fp32([1, 1], binary_data_size=-1)]},
    "binary-size-a-string": {"inputs": [_fp32([1, 1], binary_data_size="4")]},
}
UNPARSABLE_TYPED = {
    "float-in-int32": ("identity_int32", "INT32", [1, 2.5]),
    "bool-in-int32": ("identity_int32", "INT32", [1, True]),
    "int-in-bool": ("identity_bool", "BOOL", [1, 0]),
    "number-in-bytes": ("identity_bytes", "BYTES", [1, 2]),
    "negative-uint8": ("identity_uint8", "UINT8", [-1, 1]),
    "negative-uint64": ("identity_uint64", "UINT64", [-1, 1]),
    "int64-beyond": ("identity_int64", "INT64", [2**64 - 1, 1]),
}


@pytest.mark.parametrize("case", list(UNPARSABLE) + list(UNPARSABLE_TYPED))
def test_unparsable_requests(http_dtypes: HttpPair, case: str):
    if case in UNPARSABLE:
        model, header = "identity_fp32", UNPARSABLE[case]
    else:
        model, datatype, data = UNPARSABLE_TYPED[case]
        header = {
            "inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": datatype, "data": data}]
        }
    binary = b"\0" * 4 if case.startswith("binary-size") else b""
    triton, bridge = infer_both(http_dtypes, model, header, binary)
    assert triton.status == 500, triton
    assert bridge == expected_bridge_parse_error(triton)


@pytest.mark.parametrize(
    "body", [b'{"inputs": [', b"", b"[1, 2]", b"\xff\xfe{}"], ids=["cut", "empty", "array", "bytes"]
)
def test_broken_json(http_dtypes: HttpPair, body: bytes):
    triton, bridge = both(http_dtypes, "POST", "/v2/models/identity_fp32/infer", body)
    if triton.status == 200:  # Triton 2.51 answers an empty body with a stale output
        assert body == b""
        assert bridge.status == 400
        return
    if triton.document["error"].startswith("failed to parse"):
        assert bridge == expected_bridge_broken_json(triton, bridge)
    else:
        assert bridge == expected_bridge_parse_error(triton)


# -- what the model sees: request id and parameters -----------------------------------------------


def test_request_id_and_parameters_reach_the_model(http_introspect: HttpPair):
    """Request parameters of every JSON kind, sequence and priority fields, an input
    parameter and a requested output with parameters: the model sees what Triton's does, and
    the wire's own parameters (binary_data_output, binary_data) never reach it."""
    header = {
        "id": "r9",
        "parameters": {
            "binary_data_output": False,
            "a": 1,
            "b": "x",
            "c": 1.5,
            "d": True,
            "sequence_id": 7,
            "sequence_start": True,
            "priority": 1,
            "timeout": 5000,
        },
        "inputs": [
            {
                "name": "INPUT0",
                "shape": [2],
                "datatype": "FP32",
                "data": [1, 2],
                "parameters": {"foo": "bar"},
            }
        ],
        "outputs": [{"name": "INFO", "parameters": {"binary_data": False}}],
    }
    triton, bridge = infer_both(http_introspect, "request_info", header)
    assert triton.status == 200
    assert bridge == triton
    info = json.loads(triton.document["outputs"][0]["data"][0])
    assert info["parameters"] == {"a": 1, "b": "x", "c": 1.5, "d": True}


def test_all_outputs_binary_when_none_named(http_introspect: HttpPair):
    header = {
        "parameters": {"binary_data_output": True},
        "inputs": [{"name": "INPUT0", "shape": [2], "datatype": "FP32", "data": [1, 2]}],
    }
    triton, bridge = infer_both(http_introspect, "request_info", header)
    assert triton.media_type == "application/octet-stream"
    assert bridge == triton


# -- classification -------------------------------------------------------------------------------


CLASSIFICATION = [
    ("identity_fp32", "FP32", [2, 3], [3, 1, 2, -1, 5, 5], 2),
    ("identity_int32", "INT32", [1, 3], [3, 1, 2], 5),
    ("identity_fp32_nobatch", "FP32", [2, 3], [3, 1, 2, -1, 5, 5], 2),
    ("identity_fp64", "FP64", [1, 4], [0.125, -7.5, 1e10, 0.0], 3),
]


@pytest.mark.parametrize("binary", [True, False])
@pytest.mark.parametrize("model,datatype,shape,data,k", CLASSIFICATION)
def test_classification(http_dtypes: HttpPair, model, datatype, shape, data, k, binary):
    header = {
        "inputs": [{"name": "INPUT0", "shape": shape, "datatype": datatype, "data": data}],
        "outputs": [
            {"name": "OUTPUT0", "parameters": {"classification": k, "binary_data": binary}}
        ],
    }
    triton, bridge = infer_both(http_dtypes, model, header)
    assert triton.status == 200, triton
    assert triton.document["outputs"][0]["datatype"] == "BYTES"
    assert bridge == triton


def test_classification_through_tritonclient(http_dtypes: HttpPair):
    outcomes = []
    for _, server in http_dtypes.servers():
        tensor = httpclient.InferInput("INPUT0", [1, 3], "FP32")
        tensor.set_data_from_numpy(np.array([[1, 3, 2]], np.float32))
        outputs = [httpclient.InferRequestedOutput("OUTPUT0", class_count=2)]
        outcomes.append(_tc_outcome(server, "identity_fp32", [tensor], outputs))
    _assert_same(*outcomes)
    assert list(outcomes[1][1]["OUTPUT0"].ravel()) == [b"3.000000:1", b"2.000000:2"]


# -- compression ----------------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_request_and_response(http_dtypes: HttpPair, algorithm: str):
    outcomes = []
    array = np.arange(12, dtype=np.float32).reshape(1, 12)
    for _, server in http_dtypes.servers():
        tensor = httpclient.InferInput("INPUT0", [1, 12], "FP32")
        tensor.set_data_from_numpy(array)
        outcomes.append(
            _tc_outcome(
                server,
                "identity_fp32",
                [tensor],
                None,
                request_compression_algorithm=algorithm,
                response_compression_algorithm=algorithm,
            )
        )
    _assert_same(*outcomes)
    assert outcomes[1][1]["OUTPUT0"].tobytes() == array.tobytes()


def test_gzip_answer_is_compressed(http_dtypes: HttpPair):
    body = json.dumps({"inputs": [_fp32([1, 1], [1])]}).encode()
    headers = {"Accept-Encoding": "gzip"}
    import httpx

    answers = []
    for _, server in http_dtypes.servers():
        with httpx.Client() as client:
            response = client.post(
                f"http://{server.http_url}/v2/models/identity_fp32/infer",
                content=gzip.compress(body),
                headers={**headers, "Content-Encoding": "gzip"},
            )
        answers.append(
            (response.status_code, response.headers.get("content-encoding"), response.json())
        )
    assert answers[1] == answers[0]
    assert answers[0][1] == "gzip"


# -- versions, model errors, decoupled models -----------------------------------------------------


@pytest.mark.parametrize(
    "version", ["", "/versions/2", "/versions/3", "/versions/1", "/versions/9"]
)
def test_versions(http_introspect: HttpPair, version: str):
    """The version a request names answers (1 exists on disk but the policy serves 2 and 3)."""
    header = {"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "INT32", "data": [5]}]}
    triton, bridge = infer_both(http_introspect, f"versioned{version}", header)
    assert bridge == triton


def _int32(value: int = 7) -> dict:
    return {"name": "INPUT0", "shape": [1], "datatype": "INT32", "data": [value]}


ERROR_MODELS = [
    "raise_in_execute",
    "raise_model_exception",
    "return_response_not_list",
    "return_tuple",
    "return_dict",
    "return_too_few",
    "return_too_many",
    "return_non_response",
    "no_execute",
]


@pytest.mark.parametrize("model", ERROR_MODELS)
def test_model_errors(http_errors: HttpPair, model: str):
    """A model that fails: Triton's status, text (tracebacks included) and text/plain label."""
    triton, bridge = infer_both(http_errors, model, {"inputs": [_int32()]})
    assert triton.status == 500, triton
    assert triton.media_type == "text/plain"
    assert bridge == triton


@pytest.mark.parametrize(
    "code",
    [
        "NOT_FOUND",
        "UNSUPPORTED",
        "ALREADY_EXISTS",
        "CANCELLED",
        "INTERNAL",
        "INVALID_ARG",
        "UNKNOWN",
        "UNAVAILABLE",
        "DEFAULT",
    ],
)
def test_model_error_codes_become_triton_s_statuses(http_errors: HttpPair, code: str):
    """TritonError(code) from the model: 404, 501, 400, 400, 500, 400, 400, 503, 500."""
    header = {"parameters": {"code": code}, "inputs": [_int32()]}
    triton, bridge = infer_both(http_errors, "error_code", header)
    assert triton.status >= 400
    assert bridge == triton


def test_decoupled_model_through_infer(http_pair_for):
    """Triton's HTTP infer refuses a decoupled model: 501 and its text (generate_stream is
    the HTTP way to such models)."""
    from tests.differential.support import REPOSITORIES

    pair = http_pair_for(REPOSITORIES / "streaming")
    header = {"inputs": [{"name": "IN", "shape": [1], "datatype": "INT32", "data": [2]}]}
    triton, bridge = infer_both(pair, "repeat", header)
    assert triton.status == 501
    assert bridge == triton
