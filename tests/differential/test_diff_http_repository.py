"""Triton's model repository API over HTTP on the triton door, against the real Triton: the same
raw requests (httpx) and tritonclient.http calls, in explicit and in the default control mode,
get the same status, Content-Type and body.

The control port (`--control-port`) serves these same routes (bridge/control/port.py); its
guards are tests/e2e/test_control_security.py's.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import httpx
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.differential.support import REPOSITORIES
from tests.harness import TritonOracle

pytestmark = pytest.mark.oracle

REPO = REPOSITORIES / "http_generate"
EXPLICIT = ("--model-control-mode=explicit", "--load-model=shapes")
JSON_PARSER_WORDS = "failed to parse the request JSON buffer: "
CONFIG = json.dumps(
    {
        "backend": "python",
        "max_batch_size": 0,
        "input": [{"name": "N", "data_type": "TYPE_INT32", "dims": [1]}],
        "output": [{"name": "V", "data_type": "TYPE_INT32", "dims": [1]}],
    }
)
MODEL_PY = (
    "import triton_python_backend_utils as pb_utils\n"
    "class TritonPythonModel:\n"
    "    def execute(self, requests):\n"
    "        return [pb_utils.InferenceResponse([pb_utils.Tensor('V', "
    "pb_utils.get_input_tensor_by_name(r, 'N').as_numpy() * 3)]) for r in requests]\n"
)
FILES = {"file:1/model.py": base64.b64encode(MODEL_PY.encode()).decode()}

# (path, body), sent in this order to both; each answer compared.
EXPLICIT_CALLS: list[tuple[str, str]] = [
    ("/v2/repository/index", ""),
    ("/v2/repository/index", '{"ready":true}'),
    ("/v2/repository/index", '{"ready":"yes"}'),
    ("/v2/repository/index", "[1]"),
    ("/v2/repository/index", "{bad"),
    ("/v2/repository/models/batched/load", ""),
    ("/v2/repository/index", ""),
    ("/v2/repository/models/batched/unload", '{"parameters":{"unload_dependents":true}}'),
    ("/v2/repository/models/zzz/load", ""),
    ("/v2/repository/models/zzz/unload", ""),
    ("/v2/repository/models/types/load", '{"parameters":["not","a map"]}'),
    ("/v2/repository/models/types/load", '{"parameters":5}'),
    ("/v2/repository/models/types/load", '{"parameters":{"config":5}}'),
    ("/v2/repository/models/types/load", '{"parameters":{"config":"{bad"}}'),
    ("/v2/repository/models/types/load", '{"parameters":{"file:1/model.py":5}}'),
    ("/v2/repository/models/types/load", '{"parameters":{"file:1/model.py":"!!!"}}'),
    ("/v2/repository/models/types/load", "{bad"),
    ("/v2/repository/models/types/load", "[1]"),
    ("/v2/repository/index", ""),
    ("/v2/repository/models/tripler/load", json.dumps({"parameters": {"config": CONFIG, **FILES}})),
]
# A model loaded from the load's files alone is not in Triton's index [V], and is in the bridge's
# (the workers list what they serve); the indexes are compared without it.
FROM_FILES = "tripler"


def answer(url: str, path: str, body: str, method: str = "POST") -> tuple[int, str, Any]:
    response = httpx.request(method, f"http://{url}{path}", content=body.encode(), timeout=120)
    text = response.text
    try:
        parsed: Any = json.loads(text) if text else None
    except ValueError:
        parsed = text
    if isinstance(parsed, dict) and str(parsed.get("error", "")).startswith(JSON_PARSER_WORDS):
        parsed = {"error": JSON_PARSER_WORDS + "<the parser's words>"}  # RapidJSON's vs Python's
    return response.status_code, response.headers.get("content-type", ""), parsed


def test_repository_calls_match_triton_in_explicit_mode(bridge_server, tmp_path) -> None:
    # A fresh oracle and bridge: the sequence loads and unloads models.
    with TritonOracle(REPO, *EXPLICIT, log_path=tmp_path / "tritonserver.log") as oracle:
        bridge = bridge_server(REPO, "--frontend=triton", *EXPLICIT)
        for path, body in EXPLICIT_CALLS:
            triton = answer(oracle.http_url, path, body)
            ours = answer(bridge.http_url, path, body)
            assert ours == triton, (path, body)
        # A model made of the load's config and files serves.
        for server in (oracle, bridge):
            result = httpx.post(
                f"http://{server.http_url}/v2/models/tripler/generate", json={"N": 2}, timeout=60
            )
            assert result.json()["V"] == 6
        # tritonclient.http's own calls, the same answers.
        for server in (oracle, bridge):
            client = httpclient.InferenceServerClient(server.http_url)
            client.unload_model("tripler")
        index = [
            [
                row
                for row in httpclient.InferenceServerClient(s.http_url).get_model_repository_index()
                if row["name"] != FROM_FILES
            ]
            for s in (oracle, bridge)
        ]
        assert index[1] == index[0]
        outcomes = []
        for server in (oracle, bridge):
            client = httpclient.InferenceServerClient(server.http_url)
            client.load_model("batched")
            assert client.is_model_ready("batched")
            try:
                client.load_model("zzz")
            except InferenceServerException as exc:
                outcomes.append((exc.status(), exc.message()))
        assert outcomes[0] == outcomes[1]


def test_repository_calls_match_triton_without_explicit_mode(
    oracle_server, shared_bridge_server
) -> None:
    # The bridge's default mode is poll, Triton's (here) none: both refuse loads alike.
    oracle, bridge = oracle_server(REPO), shared_bridge_server(REPO, "--frontend=triton")
    for path in ("/v2/repository/models/shapes/load", "/v2/repository/models/shapes/unload"):
        assert answer(bridge.http_url, path, "") == answer(oracle.http_url, path, "")
    get = [answer(s.http_url, "/v2/repository/index", "", "GET") for s in (oracle, bridge)]
    assert get[1] == get[0]
