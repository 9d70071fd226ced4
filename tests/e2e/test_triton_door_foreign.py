"""The triton door serves a TensorBased worker that is not a bridge worker.

tests/e2e/foreign_worker.py registers the benchmark models (benchmarks/repository) with Dynamo
as any TensorBased worker does: a model card, no bridge control endpoint, Dynamo's standard
tensor form only. Beside it a bridge worker serves e2e_multi_a. A `--role frontend --frontend
triton` door finds both kinds, with file discovery and with etcd, and answers each model's
requests: the foreign ones converted to and from the standard form at the door.
"""

from __future__ import annotations

import os
import queue
import subprocess
import sys
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.e2e.support import wait_until
from tests.harness.bridge_server import PROJECT_ROOT
from tests.harness.process import stop_process_group
from tests.harness.roles import Frontend, Worker
from tests.harness.services import EtcdServer, require_service

DOOR = ("--frontend", "triton")
BENCHMARK_MODELS = PROJECT_ROOT / "benchmarks" / "repository"
FOREIGN = ("add_sub", "identity_bytes", "identity_fp32", "stream_100")


@pytest.fixture(params=["file"])
def door(request, tmp_path: Path, e2e_multi_a: Path):
    discovery = request.param
    env = {
        "DYN_FILE_KV": str(tmp_path / "kv"),
        "DYN_DISCOVERY_BACKEND": discovery,
        "DYN_REQUEST_PLANE": "tcp",
        "DYN_TCP_RPC_HOST": "127.0.0.1",
        "DYN_TCP_RESPONSE_STREAM_HOST": "127.0.0.1",
    }
    etcd = None
    if discovery == "etcd":
        require_service("etcd")
        etcd = EtcdServer(tmp_path / "etcd").start()
        env["ETCD_ENDPOINTS"] = etcd.endpoint
    environ = {**os.environ, **env, "DYN_LOG": "warn"}
    environ["PYTHONPATH"] = os.pathsep.join(
        [str(PROJECT_ROOT)] + [p for p in environ.get("PYTHONPATH", "").split(":") if p]
    )
    log = tmp_path / "foreign.log"
    with open(log, "wb") as out:
        foreign = subprocess.Popen(
            [sys.executable, "-m", "tests.e2e.foreign_worker", "--model-repository",
             str(BENCHMARK_MODELS)],
            stdout=out, stderr=subprocess.STDOUT, env=environ, cwd=PROJECT_ROOT,
            start_new_session=True,
        )  # fmt: skip
    worker = Worker(e2e_multi_a, env=env, log_path=tmp_path / "worker.log")
    frontend = Frontend(*DOOR, env=env, log_path=tmp_path / "frontend.log")
    try:
        wait_until(lambda: "registered" in log.read_text(), "the foreign worker to register")
        worker.start()
        frontend.start()
        yield frontend
    finally:
        frontend.stop()
        worker.stop()
        stop_process_group(foreign, 10)
        if etcd is not None:
            etcd.stop()


def fp32(name: str, values: list[float]) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, [len(values)], "FP32")
    tensor.set_data_from_numpy(np.array(values, np.float32))
    return tensor


@pytest.mark.parametrize("door", ["file", "etcd"], indirect=True)
def test_foreign_worker_models_are_served(door):
    client = door.client()
    wait_until(lambda: all(client.is_model_ready(m) for m in (*FOREIGN, "alpha")), "models")
    index = {m["name"]: m for m in client.get_model_repository_index(as_json=True)["models"]}
    assert {m: index[m].get("state") for m in FOREIGN} == {m: "READY" for m in FOREIGN}

    # The config the worker registered (its triton_model_config), and version 1.
    config = client.get_model_config("stream_100", as_json=True)["config"]
    assert config["model_transaction_policy"] == {"decoupled": True}
    metadata = client.get_model_metadata("add_sub", as_json=True)
    assert metadata["versions"] == ["1"]
    assert [i["name"] for i in metadata["inputs"]] == ["INPUT0", "INPUT1"]

    result = client.infer("identity_fp32", [fp32("INPUT0", [1.5, -2.0, 3.25])])
    assert result.as_numpy("OUTPUT0").tolist() == [1.5, -2.0, 3.25]
    assert result.get_response().model_version == "1"
    result = client.infer("add_sub", [fp32("INPUT0", [1, 2]), fp32("INPUT1", [10, 20])])
    assert result.as_numpy("OUTPUT0").tolist() == [11, 22]
    assert result.as_numpy("OUTPUT1").tolist() == [-9, -18]

    texts = np.array([b"", b"a\x00b", "é".encode()], dtype=np.object_)
    tensor = grpcclient.InferInput("INPUT0", [3], "BYTES")
    tensor.set_data_from_numpy(texts)
    assert client.infer("identity_bytes", [tensor]).as_numpy("OUTPUT0").tolist() == list(texts)

    # The bridge worker's model beside them, in the bridge form.
    value = grpcclient.InferInput("INPUT0", [1], "INT32")
    value.set_data_from_numpy(np.array([7], np.int32))
    assert client.infer("alpha", [value]).as_numpy("OUTPUT0").tolist() == [7]

    with pytest.raises(InferenceServerException) as caught:
        client.infer("identity_fp32", [fp32("INPUT0", [1.0])], model_version="2")
    assert caught.value.status() == "StatusCode.NOT_FOUND"


def test_foreign_decoupled_model_streams(door):
    client = door.client()
    wait_until(lambda: client.is_model_ready("stream_100"), "stream_100")
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=partial(lambda q, result, error: q.put((result, error)), answers))
    count = grpcclient.InferInput("COUNT", [1], "INT32")
    count.set_data_from_numpy(np.array([5], np.int32))
    client.async_stream_infer("stream_100", [count], enable_empty_final_response=True)
    got = []
    while True:
        result, error = answers.get(timeout=30)
        assert error is None, error
        response = result.get_response()
        final = response.parameters["triton_final_response"].bool_param
        if result.as_numpy("OUT") is not None:
            got.append(int(result.as_numpy("OUT")[0]))
        if final:
            break
    client.stop_stream()
    assert got == [0, 1, 2, 3, 4]
