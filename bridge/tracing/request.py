"""One traced request at the door: the wire's timestamps, the worker's part, then the trace's
way out (the trace file, or OpenTelemetry spans).

The wire stamps what only it sees (HTTP_RECV_START/END and HTTP_SEND_START/END, or
GRPC_WAITREAD_START/END and GRPC_SEND_START/END, and INFER_RESPONSE_COMPLETE) and puts
`request_form()` into the bridge-form request as `"trace"`; the worker answers its part
(model_repository_loader/tracing.py) in the final answer's `"trace"`, which `took` removes.
Ids are the server's, one per trace and step, from one counter, as Triton numbers them.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from typing import Any

from .setting import TraceSetting
from .triton_file import trace_objects

_ids = itertools.count(1)
_ids_lock = threading.Lock()


def _count(part: dict[str, Any]) -> int:
    return 1 + sum(_count(child) for child in part.get("children", ()))


def next_ids(n: int) -> int:
    """The first of `n` consecutive fresh trace ids."""
    with _ids_lock:
        first = next(_ids)
        for _ in range(n - 1):
            next(_ids)
    return first


class WireTrace:
    """A request the door traces."""

    __slots__ = ("setting", "wire", "times", "request_id", "part", "export", "traceparent")

    def __init__(
        self,
        setting: TraceSetting,
        wire: str,
        export: Callable[[WireTrace], None] | None = None,
    ) -> None:
        self.setting = setting
        self.wire = wire  # "HTTP" | "GRPC"
        self.times: dict[str, int] = {}
        self.request_id = ""
        self.part: dict[str, Any] | None = None
        self.export = export  # OpenTelemetry mode: where the finished trace goes instead
        self.traceparent = ""  # the client's W3C trace context, if it sent one

    def stamp(self, name: str) -> None:
        self.times[name] = time.monotonic_ns()

    def request_form(self) -> dict[str, Any]:
        return {"level": list(self.setting.values.levels)}

    def took(self, item: dict[str, Any]) -> None:
        """Keep the worker's part of the trace, if `item` carries it."""
        part = item.pop("trace", None)
        if part is not None:
            self.part = part

    def finish(self, name: str | None = None) -> None:
        """The last wire timestamp (`name`), then the trace goes out. A request that reached
        no model has no part and is not written, as Triton writes no trace without one."""
        if name is not None:
            self.stamp(name)
        if self.part is None:
            return
        if self.export is not None:
            self.export(self)
            return
        first = next_ids(_count(self.part))
        objects, _ = trace_objects(self.part, first, self.wire, self.times, self.request_id)
        self.setting.collect(objects)
