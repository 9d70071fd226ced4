"""`ClusterIndex`: the one client of the control endpoint (protocol.py, docs/worker_protocol.md
§1). BLS across workers (remote_models.py) and the triton door (bridge/frontends/triton/
directory.py) read which bridge worker serves what through it, and the door sends its other
control ops (stats, folders, load, unload, log settings) through it. A process has one: the
composition root (bridge/server.py) builds it, hands it to every role that reads it, and starts
and stops it; each reader keeps its own view of a round as a hook (`on_round`).

Its rules, set here once:
- The cache: one round of `index` answers, one per control instance (`current`), replaced
  whole, so any thread may read it without a hop to the loop.
- When a round is asked again: when the set of control instances changed (a process came or
  went), when this process said that one of its own models changed (`invalidate`, told
  in-process at once, so the very next request sees a load, unload or reload with no poll to
  race), when a caller finds the cache lacking (a name missing, an endpoint with no instance
  left: it asks `fresh()`), and every REFRESH_S while lookups use it (`used`): a reload in
  another process serves the model on a new endpoint and that worker withdraws the old one only
  once no request has reached it for a moment, so callers must move on by themselves.
- Concurrent refreshes share one round, but `fresh()` never returns a round asked for before it
  was called.
- How long an answer may take: OP_TIMEOUT_S, per op. A worker that does not answer in time, or
  is gone (crashed, its runtime stopped: listed until its lease ends), is left out of the round;
  the round is `complete` only when every instance left out was gone.
- Model endpoint clients: made once per endpoint and kept (`endpoint_client`); a new one waits
  INSTANCE_WAIT_S for its first instance, unless the caller finds the endpoint withdrawn.
  Concurrent first requests share one making. The Dynamo endpoint objects behind them are
  made once, when a round first names their endpoint, before any request needs one, and
  dropped when a complete round names them no more and no client uses them: on the nats
  request plane each `endpoint()` call can wedge the process while responses are arriving
  (bridge/dynamo_endpoints.py).
- Workers this process cannot reach: each round first probes the request-plane address of every
  worker new to it (address_probe.py); one that does not accept a connection is left out of the
  round (its models are not ready through it), of `instance_ids()` and of every model endpoint's
  client, and probed again every PROBE_AGAIN_S until it answers.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from dynamo.runtime import DistributedRuntime, Endpoint

from ..dynamo_endpoints import dynamo_endpoint
from .address_probe import AddressProbe, ReachableClient
from .instances import instance_gone
from .protocol import IndexAnswer, Op, control_path, control_request

log = logging.getLogger(__name__)

# How long one worker's answer to a control op may take. The reads are answered from the
# worker's memory at once, so a worker that takes longer is hung (or partitioned away) and must
# not hold every lookup, ModelReady or statistics call up; 10 s leaves room for a worker whose
# loop is busy for a moment (a load's start, a burst of requests). A folder scan, a load and an
# unload take the time they take (a model's initialize may run for minutes): no bound here;
# the client's own deadline bounds them.
ANSWER_TIMEOUT_S = 10.0
OP_TIMEOUT_S: dict[Op, float | None] = {
    Op.INDEX: ANSWER_TIMEOUT_S,
    Op.STATS: ANSWER_TIMEOUT_S,
    Op.LOG_SETTINGS: ANSWER_TIMEOUT_S,
    Op.FOLDERS: None,
    Op.LOAD: None,
    Op.UNLOAD: None,
    # Each instance's is_ready() is bounded by the worker (5 s, as Triton), one after another.
    Op.READY: 60.0,
}
# While lookups use the cache: how old it may get before it is asked again (see the module doc;
# a quarter second moves callers to a reloaded model's new endpoint well within the worker's
# quiet period before it withdraws the old one).
REFRESH_S = 0.25
# How long a new client waits to see the first instance of an endpoint the index named (the
# control endpoint itself at start-up, when this process serves it too): discovery lists a new
# instance within a second or two; a longer wait means it is not coming.
INSTANCE_WAIT_S = 10.0


class EndpointWithdrawn(Exception):
    """The endpoint a request was about to go to is no longer in the index: nothing was sent."""


@dataclass(frozen=True, slots=True)
class IndexRound:
    """One round of `index` answers (see the module doc)."""

    number: int = 0  # rounds answered before this one
    answers: tuple[tuple[int, IndexAnswer], ...] = ()  # (control instance, its answer)
    instances: frozenset[int] = frozenset()  # the control instances listed when it was asked
    complete: bool = False  # heard from every instance that is not gone


class ClusterIndex:
    """The control endpoint's client (see the module doc)."""

    def __init__(self, runtime: DistributedRuntime, namespace: str) -> None:
        self._runtime = runtime
        self._path = control_path(namespace)
        self._control: Any = None
        self.current = IndexRound()
        self._stale = False  # this process changed a model since the last round began
        self._used = False  # a lookup used the cache since the last round
        self._lock = asyncio.Lock()  # one round at a time
        self._asked = 0  # refresh tickets handed out
        self._answered = 0  # the newest ticket a round answered
        self._gone_logged: set[int] = set()  # control instances found gone (said once)
        self._clients: dict[str, ReachableClient] = {}  # model endpoint → its Dynamo client
        self._making: dict[str, asyncio.Future[ReachableClient]] = {}  # clients being made
        self._endpoints: dict[str, Endpoint] = {}  # path → Dynamo's endpoint object, made once
        self.probe = AddressProbe(self.invalidate)  # the workers this process cannot reach
        self._refresher: asyncio.Future[None] | None = None
        # Awaited with each new round before `fresh()` returns it: the readers' own views of it
        # (the door's merged entries, BLS's targets), made once per round, off the hot path.
        self.on_round: list[Callable[[IndexRound], Awaitable[None]]] = []
        # Called with the control instances that appeared since the last round (not waited on).
        self.on_new_workers: list[Callable[[list[int]], None]] = []

    async def start(self) -> None:
        """Watch the control endpoint from now on, and keep the cache fresh while it is used.
        The composition root (bridge/server.py) starts the process's one index, before any of
        its readers serves, and stops it."""
        if self._control is not None:
            return
        self._control = await self._endpoint(self._path).client()
        self._refresher = asyncio.ensure_future(self._keep_fresh())

    async def listed(self) -> None:
        """Wait until the control endpoint lists an instance (at most INSTANCE_WAIT_S): when
        this process serves it too, discovery has then caught up with the processes already
        running, so a first lookup sees them."""
        try:
            await asyncio.wait_for(self._control.wait_for_instances(), INSTANCE_WAIT_S)
        except asyncio.TimeoutError:
            log.warning("the bridge control endpoint lists no instance yet")

    def stop(self) -> None:
        if self._refresher is not None:
            self._refresher.cancel()
        self.probe.close()

    def instance_ids(self) -> list[int]:
        """The bridge workers listed, less those this process cannot reach."""
        left_out = self.probe.unreachable
        return [i for i in self._control.instance_ids() if i not in left_out]

    # -- the cache ----------------------------------------------------------------------------

    def used(self) -> None:
        """A lookup used the cache: keep it fresh (REFRESH_S)."""
        self._used = True

    def invalidate(self) -> None:
        """This process changed what serves a model: the next lookup asks again."""
        self._stale = True

    def outdated(self) -> bool:
        """Whether `current` must be asked again before it is trusted (any thread)."""
        control = self._control
        return (
            control is None
            or self._stale
            or frozenset(control.instance_ids()) != self.current.instances
        )

    async def fresh(self) -> IndexRound:
        """A round asked for after this call."""
        self._asked += 1
        ticket = self._asked
        async with self._lock:
            if self._answered >= ticket:
                return self.current  # a round that started after our call has answered
            started = self._asked
            before = self.current.instances
            self._stale = False  # a change told from now on makes the next lookup ask again
            answered = await self._ask_round()
            self._keep_endpoints(answered)
            for merge in self.on_round:  # the readers' views, made from the same round
                await merge(answered)
            self.current = answered
            joined = answered.instances - before
            if joined:  # new workers (the first round too: they get what changed before)
                for hook in self.on_new_workers:
                    hook(sorted(joined))
            self._answered = started
        return self.current

    async def _keep_fresh(self) -> None:
        while True:
            await asyncio.sleep(REFRESH_S)
            if self._used:
                self._used = False
                try:
                    await self.fresh()
                except Exception as exc:  # keep refreshing; the next round may succeed
                    log.warning("refreshing the model index failed: %s", exc)

    async def _ask_round(self) -> IndexRound:
        listed = list(self._control.instance_ids())
        # Before anything is asked of a new worker: can this process reach it at all?
        unreachable = await self.probe.check(self._control.instances())
        ids = [i for i in listed if i not in unreachable]
        gone: set[int] = set()
        answers = await asyncio.gather(*(self._index_of(i, gone) for i in ids))
        complete = True
        heard = []
        for instance_id, answer in zip(ids, answers, strict=True):
            if answer is None:
                # A worker that is gone stays listed until its lease expires; it serves
                # nothing, so the index lacks nothing without it (nor without one this
                # process cannot reach, left out above: nothing of it is served here).
                complete = complete and instance_id in gone
            else:
                heard.append((instance_id, IndexAnswer.from_wire(answer)))
        return IndexRound(self.current.number + 1, tuple(heard), frozenset(listed), complete)

    async def _index_of(self, instance_id: int, gone: set[int]) -> dict[str, Any] | None:
        answer = await self.ask(instance_id, control_request(Op.INDEX), gone)
        if answer is not None and "error" in answer:
            log.warning("worker %x answered %s with %r", instance_id, Op.INDEX, answer)
            return None
        return answer

    # -- control ops --------------------------------------------------------------------------

    async def ask(
        self, instance_id: int, request: dict[str, Any], gone: set[int] | None = None
    ) -> dict[str, Any] | None:
        """One control op's answer from one worker, bounded by OP_TIMEOUT_S (its errors are
        answers, returned). None when the worker does not answer; its id is then added to
        `gone` if the worker is gone, logged once."""
        op = request.get("op")
        try:
            timeout = OP_TIMEOUT_S[Op(str(op))]
        except ValueError:  # not an op of ours: the worker answers INVALID_ARG at once
            timeout = ANSWER_TIMEOUT_S
        try:
            async with asyncio.timeout(timeout):
                stream = await self._control.direct(request, instance_id, annotated=False)
                async for item in stream:
                    if isinstance(item, dict):
                        return item
                    log.warning("worker %x answered %s with %r", instance_id, op, item)
                    return None
        except TimeoutError:
            log.info("worker %x did not answer %s in time", instance_id, op)
        except Exception as exc:  # a worker going away mid-question: the others still count
            if not instance_gone(exc):
                log.info("worker %x did not answer %s: %s", instance_id, op, exc)
            else:
                if gone is not None:
                    gone.add(instance_id)
                if instance_id not in self._gone_logged:
                    self._gone_logged.add(instance_id)
                    log.info("worker %x is gone (until its lease ends): %s", instance_id, exc)
        return None

    async def ask_each(
        self, request: dict[str, Any], instance_ids: list[int] | None = None
    ) -> list[dict[str, Any] | None]:
        """One control op to every bridge worker (or those of `instance_ids`); their answers
        (None: none in time)."""
        ids = self.instance_ids() if instance_ids is None else instance_ids
        return await asyncio.gather(*(self.ask(i, request) for i in ids))

    # -- model endpoints ----------------------------------------------------------------------

    async def endpoint_client(self, endpoint: str, withdrawn: Callable[[], Awaitable[bool]]) -> Any:
        """A Dynamo client of a model endpoint (listing only the instances this process can
        reach), made once and kept; concurrent callers share its making (see the module doc).
        A new one that lists no instance asks `withdrawn()` (which looks at a fresh index)
        before it waits: EndpointWithdrawn at once when the endpoint is gone for good."""
        client = self._clients.get(endpoint)
        if client is not None:
            return client
        making = self._making.get(endpoint)
        if making is None:
            making = self._making[endpoint] = asyncio.ensure_future(
                self._make_client(endpoint, withdrawn)
            )
            making.add_done_callback(lambda _: self._making.pop(endpoint, None))
        # Shielded: a caller that gives up does not cancel the others' making.
        return await asyncio.shield(making)

    async def _make_client(
        self, endpoint: str, withdrawn: Callable[[], Awaitable[bool]]
    ) -> ReachableClient:
        client = ReachableClient(await self._endpoint(endpoint).client(), self.probe)
        if not client.instance_ids():
            if await withdrawn():
                raise EndpointWithdrawn("no instance, and the index no longer names it")
            try:
                await asyncio.wait_for(client.wait_for_instances(), INSTANCE_WAIT_S)
            except asyncio.TimeoutError:
                pass  # the call itself says "no instances"
        self._clients[endpoint] = client
        return client

    def _keep_endpoints(self, answered: IndexRound) -> None:
        """The endpoint objects of the endpoints `answered` names, made now (module doc). Once a
        complete round names one no more and no client uses it (a reload's old generation), it
        is let go; a round that missed a worker (cut off, slow) keeps that worker's, or the
        next round would make them again, each `endpoint()` call a risk on nats."""
        named = {row.endpoint for _, answer in answered.answers for row in answer.models}
        named.discard("")
        for path in named:
            self._endpoint(path)
        if not answered.complete:
            return
        for path in [p for p in self._endpoints if p not in named and p not in self._clients]:
            if path != self._path:
                del self._endpoints[path]

    def _endpoint(self, path: str) -> Endpoint:
        endpoint = self._endpoints.get(path)
        if endpoint is None:
            endpoint = self._endpoints[path] = dynamo_endpoint(self._runtime, path)
        return endpoint

    def routable(self, endpoint: str) -> bool:
        """False when a kept client of `endpoint` has lost its instances (withdrawn)."""
        client = self._clients.get(endpoint)
        return client is None or bool(client.instance_ids())

    def forget_endpoint(self, endpoint: str) -> None:
        """Nothing is sent to `endpoint` again until a new client is made."""
        self._clients.pop(endpoint, None)
        self._endpoints.pop(endpoint, None)
