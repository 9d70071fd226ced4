"""A worker does not start a request that reached it after its caller gave up on it.

Over the TCP request plane a caller (the triton door, a BLS call) waits DYN_TCP_REQUEST_TIMEOUT
for the worker to acknowledge a request, then answers its client UNAVAILABLE. A request held up
by a partition is still delivered when the link comes back (TCP retransmits it), and Dynamo then
runs the handler even though the caller's response stream is gone: measured on three network
namespaces, a worker ran requests 20 s after the door had reported them failed (the model saw
`is_cancelled()` only afterwards). A client that retries a request it was told failed would
have it run twice.

So the caller stamps each request (`stamp`): who sent it, when (its monotonic clock), and how
long it waits. The worker compares, per caller, the request's delay from stamp to arrival with
the smallest delay that caller's requests have had lately (`Arrivals`): the two hosts' clocks
need not agree, only tick at the same rate. A request whose delay exceeds the smallest by more
than the caller's wait arrived after the caller gave up, and is refused unstarted (rejected,
UNAVAILABLE); one whose Dynamo context is already stopped (its caller went away) too. A caller
that is still waiting takes such a refusal as not taken, and sends the request to a replica
(routes.py), since nothing ran.

What stays at-least-once (docs/deployment.md): a request that reached the worker in time whose
acknowledgement was lost on the way back; the first request from a caller the worker has not
heard from before (it sets the smallest delay).
"""

from __future__ import annotations

import logging
import secrets
import time
from typing import Any

from model_repository_loader.pb_utils import TritonError

log = logging.getLogger(__name__)

# This process as a caller: random, so that a restarted caller (new clock origin) is new.
SENDER = secrets.token_hex(8)
# The smallest delay is kept over two windows of WINDOW_S: a caller's clock may drift slowly
# against this one (NTP slews monotonic clocks by at most 500 ppm: 30 ms over a minute).
WINDOW_S = 30.0

_caller_timeout_ms: int | None = None


def set_caller_timeout(seconds: float | None) -> None:
    """How long this process waits for a worker to take a request (None: no bound it knows, as
    on the NATS request plane: requests are not stamped)."""
    global _caller_timeout_ms
    _caller_timeout_ms = None if seconds is None else int(seconds * 1000)


def stamp(body: dict[str, Any]) -> dict[str, Any]:
    """`body` with this caller's stamp (in place: each attempt gets a fresh one)."""
    if _caller_timeout_ms is not None:
        body["sent"] = [SENDER, time.monotonic_ns(), _caller_timeout_ms]
    return body


class _Window:
    __slots__ = ("current", "previous", "since")

    def __init__(self, delay: int, now: float) -> None:
        self.current = delay
        self.previous = delay
        self.since = now


class Arrivals:
    """The smallest stamp-to-arrival delay of each caller lately (worker side; on the loop)."""

    def __init__(self) -> None:
        self._callers: dict[str, _Window] = {}

    def refusal(self, request: dict[str, Any], context: Any, model: str) -> TritonError | None:
        """Triton's error for a request that must not start (see the module doc), else None."""
        if context is not None and (context.is_stopped() or context.is_killed()):
            # Its caller cancelled it, or gave up and its response stream could not be opened.
            log.info(
                "a request for '%s' was not run: its caller went away before it started", model
            )
            return TritonError(
                "the request's caller went away before it started", TritonError.UNAVAILABLE
            )
        late_ms = self.late_ms(request.get("sent"))
        if late_ms is None:
            return None
        log.warning(
            "a request for '%s' arrived %d ms after its caller gave up: not run",
            model,
            late_ms,
        )
        return TritonError(late_text(late_ms), TritonError.UNAVAILABLE)

    def late_ms(self, sent: Any) -> int | None:
        """How many ms past its caller's wait a stamped request arrived (None: in time)."""
        try:
            sender, sent_ns, wait_ms = sent
            delay = time.monotonic_ns() - int(sent_ns)
            wait_ns = int(wait_ms) * 1_000_000
        except (TypeError, ValueError):
            return None  # unstamped (a caller on this host in-process, NATS) or malformed
        now = time.monotonic()
        window = self._callers.get(sender)
        if window is None:
            if len(self._callers) > 4096:  # callers come and go (restarts): keep it bounded
                self._callers.clear()
            self._callers[sender] = _Window(delay, now)
            return None
        if now - window.since > WINDOW_S:
            window.previous, window.current, window.since = window.current, delay, now
        elif delay < window.current:
            window.current = delay
        lateness = delay - min(window.current, window.previous)
        if lateness <= wait_ns:
            return None
        return (lateness - wait_ns) // 1_000_000


LATE_TEXT = "arrived after its caller gave up"


def late_text(late_ms: int) -> str:
    return f"the request {LATE_TEXT} ({late_ms} ms past its wait): not run"


def arrived_late(message: str) -> bool:
    return LATE_TEXT in message


ARRIVALS = Arrivals()
