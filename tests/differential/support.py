"""Helpers for the differential tests: one request, two servers, comparable answers.

Every test here sends the same `tritonclient.grpc` call to the real Triton oracle and to the
bridge, both serving the same repository, and compares what came back. What Dynamo's KServe
frontend changes and a worker cannot change is listed in `KNOWN_FRONTEND_DIFFERENCES`, and each
such difference is applied by one named function below (`expected_bridge_*`), so a test asserts
the exact difference, never "anything goes".

The suite runs against either front door: the bridge's own (the triton door, the default) or
Dynamo's KServe frontend (`DYN_BRIDGE_FRONTEND=dynamo`, which every bridge the harness starts
inherits; scripts/test.sh's second pass). The triton door's list is empty, and every
`expected_bridge_*` function then expects Triton's own answer.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
from google.protobuf import json_format
from tritonclient.utils import InferenceServerException

from tests.harness import BridgeServer, TritonOracle

PROJECT_ROOT = Path(__file__).resolve().parents[2]
REPOSITORIES = PROJECT_ROOT / "tests" / "repositories"
EXAMPLES = PROJECT_ROOT / "examples" / "model_repository"

# The front door of the bridges under test (the bridge's CLI reads the same variable).
FRONTEND = os.environ.get("DYN_BRIDGE_FRONTEND", "triton")
TRITON_DOOR = FRONTEND == "triton"

# Name → what Dynamo's frontend (ai-dynamo-runtime 1.6.1) does differently from Triton; see
# docs/frontend_differences.md. Tests name the key they rely on.
DYNAMO_FRONTEND_DIFFERENCES: dict[str, str] = {
    "error_status": "a failed unary ModelInfer is always INTERNAL "
    "(`Failed to fold completions stream: <Category>: <Triton's text>`)",
    "error_json_body": "NotFound / NotImplemented categories carry Triton's text as JSON "
    '`{"message":<text>,"code":404|501}` (Dynamo\'s HttpError is the only way to them)',
    "metadata_platform": "ModelMetadata `platform` is the config's (empty for Python models); "
    "Triton says `python`",
    "metadata_versions": 'ModelMetadata `versions` is always ["1"]',
    "response_model_version": 'ModelInferResponse `model_version` is always "1" (a worker\'s '
    "response has no version field)",
    "unknown_model_text": "an unknown or unavailable model is NOT_FOUND `Model '<m>' not found`; "
    "Triton: `Request for unknown model: '<m>' is not found` / `has no available versions`",
    "model_version_ignored": "the request's model_version never reaches the worker: "
    "every version-specific request (also ModelReady / ModelConfig) is the newest version's",
    "grpc_error_header": "the `triton_grpc_error: true` stream header is not honoured: an "
    "error stays in-band and the stream goes on",
    "stream_error_text": "an error on ModelStreamInfer is `<Category>: <Triton's text>` in-band "
    "(the unary wrapping without its `Failed to fold completions stream: ` prefix)",
    "unary_final_flag": "a unary ModelInfer response carries `triton_final_response` (true, or "
    "false when a decoupled model sent FINAL on its own): the worker cannot tell a stream from "
    "a unary call, and streams need the flag; Triton's unary responses have no such parameter",
    "decoupled_unary": "ModelInfer on a decoupled model runs it: one response is returned as a "
    "unary answer, more fail with `Failed to fold completions stream: Multiple responses in "
    "non-streaming mode`; Triton refuses it with UNIMPLEMENTED `ModelInfer RPC doesn't support "
    "models with decoupled transaction policy` (the worker cannot tell the call kinds apart)",
    "stream_error_ends_request": "an error response sent mid-stream ends that request on the "
    "bridge (the model sees is_cancelled()); Triton delivers it and the request goes on",
    "default_second_response": "a default-mode model sent a response without FINAL, then failed "
    "the request (a second send raised, or it also returned a response): Triton's unary answer "
    "is INTERNAL `expected a single response, got 2` and its stream shows only the response; "
    "the bridge's unary answer is the error (error_status) and its stream carries it after the "
    "response (the worker cannot tell a stream from a unary call)",
    "server_ready_with_failures": "ServerReady is true while a model failed to load",
    "repository_index": "RepositoryIndex (and ServerMetadata, statistics, load/unload) is "
    "UNIMPLEMENTED",
    "classification_ignored": "a requested output's `class_count` is ignored: the output comes "
    "back as the model made it; Triton answers its top k classes as BYTES `<value>:<index>`",
}
# What the triton door (bridge/frontends/triton/) answers differently: nothing the suite covers.
TRITON_DOOR_DIFFERENCES: dict[str, str] = {}
KNOWN_FRONTEND_DIFFERENCES = TRITON_DOOR_DIFFERENCES if TRITON_DOOR else DYNAMO_FRONTEND_DIFFERENCES

_UNARY_PREFIX = "Failed to fold completions stream: "

# Triton's gRPC status → the category word Dynamo's frontend prints for the bridge's exception.
ERROR_CATEGORY = {
    "StatusCode.INVALID_ARGUMENT": "InvalidRequest",
    "StatusCode.NOT_FOUND": "NotFound",
    "StatusCode.CANCELLED": "Cancelled",
    "StatusCode.UNIMPLEMENTED": "NotImplemented",
}
_DEFAULT_CATEGORY = "Internal"
# Categories reached through Dynamo's HttpError, whose body is JSON (error_json_body).
_JSON_BODY_CODE = {"NotFound": 404, "NotImplemented": 501}


# -- servers --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pair:
    """The oracle and the bridge serving the same repository."""

    oracle: TritonOracle
    bridge: BridgeServer
    root: Path

    def servers(self) -> list[tuple[str, TritonOracle | BridgeServer]]:
        return [("triton", self.oracle), ("bridge", self.bridge)]


# -- outcomes -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Failure:
    """An InferenceServerException as the client saw it: its status and message."""

    status: str
    message: str


def relative_paths(text: str, root: Path) -> str:
    """`text` with the repository's absolute path dropped, so tracebacks compare across hosts."""
    return text.replace(f"{root}/", "")


def call(server: TritonOracle | BridgeServer, root: Path, request: Callable[[Any], Any]) -> Any:
    """`request(client)`'s result, or the `Failure` it raised (paths made relative)."""
    try:
        return request(server.client())
    except InferenceServerException as exc:
        return Failure(str(exc.status()), relative_paths(exc.message() or "", root))


def both(pair: Pair, request: Callable[[Any], Any]) -> tuple[Any, Any]:
    """The same call on Triton and on the bridge: (triton outcome, bridge outcome)."""
    return call(pair.oracle, pair.root, request), call(pair.bridge, pair.root, request)


def response_dict(result: grpcclient.InferResult) -> dict[str, Any]:
    """The whole ModelInferResponse as a dict (raw output bytes included, base64)."""
    return json_format.MessageToDict(result.get_response(), preserving_proto_field_name=True)


def summarize(outcome: Any, *, stream: bool = False) -> Any:
    """An infer outcome in a comparable form: the response dict, or the Failure as is.

    BYTES outputs are shown element by element (a readable diff when they differ); the raw
    bytes of every other output stay as they are (bit-exact, NaN included). For a unary call
    (`stream=False`) the `triton_final_response` parameter is left out (unary_final_flag: the
    bridge sets it on every response; Triton only on streamed ones).
    """
    if isinstance(outcome, Failure):
        return outcome
    summary = response_dict(outcome)
    if not stream:
        parameters = summary.get("parameters", {})
        parameters.pop("triton_final_response", None)
        if not parameters:
            summary.pop("parameters", None)
    raw = summary.pop("raw_output_contents", [])
    outputs = summary.get("outputs", [])
    if raw:
        summary["raw_output_contents"] = {
            output["name"]: bytes_output(outcome, output["name"])
            if output["datatype"] == "BYTES"
            else content
            for output, content in zip(outputs, raw, strict=True)
        }
    return summary


def bytes_output(result: grpcclient.InferResult, name: str) -> list[bytes]:
    """A BYTES output as a flat list (results are raw here, so as_numpy works on numpy 2)."""
    return list(result.as_numpy(name).ravel())


def json_output(result: grpcclient.InferResult, name: str = "INFO") -> Any:
    """The JSON document an introspection model returned in its first BYTES element."""
    return json.loads(bytes_output(result, name)[0])


# -- inputs ---------------------------------------------------------------------------------------


def make_input(name: str, array: np.ndarray, datatype: str) -> grpcclient.InferInput:
    """An input sent as raw bytes (binary), as tritonclient does by default."""
    tensor = grpcclient.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


def requested(*names: str) -> list[grpcclient.InferRequestedOutput]:
    """The `outputs=` argument asking for these outputs only."""
    return [grpcclient.InferRequestedOutput(name) for name in names]


def int32_input(values: Any, name: str = "INPUT0") -> grpcclient.InferInput:
    return make_input(name, np.array(values, dtype=np.int32), "INT32")


def fp32_input(values: Any, name: str = "INPUT0") -> grpcclient.InferInput:
    return make_input(name, np.array(values, dtype=np.float32), "FP32")


# -- the known frontend differences, one function each ---------------------------------------------


def expected_bridge_error(triton: Failure) -> Failure:
    """error_status + error_json_body: what the bridge answers where Triton answered `triton`."""
    if TRITON_DOOR:
        return triton
    category = ERROR_CATEGORY.get(triton.status, _DEFAULT_CATEGORY)
    text = triton.message
    if category in _JSON_BODY_CODE:
        body = {"message": text, "code": _JSON_BODY_CODE[category]}
        text = json.dumps(body, separators=(",", ":"), ensure_ascii=False)
    return Failure("StatusCode.INTERNAL", f"{_UNARY_PREFIX}{category}: {text}")


def expected_bridge_stream_error(triton: Failure) -> Failure:
    """stream_error_text: what the bridge's stream carries where Triton's carried `triton`
    (both in-band, without a gRPC status; `triton.status` is the unary status of that error)."""
    if TRITON_DOOR:
        return Failure("None", triton.message)
    unary = expected_bridge_error(triton)
    return Failure("None", unary.message[len(_UNARY_PREFIX) :])


def triton_text_in_bridge_error(bridge: Failure) -> str:
    """The Triton text the bridge's error carries, with the frontend's wrapping taken off."""
    if TRITON_DOOR:
        return bridge.message
    assert bridge.message.startswith(_UNARY_PREFIX), bridge
    category, _, text = bridge.message[len(_UNARY_PREFIX) :].partition(": ")
    if category in _JSON_BODY_CODE:
        return json.loads(text)["message"]
    return text


def expected_bridge_metadata(triton: Mapping[str, Any]) -> dict[str, Any]:
    """metadata_platform + metadata_versions, applied to Triton's ModelMetadata (as_json)."""
    if TRITON_DOOR:
        return dict(triton)
    expected = dict(triton)
    expected.pop("platform", None)  # empty on the bridge, so absent from the JSON
    expected["versions"] = ["1"]
    return expected


def expected_bridge_response(triton: Any, *, stream: bool = False) -> Any:
    """response_model_version, applied to Triton's successful response (`summarize` form)."""
    expected = summarize(triton, stream=stream)
    if TRITON_DOOR:
        return expected
    expected["model_version"] = "1"
    return expected


def expected_bridge_decoupled_unary(triton: Failure) -> Failure:
    """decoupled_unary: Triton refused ModelInfer on a decoupled model that answered more than
    once; the frontend's fold of the several responses fails instead."""
    assert triton == Failure(
        "StatusCode.UNIMPLEMENTED",
        "ModelInfer RPC doesn't support models with decoupled transaction policy",
    ), triton
    if TRITON_DOOR:
        return triton
    return Failure(
        "StatusCode.INTERNAL", f"{_UNARY_PREFIX}Multiple responses in non-streaming mode"
    )


def expected_bridge_unknown_model(model: str, triton: Failure) -> Failure:
    """unknown_model_text: the frontend's own NOT_FOUND for a model it does not serve, where
    Triton answered `triton`."""
    if TRITON_DOOR:
        return triton
    return Failure("StatusCode.NOT_FOUND", f"Model '{model}' not found")


def expected_bridge_stream_response(triton: dict[str, Any]) -> dict[str, Any]:
    """response_model_version on a streamed response (`summarize(..., stream=True)` form)."""
    return triton if TRITON_DOOR else {**triton, "model_version": "1"}


_TRITON_UNKNOWN_MODEL = re.compile(
    r"Request for unknown model: '(?P<model>[^']+)' (is not found|has no available versions)"
)


def is_triton_unknown_model(failure: Failure, model: str) -> bool:
    match = _TRITON_UNKNOWN_MODEL.fullmatch(failure.message)
    return failure.status == "StatusCode.NOT_FOUND" and bool(match) and match["model"] == model


def model_names(root: Path) -> list[str]:
    """The model folders of a repository (every directory, loadable or not)."""
    return sorted(
        p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))
    )
