"""Which instance of a model endpoint a request goes to, and which instances are left out.

The triton door's request-plane routes (bridge/frontends/triton/routes.py) and BLS calls into
other processes (remote_models.py) both send through an `Instances`.

**Selection: fewest requests in flight.** Each `Instances` counts its own requests per
instance, from the open until the final item, and picks the instance with the fewest; ties go
round robin. A healthy instance finishes its requests; one that stalls (cut off by a partition,
hung) keeps them, so new requests go to its replicas at once, before any timeout has said
anything (Envoy's LEAST_REQUEST; Dynamo's `round_robin` would keep sending it its share).

**Out of rotation**, by what the request plane said when a request was opened:

* *gone*: the request never reached the instance ("TCP connection to … failed", "unknown
  endpoint": a worker that crashed stays listed until its lease ends). Nothing ran, so the
  request is sent on to another instance (MAX_TRIES in all), and the instance is left out for
  GONE_S; a worker restarted meanwhile is a new instance.
* *unreachable*: the request plane gave up waiting for the instance to acknowledge the request
  (`DYN_TCP_REQUEST_TIMEOUT`; bridge processes default it to 1 s, bridge/tuning.py), or its
  connection broke. The request may have reached the worker, so it is **not** sent again: the
  caller gets UNAVAILABLE, and a worker never starts a request that arrives after its caller
  gave up (bridge/transport/arrival.py). The instance is *ejected*: left out until it answers
  a ping sent the way requests go (this endpoint's client, so its own connections: after a
  partition heals, each connection of the request plane's pool recovers at its own
  retransmission, and a ping by another client proved nothing about this one's; measured, it
  let the instance back while this endpoint's requests still timed out). A bridge worker
  answers `PING` at once, without its model; an endpoint of another kind of worker is tried
  again after EJECT_S instead.

Instances out of rotation are still tried when no other is listed (a lone worker that comes
back is used at once, not after its probe).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import AsyncIterator, Callable
from enum import Enum
from typing import Any

from dynamo.runtime import Context

from ..codec import PING

log = logging.getLogger(__name__)

# How long an instance found gone is left out before it is tried again (it may only have been
# unreachable for a moment): Dynamo's own inhibition period.
GONE_S = 5.0
# Instances one request tries at most: after a restart of every worker, the dead half of the
# list comes first as often as not, until each has been found gone once.
MAX_TRIES = 4
# How often an ejected instance is pinged, and how long one ping may take: a live worker answers
# at once. An instance that cannot be pinged (not a bridge worker) is tried again after EJECT_S.
PROBE_S = 0.5
PING_TIMEOUT_S = 1.0
EJECT_S = 5.0


class Failure(Enum):
    GONE = "gone"  # never reached the instance: safe to send elsewhere
    UNREACHABLE = "unreachable"  # may have reached it: not sent again, the instance ejected
    OTHER = "other"  # not the transport's: the caller's


# The request plane's words (ai-dynamo-runtime 1.6.1, measured): a request that reached no
# handler, and a request whose acknowledgement never came or whose connection broke.
_GONE_TEXTS = ("TCP connection to", "unknown endpoint", "not found for endpoint")
_UNREACHABLE_TEXTS = (
    "timed out",  # "DeadlineExceeded: TCP request to <addr> timed out"
    "Connection closed",  # "... Connection closed before response was received"
    "Connection unhealthy",
    "Reader task closed",
)


def classify(exc: BaseException) -> Failure:
    """What a failure to open a request's stream says about the instance."""
    text = str(exc)
    if text.startswith("Unavailable:") and any(t in text for t in _GONE_TEXTS):
        return Failure.GONE
    if any(t in text for t in _UNREACHABLE_TEXTS):
        return Failure.UNREACHABLE
    return Failure.OTHER


def instance_gone(exc: BaseException) -> bool:
    """The request could not reach the instance: it is gone (crashed, or its runtime stopped)."""
    return classify(exc) is Failure.GONE


class Instances:
    """Fewest requests in flight over an endpoint's instances that are in rotation (module doc).

    `open` gives a request's items; the request counts as in flight on its instance until its
    final item has been taken, or its stream ends or is dropped."""

    __slots__ = ("client", "pingable", "_gone", "_ejected", "_in_flight", "_turn")

    def __init__(self, client: Any, pingable: bool = True) -> None:
        self.client = client  # a Dynamo endpoint client
        self.pingable = pingable  # its instances are bridge workers: they answer PING
        self._gone: dict[int, float] = {}  # instance id -> loop time it was found gone
        self._ejected: dict[int, asyncio.Future[None]] = {}  # instance id -> its probe
        self._in_flight: dict[int, int] = {}
        self._turn = itertools.count()

    def _out(self, instance_id: int) -> bool:
        return instance_id in self._gone or instance_id in self._ejected

    def ejected(self) -> list[int]:
        return list(self._ejected)

    def _candidates(self) -> list[int]:
        now = asyncio.get_running_loop().time()
        ids = sorted(self.client.instance_ids())
        for instance_id in [i for i, t in self._gone.items() if i not in ids or now - t > GONE_S]:
            del self._gone[instance_id]
        if not ids:
            return []
        turn = next(self._turn) % len(ids)
        rotated = ids[turn:] + ids[:turn]
        # Fewest in flight first (a stable sort keeps the rotation among equals); those out of
        # rotation last, tried only when nothing else is listed.
        return sorted(rotated, key=lambda i: (self._out(i), self._in_flight.get(i, 0)))

    async def open(
        self,
        request: Any,
        context: Context,
        shape: Callable[[int, Any], Any] | None = None,
    ) -> AsyncIterator[Any]:
        """`shape(instance_id, request)`, when given, is what that instance is sent."""
        # The first, then others while they turn out gone (fast: nothing listens there).
        candidates = self._candidates()[:MAX_TRIES]
        if not candidates:  # Dynamo's own answer: "No workers available for endpoint …"
            stream: AsyncIterator[Any] = await self.client.round_robin(
                request, annotated=False, context=context
            )
            return stream
        for attempt, instance_id in enumerate(candidates):
            sent = request if shape is None else shape(instance_id, request)
            self._in_flight[instance_id] = self._in_flight.get(instance_id, 0) + 1
            try:
                stream = await self.client.direct(
                    sent, instance_id, annotated=False, context=context
                )
            except Exception as exc:
                self._done(instance_id)
                failure = classify(exc)
                if failure is Failure.UNREACHABLE:
                    self._eject(instance_id, exc)
                if failure is not Failure.GONE or attempt == len(candidates) - 1:
                    raise
                self._gone[instance_id] = asyncio.get_running_loop().time()
                continue
            return self._counted(stream, instance_id)
        raise AssertionError("unreachable")

    async def _counted(self, stream: AsyncIterator[Any], instance_id: int) -> AsyncIterator[Any]:
        counted = True
        try:
            async for item in stream:
                if isinstance(item, dict) and item.get("final", False):
                    counted = False
                    self._done(instance_id)
                yield item
        finally:
            if counted:
                self._done(instance_id)

    def _eject(self, instance_id: int, reason: BaseException) -> None:
        if instance_id in self._ejected:
            return
        log.warning(
            "worker %x does not answer (%s): no new requests go to it until it answers again",
            instance_id,
            reason,
        )
        self._ejected[instance_id] = asyncio.ensure_future(self._probe(instance_id))

    async def _probe(self, instance_id: int) -> None:
        try:
            while True:
                await asyncio.sleep(PROBE_S if self.pingable else EJECT_S)
                if instance_id not in self.client.instance_ids():
                    return  # left discovery: nothing to let back
                if not self.pingable:
                    log.warning("worker %x is tried again (it cannot be pinged)", instance_id)
                    return
                if await self._ping(instance_id):
                    log.warning("worker %x answers its ping: back in rotation", instance_id)
                    return
        finally:
            self._ejected.pop(instance_id, None)

    async def _ping(self, instance_id: int) -> bool:
        try:
            async with asyncio.timeout(PING_TIMEOUT_S):
                stream = await self.client.direct(PING, instance_id, annotated=False)
                async for item in stream:
                    return isinstance(item, dict) and item.get("pong") == 1
        except Exception:  # timed out, connection broken, gone: not back yet
            return False
        return False

    def close(self) -> None:
        """Stop the probes (the endpoint is forgotten)."""
        for probe in list(self._ejected.values()):
            probe.cancel()

    def _done(self, instance_id: int) -> None:
        left = self._in_flight.get(instance_id, 0) - 1
        if left > 0:
            self._in_flight[instance_id] = left
        else:
            self._in_flight.pop(instance_id, None)
