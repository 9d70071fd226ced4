"""One effective trace setting (the server's, or one model's) with its sampler and the traces it
collected but has not written yet, as Triton's TraceManager::TraceSetting keeps them
(src/tracer.cc) [V]:

- every request counts toward the rate; each `rate`-th is traced while `count` (-1: no limit)
  is not used up; each trace made takes one off `count`, which the settings then report;
- with `log_frequency` N, every N collected traces are written to `file.<index>`; when `count`
  runs out and every trace made was collected, what is left goes to `file.<index>` too;
  otherwise (frequency 0) they go to `file` when the setting is replaced or the server exits;
- a setting that changes is a new setting: its counters start again.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from .triton_file import TraceFile

# Why a setting traces nothing (Triton's words, used in its INVALID_ARG answer).
DISABLED = "tracing is disabled"
ZERO_RATE = "sample rate must be non-zero"
NO_FILE = "trace file name is not given"


@dataclass(frozen=True, slots=True)
class TraceValues:
    levels: tuple[str, ...]  # () is OFF
    rate: int
    count: int
    log_frequency: int
    file: str
    mode: str


class TraceSetting:
    """A setting in use: its values, its sampler, and its collected traces."""

    def __init__(self, values: TraceValues, file: TraceFile | None) -> None:
        self.values = values
        self.count = values.count  # what is left; the settings report this one
        self._file = file
        self._lock = threading.Lock()
        self._sample = 0
        self._created = 0
        self._collected = 0
        self._in_stream: list[str] = []
        self._traces_in_stream = 0
        self.reason = ""
        if not values.levels:
            self.reason = DISABLED
        elif values.rate == 0:
            self.reason = ZERO_RATE
        elif values.mode == "triton" and not values.file:
            self.reason = NO_FILE

    def sample(self, force: bool = False) -> bool:
        """Count one request; True when it is to be traced. `force`: a request whose client
        sent its trace context (OpenTelemetry mode) is traced whatever the rate and count."""
        if self.reason and not (force and self.values.levels):
            return False
        with self._lock:
            if self.values.rate == 0:
                return force
            if self.count == 0 and not force:
                return False
            self._sample += 1
            if self._sample % self.values.rate or self.count == 0:
                return force
            if self.count > 0:
                self.count -= 1
            self._created += 1
            return True

    def collect(self, objects: list[str]) -> None:
        """One finished trace's JSON objects (with its ensemble steps')."""
        if self._file is None:
            return
        with self._lock:
            self._in_stream.extend(objects)
            self._traces_in_stream += 1
            self._collected += 1
            frequency = self.values.log_frequency
            used_up = self.count == 0 and self._collected == self._created
            if not (used_up or (frequency and self._traces_in_stream >= frequency)):
                return
            batch, self._in_stream, self._traces_in_stream = self._in_stream, [], 0
        self._file.save(batch, to_index_file=True)

    def retire(self) -> None:
        """Replaced or the server exits: what it still holds goes to the file."""
        with self._lock:
            batch, self._in_stream, self._traces_in_stream = self._in_stream, [], 0
        if batch and self._file is not None:
            self._file.save(batch, to_index_file=self.values.log_frequency != 0)
