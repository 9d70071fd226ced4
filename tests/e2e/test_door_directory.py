"""The triton door's model list after reloads, loads and unloads (issue 22, findings 5 and 11).

- Embedded (`--role all --frontend triton`): the door is told of every change in-process at
  once, so the first request after an idle hot reload, or right after a load answered 200, goes
  to the model now serving the name (it answers with its MARK, so the test sees which code ran).
  Before, the door's cached index named a generation already withdrawn: every second idle
  reload the request waited 10 s and failed UNAVAILABLE "No workers available for endpoint".
- A model being unloaded while a request is stuck in its execute refuses new requests at once
  with Triton's answer (checked against the real Triton below), instead of queueing them behind
  the stuck one until the unload's drain gives up.
- Split (`--role worker` + `--role frontend --frontend triton`, file discovery): a request that
  meets a withdrawn endpoint makes the door ask the workers again and retry once.

Nothing here is timed: every wait is for an event (a log line, a file a model writes), bounded.
"""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.e2e.reload_support import ask_marked, control, copy_models, set_line
from tests.e2e.support import REPOSITORIES, WAIT_S, Gate, fp32_input, wait_until
from tests.harness import BridgeServer
from tests.harness.ports import free_port
from tests.harness.roles import Frontend, Worker

DOOR = ("--frontend", "triton")
HANG = REPOSITORIES / "lifecycle" / "hang"
NO_VERSIONS = "Request for unknown model: '{}' has no available versions"
RELOADS = 4
# What Triton 2.51 answers over HTTP, as tritonclient.http reports it (the oracle test checks).
HTTP_NO_VERSIONS = ("404", NO_VERSIONS.format("hang"))


def unloaded(server: BridgeServer, name: str, generation: int) -> bool:
    return f"successfully unloaded '{name}' (generation {generation})" in server.log_text


def refusal(call) -> tuple[str, str]:
    """(status, message) of the InferenceServerException `call()` raises."""
    with pytest.raises(InferenceServerException) as caught:
        call()
    return str(caught.value.status()), str(caught.value.message())


# -- embedded: told at once ------------------------------------------------------------------------


def test_idle_reloads_answer_at_once_from_the_new_generation(bridge_server, tmp_path) -> None:
    repo = copy_models(tmp_path, "marked")
    server = bridge_server(repo, *DOOR, "--reload-debounce-secs", "0.2")
    client = server.client()
    assert ask_marked(client) == (1, 1)
    model_py = repo / "marked" / "1" / "model.py"
    for mark in range(2, 2 + RELOADS):
        set_line(model_py, "MARK = ", f"MARK = {mark}")
        # No request meanwhile: the old generation is withdrawn and finalized while idle.
        wait_until(lambda m=mark: unloaded(server, "marked", m - 1), f"generation {mark - 1} gone")
        assert ask_marked(client) == (mark, 1)


def test_request_right_after_a_load_or_unload(bridge_server, tmp_path) -> None:
    """Load and unload through the control port (not through the door itself): the door's
    list follows at once. An unloaded model is refused as Triton does, a loaded one answers."""
    repo = copy_models(tmp_path, "marked", "plain")
    port = free_port()
    server = bridge_server(
        repo,
        *DOOR,
        "--model-control-mode=explicit",
        "--load-model=marked",
        f"--control-port={port}",
    )
    client = server.client()
    for _ in range(3):
        assert control(port, "/v2/repository/models/plain/load") == (200, None)
        assert client.infer("plain", [fp32_input([3.0])]).as_numpy("OUTPUT0").tolist() == [3.0]
        assert control(port, "/v2/repository/models/plain/unload") == (200, None)
        assert refusal(lambda: client.infer("plain", [fp32_input([3.0])])) == (
            "StatusCode.NOT_FOUND",
            NO_VERSIONS.format("plain"),
        )
    set_line(repo / "marked" / "1" / "model.py", "MARK = ", "MARK = 2")
    assert control(port, "/v2/repository/models/marked/load") == (200, None)
    assert ask_marked(client) == (2, 1)


# -- a model being unloaded refuses new work -------------------------------------------------------


def hang_repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    shutil.copytree(HANG, repo / "hang")
    return repo


def http_input(value: float) -> httpclient.InferInput:
    tensor = httpclient.InferInput("INPUT0", [1], "FP32")
    tensor.set_data_from_numpy(np.array([value], np.float32))
    return tensor


def unload_while_stuck(tmp_path: Path, server, unload) -> tuple:
    """A request stuck in `hang`'s execute, then `unload()`, then a new request over gRPC and
    one over HTTP: their refusals (status, text), and the stuck one's answer once its gate
    opens."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    http = httpclient.InferenceServerClient(server.http_url)
    gate = Gate(tmp_path)
    answer: dict = {}

    def stuck() -> None:
        try:
            result = client.infer("hang", [fp32_input([1.0])], parameters=gate.params("a"))
            answer["values"] = result.as_numpy("OUTPUT0").tolist()
        except Exception as exc:  # reported by the caller's assertion
            answer["error"] = exc

    thread = threading.Thread(target=stuck, daemon=True)
    thread.start()
    try:
        wait_until(lambda: gate.started("a"), "the request to be stuck in execute")
        unload()
        refused = refusal(lambda: client.infer("hang", [fp32_input([2.0])]))
        refused_http = refusal(lambda: http.infer("hang", [http_input(2.0)]))
    finally:
        gate.open()
        thread.join(WAIT_S)
        client.close()
        http.close()
    return refused, refused_http, answer


@pytest.mark.oracle
def test_unloading_model_refuses_new_requests_as_triton(oracle_server, tmp_path) -> None:
    oracle = oracle_server(
        hang_repo(tmp_path), "--model-control-mode=explicit", "--load-model=hang"
    )
    client = grpcclient.InferenceServerClient(oracle.grpc_url)
    refused, refused_http, answer = unload_while_stuck(
        tmp_path, oracle, lambda: client.unload_model("hang")
    )
    assert refused == ("StatusCode.NOT_FOUND", NO_VERSIONS.format("hang"))
    assert refused_http == HTTP_NO_VERSIONS
    assert answer == {"values": [1.0]}  # the request in flight still finishes


@pytest.mark.parametrize("mode", ["embedded", "split"])
def test_unloading_model_refuses_new_requests_at_once(bridge_server, tmp_path, mode) -> None:
    """The unload is sent through the control port, so the door learns of it only from the
    worker: in split mode the new request still reaches the unloading generation, which
    refuses it rather than queue it behind the stuck one."""
    repo = hang_repo(tmp_path)
    port = free_port()
    flags = ("--model-control-mode=explicit", "--load-model=hang", f"--control-port={port}")
    if mode == "embedded":
        server = bridge_server(repo, *DOOR, *flags)
    else:
        env = {"DYN_FILE_KV": str(tmp_path / "kv")}
        worker = Worker(repo, *flags, env=env, log_path=tmp_path / "worker.log")
        server = Frontend(*DOOR, env=env, log_path=tmp_path / "frontend.log")
        try:
            worker.start()
            server.start()
        except BaseException:
            worker.stop()
            server.stop()
            raise
    try:
        client = server.client()
        wait_until(lambda: client.is_model_ready("hang"), "hang ready")
        # Once through the door first: the split door's route to the generation is made.
        assert client.infer("hang", [fp32_input([0.0])]).as_numpy("OUTPUT0").tolist() == [0.0]
        refused, refused_http, answer = unload_while_stuck(
            tmp_path, server, lambda: control(port, "/v2/repository/models/hang/unload")
        )
        assert refused == ("StatusCode.NOT_FOUND", NO_VERSIONS.format("hang"))
        assert refused_http == HTTP_NO_VERSIONS
        assert answer == {"values": [1.0]}
    finally:
        server.stop()
        if mode == "split":
            worker.stop()


# -- split: a withdrawn endpoint is asked about again, once ----------------------------------------


def test_split_door_follows_idle_reloads(tmp_path) -> None:
    """The door's index names a generation (a state RPC asked it) that no request has used;
    the model is reloaded while idle, and that generation withdrawn: the next request finds it
    gone, asks again and is answered by the new one. Before, it waited 10 s for an instance of
    the withdrawn endpoint and failed UNAVAILABLE "No workers available for endpoint"."""
    repo = copy_models(tmp_path, "marked")
    env = {"DYN_FILE_KV": str(tmp_path / "kv")}
    worker = Worker(repo, "--reload-debounce-secs", "0.2", env=env, log_path=tmp_path / "w.log")
    door = Frontend(*DOOR, env=env, log_path=tmp_path / "door.log")
    try:
        worker.start()
        client = door.start().client()
        wait_until(lambda: client.is_model_ready("marked"), "marked ready")
        assert ask_marked(client) == (1, 1)
        model_py = repo / "marked" / "1" / "model.py"
        mark = 1
        for _ in range(RELOADS // 2):
            for _ in range(2):
                mark += 1
                set_line(model_py, "MARK = ", f"MARK = {mark}")
                wait_until(
                    lambda m=mark: unloaded(worker, "marked", m - 1), f"generation {mark - 1}"
                )
                if mark % 2 == 0:
                    assert client.is_model_ready("marked")  # the index names generation `mark`
            assert ask_marked(client) == (mark, 1)
        # The answers above are the test; the line says they came through the retry (the door's
        # new client of the withdrawn endpoint listed no instance).
        assert "withdrawn; asking the workers again" in door.log_text
    finally:
        door.stop()
        worker.stop()
