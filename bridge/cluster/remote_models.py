"""BLS calls and ensemble steps into models other bridge processes serve, through Dynamo.

`DynamoRemoteModels` is the loader's `RemoteModels` (model_repository_loader/composition/
remote.py), installed by the ModelManager. The loader asks it only for names not loaded here.

- Where a model lives: the `index` of every bridge process's control endpoint, read through
  the cluster's one client of it (index.py `ClusterIndex`: its cache, when it is asked again,
  how long an answer may take). Besides its rules, a round is asked for on a miss (a model
  loaded somewhere since) and when a cached endpoint has no instance any more (a reload moved
  the model to a new generation, or its worker stopped). This process's own entries are
  skipped: its models are local, and the loader never asks for them.
- How a request goes: through an `Instances` (instances.py) of the model's endpoint (the
  ClusterIndex's client of it), as the door sends: the replica with the fewest of this
  process's calls in flight, workers found unreachable left out until they answer. In the
  bridge form (codec.py): raw `bytes` both ways, no per-element work, errors as items.
- Threads: the loader calls from a model's thread (BLS `exec`), an executor thread
  (`async_exec`), or the event loop itself (an ensemble's first steps). Everything Dynamo is done
  on the runtime's loop, scheduled with `run_coroutine_threadsafe`; only `find` waits for it,
  and it is never called on the loop.
- Cancel: `RemoteCall.cancel()` stops the call's Dynamo context; the serving worker sees its
  client gone and cancels the model's request (worker.py). The target's later responses are
  dropped on the way, so the call ends with a flag-only final here.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from dynamo._core import Context
from google.protobuf.message import DecodeError
from tritonclient.grpc import model_config_pb2 as mc

from model_repository_loader.composition import RemoteRespond, RemoteTarget
from model_repository_loader.inference import InferRequest
from model_repository_loader.pb_utils import InferenceResponse, TritonError
from model_repository_loader.tracing import RequestTrace

from ..codec import decode_bridge_item, encode_bridge_request
from ..transport.arrival import stamp
from .index import ClusterIndex, EndpointWithdrawn, IndexRound
from .instances import Failure, Instances, classify
from .protocol import IndexRow

log = logging.getLogger(__name__)

# Bound of `find`'s wait for the loop: a backstop, the index calls are bounded themselves
# (index.py ANSWER_TIMEOUT_S).
FIND_TIMEOUT_S = 30.0


@dataclass(frozen=True, slots=True)
class _Entry:
    endpoint: str
    target: RemoteTarget


class RemoteCall:
    """One call in flight; `cancel()` from any thread stops its Dynamo context."""

    __slots__ = ("_loop", "context", "cancelled")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.context = Context()
        self.cancelled = False

    def cancel(self) -> None:
        if self.cancelled:
            return
        self.cancelled = True
        try:
            self._loop.call_soon_threadsafe(self.context.stop_generating)
        except RuntimeError:
            pass  # the loop is closed: nothing runs any more


class DynamoRemoteModels:
    """The loader's RemoteModels over Dynamo (see the module doc)."""

    def __init__(
        self, index: ClusterIndex, loop: asyncio.AbstractEventLoop, own_worker: str
    ) -> None:
        self._index = index
        self._loop = loop
        self._loop_thread = threading.get_ident()  # made on the loop (ModelManager.start)
        self._own_worker = own_worker
        # model name → where it is served, from the index's latest round; replaced whole
        self._targets: dict[str, _Entry] = {}
        # endpoint → how its instances are chosen (on the loop); kept while its client is
        self._instances: dict[str, Instances] = {}
        index.on_round.append(self._merge)

    async def start(self) -> None:
        """Once this process's control endpoint is listed (the index is started by the
        composition root), so that the first lookup already sees the other processes."""
        await self._index.listed()

    # -- the loader's side (any thread) ---------------------------------------------------------

    def find(self, name: str) -> RemoteTarget | None:
        cached = self._cached(name)
        if cached is not None:
            return cached.target
        if self._on_loop():
            # Waiting here would stop the very loop that answers: say "not served" instead.
            log.error("remote lookup of '%s' on the event loop refused", name)
            return None
        try:
            entry = self._wait(self._lookup(name), FIND_TIMEOUT_S)
        except Exception as exc:  # runtime gone, lookup failed: nobody serves it for us
            log.warning("looking up '%s' in other processes failed: %r", name, exc)
            return None
        return entry.target if entry is not None else None

    def submit(self, name: str, request: InferRequest, respond: RemoteRespond) -> RemoteCall:
        once = _Once(respond)
        call = RemoteCall(self._loop)
        try:
            # Encoded on the caller's thread: the loop only hands bytes over.
            body = encode_bridge_request(request)
            if request.trace is not None:  # the callee measures its part (tracing.py)
                levels = ["TIMESTAMPS", "TENSORS"] if request.trace.tensors else ["TIMESTAMPS"]
                body["trace"] = {"level": levels}
                request.trace.sent(name)
        except Exception as exc:
            once(_internal(f"BLS call to '{name}' could not be encoded: {exc!r}"), True, False)
            return call
        running = self._run(name, body, once, call, request.trace)
        try:
            asyncio.run_coroutine_threadsafe(running, self._loop)
        except RuntimeError as exc:  # the loop is closed: the server is stopping
            running.close()
            once(_internal(f"BLS call to '{name}' could not be sent: {exc}"), True, False)
        return call

    def _cached(self, name: str) -> _Entry | None:
        """The cache's entry for `name` while no bridge process came or went, read from any
        thread without a hop to the loop (the index is replaced whole, never changed)."""
        targets = self._targets
        self._index.used()
        if name not in targets or self._index.outdated():
            return None
        return targets[name]

    # -- on the loop ----------------------------------------------------------------------------

    async def _run(
        self,
        name: str,
        body: dict[str, Any],
        respond: _Once,
        call: RemoteCall,
        trace: RequestTrace | None = None,
    ) -> None:
        try:
            stream = await self._open(name, body, call)
            if stream is None:
                respond(None, True, True)  # no process serves it: the loader words it
                return
            async for item in stream:
                if trace is not None and item.get("final"):
                    trace.adopt(item.pop("trace", None))
                response, final, rejected = decode_bridge_item(item)
                respond(response, final, rejected)
                if final:
                    return
            if not call.cancelled:
                log.warning("'%s': the remote stream ended before its final response", name)
                respond(_internal(f"the response stream of '{name}' ended early"), True, False)
        except Exception as exc:
            if not call.cancelled:
                log.warning("BLS call to '%s' in another process failed: %r", name, exc)
                respond(_internal(f"BLS call to '{name}' failed: {exc}"), True, False)
        finally:
            if trace is not None:
                trace.end()  # a no-op once adopted
            respond(None, True, False)  # a no-op unless nothing final was said (cancelled)

    async def _open(self, name: str, body: dict[str, Any], call: RemoteCall) -> Any:
        """The response stream of `body` sent to `name`, or None when no process serves it.

        A cached endpoint that turns out stale (no instance any more) is forgotten and looked up
        once more from a fresh index.
        """
        for attempt in range(2):
            entry = await self._lookup(name, refresh=attempt > 0)
            if entry is None:
                return None
            try:
                client = await self._index.endpoint_client(entry.endpoint, self._withdrawn(entry))
            except EndpointWithdrawn:
                client = None
            if client is not None and client.instance_ids():
                instances = self._instances.get(entry.endpoint)
                if instances is None or instances.client is not client:
                    instances = Instances(client)
                    self._instances[entry.endpoint] = instances
                try:
                    return await instances.open(stamp(body), call.context)
                except Exception as exc:  # no worker left on it, connection refused ...
                    if classify(exc) is Failure.UNREACHABLE:
                        raise  # it may have reached the worker: never sent twice
                    log.debug("'%s' at %s: %r; looking again", name, entry.endpoint, exc)
            self._index.forget_endpoint(entry.endpoint)
            self._instances.pop(entry.endpoint, None)
        return None

    def _withdrawn(self, entry: _Entry) -> Callable[[], Awaitable[bool]]:
        """Whether a fresh index, heard from every live process, names `entry`'s endpoint no
        more (then nothing waits for an instance that will never come)."""

        async def withdrawn() -> bool:
            answered = await self._index.fresh()
            named = any(t.endpoint == entry.endpoint for t in self._targets.values())
            return answered.complete and not named

        return withdrawn

    async def _lookup(self, name: str, refresh: bool = False) -> _Entry | None:
        self._index.used()
        if refresh or self._index.outdated() or name not in self._targets:
            await self._index.fresh()
        return self._targets.get(name)

    async def _merge(self, answered: IndexRound) -> None:
        """A new round's rows that can take requests, by name (another process's first)."""
        targets: dict[str, _Entry] = {}
        for _, answer in answered.answers:
            if answer.worker == self._own_worker:
                continue
            for row in answer.models:
                entry = _entry(row)
                if entry is not None:
                    targets.setdefault(entry.target.name, entry)
        self._targets = targets

    def _on_loop(self) -> bool:
        return threading.get_ident() == self._loop_thread

    def _wait(self, coroutine: Coroutine[Any, Any, Any], timeout: float) -> Any:
        future: concurrent.futures.Future[Any] = asyncio.run_coroutine_threadsafe(
            coroutine, self._loop
        )
        return future.result(timeout)


class _Once:
    """The loader's respond, guarded: nothing after the final response."""

    __slots__ = ("_respond", "_done", "_lock")

    def __init__(self, respond: RemoteRespond) -> None:
        self._respond = respond
        self._done = False
        self._lock = threading.Lock()

    def __call__(self, response: InferenceResponse | None, final: bool, rejected: bool) -> None:
        with self._lock:
            if self._done:
                return
            self._done = final
        self._respond(response, final, rejected)


def _entry(row: IndexRow) -> _Entry | None:
    """An index row that can take requests, as a cache entry; None otherwise."""
    if not row.takes_requests:
        return None
    try:
        target = RemoteTarget(
            name=row.name,
            versions=frozenset(int(v) for v in row.versions),
            config=mc.ModelConfig.FromString(row.config),
        )
    except (TypeError, ValueError, DecodeError) as exc:
        log.debug("unusable index entry %r: %r", row.name, exc)
        return None
    return _Entry(row.endpoint, target)


def _internal(message: str) -> InferenceResponse:
    return InferenceResponse._create([], TritonError(message, TritonError.INTERNAL))
