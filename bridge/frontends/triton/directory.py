"""Which models exist, which versions are ready, and which Dynamo endpoint serves each.

Every bridge process that serves models answers `{"op": "index"}` on its control endpoint
`<namespace>.bridge.control` (docs/worker_protocol.md §1). The directory asks every instance of
that endpoint (`client.instance_ids()`, then `client.direct`) and merges the answers: one entry
per model name, over however many workers serve it. Nothing travels outside Dynamo.

The merged index is cached. The hot path (ModelInfer) reuses it until the set of control
instances changes (a worker came or went), a name is missing or cannot take requests, the
endpoint it names has no instance left, or this process's own worker said that a model changed
(`changed`, called by the ModelManager in-process at once: a reload, load or unload in the
embedded default is seen by the very next request, with no poll to race). The RPCs that report
state (ModelReady, ServerReady, ModelMetadata, ModelConfig) ask for a fresh one, so a model
unloaded or reloaded on a worker is seen at once. While requests flow, the index is also asked
again every REFRESH_S: a reload in another process serves the model on a new endpoint (a new
generation) and the worker withdraws the old one only once no request has reached it for a
moment, so the door must move on by itself. Concurrent refreshes share one round of questions,
but a caller never gets an index that was asked for before it called.

A request may still meet an endpoint withdrawn since the last index (another process reloaded
the model while the door was idle). The first client of an endpoint that lists no instance asks
the index again before it waits for one, and gives up at once (`EndpointWithdrawn`) when the
index no longer names it; the service then retries the request once on the model's endpoint
now (service.py), rather than wait INSTANCE_WAIT_S for an instance that will never come.

Workers that are not bridge workers have no control endpoint: their TensorBased models come
from Dynamo's model cards (model_cards.py) in the same round, as entries with
`bridge_form=False`.

Each model endpoint is reached over a route (routes.py), made once per endpoint: in-process
when `local_worker(path)` (given by the composition root) names this process's own worker for
it, else over the request plane."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dynamo.runtime import DistributedRuntime
from tritonclient.grpc import model_config_pb2 as mc

from model_repository_loader.pb_utils.errors import ErrorCode
from model_repository_loader.validation import no_available_versions_error, unknown_model_error

from .model_cards import FOREIGN_VERSION, ModelCards
from .routes import LocalRoute, RequestPlaneRoute, Route, StandardFormRoute, instance_gone
from .status import DoorError

log = logging.getLogger(__name__)

CONTROL_COMPONENT = "bridge"
CONTROL_ENDPOINT = "control"
_NO_VERSION_SELECTED = "at least one version must be available"
# Bound of one worker's index answer: a worker that hangs must not hang the door.
INDEX_TIMEOUT_S = 10.0
# Bound of waiting for a model endpoint's first instance to be seen by a new client.
INSTANCE_WAIT_S = 10.0
# While lookups happen: how old the cached index may get (a reloaded model's new endpoint).
REFRESH_S = 0.25


class EndpointWithdrawn(Exception):
    """The endpoint a request was about to go to is no longer in the index: nothing was sent."""


@dataclass
class ModelEntry:
    """One model name as the workers that know it describe it."""

    name: str
    config: mc.ModelConfig
    ready: bool = False
    versions: set[str] = field(default_factory=set)  # ready versions, over every worker
    known_versions: set[str] = field(default_factory=set)  # also those that failed to load
    endpoints: list[str] = field(default_factory=list)  # the generations serving it now
    owners: list[int] = field(default_factory=list)  # control instances that know the name
    reason: str = ""
    bridge_form: bool = False

    def unavailable(self) -> tuple[ErrorCode, str]:
        """Triton's answer for a model with no ready version: a model whose versions failed to
        load "has no available versions"; one that never got as far as its versions (its
        config did not load) is "not found" [V]."""
        if self.known_versions or self.selects_no_version:
            return ErrorCode.NOT_FOUND, no_available_versions_error(self.name)
        return ErrorCode.NOT_FOUND, unknown_model_error(self.name)

    @property
    def selects_no_version(self) -> bool:
        """The config loaded but its version policy selects no version folder. The index
        carries no load stage; this is the one failure past the config that lists no versions
        (model_repository_loader/repository.py)."""
        return not self.known_versions and self.reason.startswith(_NO_VERSION_SELECTED)

    @property
    def decoupled(self) -> bool:
        return self.config.model_transaction_policy.decoupled

    def merge(self, model: dict[str, Any]) -> None:
        ready = bool(model.get("ready"))
        endpoint = str(model.get("endpoint") or "")
        self.known_versions.update(str(v) for v in model.get("versions", ()))
        if ready:
            self.ready = True
            self.versions.update(str(v) for v in model.get("versions", ()))
        elif not self.reason:
            self.reason = str(model.get("reason") or "")
        if endpoint and endpoint not in self.endpoints:
            self.endpoints.append(endpoint)
        self.bridge_form = self.bridge_form or model.get("bridge_form") == 1


def _parse_config(data: Any, name: str) -> mc.ModelConfig:
    config = mc.ModelConfig()
    if isinstance(data, bytes | bytearray):
        config.ParseFromString(bytes(data))
    if not config.name:
        config.name = name
    return config


class Directory:
    """The door's view of the models served in its namespace."""

    def __init__(
        self,
        runtime: DistributedRuntime,
        namespace: str,
        cards: ModelCards | None = None,
        local_worker: Callable[[str], Any | None] = lambda path: None,
    ) -> None:
        self._runtime = runtime
        self._namespace = namespace
        self._cards = cards  # foreign TensorBased workers' models (model_cards.py)
        # endpoint path → this process's ModelWorker serving it, or None (routes.py)
        self._local_worker = local_worker
        self._routes: dict[str, Route] = {}
        self._control: Any = None
        self._models: dict[str, ModelEntry] = {}
        self._instances: frozenset[int] = frozenset()
        self._clients: dict[str, Any] = {}
        self._gone_logged: set[int] = set()  # control instances found gone (said once)
        self._lock = asyncio.Lock()
        self._asked = 0  # refresh tickets handed out
        self._answered = 0  # the newest ticket an index answered
        self.complete = False  # the last index heard from every control instance
        self._looked_up = False  # a lookup used the cache since the last refresh
        # This process's own worker changed a model since the last round of questions began.
        self._stale = False
        self._refresher: asyncio.Task | None = None
        # Called with the control instances that appeared since the last index (not waited on).
        self.on_new_workers: list[Callable[[list[int]], None]] = []

    async def start(self) -> None:
        path = f"{self._namespace}.{CONTROL_COMPONENT}.{CONTROL_ENDPOINT}"
        self._control = await self._runtime.endpoint(path).client()
        self._refresher = asyncio.ensure_future(self._keep_fresh())

    def stop(self) -> None:
        if self._refresher is not None:
            self._refresher.cancel()

    async def _keep_fresh(self) -> None:
        while True:
            await asyncio.sleep(REFRESH_S)
            if self._looked_up:
                self._looked_up = False
                try:
                    await self.refresh()
                except Exception as exc:  # keep refreshing; the next round may succeed
                    log.warning("refreshing the model index failed: %s", exc)

    # -- lookups ------------------------------------------------------------------------------

    def changed(self, name: str) -> None:
        """This process's worker changed what serves `name` (ModelManager.listeners): the next
        lookup asks again. Synchronous, on the loop, before the load or unload returns."""
        self._stale = True

    def _instances_changed(self) -> bool:
        return frozenset(self._control.instance_ids()) != self._instances

    async def lookup(self, name: str) -> ModelEntry | None:
        """The model's entry; the cached index unless it misses the name, the entry cannot take
        requests (a load since may have made it ready), or the index is outdated."""
        entry = self._models.get(name)
        self._looked_up = True
        if (
            entry is None
            or self._stale
            or not (entry.endpoints and entry.versions)
            or self._instances_changed()
            or not self._routable(entry)
        ):
            await self.refresh()
            entry = self._models.get(name)
        return entry

    def _routable(self, entry: ModelEntry) -> bool:
        """False when the endpoint the entry names has lost its instances (withdrawn)."""
        client = self._clients.get(entry.endpoints[-1]) if entry.endpoints else None
        return client is None or bool(client.instance_ids())

    def known_names(self) -> set[str]:
        """The model names of the last index (no question asked)."""
        return set(self._models)

    async def fresh(self, name: str | None = None) -> dict[str, ModelEntry]:
        """An index asked for after this call (state RPCs must not report the past)."""
        await self.refresh()
        return self._models

    async def refresh(self) -> None:
        self._asked += 1
        ticket = self._asked
        async with self._lock:
            if self._answered >= ticket:
                return  # a round that started after our call has answered meanwhile
            started = self._asked
            before = self._instances
            self._stale = False  # a change told from now on makes the next lookup ask again
            self._models, self._instances, self.complete = await self._ask_every_worker()
            joined = self._instances - before
            if joined:  # new workers (the first index too: they get what changed before)
                for hook in self.on_new_workers:
                    hook(sorted(joined))
            self._answered = started
            self._forget_routes()

    async def _ask_every_worker(self) -> tuple[dict[str, ModelEntry], frozenset[int], bool]:
        ids = list(self._control.instance_ids())
        gone: set[int] = set()
        answers = await asyncio.gather(*(self._index_of(i, gone=gone) for i in ids))
        models: dict[str, ModelEntry] = {}
        complete = True
        for instance_id, answer in zip(ids, answers, strict=True):
            if answer is None:
                # A worker that is gone (crashed, lease lost) stays listed until its lease
                # expires; it serves nothing, so the index lacks nothing without it.
                complete = complete and instance_id in gone
                continue
            for model in answer.get("models", ()):
                name = str(model.get("name", ""))
                entry = models.get(name)
                if entry is None:
                    entry = models[name] = ModelEntry(
                        name, _parse_config(model.get("config"), name)
                    )
                elif model.get("ready") and not entry.ready:
                    entry.config = _parse_config(model.get("config"), name)
                entry.merge(model)
                entry.owners.append(instance_id)
        if self._cards is not None:
            await self._merge_cards(models)
        return models, frozenset(ids), complete

    async def _merge_cards(self, models: dict[str, ModelEntry]) -> None:
        """Add the models of foreign workers (no control endpoint, `bridge_form=False`); a
        name a bridge worker knows stays the bridge worker's."""
        assert self._cards is not None
        try:
            cards = await self._cards.read()
        except Exception as exc:  # the bridge workers' models still count
            log.warning("reading Dynamo's model cards failed: %s", exc)
            return
        for name, endpoint, config in cards:
            entry = models.get(name)
            if entry is None:
                entry = models[name] = ModelEntry(name, config, ready=True)
                entry.versions.add(FOREIGN_VERSION)
                entry.known_versions.add(FOREIGN_VERSION)
            elif entry.bridge_form:
                continue
            if endpoint not in entry.endpoints:
                entry.endpoints.append(endpoint)

    async def change(self, name: str, request: dict[str, Any]) -> dict[str, Any] | None:
        """Send a load/unload to the workers that know `name` (every worker, for a name none
        knows). The first success answers (None); else the first worker's error."""
        await self.refresh()
        entry = self._models.get(name)
        ids = entry.owners if entry is not None else list(self._control.instance_ids())
        if not ids:
            return {"code": "UNAVAILABLE", "message": "no bridge worker is serving"}
        answers = await asyncio.gather(*(self._index_of(i, request) for i in ids))
        await self.refresh()  # the change is visible to the next lookup
        if any(answer is not None and "error" not in answer for answer in answers):
            return None
        errors = [answer["error"] for answer in answers if answer is not None]
        return errors[0] if errors else {"code": "UNAVAILABLE", "message": "no worker answered"}

    async def folders(self) -> set[str]:
        """Every model name in the workers' repositories, loaded or not (control op `folders`);
        DoorError with a worker's error when one cannot read its repositories."""
        ids = list(self._control.instance_ids())
        answers = await asyncio.gather(*(self._index_of(i, {"op": "folders"}) for i in ids))
        names: set[str] = set()
        for answer in answers:
            if answer is not None and "error" in answer:
                raise DoorError.from_item(answer["error"])
            names.update(answer.get("names", ()) if answer is not None else ())
        return names

    async def stats(self) -> list[dict[str, Any]]:
        """Every worker's per-version statistics (control op `stats`), one list over all."""
        ids = list(self._control.instance_ids())
        answers = await asyncio.gather(*(self._index_of(i, "stats") for i in ids))
        return [model for answer in answers if answer for model in answer.get("models", ())]

    async def tell_every_worker(
        self,
        request: dict[str, Any],
        timeout: float = INDEX_TIMEOUT_S,
        instance_ids: list[int] | None = None,
    ) -> list[dict[str, Any] | None]:
        """One control request to every bridge worker (or those of `instance_ids`); their
        answers (None: none in time)."""

        async def ask(instance_id: int) -> dict[str, Any] | None:
            try:
                async with asyncio.timeout(timeout):
                    return await self._index_of(instance_id, request)
            except TimeoutError:
                log.info("worker %x did not answer %s in time", instance_id, request.get("op"))
                return None

        ids = self._control.instance_ids() if instance_ids is None else instance_ids
        return await asyncio.gather(*(ask(i) for i in ids))

    async def _index_of(
        self, instance_id: int, op: str | dict[str, Any] = "index", gone: set[int] | None = None
    ) -> dict[str, Any] | None:
        """One control op's answer from one worker (a dict op is sent as it is; its errors are
        answers, returned). None when the worker does not answer; its id is then added to
        `gone` if the worker is gone (routes.instance_gone), logged once."""
        request = {"op": op} if isinstance(op, str) else op
        timeout = INDEX_TIMEOUT_S if isinstance(op, str) else None  # a load takes its time
        try:
            async with asyncio.timeout(timeout):
                stream = await self._control.direct(request, instance_id, annotated=False)
                async for item in stream:
                    if isinstance(item, dict) and ("error" not in item or not isinstance(op, str)):
                        return item
                    log.warning("worker %x answered %s with %r", instance_id, op, item)
                    return None
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

    # -- model endpoints ----------------------------------------------------------------------

    def serves_locally(self, endpoint: str) -> bool:
        """This process's own worker serves `endpoint`: a request may lend it buffers."""
        route = self._routes.get(endpoint)
        if route is not None:
            return isinstance(route, LocalRoute)
        return self._local_worker(endpoint) is not None

    async def route(self, endpoint: str, entry: ModelEntry) -> Route:
        """How to reach `endpoint` of `entry`'s model: in-process when this process's own
        worker serves it (the embedded default), over the request plane in the bridge form to
        other bridge workers, in Dynamo's standard form to any other worker. Made once per
        endpoint and kept."""
        route = self._routes.get(endpoint)
        if route is None:
            worker = self._local_worker(endpoint)
            if worker is not None:
                route = LocalRoute(worker)
            elif entry.bridge_form:
                route = RequestPlaneRoute(await self.client(endpoint))
            else:
                route = StandardFormRoute(await self.client(endpoint), entry.name)
            self._routes[endpoint] = route
        return route

    def forget(self, endpoint: str) -> None:
        """A request found `endpoint` withdrawn: drop its route and client, so nothing is sent
        there again until an index names it."""
        self._routes.pop(endpoint, None)
        self._clients.pop(endpoint, None)

    def _named(self, endpoint: str) -> bool:
        return any(endpoint in entry.endpoints for entry in self._models.values())

    def _forget_routes(self) -> None:
        """Drop the in-process routes to generations the index no longer names: a retired
        worker is not kept alive by the door."""
        named = {e for entry in self._models.values() for e in entry.endpoints}
        for endpoint in [e for e, r in self._routes.items() if isinstance(r, LocalRoute)]:
            if endpoint not in named:
                del self._routes[endpoint]

    async def client(self, endpoint: str) -> Any:
        """A Dynamo client of a model endpoint, made once and kept. EndpointWithdrawn when it
        lists no instance and a fresh index no longer names it (see the module doc)."""
        client = self._clients.get(endpoint)
        if client is None:
            client = await self._runtime.endpoint(endpoint).client()
            if not client.instance_ids():
                await self.refresh()
                if self.complete and not self._named(endpoint):
                    raise EndpointWithdrawn("no instance, and the index no longer names it")
                try:
                    await asyncio.wait_for(client.wait_for_instances(), INSTANCE_WAIT_S)
                except asyncio.TimeoutError:
                    pass  # the call itself says "no instances"
            self._clients[endpoint] = client
        return client
