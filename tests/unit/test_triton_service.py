"""TritonService's decisions in memory: no gRPC or HTTP socket, the real models behind it.

Both wires only translate; what an RPC answers is decided by `TritonService`
(bridge/frontends/triton/service.py). As uvicorn and h11 test their protocols in memory, these
tests call the service directly, the way the embedded default builds it: a real worker role
loading a real repository, a real Dynamo runtime (`mem` discovery), the door's directory reaching
the models in-process. Nothing is mocked.

The repository is the one real Triton 2.51 answered in fixtures/validation_oracle.json: the
probe models of fixtures/capture_validation.py, written the same way, loaded the same way
(explicit mode, `--load-model=*`), plus introspect's `versioned`. Every expected code and text is
Triton's: from that fixture, from the differential tests' assertions against the oracle
(test_diff_versions.py), or from the spec (/work/shared/spec/triton_python_backend.md §3.13-3.15);
none is copied from the service's own output.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import struct
import threading
import time
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest
from dynamo.runtime import Context

from bridge.cluster.index import ClusterIndex
from bridge.frontends.triton.directory import Directory
from bridge.frontends.triton.service import TritonService
from bridge.options import ServerOptions
from bridge.roles.runtime import start_runtime
from bridge.roles.worker import WorkerRole
from model_repository_loader.errors import TritonStatusError
from model_repository_loader.pb_utils.errors import ErrorCode
from tests.unit.fixtures.capture_validation import (
    BROKEN,
    BROKEN_CONFIG,
    BROKEN_MODEL,
    MODELS,
    PROBE_MODEL,
)

FIXTURES = Path(__file__).parent / "fixtures"
ORACLE = json.loads((FIXTURES / "validation_oracle.json").read_text())
REPOSITORIES = Path(__file__).parents[1] / "repositories"
# Models of the test repositories whose Triton answers are recorded in their READMEs.
BORROWED = (REPOSITORIES / "introspect" / "versioned", REPOSITORIES / "streaming" / "repeat")
NAMESPACE = "service_in_memory"
# Triton's error codes as its gRPC server sends them (src/grpc/grpc_utils.cc), the form the
# oracle fixture records statuses in.
GRPC_NAME = {
    ErrorCode.INVALID_ARG: "INVALID_ARGUMENT",
    ErrorCode.NOT_FOUND: "NOT_FOUND",
    ErrorCode.UNAVAILABLE: "UNAVAILABLE",
    ErrorCode.UNSUPPORTED: "UNIMPLEMENTED",
    ErrorCode.INTERNAL: "INTERNAL",
    ErrorCode.ALREADY_EXISTS: "ALREADY_EXISTS",
}
# The bridge form's datatype names (docs/worker_protocol.md §2: Dynamo's names) and item sizes.
DYNAMO_TYPE = {
    "BOOL": ("Bool", 1),
    "UINT8": ("Uint8", 1),
    "INT32": ("Int32", 4),
    "INT64": ("Int64", 8),
    "FP16": ("Float16", 2),
    "BF16": ("BFloat16", 2),
    "FP32": ("Float32", 4),
    "FP64": ("Float64", 8),
    "BYTES": ("Bytes", 0),
}
# Waits on the worker and the runtime: generous, as the machine may be loaded.
CALL_TIMEOUT_S = 60.0

T = TypeVar("T")


class Served:
    """A TritonService over a loaded repository, on an event loop of its own thread (the
    runtime and the models' threads outlive each test; each test submits its coroutine)."""

    def __init__(self, repo: Path) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.repo = repo
        self.worker: WorkerRole | None = None
        self.runtime: Any = None
        self.directory: Directory | None = None
        self.index: ClusterIndex | None = None
        self.service: TritonService | None = None

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(CALL_TIMEOUT_S)

    async def start(self) -> None:
        """As the composition root does for `--role all` (bridge/server.py), minus the ports."""
        options = ServerOptions(
            model_repositories=[self.repo],
            namespace=NAMESPACE,
            model_control_mode="explicit",
            load_models=("*",),
            allow_metrics=False,
        )
        self.worker = WorkerRole(options)
        await self.worker.load()
        self.runtime = start_runtime("mem", "tcp", "all")
        # The process's one index, started before its readers and stopped after them.
        index = self.index = ClusterIndex(self.runtime, NAMESPACE)
        await index.start()
        await self.worker.start(self.runtime, index, None)
        manager = self.worker.manager
        assert manager is not None
        self.directory = Directory(index, None, manager.local_worker)
        manager.listeners.append(self.directory.changed)  # told of loads and unloads at once
        self.service = TritonService(self.directory, ready=self.worker.ready)
        # Discovery shows the worker's control endpoint a moment after it is served.
        for _ in range(int(CALL_TIMEOUT_S / 0.05)):
            if {path.name for path in BORROWED} <= set(await self.directory.fresh()):
                return
            await asyncio.sleep(0.05)
        raise AssertionError("the worker's models never appeared in the door's directory")

    async def stop(self) -> None:
        if self.service is not None:
            self.service.close()
        if self.index is not None:
            self.index.stop()
        if self.worker is not None and self.runtime is not None:
            await self.worker.close(self.runtime, 5.0, withdraw=True)
        if self.runtime is not None:
            self.runtime.shutdown()

    def close(self) -> None:
        try:
            self.run(self.stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=10)


def write_repository(root: Path) -> Path:
    """The oracle capture's repository (capture_validation.main), introspect's `versioned` and
    streaming's decoupled `repeat`."""
    repo = root / "repo"
    for name, config in [*MODELS.items(), (BROKEN, BROKEN_CONFIG)]:
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(config)
        (repo / name / "1" / "model.py").write_text(BROKEN_MODEL if name == BROKEN else PROBE_MODEL)
    for model in BORROWED:
        shutil.copytree(model, repo / model.name)
    return repo


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    served = Served(write_repository(tmp_path_factory.mktemp("service")))
    try:
        served.run(served.start())
        yield served
    finally:
        served.close()


@pytest.fixture
def service(served: Served) -> TritonService:
    assert served.service is not None
    return served.service


def values(datatype: str, shape: list[int]) -> bytes:
    """Zeros of `shape` in the bridge form (raw bytes; BYTES: each element length-prefixed)."""
    count = int(np.prod(shape)) if shape else 1
    if datatype == "BYTES":
        return (struct.pack("<I", 2) + b"ab") * count
    return bytes(count * DYNAMO_TYPE[datatype][1])


def body(model: str, inputs: list, outputs: list[str], request_id: str = "") -> dict[str, Any]:
    """One request in the bridge form a wire hands the service (docs/worker_protocol.md §2)."""
    tensors = []
    for name, datatype, shape in inputs:
        dynamo = DYNAMO_TYPE[datatype][0]
        tensors.append(
            {
                "metadata": {"name": name, "data_type": dynamo, "shape": list(shape)},
                "data": {"data_type": dynamo, "values": values(datatype, shape)},
            }
        )
    request: dict[str, Any] = {
        "model": model,
        "tensors": tensors,
        "bridge_form": 1,
        "model_version": "",
    }
    if request_id:
        request["id"] = request_id
    if outputs:
        request["outputs"] = [{"name": name} for name in outputs]
    return request


async def infer(
    service: TritonService, model: str, version: str, request: dict[str, Any]
) -> dict[str, Any]:
    """What a unary ModelInfer decides: Triton's status and text, or the outputs (by name)."""
    try:
        target = await service.target(model, version, stream=False)
        request["model_version"] = target.version
        items = [item async for item in service.items(target, request, Context())]
    except TritonStatusError as exc:
        return {"status": GRPC_NAME[exc.code], "message": exc.message}
    answers = [item for item in items if not item.get("empty")]
    assert len(answers) == 1, answers
    if "error" in answers[0]:
        error = answers[0]["error"]
        return {"status": GRPC_NAME[ErrorCode[error["code"]]], "message": error["message"]}
    return {"status": "OK", "outputs": {t["metadata"]["name"]: t for t in answers[0]["tensors"]}}


def model_shapes(answer: dict[str, Any]) -> dict[str, list[int]]:
    """The probe model's SHAPES output: the input shapes `execute` saw (JSON, one element)."""
    raw = answer["outputs"]["SHAPES"]["data"]["values"]
    (length,) = struct.unpack_from("<I", raw)
    return json.loads(raw[4 : 4 + length])


async def error_of(call: Coroutine[Any, Any, Any]) -> tuple[str, str]:
    try:
        await call
    except TritonStatusError as exc:
        return GRPC_NAME[exc.code], exc.message
    raise AssertionError("expected Triton's error, got an answer")


# -- inference: the requests real Triton answered (fixtures/validation_oracle.json) -------------


@pytest.mark.parametrize("case", ORACLE["cases"], ids=[c["id"] for c in ORACLE["cases"]])
def test_inference_requests_are_answered_as_triton_answered(
    served: Served, service: TritonService, case: dict
) -> None:
    """Unknown, missing, duplicate inputs; wrong datatypes, shapes and batch sizes; unknown
    outputs: the status and text Triton gave, and for accepted ones the shapes its model saw."""
    request = body(case["model"], case["inputs"], case["outputs"], case.get("request_id", ""))
    answer = served.run(infer(service, case["model"], "", request))
    expected = case["expected"]
    assert answer["status"] == expected["status"], answer
    if expected["status"] != "OK":
        assert answer["message"] == expected["message"]
    elif "model_shapes" in expected:
        assert model_shapes(answer) == expected["model_shapes"]


@pytest.mark.parametrize("case", ORACLE["lookups"], ids=lambda case: case["id"])
def test_model_and_version_lookups_are_answered_as_triton_answered(
    served: Served, service: TritonService, case: dict
) -> None:
    """Unknown models and versions, version texts that are no number, a model that failed to
    load: Triton's status and text before any model runs."""
    # Valid inputs, as the capture sent, so that a lookup that succeeds answers OK.
    inputs = [("X", "FP32", [1])] if case["model"] == BROKEN else [("INPUT0", "FP32", [4])] * 2
    inputs = inputs if case["model"] == BROKEN else [inputs[0], ("INPUT1", "FP32", [4])]
    request = body(case["model"], inputs, [])
    answer = served.run(infer(service, case["model"], case["version"], request))
    expected = case["expected"]
    assert answer["status"] == expected["status"], answer
    if expected["status"] != "OK":
        assert answer["message"] == expected["message"]
    else:
        assert model_shapes(answer) == expected["model_shapes"]


# -- readiness, metadata and config (test_diff_versions.py's oracle answers; spec §3.13-3.14) ---


def test_model_ready_per_version(served: Served, service: TritonService) -> None:
    """versioned: versions 1-3 on disk, policy latest 2; Triton: ready "", 2, 3, not 1."""
    answers = [served.run(service.model_ready("versioned", v)) for v in ("", "1", "2", "3")]
    assert answers == [True, False, True, True]


def test_model_ready_of_unknown_and_failed_models_is_false(
    served: Served, service: TritonService
) -> None:
    """Triton 2.51: ModelReady on an unknown model, or one that failed, is false, not an error."""
    assert served.run(service.model_ready("nope", "")) is False
    assert served.run(service.model_ready(BROKEN, "")) is False
    assert served.run(service.model_ready(BROKEN, "1")) is False


def test_metadata_lists_the_served_versions_and_the_config_s_tensors(
    served: Served, service: TritonService
) -> None:
    metadata = served.run(service.model_metadata("versioned", ""))
    assert list(metadata.versions) == ["2", "3"]
    assert metadata.platform == "python"  # the backend, for a python model
    assert [(t.name, t.datatype, list(t.shape)) for t in metadata.inputs] == [
        ("INPUT0", "INT32", [1])
    ]
    assert [(t.name, t.datatype) for t in metadata.outputs] == [
        ("VERSION", "INT32"),
        ("TAG", "BYTES"),
    ]


def test_metadata_shapes_carry_the_batch_dimension(served: Served, service: TritonService) -> None:
    """max_batch_size > 0: -1 before the config's dims (spec §3.14)."""
    metadata = served.run(service.model_metadata("batched", ""))
    assert [(t.name, t.datatype, list(t.shape)) for t in metadata.inputs] == [
        ("IN", "FP32", [-1, 2]),
        ("IDX", "INT32", [-1, -1]),
    ]


@pytest.mark.parametrize("rpc", ["model_metadata", "model_config"])
def test_metadata_and_config_of_versions_and_models_not_served(
    served: Served, service: TritonService, rpc: str
) -> None:
    call = getattr(service, rpc)
    assert served.run(error_of(call("versioned", "1"))) == (
        "NOT_FOUND",
        "Request for unknown model: 'versioned' version 1 is not found",
    )
    assert served.run(error_of(call("nope", ""))) == (
        "NOT_FOUND",
        "Request for unknown model: 'nope' is not found",
    )


def test_config_is_the_model_s_own(served: Served, service: TritonService) -> None:
    config = served.run(service.model_config("versioned", "3")).config
    assert (config.name, config.backend, config.max_batch_size) == ("versioned", "python", 0)
    assert config.version_policy.latest.num_versions == 2


# -- the server as a whole -----------------------------------------------------------------------


def test_server_metadata_names_triton_2_51_and_only_its_extensions(service: TritonService) -> None:
    metadata = service.server_metadata()
    assert (metadata.name, metadata.version) == ("triton", "2.51.0")
    # Triton 2.51's own list (spec §3.14): the door may serve fewer, never others.
    triton = {
        "classification", "sequence", "model_repository", "model_repository(unload_dependents)",
        "schedule_policy", "model_configuration", "system_shared_memory", "cuda_shared_memory",
        "binary_tensor_data", "parameters", "statistics", "trace", "logging",
    }  # fmt: skip
    assert set(metadata.extensions) <= triton


def test_server_is_live_but_not_ready_while_a_model_failed(
    served: Served, service: TritonService
) -> None:
    """Strict readiness, Triton's default: not ready while a model it tried to load is not."""
    assert service.server_live() is True
    assert served.run(service.server_ready()) is False


# -- inference: decoupled models ------------------------------------------------------------------


def test_a_decoupled_model_refuses_a_unary_call(served: Served, service: TritonService) -> None:
    assert served.run(error_of(service.target("repeat", "", stream=False))) == (
        "UNIMPLEMENTED",
        "ModelInfer RPC doesn't support models with decoupled transaction policy",
    )


def test_a_decoupled_model_answers_a_stream_response_by_response(
    served: Served, service: TritonService
) -> None:
    """repeat [5, 6, 7]: three responses, then the flag-only FINAL (streaming/README.md)."""

    async def stream() -> list[dict[str, Any]]:
        target = await service.target("repeat", "", stream=True)
        request = body("repeat", [("IN", "INT32", [3])], [])
        request["tensors"][0]["data"]["values"] = np.array([5, 6, 7], np.int32).tobytes()
        return [item async for item in service.items(target, request, Context())]

    items = served.run(stream())
    assert [bool(item.get("final")) for item in items] == [False, False, False, True]
    assert items[-1].get("empty")
    outs = [
        np.frombuffer(t["data"]["values"], np.int32).tolist()
        for item in items[:3]
        for t in item["tensors"]
        if t["metadata"]["name"] == "OUT"
    ]
    assert outs == [[5], [6], [7]]


# -- statistics (spec §3.15) --------------------------------------------------------------------


def _counts(response: Any) -> dict[str, tuple[int, int, int]]:
    return {
        s.version: (s.inference_count, s.execution_count, s.inference_stats.success.count)
        for s in response.model_stats
    }


def test_statistics_count_one_request_on_the_version_it_ran(
    served: Served, service: TritonService
) -> None:
    """inference_count: batch sizes of successful requests; execution_count: execute calls."""
    before = _counts(served.run(service.statistics("versioned", "")))
    assert set(before) == {"2", "3"}
    request = body("versioned", [("INPUT0", "INT32", [1])], [])
    answer = served.run(infer(service, "versioned", "2", request))
    assert answer["status"] == "OK"
    # Counted once `execute` has returned, which may be just after the answer left (as in
    # Triton: the request's duration ends when the backend releases it).
    deadline = time.monotonic() + 5
    while True:
        after = _counts(served.run(service.statistics("versioned", "")))
        if after["2"] != before["2"] or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    assert after["2"] == tuple(n + 1 for n in before["2"])
    assert after["3"] == before["3"]
    assert set(_counts(served.run(service.statistics("versioned", "2")))) == {"2"}


def test_statistics_of_models_and_versions_not_served(
    served: Served, service: TritonService
) -> None:
    assert served.run(error_of(service.statistics("nope", ""))) == (
        "INVALID_ARGUMENT",
        "requested model 'nope' is not available",
    )
    # Triton's text (src/tritonserver.cc, TRITONSERVER_ServerModelStatistics).
    assert served.run(error_of(service.statistics("versioned", "1"))) == (
        "INVALID_ARGUMENT",
        "requested model version is not available for model 'versioned'",
    )


def test_statistics_without_a_name_cover_every_served_version(
    served: Served, service: TritonService
) -> None:
    rows = served.run(service.statistics("", "")).model_stats
    pairs = {(s.name, s.version) for s in rows}
    assert {("versioned", "2"), ("versioned", "3"), ("two_in", "1")} <= pairs
    assert not any(name == BROKEN for name, _ in pairs)


# -- the repository (spec §3.13: explicit mode) ---------------------------------------------------


def test_repository_index_lists_every_model_with_its_state(
    served: Served, service: TritonService
) -> None:
    rows = served.run(service.repository_index(ready_only=False)).models
    names = sorted({*MODELS, BROKEN, *(path.name for path in BORROWED)})
    assert sorted({row.name for row in rows}) == names
    assert [row.name for row in rows] == sorted(row.name for row in rows)
    broken = [row for row in rows if row.name == BROKEN]
    assert [(row.version, row.state) for row in broken] == [("1", "UNAVAILABLE")]
    assert broken[0].reason.startswith("Internal: RuntimeError: probe model that never loads")
    versioned = [(row.version, row.state) for row in rows if row.name == "versioned"]
    assert versioned == [("2", "READY"), ("3", "READY")]


def test_repository_index_of_ready_models_leaves_the_failed_one_out(
    served: Served, service: TritonService
) -> None:
    rows = served.run(service.repository_index(ready_only=True)).models
    assert BROKEN not in {row.name for row in rows}
    assert {row.state for row in rows} == {"READY"}


def test_loading_a_model_that_fails_and_one_that_does_not_exist(
    served: Served, service: TritonService
) -> None:
    status, text = served.run(error_of(service.load(BROKEN)))
    assert status == "INVALID_ARGUMENT"
    assert text.startswith(
        f"load failed for model '{BROKEN}': version 1 is at UNAVAILABLE state: "
        "Internal: RuntimeError: probe model that never loads"
    )
    assert served.run(error_of(service.load("nope"))) == (
        "INTERNAL",
        "failed to load 'nope', failed to poll from model repository",
    )


def test_unload_and_load_again(served: Served, service: TritonService) -> None:
    """Unloading an unknown model succeeds; an unloaded model is not ready until loaded again."""
    served.run(service.unload("nope"))
    served.run(service.unload("wild"))
    assert served.run(service.model_ready("wild", "")) is False
    served.run(service.load("wild"))
    assert served.run(service.model_ready("wild", "")) is True
    request = body("wild", [("X", "FP32", [7, 3])], [])
    assert served.run(infer(service, "wild", "", request))["status"] == "OK"


# -- system shared memory (Triton's src/shared_memory_manager.cc) --------------------------------


@pytest.fixture
def shm_key() -> Iterator[str]:
    """A 64-byte object in /dev/shm, for this test only."""
    key = f"/triton_service_test_{os.getpid()}"
    path = Path("/dev/shm") / key[1:]
    path.write_bytes(bytes(64))
    try:
        yield key
    finally:
        path.unlink(missing_ok=True)


def test_shared_memory_registration(service: TritonService, shm_key: str) -> None:
    shm = service.shm
    try:
        with pytest.raises(TritonStatusError) as past:
            shm.register("big", shm_key, 0, 65)  # past the object's end
        assert (GRPC_NAME[past.value.code], past.value.message) == (
            "INVALID_ARGUMENT",
            "failed to register shared memory region 'big': invalid args",
        )
        shm.register("r", shm_key, 0, 64)
        assert [(r.name, r.key, r.offset, r.byte_size) for r in shm.status("r")] == [
            ("r", shm_key, 0, 64)
        ]
        with pytest.raises(TritonStatusError) as again:
            shm.register("r", shm_key, 0, 64)
        assert (GRPC_NAME[again.value.code], again.value.message) == (
            "ALREADY_EXISTS",
            "shared memory region 'r' already in manager",
        )
        with pytest.raises(TritonStatusError) as missing:
            shm.register("m", shm_key + "_missing", 0, 8)
        assert (GRPC_NAME[missing.value.code], missing.value.message) == (
            "INTERNAL",
            f"Unable to open shared memory region: '{shm_key}_missing'",
        )
        with pytest.raises(TritonStatusError) as unknown:
            shm.status("nope")
        assert (GRPC_NAME[unknown.value.code], unknown.value.message) == (
            "NOT_FOUND",
            "Unable to find system shared memory region: 'nope'",
        )
        shm.unregister("nope")  # an unknown name is no error
        shm.unregister("r")
        assert shm.status("") == []
    finally:
        shm.unregister("")


# -- shutdown -------------------------------------------------------------------------------------


def test_while_exiting(served: Served) -> None:
    """Triton 2.51 while it exits (tests/e2e/test_triton_door_exit.py): health "Server
    exiting", the repository "Server not ready", a model's metadata and a new inference "has no
    available versions"."""
    assert served.directory is not None
    exiting = TritonService(served.directory)  # its own: the shared one keeps serving
    exiting.begin_exit()
    try:
        with pytest.raises(TritonStatusError) as live:
            exiting.server_live()
        assert (GRPC_NAME[live.value.code], live.value.message) == (
            "UNAVAILABLE",
            "Server exiting",
        )
        assert served.run(error_of(exiting.repository_index(False))) == (
            "UNAVAILABLE",
            "Server not ready",
        )
        assert served.run(error_of(exiting.model_metadata("versioned", ""))) == (
            "NOT_FOUND",
            "Request for unknown model: 'versioned' has no available versions",
        )
        assert served.run(error_of(exiting.target("versioned", "", stream=False))) == (
            "NOT_FOUND",
            "Request for unknown model: 'versioned' has no available versions",
        )
    finally:
        exiting.close()
