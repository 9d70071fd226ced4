"""LogSettings through the triton door reach the workers: `--role frontend --frontend triton`
in front of a `--role worker`, file discovery.

The worker serves `chatty` (tests/repositories/e2e_serving) twice: in its own process and as an
isolated instance process (`BRIDGE_INSTANCE_KIND: process`), whose lines travel through the
worker. Each request logs one line per level; its warning line marks that it ran, so the test
waits for that line, then counts the info and verbose lines.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import grpc
import pytest
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from tests.e2e.support import SERVING, fp32_input, wait_until
from tests.harness.roles import Frontend, Worker

DOOR = ("--frontend", "triton")
ISOLATED = 'parameters { key: "BRIDGE_INSTANCE_KIND" value { string_value: "process" } }\n'


def chatty_repository(root: Path) -> Path:
    """chatty in-process, and chatty_process: the same model in an instance process."""
    shutil.copytree(SERVING / "chatty", root / "chatty")
    shutil.copytree(SERVING / "chatty", root / "chatty_process")
    config = root / "chatty_process" / "config.pbtxt"
    config.write_text(
        config.read_text().replace('name: "chatty"', 'name: "chatty_process"') + ISOLATED
    )
    return root


def set_log(stub, **settings) -> dict:
    request = pb.LogSettingsRequest()
    for key, value in settings.items():
        if isinstance(value, bool):
            request.settings[key].bool_param = value
        else:
            request.settings[key].uint32_param = value
    response = stub.LogSettings(request)
    return {k: getattr(v, v.WhichOneof("parameter_choice")) for k, v in response.settings.items()}


@pytest.fixture
def env(tmp_path) -> dict[str, str]:
    return {
        "DYN_FILE_KV": str(tmp_path / "kv"),
        "DYN_DISCOVERY_BACKEND": "file",
        "DYN_REQUEST_PLANE": "tcp",
    }


@pytest.fixture
def late_repo(tmp_path) -> Path:
    """chatty as `chatty_late`, for a worker that starts after the changes."""
    root = tmp_path / "late"
    shutil.copytree(SERVING / "chatty", root / "chatty_late")
    config = root / "chatty_late" / "config.pbtxt"
    config.write_text(config.read_text().replace('name: "chatty"', 'name: "chatty_late"'))
    return root


@pytest.fixture
def cluster(tmp_path, env):
    repo = chatty_repository(tmp_path / "repo")
    worker = Worker(repo, env=env, log_path=tmp_path / "worker.log")
    frontend = Frontend(*DOOR, env=env, log_path=tmp_path / "frontend.log")
    try:
        worker.start()
        frontend.start()
        yield worker, frontend
    finally:
        frontend.stop()
        worker.stop()


def test_log_settings_reach_the_worker_and_its_instance_processes(
    cluster, env, late_repo, tmp_path
):
    worker, frontend = cluster
    client = frontend.client()
    models = ("chatty", "chatty_process")
    wait_until(lambda: all(client.is_model_ready(m) for m in models), "chatty ready")
    stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(frontend.grpc_url))
    runs = {model: 0 for model in models}

    def run(model: str) -> int:
        """Run one request; then the number of the model's info lines in the worker's log."""
        client.infer(model, [fp32_input([1.0])], request_id=f"{model}-{runs[model]}")
        runs[model] += 1
        wait_until(
            lambda: worker.log_text.count('"chatty-execute-warn"') >= sum(runs.values()),
            "the request's warning line",
        )
        return worker.log_text.count(f"chatty-execute-info id={model}-")

    def verbose_lines() -> int:
        return worker.log_text.count('"chatty-execute-verbose"')

    for model in models:
        assert run(model) == 1
    assert verbose_lines() == 0

    settings = set_log(stub, log_verbose_level=1)
    assert settings["log_verbose_level"] == 1
    for model in models:
        run(model)
    assert verbose_lines() == 2  # one per model: in-process and isolated

    set_log(stub, log_verbose_level=0, log_info=False)
    for model in models:
        assert run(model) == 2, model  # the third request's info line is not there
    assert verbose_lines() == 2

    set_log(stub, log_info=True)
    for model in models:
        assert run(model) == 3

    # A worker that joins after a change gets it too (once the door sees it in the index).
    set_log(stub, log_verbose_level=1)
    late = Worker(late_repo, env=env, log_path=tmp_path / "late.log").start()
    try:
        wait_until(lambda: client.is_model_ready("chatty_late"), "chatty_late")

        def late_verbose() -> bool:
            client.infer("chatty_late", [fp32_input([1.0])])
            return '"chatty-execute-verbose"' in late.log_text

        wait_until(late_verbose, "a verbose line from the late worker")
    finally:
        late.stop()
