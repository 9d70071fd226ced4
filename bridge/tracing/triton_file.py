"""The trace file in Triton's JSON shape, written as Triton 2.51 writes it (src/tracer.cc).

A trace is a run of JSON objects with one `id`: a header (`model_name`, `model_version`, and
`request_id` / `parent_id` when set), one object per timestamp (`{"id", "timestamps":
[{"name", "ns"}]}`), and at level TENSORS one per tensor (`{"id", "activity", "tensor":
{"name", "data", "shape", "dtype"}}`). The objects come in the order Triton writes them [V]:

- HTTP: HTTP_RECV_START, HTTP_RECV_END, the header, REQUEST_START, QUEUE_START, the input
  tensors, the output tensors, INFER_RESPONSE_COMPLETE, HTTP_SEND_START, HTTP_SEND_END, then
  COMPUTE_START, COMPUTE_INPUT_END, COMPUTE_OUTPUT_START, COMPUTE_END and REQUEST_END;
- gRPC: the header, REQUEST_START, QUEUE_START, the tensors, the COMPUTE_* timestamps,
  REQUEST_END, then GRPC_WAITREAD_START, GRPC_WAITREAD_END, INFER_RESPONSE_COMPLETE,
  GRPC_SEND_START, GRPC_SEND_END;
- an ensemble's steps are traces of their own with `parent_id` the ensemble's id, written
  before it, the last step first; the ensemble itself has no COMPUTE_* timestamps.

With log frequency 0 every trace goes to `file` (one JSON array, closed when the server
exits); with log frequency N every N traces go to a new `file.<index>`. BLS calls are not
traced in this mode, as in Triton.

Every trace file is readable by the server's user alone (mode 0600, whatever the umask, an
existing file too): it holds request ids and, at level TENSORS, the inputs themselves (issue 38,
finding 7). Triton creates it with the umask's mode (0644 as a rule); this is stricter.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import threading
from typing import Any, TextIO

log = logging.getLogger(__name__)

COMPUTE = ("COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END")
WIRE_BEFORE = {"HTTP": ("HTTP_RECV_START", "HTTP_RECV_END"), "GRPC": ()}
WIRE_AFTER = {
    "HTTP": ("INFER_RESPONSE_COMPLETE", "HTTP_SEND_START", "HTTP_SEND_END"),
    "GRPC": (
        "GRPC_WAITREAD_START",
        "GRPC_WAITREAD_END",
        "INFER_RESPONSE_COMPLETE",
        "GRPC_SEND_START",
        "GRPC_SEND_END",
    ),
}


def _stamp(trace_id: int, name: str, times: dict[str, int]) -> str | None:
    ns = times.get(name)
    if ns is None:
        return None
    return f'{{"id":{trace_id},"timestamps":[{{"name":"{name}","ns":{ns}}}]}}'


def _tensor(trace_id: int, activity: str, tensor: list[Any]) -> str:
    name, data, shape, dtype = tensor
    body = json.dumps(
        {"name": name, "data": data, "shape": shape, "dtype": dtype}, separators=(",", ":")
    )
    return f'{{"id":{trace_id},"activity":"{activity}","tensor":{body}}}'


def trace_objects(
    part: dict[str, Any],
    first_id: int,
    wire: str | None,
    wire_times: dict[str, int],
    request_id: str = "",
    parent_id: int = 0,
) -> tuple[list[str], int]:
    """The JSON objects of one worker-recorded trace (`part`, model_repository_loader/
    tracing.py's wire form) and its steps', ids from `first_id`; and the next free id.
    `wire` is "HTTP" or "GRPC" for the request a client sent, None for an ensemble's step."""
    trace_id = first_id
    next_id = first_id + 1
    steps: list[list[str]] = []
    for child in part.get("children", ()):
        objects, next_id = trace_objects(child, next_id, None, {}, request_id, trace_id)
        steps.append(objects)
    times: dict[str, int] = part.get("times", {})
    header: dict[str, Any] = {
        "id": trace_id,
        "model_name": part.get("model_name", ""),
        "model_version": int(part.get("model_version", -1)),
    }
    if request_id:
        header["request_id"] = request_id
    if parent_id:
        header["parent_id"] = parent_id
    out: list[str] = []
    for step in reversed(steps):  # Triton writes the last-made trace first
        out.extend(step)
    stamps = [_stamp(trace_id, name, wire_times) for name in WIRE_BEFORE.get(wire or "", ())]
    out.extend(s for s in stamps if s)
    out.append(json.dumps(header, separators=(",", ":")))
    for name in ("REQUEST_START", "QUEUE_START"):
        if (s := _stamp(trace_id, name, times)) is not None:
            out.append(s)
    out.extend(_tensor(trace_id, "TENSOR_QUEUE_INPUT", t) for t in part.get("inputs", ()))
    out.extend(_tensor(trace_id, "TENSOR_BACKEND_OUTPUT", t) for t in part.get("outputs", ()))
    late = [_stamp(trace_id, name, times) for name in (*COMPUTE, "REQUEST_END")]
    wire_after = [_stamp(trace_id, name, wire_times) for name in WIRE_AFTER.get(wire or "", ())]
    if wire == "HTTP":
        out.extend(s for s in wire_after if s)
        out.extend(s for s in late if s)
    else:
        out.extend(s for s in late if s)
        out.extend(s for s in wire_after if s)
    return out, next_id


def open_private(path: str) -> TextIO:
    """`path` opened for writing from its start, mode 0600 before anything is written: made so
    when new (O_CREAT's mode, which a umask can only narrow), set so when it was a regular file
    already (O_CREAT keeps an existing file's mode). Anything else (a pipe, a terminal) is
    written as it is: its mode is not ours to change."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            os.fchmod(fd, 0o600)
        return open(fd, "w", encoding="utf-8")  # noqa: SIM115 (the caller closes it)
    except BaseException:
        os.close(fd)
        raise


class TraceFile:
    """One trace file path; every setting that names it writes through this one object."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._index = 0
        self._first = True
        self._stream: Any = None

    def save(self, objects: list[str], to_index_file: bool) -> None:
        """Write `objects` to `path.<next index>` as one array, or append them to `path`."""
        text = ",".join(objects)
        try:
            with self._lock:
                if to_index_file:
                    name = f"{self.path}.{self._index}"
                    self._index += 1
                    with open_private(name) as out:
                        out.write("[" + text + "]")
                    return
                if self._first:
                    self._stream = open_private(self.path)
                    self._stream.write("[")
                    self._first = False
                else:
                    self._stream.write(",")
                self._stream.write(text)
                self._stream.flush()
        except OSError as exc:
            log.error("failed creating trace file: %s", exc)

    def close(self) -> None:
        """Close the array of `path` (Triton does this when it exits)."""
        with self._lock:
            if self._stream is not None:
                self._stream.write("]")
                self._stream.close()
                self._stream = None
