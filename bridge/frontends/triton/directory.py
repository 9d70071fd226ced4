"""Which models exist, which versions are ready, and which Dynamo endpoint serves each.

Every bridge process that serves models answers `{"op": "index"}` on its control endpoint
(docs/worker_protocol.md §1). The directory reads their answers through the cluster's one
client of that endpoint (bridge/cluster/index.py `ClusterIndex`, which also holds the cache,
when it is asked again, and how long an answer may take) and merges them: one entry per model
name, over however many workers serve it. Nothing travels outside Dynamo.

The hot path (ModelInfer) reuses the merged index while the ClusterIndex's round is not outdated
(no control instance came or went, this process's own worker did not say that a model changed:
`changed`, called by the ModelManager in-process at once), the name is known and can take
requests, and the endpoint it names still has an instance. The RPCs that report state
(ModelReady, ServerReady, ModelMetadata, ModelConfig) ask for a fresh one, so a model unloaded
or reloaded on a worker is seen at once.

A request may still meet an endpoint withdrawn since the last index (another process reloaded
the model while the door was idle). The first client of an endpoint that lists no instance asks
the index again before it waits for one, and gives up at once (`EndpointWithdrawn`) when the
index no longer names it; the service then retries the request once on the model's endpoint
now (service.py), rather than wait for an instance that will never come.

Workers that are not bridge workers have no control endpoint: their TensorBased models come
from Dynamo's model cards (model_cards.py), read with every new round, as entries with
`bridge_form=False`.

Each model endpoint is reached over a route (routes.py), made once per endpoint: in-process
when `local_worker(path)` (given by the composition root) names this process's own worker for
it, else over the request plane."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from model_repository_loader.pb_utils.errors import ErrorCode
from model_repository_loader.validation import (
    no_available_versions_error,
    unknown_model_error,
    version_not_ready_error,
)

from ...cluster.index import ClusterIndex, IndexRound
from ...cluster.protocol import (
    BRIDGE_FORM_VERSION,
    IndexRow,
    Op,
    ReadyRow,
    StatsRow,
    control_request,
    error_item,
    ready_request,
)
from ...transport.shm_exchange import ShmDoor
from .door_error import DoorError
from .model_cards import FOREIGN_VERSION, ModelCards
from .routes import LocalRoute, RequestPlaneRoute, Route, StandardFormRoute

log = logging.getLogger(__name__)

_NO_VERSION_SELECTED = "at least one version must be available"


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

    def unavailable(self, version: int = -1) -> tuple[ErrorCode, str]:
        """Triton's answer for a model with no ready version: a model whose versions failed to
        load "has no available versions", or, asked for one version, that version "is not at
        ready state" (UNAVAILABLE) when it failed and "is not found" when it is none of them;
        one that never got as far as its versions (its config did not load) is "not found"
        [V] (tests/unit/fixtures/validation_oracle.json)."""
        if self.known_versions and version != -1:
            if str(version) in self.known_versions:
                return ErrorCode.UNAVAILABLE, version_not_ready_error(self.name, version)
            return ErrorCode.NOT_FOUND, unknown_model_error(self.name, version)
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

    def merge(self, row: IndexRow) -> None:
        self.known_versions.update(row.versions)
        if row.ready:
            self.ready = True
            self.versions.update(row.versions)
        elif not self.reason:
            self.reason = row.reason
        if row.endpoint and row.endpoint not in self.endpoints:
            self.endpoints.append(row.endpoint)
        self.bridge_form = self.bridge_form or row.bridge_form == BRIDGE_FORM_VERSION


def _serving(entry: ModelEntry | None) -> bool:
    return entry is not None and bool(entry.endpoints and entry.versions)


def _parse_config(data: bytes, name: str) -> mc.ModelConfig:
    config = mc.ModelConfig()
    if data:
        config.ParseFromString(data)
    if not config.name:
        config.name = name
    return config


class Directory:
    """The door's view of the models served in its namespace."""

    def __init__(
        self,
        index: ClusterIndex,
        cards: ModelCards | None = None,
        local_worker: Callable[[str], Any | None] = lambda path: None,
        shm: ShmDoor | None = None,
        departed_grace: float = 0.0,
    ) -> None:
        self._index = index
        # Models whose serving workers left discovery: name → (when, its newest version).
        self._departed: dict[str, tuple[float, int]] = {}
        self._departed_grace = departed_grace
        # Tensors to workers on this host through shared memory (bridge/transport/): learns
        # each worker's host from its index answer.
        self._shm = shm
        self._cards = cards  # foreign TensorBased workers' models (model_cards.py)
        # endpoint path → this process's ModelWorker serving it, or None (routes.py)
        self._local_worker = local_worker
        self._routes: dict[str, Route] = {}
        self._models: dict[str, ModelEntry] = {}
        self._merged = IndexRound()  # the round `_models` was merged from
        index.on_round.append(self._merge)
        # Called with the control instances that appeared since the last index (not waited on).
        self.on_new_workers = index.on_new_workers

    @property
    def complete(self) -> bool:
        """The last index heard from every control instance that is not gone."""
        return self._merged.complete

    # -- lookups ------------------------------------------------------------------------------

    def changed(self, name: str) -> None:
        """This process's worker changed what serves `name` (ModelManager.listeners): the next
        lookup asks again. Synchronous, on the loop, before the load or unload returns."""
        self._index.invalidate()

    async def lookup(self, name: str) -> ModelEntry | None:
        """The model's entry; the cached index unless it misses the name, the entry cannot take
        requests (a load since may have made it ready), or the index is outdated."""
        entry = self.cached(name)
        if entry is None:
            await self.refresh()
            entry = self._models.get(name)
        return entry

    def cached(self, name: str) -> ModelEntry | None:
        """The model's entry when the cached index can be trusted for it, asking nothing (any
        thread); None when `lookup` must ask the workers."""
        entry = self._models.get(name)
        self._index.used()
        if (
            entry is None
            or not (entry.endpoints and entry.versions)
            or self._index.outdated()
            or not self._index.routable(entry.endpoints[-1])
        ):
            return None
        return entry

    def departed(self, name: str) -> int | None:
        """The newest version `name` had, if the workers serving it left discovery (a rolling
        restart, a crash) within the grace; None otherwise, and for a model a worker unloaded
        (that is Triton's NOT_FOUND at once)."""
        left = self._departed.get(name)
        if left is None or time.monotonic() - left[0] > self._departed_grace:
            return None
        return left[1]

    def _note_departures(self, models: dict[str, ModelEntry]) -> None:
        """Models whose serving workers left or are leaving: no worker lists them any more, or
        the workers list them loaded and ready with no endpoint (a stopping worker withdraws
        its endpoints first). An unloaded model is listed as not ready instead."""
        now = time.monotonic()
        for name, entry in self._models.items():
            new = models.get(name)
            leaving = new is None or bool(new.versions and not new.endpoints)
            if _serving(entry) and leaving:
                versions = [int(v) for v in entry.versions if v.isdigit()]
                self._departed[name] = (now, max(versions, default=1))
        for name in [n for n in self._departed if _serving(models.get(n))]:
            del self._departed[name]  # served again

    def known_names(self) -> set[str]:
        """The model names of the last index (no question asked)."""
        return set(self._models)

    async def fresh(self, name: str | None = None) -> dict[str, ModelEntry]:
        """An index asked for after this call (state RPCs must not report the past)."""
        await self.refresh()
        return self._models

    async def refresh(self) -> None:
        """An index asked for after this call, merged."""
        await self._index.fresh()

    async def _merge(self, answered: IndexRound) -> None:
        """A new round's rows as one entry per model name, with the model cards read now."""
        models = _merge_rows(answered)
        if self._departed_grace > 0:
            self._note_departures(models)
        if self._shm is not None:
            self._shm.hosts = {i: answer.host for i, answer in answered.answers}
        if self._cards is not None:
            await self._merge_cards(models)
        self._models, self._merged = models, answered
        self._forget_routes()

    async def _merge_cards(self, models: dict[str, ModelEntry]) -> None:
        """Add the models of foreign workers (no control endpoint, `bridge_form=False`); a
        name a bridge worker knows stays the bridge worker's."""
        assert self._cards is not None
        try:
            cards = await self._cards.read(self._index.probe.unreachable)
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
        ids = entry.owners if entry is not None else self._index.instance_ids()
        if not ids:
            return error_item(ErrorCode.UNAVAILABLE, "no bridge worker is serving")
        answers = await self._index.ask_each(request, ids)
        await self.refresh()  # the change is visible to the next lookup
        if any(answer is not None and "error" not in answer for answer in answers):
            return None
        errors = [answer["error"] for answer in answers if answer is not None]
        return errors[0] if errors else error_item(ErrorCode.UNAVAILABLE, "no worker answered")

    async def folders(self) -> set[str]:
        """Every model name in the workers' repositories, loaded or not (control op `folders`);
        DoorError with a worker's error when one cannot read its repositories."""
        answers = await self._index.ask_each(control_request(Op.FOLDERS))
        names: set[str] = set()
        for answer in answers:
            if answer is not None and "error" in answer:
                raise DoorError.from_item(answer["error"])
            names.update(answer.get("names", ()) if answer is not None else ())
        return names

    async def stats(self) -> list[StatsRow]:
        """Every worker's per-version statistics (control op `stats`), one list over all."""
        rows = await self._model_rows(control_request(Op.STATS), Op.STATS)
        return [StatsRow.from_wire(row) for row in rows]

    async def runtime_ready(
        self, name: str = "", version: int = -1, owners: list[int] | None = None
    ) -> bool:
        """Triton's runtime readiness (control op `ready`): `name`'s `version` is ready on one
        of `owners`; `name` "": every loaded version on every worker is (strict server
        readiness). Each worker asks its models' instances and logs why one is not ready."""
        answered = await self._model_rows(ready_request(name, version), Op.READY, owners)
        rows = [ReadyRow.from_wire(row) for row in answered]
        if name:
            return any(not row.reason for row in rows)
        return all(not row.reason for row in rows)

    async def _model_rows(
        self, request: dict[str, Any], op: str, owners: list[int] | None = None
    ) -> list[Any]:
        """The `models` rows every worker (or those of `owners`) answered `request` with; a
        worker's error answer is logged and counts for nothing."""
        rows: list[Any] = []
        for answer in await self._index.ask_each(request, owners):
            if answer is not None and "error" in answer:
                log.warning("a worker answered %s with %r", op, answer)
            elif answer:
                rows.extend(answer.get("models", ()))
        return rows

    async def tell_every_worker(
        self, request: dict[str, Any], instance_ids: list[int] | None = None
    ) -> list[dict[str, Any] | None]:
        """One control request to every bridge worker (or those of `instance_ids`); their
        answers (None: none in time)."""
        return await self._index.ask_each(request, instance_ids)

    # -- model endpoints ----------------------------------------------------------------------

    def serves_locally(self, endpoint: str) -> bool:
        """This process's own worker serves `endpoint`: a request may lend it buffers."""
        return self.local_route(endpoint) is not None

    def local_route(self, endpoint: str) -> LocalRoute | None:
        """The route to `endpoint` when this process's own worker serves it, else None
        (asks nothing of Dynamo, so it cannot fail)."""
        route = self._routes.get(endpoint)
        if route is None:
            worker = self._local_worker(endpoint)
            if worker is None:
                return None
            route = self._routes[endpoint] = LocalRoute(worker)
        return route if isinstance(route, LocalRoute) else None

    async def route(self, endpoint: str, entry: ModelEntry) -> Route:
        """How to reach `endpoint` of `entry`'s model: in-process when this process's own
        worker serves it (the embedded default), over the request plane in the bridge form to
        other bridge workers, in Dynamo's standard form to any other worker. Made once per
        endpoint and kept; a standard-form route is made again once a bridge worker's index
        row names its endpoint (a round that missed the bridge workers, its model known from
        Dynamo's card alone, must not leave a bridge worker's endpoint unpingable for good)."""
        route: Route | None = self._routes.get(endpoint) or self.local_route(endpoint)
        if isinstance(route, StandardFormRoute) and entry.bridge_form:
            route.instances.close()
            route = None
        if route is None:
            if entry.bridge_form:
                route = RequestPlaneRoute(await self.client(endpoint), self._shm)
            else:
                route = StandardFormRoute(await self.client(endpoint), entry.name)
            self._routes[endpoint] = route
        return route

    def forget(self, endpoint: str) -> None:
        """A request found `endpoint` withdrawn: drop its route and client, so nothing is sent
        there again until an index names it."""
        self._routes.pop(endpoint, None)
        self._index.forget_endpoint(endpoint)

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

        async def withdrawn() -> bool:
            await self.refresh()
            named = any(endpoint in entry.endpoints for entry in self._models.values())
            return self.complete and not named

        return await self._index.endpoint_client(endpoint, withdrawn)


def _merge_rows(answered: IndexRound) -> dict[str, ModelEntry]:
    """One entry per model name over every worker's rows (the first ready one's config)."""
    models: dict[str, ModelEntry] = {}
    for instance_id, answer in answered.answers:
        for row in answer.models:
            entry = models.get(row.name)
            if entry is None:
                entry = models[row.name] = ModelEntry(row.name, _parse_config(row.config, row.name))
            elif row.ready and not entry.ready:
                entry.config = _parse_config(row.config, row.name)
            entry.merge(row)
            entry.owners.append(instance_id)
    return models
