"""What one traced request measures on its way through a model: Triton's trace activities.

A caller that wants a request traced sets `InferRequest.trace` to a `RequestTrace`; every
request without one (nearly all) costs nothing more than that attribute's None. On the way:

- the model admits it: REQUEST_START, and at level TENSORS its inputs (TENSOR_QUEUE_INPUT);
- the scheduler takes it: QUEUE_START;
- its `execute` call ends (scheduling/entry.py `run_recorded`): COMPUTE_START, COMPUTE_INPUT_END,
  COMPUTE_OUTPUT_START, COMPUTE_END, where the statistics measure the compute input, infer and
  output parts (execution.py's compute span);
- each response: its outputs (TENSOR_BACKEND_OUTPUT);
- it is released (its final response sent and its `execute` returned): REQUEST_END.

An ensemble's steps get child traces of the ensemble's (Triton's parent_id); so does a BLS call
whose request was given the caller's trace (`pb_utils.InferenceRequest(..., trace=
request.trace())`, as in Triton; without it a BLS call is not traced). A BLS call or step served
by another process sends the trace's level in the bridge form and adopts the part that process
measured (`adopt`). A trace is complete when it and every child it made have ended;
`when_complete` tells the caller (the bridge sends the trace back with the final answer). Times
are `time.monotonic_ns()` (Linux's CLOCK_MONOTONIC, the same clock in every process of a host,
as Triton's steady clock); the tensors' data is written as Triton writes it (values joined by
commas; BYTES elements between quotes).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np


def _data(array: np.ndarray, datatype: str) -> str:
    flat = array.ravel()
    if datatype == "BYTES":
        return ",".join(
            '"' + (v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)) + '"'
            for v in flat
        )
    if datatype == "BOOL":
        return ",".join("1" if v else "0" for v in flat.tolist())
    if array.dtype.kind == "f":
        return ",".join(format(float(v), "g") for v in flat.tolist())
    return ",".join(str(v) for v in flat.tolist())


def tensor_entry(tensor: Any) -> list[str]:
    """[name, data, shape, dtype] of a pb_utils.Tensor, as Triton's trace file has them."""
    array = tensor._on_host().as_numpy()  # a GPU tensor's data, copied to the host
    datatype = tensor._datatype
    return [tensor.name(), _data(array, datatype), ",".join(map(str, array.shape)), datatype]


class RequestTrace:
    """One traced request's activities (and its ensemble steps')."""

    __slots__ = (
        "tensors",
        "model_name",
        "model_version",
        "times",
        "inputs",
        "outputs",
        "children",
        "kind",
        "remote_part",
        "_root",
        "_lock",
        "_open",
        "_ended",
        "_on_complete",
    )

    def __init__(self, tensors: bool = False, root: RequestTrace | None = None) -> None:
        self.tensors = tensors
        self.model_name = ""
        self.model_version = -1
        self.times: dict[str, int] = {}
        self.inputs: list[list[str]] = []
        self.outputs: list[list[str]] = []
        self.children: list[RequestTrace] = []
        self.kind = ""  # "" for a client's request, "ENSEMBLE_STEP" or "BLS" for a child
        self.remote_part: dict[str, Any] | None = None  # what another process measured
        self._root = root if root is not None else self
        self._ended = False
        # The root counts what is still open: itself and every child admitted.
        self._lock = threading.Lock()
        self._open = 1 if root is None else 0
        self._on_complete: Callable[[], None] | None = None

    def child(self, kind: str) -> RequestTrace:
        """A trace for one of this request's ensemble steps or BLS calls (open once a model
        admits it, or it is sent to another process)."""
        child = RequestTrace(self.tensors, self._root)
        child.kind = kind
        self.children.append(child)
        return child

    def sent(self, model_name: str) -> None:
        """Sent to another process, which measures it; `adopt` takes what it measured."""
        self.admitted(model_name, -1, ())

    def adopt(self, part: dict[str, Any] | None) -> None:
        """The part another process measured (its final answer's "trace"), and the end."""
        if part is not None:
            self.remote_part = part
        self.end()

    def admitted(self, model_name: str, version: int, inputs: Iterable[Any]) -> None:
        self.model_name, self.model_version = model_name, version
        self.times["REQUEST_START"] = time.monotonic_ns()
        if self._root is not self:
            root = self._root
            with root._lock:
                root._open += 1
        if self.tensors:
            self.inputs = [tensor_entry(t) for t in inputs]

    def queued(self) -> None:
        self.times["QUEUE_START"] = time.monotonic_ns()

    def computed(self, start_ns: int, span: tuple[int, int] | None, end_ns: int) -> None:
        input_end, output_start = span if span is not None else (start_ns, end_ns)
        self.times["COMPUTE_START"] = start_ns
        self.times["COMPUTE_INPUT_END"] = input_end
        self.times["COMPUTE_OUTPUT_START"] = output_start
        self.times["COMPUTE_END"] = end_ns

    def responded(self, response: Any) -> None:
        if self.tensors and response is not None:
            self.outputs.extend(tensor_entry(t) for t in response.output_tensors())

    def end(self) -> None:
        """Released: REQUEST_END (once); tells the caller when the whole trace is done."""
        if self._ended:
            return
        self._ended = True
        self.times["REQUEST_END"] = time.monotonic_ns()
        root = self._root
        with root._lock:
            root._open -= 1
            callback = root._on_complete if root._open == 0 else None
        if callback is not None:
            callback()

    def when_complete(self, callback: Callable[[], None]) -> bool:
        """Call `callback` (on whatever thread ends the trace) once it and its children have
        ended; False, and no call, when they already have."""
        with self._lock:
            if self._open == 0:
                return False
            self._on_complete = callback
            return True

    def to_wire(self) -> dict[str, Any]:
        """Plain values for the bridge form (docs/worker_protocol.md §2)."""
        if self.remote_part is not None:
            return {**self.remote_part, "kind": self.kind}
        wire: dict[str, Any] = {
            "kind": self.kind,
            "model_name": self.model_name,
            "model_version": self.model_version,
            "times": self.times,
        }
        if self.inputs:
            wire["inputs"] = self.inputs
        if self.outputs:
            wire["outputs"] = self.outputs
        children = [c.to_wire() for c in self.children if c.times]
        if children:
            wire["children"] = children
            # Released after its steps are, as in Triton: an ensemble answers from within its
            # last step's response, before that step's `execute` has returned.
            ends = [c["times"].get("REQUEST_END", 0) for c in children]
            if "REQUEST_END" in self.times and max(ends) > self.times["REQUEST_END"]:
                wire["times"] = {**self.times, "REQUEST_END": max(ends)}
        return wire
