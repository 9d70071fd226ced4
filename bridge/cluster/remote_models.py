"""BLS calls and ensemble steps into models other bridge processes serve, through Dynamo.

`DynamoRemoteModels` is the loader's `RemoteModels` (model_repository_loader/composition/
remote.py), installed by the ModelManager. The loader asks it only for names not loaded here.

- Where a model lives: the `index` of every bridge process's control endpoint
  (control_endpoint.py), cached. The cache is rebuilt when the control endpoint's
  `instance_ids()` change (a process came or went), on a miss (a model loaded somewhere since),
  and when a cached endpoint has no instance any more (a reload moved the model to a new
  generation, or its worker stopped). This process's own entries are skipped: its models are
  local, and the loader never asks for them.
- How a request goes: `client.round_robin(request, annotated=False, context=...)` on the model's
  endpoint (one cached client per endpoint), in the bridge form (codec.py): raw `bytes` both ways,
  no per-element work, errors as items. Dynamo routes between replicas.
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
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

from dynamo._core import Context
from dynamo.runtime import DistributedRuntime
from tritonclient.grpc import model_config_pb2 as mc

from model_repository_loader.composition import RemoteRespond, RemoteTarget
from model_repository_loader.inference import InferRequest
from model_repository_loader.pb_utils import InferenceResponse, TritonError
from model_repository_loader.tracing import RequestTrace

from ..codec import decode_bridge_item, encode_bridge_request
from .protocol import Op, control_path, control_request

log = logging.getLogger(__name__)

# Bound of one control call (`index`) to one process: a process that died without leaving
# discovery must not hold every lookup up.
INDEX_TIMEOUT_S = 5.0
# Bound of `find`'s wait for the loop: a backstop, the index calls are bounded themselves.
FIND_TIMEOUT_S = 30.0
# How long a new endpoint client may take to see the instances the index named.
INSTANCES_TIMEOUT_S = 5.0


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
        self,
        runtime: DistributedRuntime,
        namespace: str,
        loop: asyncio.AbstractEventLoop,
        own_worker: str,
    ) -> None:
        self._runtime = runtime
        self._loop = loop
        self._loop_thread = threading.get_ident()  # made on the loop (ModelManager.start)
        self._control_path = control_path(namespace)
        self._own_worker = own_worker
        self._control: Any = None
        self._index: dict[str, _Entry] = {}
        self._seen: tuple[int, ...] | None = None  # control instances at the last refresh
        self._refreshes = 0
        self._refresh_lock: asyncio.Lock | None = None
        self._clients: dict[str, Any] = {}

    async def start(self) -> None:
        """Watch the control endpoint from now on, so that the first lookup already sees the
        other processes (discovery lists them shortly after a client is made)."""
        await self._control_client()

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
        control, index = self._control, self._index
        if control is None or name not in index:
            return None
        if tuple(sorted(control.instance_ids())) != self._seen:
            return None
        return index[name]

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
            client = await self._client(entry.endpoint)
            if client is not None and client.instance_ids():
                try:
                    return await client.round_robin(body, annotated=False, context=call.context)
                except Exception as exc:  # no worker left on it, connection refused ...
                    log.debug("'%s' at %s: %r; looking again", name, entry.endpoint, exc)
            self._clients.pop(entry.endpoint, None)
        return None

    async def _lookup(self, name: str, refresh: bool = False) -> _Entry | None:
        control = await self._control_client()
        seen = tuple(sorted(control.instance_ids()))
        if refresh or seen != self._seen or name not in self._index:
            await self._refresh(control)
        return self._index.get(name)

    async def _refresh(self, control: Any) -> None:
        """Ask every bridge process for its index; concurrent refreshes share one."""
        if self._refresh_lock is None:
            self._refresh_lock = asyncio.Lock()
        started = self._refreshes
        async with self._refresh_lock:
            if self._refreshes != started:
                return  # another refresh ran while this one waited: it is fresh enough
            seen = tuple(sorted(control.instance_ids()))
            answers = await asyncio.gather(*(self._index_of(control, i) for i in seen))
            index: dict[str, _Entry] = {}
            for answer in answers:
                if not answer or answer.get("worker") == self._own_worker:
                    continue
                for model in answer.get("models", ()):
                    entry = _entry(model)
                    if entry is not None:
                        index.setdefault(entry.target.name, entry)
            self._index = index
            self._seen = seen
            self._refreshes += 1

    async def _index_of(self, control: Any, instance: int) -> dict[str, Any] | None:
        async def ask() -> dict[str, Any] | None:
            stream = await control.direct(control_request(Op.INDEX), instance, annotated=False)
            async for item in stream:
                return item if isinstance(item, dict) else None
            return None

        try:
            return await asyncio.wait_for(ask(), INDEX_TIMEOUT_S)
        except Exception as exc:  # a process going away: the others still answer
            log.debug("index of bridge instance %x failed: %r", instance, exc)
            return None

    async def _control_client(self) -> Any:
        if self._control is None:
            control = await self._runtime.endpoint(self._control_path).client()
            try:  # this process serves it too: an instance shows up soon
                await asyncio.wait_for(control.wait_for_instances(), INSTANCES_TIMEOUT_S)
            except asyncio.TimeoutError:
                log.warning("the bridge control endpoint lists no instance yet")
            self._control = control
        return self._control

    async def _client(self, endpoint: str) -> Any:
        client = self._clients.get(endpoint)
        if client is None:
            client = await self._runtime.endpoint(endpoint).client()
            try:
                await asyncio.wait_for(client.wait_for_instances(), INSTANCES_TIMEOUT_S)
            except asyncio.TimeoutError:
                return None
            self._clients[endpoint] = client
        return client

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


def _entry(model: dict[str, Any]) -> _Entry | None:
    """An index entry that can take requests, as a cache entry; None otherwise."""
    try:
        if not model.get("ready") or not model.get("endpoint"):
            return None
        target = RemoteTarget(
            name=model["name"],
            versions=frozenset(int(v) for v in model.get("versions", ())),
            config=mc.ModelConfig.FromString(model["config"]),
        )
        return _Entry(model["endpoint"], target)
    except (KeyError, TypeError, ValueError) as exc:
        log.debug("unusable index entry %r: %r", model.get("name"), exc)
        return None


def _internal(message: str) -> InferenceResponse:
    return InferenceResponse._create([], TritonError(message, TritonError.INTERNAL))
