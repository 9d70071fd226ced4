"""Helpers for the end-to-end tests: repositories, inputs, background requests, bounded waits."""

from __future__ import annotations

import re
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient

REPOSITORIES = Path(__file__).resolve().parents[1] / "repositories"
SERVING = REPOSITORIES / "e2e_serving"

# Upper bound of every wait: generous for a loaded 2-core CI machine; never a latency assertion.
WAIT_S = 30.0


def wait_until(predicate: Callable[[], Any], what: str, timeout: float = WAIT_S) -> Any:
    """Poll `predicate` until it returns something truthy; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.01)


def fp32_input(values: list[float], name: str = "INPUT0") -> grpcclient.InferInput:
    array = np.array(values, dtype=np.float32)
    tensor = grpcclient.InferInput(name, list(array.shape), "FP32")
    tensor.set_data_from_numpy(array)
    return tensor


def int32_input(values: list[int], name: str = "INPUT0") -> grpcclient.InferInput:
    array = np.array(values, dtype=np.int32)
    tensor = grpcclient.InferInput(name, list(array.shape), "INT32")
    tensor.set_data_from_numpy(array)
    return tensor


class BackgroundInfer:
    """One `async_infer` call whose outcome the test can poll and then collect."""

    def __init__(
        self, client: grpcclient.InferenceServerClient, model: str, inputs: list, **kwargs: Any
    ) -> None:
        self._done = threading.Event()
        self._result: grpcclient.InferResult | None = None
        self._error: Exception | None = None
        client.async_infer(model, inputs, callback=self._callback, **kwargs)

    def _callback(self, result: grpcclient.InferResult | None, error: Exception | None) -> None:
        self._result, self._error = result, error
        self._done.set()

    def done(self) -> bool:
        return self._done.is_set()

    def result(self, timeout: float = WAIT_S) -> grpcclient.InferResult:
        if not self._done.wait(timeout):
            raise AssertionError(f"no answer within {timeout:.0f} s")
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result


class Gate:
    """Files in a test's tmp folder through which the test holds a model's execute.

    A model given these parameters (`pool`; `async_repeat` and `async_square` of the streaming
    repository) writes `started` (`pool`: its instance name inside) when execute begins and goes
    on only once `gate` exists, so a test can tell "running" from "finished" without timing
    anything.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.gate = folder / "gate"

    def params(self, tag: str) -> dict[str, str]:
        return {"started": str(self.started_path(tag)), "gate": str(self.gate)}

    def started_path(self, tag: str) -> Path:
        return self.folder / f"started-{tag}"

    def started(self, tag: str) -> bool:
        return self.started_path(tag).exists()

    def instance_of(self, tag: str) -> str:
        return self.started_path(tag).read_text()

    def open(self) -> None:
        self.gate.write_text("open")


# OUT = INT32 IN + 1; the parameters `started` and `gate` as support.Gate's.
_HELD_MODEL = """import json
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            params = json.loads(request.parameters())
            if "started" in params:
                open(params["started"], "w").close()
            deadline = time.monotonic() + 60
            while "gate" in params and not os.path.exists(params["gate"]):
                if time.monotonic() > deadline:
                    raise TimeoutError("the gate never opened")
                time.sleep(0.01)
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", values + 1)]))
        return responses
"""
_HELD_CONFIG = """backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ -1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""


def held_and_fast(folder: Path) -> Path:
    """A repository of `held` (the calls a test holds with a `Gate`) and `fast`: the same
    model, OUT = INT32 IN + 1, one instance each."""
    for name in ("held", "fast"):
        (folder / name / "1").mkdir(parents=True)
        (folder / name / "config.pbtxt").write_text(_HELD_CONFIG)
        (folder / name / "1" / "model.py").write_text(_HELD_MODEL)
    return folder


_ROW = re.compile(r"^\|\s*(\S*)\s*\|\s*(\S*)\s*\|\s*(.*?)\s*\|$")


def status_rows(log_text: str) -> dict[str, list[tuple[str, str]]]:
    """The start-up table `| Model | Version | Status |` as {model: [(version, status), ...]}.

    Only the first line of a status is kept (Triton continues a long reason on rows with empty
    Model and Version cells).
    """
    lines = log_text.splitlines()
    header = next((i for i, line in enumerate(lines) if _ROW.match(line) and "Model" in line), None)
    assert header is not None, f"no status table in the log:\n{log_text}"
    cells = _ROW.match(lines[header])
    assert cells is not None and cells.groups() == ("Model", "Version", "Status")
    rows: dict[str, list[tuple[str, str]]] = {}
    for line in lines[header + 1 :]:
        if line.startswith("+"):
            if rows:
                break  # the closing rule
            continue
        match = _ROW.match(line)
        if match is None:
            break
        if not match.group(1):
            continue  # a continuation line of the previous row's status
        rows.setdefault(match.group(1), []).append((match.group(2), match.group(3)))
    return rows


def line_of(model_file: Path, text: str) -> int:
    """The 1-based line number of the only line of `model_file` containing `text`."""
    hits = [n for n, line in enumerate(model_file.read_text().splitlines(), 1) if text in line]
    assert len(hits) == 1, f"{text!r} is on lines {hits} of {model_file}"
    return hits[0]


def warmup_repository(destination: Path, *models: str) -> Path:
    """tests/repositories/warmup laid out in `destination` (every model, or `models`), with the
    one probe model.py copied into each model's version 1 (see its README)."""
    source = REPOSITORIES / "warmup"
    for model in models or sorted(p.name for p in source.iterdir() if p.is_dir()):
        shutil.copytree(source / model, destination / model)
        (destination / model / "1").mkdir(exist_ok=True)
        shutil.copyfile(source / "probe_model.py", destination / model / "1" / "model.py")
    return destination


# A model whose execute waits (at most 20 s) until its request is cancelled, and says which
# happened: files `started`, then `cancelled` or `not-cancelled`, in the folder of its input.
_CANCELLATION_GATE_MODEL = """import os
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            folder = pb_utils.get_input_tensor_by_name(request, "DIR").as_numpy()[0].decode()
            open(os.path.join(folder, "started"), "w").close()
            deadline = time.monotonic() + 20
            while not request.is_cancelled() and time.monotonic() < deadline:
                time.sleep(0.01)
            seen = "cancelled" if request.is_cancelled() else "not-cancelled"
            open(os.path.join(folder, seen), "w").close()
            error = pb_utils.TritonError("stopped", pb_utils.TritonError.CANCELLED)
            responses.append(pb_utils.InferenceResponse(error=error))
        return responses
"""
_CANCELLATION_GATE_CONFIG = """backend: "python"
max_batch_size: 0
input [ { name: "DIR" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""


def cancellation_gate(tmp_path: Path) -> tuple[Path, Path]:
    """A repository with the model `gate` (above) and the folder to send it as its input DIR."""
    repository = tmp_path / "repository"
    (repository / "gate" / "1").mkdir(parents=True)
    (repository / "gate" / "config.pbtxt").write_text(_CANCELLATION_GATE_CONFIG)
    (repository / "gate" / "1" / "model.py").write_text(_CANCELLATION_GATE_MODEL)
    gates = tmp_path / "gates"
    gates.mkdir()
    return repository, gates


def wait_for_file(folder: Path, names: tuple[str, ...], timeout: float = 60.0) -> str:
    """The first of `names` to appear in `folder`; AssertionError after `timeout` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for name in names:
            if (folder / name).exists():
                return name
        time.sleep(0.02)
    raise AssertionError(f"none of {names} appeared in {folder}")
