"""A loaded model: its served versions, each with its instances and scheduler.

`Model.submit(request, respond)` is the single way in. It picks the version, validates the request
against that version's config (Triton's texts), turns it into the `pb_utils.InferenceRequest` the
model sees, and queues it. Every outcome, including a validation error, comes back through
`respond`, so callers have one path to handle.

The way down is one-way: `admit` builds the request's `Pending` complete (with the version's
`ResponseShape`, and where a cache miss is stored), and the scheduler runs batches through the
`BatchRunner` the version gave it. Nothing on a request's way back calls into this module.

`close(timeout)` is bounded as a whole. From its start the version refuses new requests
(UNAVAILABLE, `unavailable_text`). It lets queued and executing ones finish until the bound (less
a reserve for finalize, `FINALIZE_RESERVE_S`), answers what is still queued UNAVAILABLE,
finalizes its instances side by side (abandoning any still busy at the bound), and then answers
UNAVAILABLE whatever the model left open. Nothing waits on a closed version.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from tritonclient.grpc import model_config_pb2 as mc

from . import pb_utils
from .deadlines import remaining
from .errors import ModelLoadError, TritonStatusError
from .execution import Pending
from .inference import TRITON_PARAMETERS, InferRequest, ParameterValue, Respond, answer_of
from .instance import Instance, InstanceSpec, ModelInstance
from .isolation import IsolatedInstance, environments
from .isolation.kind import runs_in_process
from .readiness import Reason
from .response_cache import CacheFill, CacheKeys, ResponseCache
from .response_shape import ResponseShape
from .scheduling import ModelStats, Scheduler, build_scheduler
from .scheduling.entry import BatchRunner
from .scheduling.rate_limiter import LimitedInstance, RateLimiter
from .validation import RequestError, RequestValidator, unknown_model_error
from .warmup import warm_up, warmup_samples

log = logging.getLogger(__name__)


def unavailable_text(name: str, version: int) -> str:
    """The answer of a version that is closing or closed (UNAVAILABLE).

    Triton removes an unloading model from its table first, so a new request there fails the
    lookup (`Request for unknown model: '<m>' has no available versions`, NOT_FOUND). A request
    that reaches a version here was routed to it before the unload: it is told, in the words of
    Triton's not-ready texts, that the version is going away, with a code a client may retry on.
    """
    return f"Model '{name}' version {version} is not ready: it is being unloaded"


class ModelVersion:
    """One version of a model: config, instances and the scheduler in front of them."""

    def __init__(
        self,
        name: str,
        version: int,
        config: mc.ModelConfig,
        config_json: str,
        model_file: Path,
        instance_kind: str = "auto",
        environment_limits: environments.EnvironmentLimits = environments.EnvironmentLimits(),
        services: pb_utils.ModelServices | None = None,
        rate_limiter: RateLimiter | None = None,
        cache: ResponseCache | None = None,
    ) -> None:
        """`services`: what the instances reach through pb_utils (their repository's);
        `rate_limiter`: their repository's, when `--rate-limit execution_count` (else None);
        `cache`: the server's response cache, used when the config enables it."""
        self.name = name
        self.version = version
        self.config = config
        self.model_file = model_file
        self.decoupled = config.model_transaction_policy.decoupled
        self.validator = RequestValidator(config)
        # FORCE_CPU_ONLY_INPUT_TENSORS: inputs that arrive on a GPU (BLS, ensembles) are
        # copied to the host before `execute` unless the model says "no".
        self._cpu_inputs_only = cpu_only_input_tensors(config)
        self.all_outputs = frozenset(o.name for o in config.output)
        # Applied to every response on its way out (requested outputs, output reshape).
        self._shape = ResponseShape(config)
        # Told when an isolated instance dies or comes back (see `ready`).
        self.on_readiness_change: Callable[[], None] | None = None
        specs = _instance_specs(name, version, config, config_json, model_file, instance_kind)
        # A model with its own Python environment runs every instance in a process of that
        # environment's interpreter (isolation/environments.py); unpacked and checked here,
        # and kept in the cache (never evicted) until this version is unloaded or fails to load.
        environment = _execution_environment(config, model_file.parent.parent, environment_limits)
        self._environment = environment
        # Instance name → its device: where its rate limiter resources are counted.
        self._devices = {spec.instance_name: spec.device_id for spec, _ in specs}
        self.instances: list[Instance] = [
            IsolatedInstance(
                spec, self._instance_health_changed, services=services, environment=environment
            )
            if isolated or environment is not None
            else ModelInstance(spec, services)
            for spec, isolated in specs
        ]
        # Queue and compute times, batch sizes and counts (Triton's ModelStatistics).
        self.stats = ModelStats()
        # Both the server and the config must enable the cache, as in Triton (the config
        # checks refuse it for decoupled and sequence-batched models).
        self.cache = cache if config.response_cache.enable else None
        self._cache_owner = self.cache.new_owner() if self.cache is not None else 0
        self._cache_keys = CacheKeys(config)
        # Every request admitted and not yet closed (by id; each leaves with its final
        # response): what close() must still answer.
        self._open: dict[int, Pending] = {}
        self._closing = False  # set once by close(): the version takes no more requests
        self._rate_limiter = rate_limiter
        # Instance name → its place in the rate limiter, once load() registered it.
        self._limited: dict[str, LimitedInstance] = {}
        # What every scheduler and warmup call to run a batch on an instance.
        self.run_batch = BatchRunner(
            self.decoupled, self._limited, unavailable_text(self.name, self.version)
        )
        self._scheduler: Scheduler = build_scheduler(
            config,
            self.instances,
            self.run_batch,
            self.stats,
        )
        # Request rescheduling (iterative sequences): a released request goes back through the
        # scheduler, by its own re-entry point when it has one (the sequence batcher keeps the
        # slot). Read once: a protobuf field lookup on every request adds up.
        self._requeue: Callable[[Pending], None] | None = (
            getattr(self._scheduler, "reschedule", self._scheduler.enqueue)
            if config.sequence_batching.iterative_sequence
            else None
        )

    def _register_rate_limits(self) -> None:
        """Each instance's resources and priority into the repository's rate limiter; a load
        error in Triton's words when the server's resources could never run one."""
        if self._rate_limiter is None:
            return
        groups = {group.name: group for group in self.config.instance_group}
        for instance in self.instances:
            group = groups[instance.name.rpartition("_")[0]]  # named `<group name>_<k>`
            try:
                self._limited[instance.name] = self._rate_limiter.register(
                    instance.name, group, self._devices[instance.name]
                )
            except TritonStatusError as exc:
                self._unregister_rate_limits()
                raise ModelLoadError(f"Invalid argument: {exc}") from None

    def _unregister_rate_limits(self) -> None:
        """Out of the rate limiter: frees what they hold, wakes the ones that wait."""
        limited = list(self._limited.values())
        self._limited.clear()  # the batch runner reads the same table
        for entry in limited:
            entry.unregister()

    @property
    def ready(self) -> bool:
        """False while every instance is down (isolated instances restart after a crash)."""
        return any(instance.alive for instance in self.instances)

    def check_ready(self) -> Reason:
        """Triton's runtime readiness of this version (TritonModel::IsReady): each instance in
        turn, its process alive and then its model's `is_ready()`; the first reason it is not."""
        for instance in self.instances:
            reason = instance.check_ready()
            if reason is not None:
                return reason
        return None

    def _instance_health_changed(self, alive: bool) -> None:
        if self.on_readiness_change is not None:
            self.on_readiness_change()

    def load(self) -> None:
        """Initialize every instance; on failure finalize the ones that did initialize.

        Whatever fails (an OSError starting an instance process too) becomes a ModelLoadError
        once every instance is stopped: a failed load leaves no thread, process or folder.
        """
        loaded: list[Instance] = []
        try:
            self._register_rate_limits()
            samples = warmup_samples(self.config, self.model_file.parent.parent)
            for instance in self.instances:
                instance.load()
                loaded.append(instance)
                # Each instance warms up before the next one starts, and all before the
                # version is READY [S]: a reload swaps to a generation that is already warm.
                warm_up(self, instance, samples)
        except Exception as exc:
            self._unregister_rate_limits()
            for instance in self.instances:
                try:
                    if instance in loaded:
                        instance.finalize()
                    else:
                        instance.stop()
                except Exception:  # stop the others all the same
                    log.exception(
                        "%s v%d: stopping %s failed", self.name, self.version, instance.name
                    )
            self._release_environment()
            if isinstance(exc, ModelLoadError):
                raise
            raise ModelLoadError(f"Internal: {type(exc).__name__}: {exc}") from exc

    def _release_environment(self) -> None:
        """Once, when no instance of this version runs any more: its unpacked environment may
        then be evicted from the cache (when no other version uses it)."""
        environment, self._environment = self._environment, None
        if environment is not None:
            environments.release(environment)

    def submit(self, request: InferRequest, respond: Respond) -> Pending | None:
        pending = self.admit(request, respond, queue=True)
        if pending is None or pending.closed:  # refused, or answered from the response cache
            return pending
        self.stats.queue_changed(1)
        params = request.parameters
        self._scheduler.enqueue(pending, _priority(params) if params else 0)
        return pending

    def admit(
        self,
        request: InferRequest,
        respond: Respond,
        *,
        use_cache: bool = True,
        queue: bool = False,
    ) -> Pending | None:
        """Check `request` and build the `Pending` that carries it to `execute`, complete.

        A refused request is answered here with Triton's error, and None comes back; so is
        every request once the version is closing (UNAVAILABLE). A request the response cache
        answers comes back as a closed `Pending`: it never reaches `execute`. Warm-up
        requests pass `use_cache=False`: Triton runs them on the instance, past the cache.
        `queue`: the request goes to the scheduler next (`submit`); it counts as queued from
        here, and an iterative sequence model's rescheduling goes back through the scheduler.
        """
        if self._closing:
            self._refuse(respond)
            return None
        try:
            batch_size = self.validator.validate(
                request.request_id, request.inputs, request.requested_outputs
            )
        except RequestError as exc:
            respond(_error_response(str(exc), exc.code), True)
            return None
        requested = (
            frozenset(request.requested_outputs) if request.requested_outputs else self.all_outputs
        )
        cached: pb_utils.InferenceResponse | None = None
        fill: CacheFill | None = None
        if self.cache is not None and use_cache:
            # A hit's queue time runs from here to its lookup, as Triton counts it.
            arrival_ns = time.monotonic_ns()
            key = (self._cache_owner, self._cache_keys.digest(request, requested))
            lookup_start = time.monotonic_ns()
            cached = self.cache.lookup(key)
            lookup_ns = time.monotonic_ns() - lookup_start
            if cached is None:
                fill = CacheFill(self.cache, key, lookup_ns, self.stats)
        queued = queue and cached is None
        pending = Pending(
            self._model_request(request, requested),
            respond,
            decoupled=self.decoupled,
            # A cached response was shaped before it was stored; it leaves unchanged.
            shape=self._shape if cached is None else None,
            requested=requested,
            cache_fill=fill,
            batch_size=batch_size,  # every scheduler reads it from here
            # The request counts its own outcome when its final response leaves; a cache hit
            # is counted here instead, as Triton counts it (no inference or execution).
            stats=self.stats if cached is None else None,
            queued=queued,
            requeue=self._requeue if queued else None,
            open_table=self._open,
            trace=request.trace,
        )
        self._open[id(pending)] = pending
        if self._closing:  # close() began meanwhile (it may not have seen this one)
            del self._open[id(pending)]
            self._refuse(respond)
            return None
        if request.trace is not None:  # from here on it ends (tracing.py)
            request.trace.admitted(self.name, self.version, request.inputs)
            if queued:
                request.trace.queued()
        if cached is not None:
            now = time.monotonic_ns()
            queue_ns = lookup_start - arrival_ns
            self.stats.record_cache_hit(now - arrival_ns, queue_ns, lookup_ns)
            pending.deliver(cached, True)
        return pending

    def _refuse(self, respond: Respond) -> None:
        message = unavailable_text(self.name, self.version)
        respond(_error_response(message, pb_utils.TritonError.UNAVAILABLE), True)

    def _model_request(
        self, request: InferRequest, requested: frozenset[str]
    ) -> pb_utils.InferenceRequest:
        """What `execute` sees; `Pending` gives it its response sender and cancellation."""
        params = request.parameters
        inputs = self.validator.apply_input_reshape(request.inputs)
        if self._cpu_inputs_only and any(t._device is not None for t in inputs):
            inputs = [t._on_host() for t in inputs]
        if params:
            sequence_id = params.get("sequence_id", 0)
            # An int or a string, as the wire allows (bridge/codec.py refuses other types).
            correlation_id = sequence_id if isinstance(sequence_id, int | str) else 0
            flags = _sequence_flags(params)
            timeout = int(params.get("timeout", 0))
            parameters_json = _custom_parameters_json(params)
        else:  # the common case: no request parameters at all
            correlation_id, flags, timeout, parameters_json = 0, 0, 0, "{}"
        return pb_utils.InferenceRequest._incoming(
            inputs=inputs,
            request_id=request.request_id,
            correlation_id=correlation_id,
            flags=flags,
            timeout=timeout,
            parameters_json=parameters_json,
            # Only read (copied by requested_output_names()), so the frozenset is shared.
            requested_output_names=requested,  # type: ignore[arg-type]
            response_sender=None,
            trace=None if request.trace is None else pb_utils.InferenceTrace("", request.trace),
        )

    def close(self, timeout: float | None = 30.0) -> bool:
        """Refuse new requests, drain, answer what is left UNAVAILABLE, finalize the instances.

        `timeout` bounds the whole close (None: no bound). Returns False if it was reached:
        requests were still running (now answered UNAVAILABLE) or an instance was abandoned.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        if self._closing:
            return True  # closed (or closing) already
        self._closing = True
        message = unavailable_text(self.name, self.version)
        drain_until = None
        if timeout is not None and deadline is not None:
            drain_until = deadline - min(FINALIZE_RESERVE_S, timeout / 2)
        drained = self._scheduler.drain(remaining(drain_until))
        if not drained:
            log.warning(
                "%s v%d: requests still running after %ss; answering them UNAVAILABLE",
                self.name,
                self.version,
                timeout,
            )
        self._scheduler.close(message)
        # Before finalize: an instance waiting for resources is woken (its batch answered
        # UNAVAILABLE) instead of holding its finalize back, and what it held is freed.
        self._unregister_rate_limits()
        # Queued requests were answered by the scheduler. Finalize comes before the rest: a
        # decoupled model may still be answering from its own threads, and its finalize is
        # where it waits for them (as Triton's examples do).
        finalized = _finalize_all(self.instances, deadline)
        # Whatever is still open now never gets an answer from the model: a hung execute, a
        # response sender the model dropped without closing.
        for pending in list(self._open.values()):  # each leaves the table as it is failed
            pending.fail(message, pb_utils.TritonError.UNAVAILABLE)
        self._open.clear()
        if self.cache is not None:  # an unloaded or replaced version's answers go with it
            self.cache.drop(self._cache_owner)
        self._release_environment()
        return finalized and drained


class Cancellable(Protocol):
    """A submitted request, as its caller holds it: it can only be cancelled."""

    def cancel(self) -> None: ...


class ServedModel(Protocol):
    """What a server and BLS use of a loaded model: a Python model (Model) or an ensemble
    (composition.EnsembleModel)."""

    name: str
    # Served version number → the version (a ModelVersion, or the ensemble itself).
    versions: dict[int, Any]
    latest: Any  # the newest served version

    @property
    def config(self) -> mc.ModelConfig: ...
    @property
    def ready(self) -> bool:
        """Whether it can serve now (a Python model: an instance of every version is alive)."""
        ...

    def submit(self, request: InferRequest, respond: Respond) -> Cancellable | None:
        """Admit `request` (None when refused: `respond` got the error) and run it."""
        ...

    def infer(
        self, request: InferRequest, timeout: float | None = None
    ) -> pb_utils.InferenceResponse: ...
    def close(self, timeout: float | None = 30.0) -> bool: ...


class Model:
    """A model and the versions of it being served."""

    def __init__(self, name: str, versions: Mapping[int, ModelVersion]) -> None:
        self.name = name
        self.versions = dict(versions)
        self.latest = self.versions[max(self.versions)]
        self._readiness_listeners: list[Callable[[bool], None]] = []
        for version in self.versions.values():
            version.on_readiness_change = self._readiness_changed

    @property
    def ready(self) -> bool:
        """True while every served version has an instance alive."""
        return all(version.ready for version in self.versions.values())

    def watch_readiness(self, listener: Callable[[bool], None]) -> None:
        """Call `listener(ready)` (from any thread) whenever `ready` may have changed."""
        self._readiness_listeners.append(listener)

    def _readiness_changed(self) -> None:
        ready = self.ready
        for listener in self._readiness_listeners:
            listener(ready)

    @property
    def config(self) -> mc.ModelConfig:
        return self.latest.config

    def submit(self, request: InferRequest, respond: Respond) -> Pending | None:
        version: ModelVersion | None = self.latest
        if request.model_version != -1:
            version = self.versions.get(request.model_version)
        if version is None:
            message = unknown_model_error(self.name, request.model_version)
            respond(_error_response(message, pb_utils.TritonError.NOT_FOUND), True)
            return None
        return version.submit(request, respond)

    def infer(
        self, request: InferRequest, timeout: float | None = None
    ) -> pb_utils.InferenceResponse:
        """Run one request and wait for its (single, final) response. For in-process use."""
        return answer_of(self.submit, request, timeout, f"model '{self.name}'")

    def close(self, timeout: float | None = 30.0) -> bool:
        """Close every version (see ModelVersion.close); `timeout` bounds the whole close.

        Versions close one after another on a shared deadline; False if it was reached.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        finished = True
        for version in self.versions.values():
            finished = version.close(remaining(deadline)) and finished
        return finished


# -- helpers ------------------------------------------------------------------------------------


# The part of a close's bound kept for finalize (half the bound if that is less): draining may
# not use it all, so an instance that did finish its work is finalized rather than abandoned.
FINALIZE_RESERVE_S = 1.0


def _finalize_all(instances: list[Instance], deadline: float | None) -> bool:
    """Finalize `instances` side by side, waiting no longer than `deadline` in total."""

    def finalize(instance: Instance) -> Callable[[], object]:
        return lambda: instance.finalize(remaining(deadline))

    return side_by_side([(i.name, finalize(i)) for i in instances], deadline, "finalize")


def side_by_side(
    calls: Sequence[tuple[str, Callable[[], object]]], deadline: float | None, what: str
) -> bool:
    """Run each named call on a daemon thread of its own; wait for them until `deadline`.

    One that hangs neither delays the others nor outlives the deadline here: it is logged as
    abandoned. False if a call raised, returned False, or was still running at the deadline.
    """
    results: dict[int, bool] = {}

    def run(index: int, name: str, call: Callable[[], object]) -> None:
        try:
            results[index] = call() is not False
        except BaseException:
            log.exception("%s: %s failed", name, what)
            results[index] = False

    threads = [
        threading.Thread(target=run, args=(i, name, call), name=f"{what}:{name}", daemon=True)
        for i, (name, call) in enumerate(calls)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(remaining(deadline))
    for index, (name, _call) in enumerate(calls):
        if index not in results:
            log.error("%s: abandoned: %s still running at the bound", name, what)
    return len(results) == len(calls) and all(results.values())


def _error_response(message: str, code: pb_utils.TritonError | int) -> pb_utils.InferenceResponse:
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message, code))


def _priority(params: Mapping[str, ParameterValue]) -> int:
    """The request's `priority` parameter (uint64 from tritonclient, int64 from raw clients)."""
    value = params.get("priority", 0)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _sequence_flags(params: Mapping[str, ParameterValue]) -> int:
    flags = 0
    if params.get("sequence_start"):
        flags |= pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START
    if params.get("sequence_end"):
        flags |= pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END
    return flags


def _custom_parameters_json(params: Mapping[str, ParameterValue]) -> str:
    if not params:
        return "{}"
    custom = {
        k: v
        for k, v in params.items()
        if k not in TRITON_PARAMETERS and not k.startswith("triton_")
    }
    # Triton's text is compact and keeps non-ASCII characters as they are [V].
    return json.dumps(custom, separators=(",", ":"), ensure_ascii=False) if custom else "{}"


def cpu_only_input_tensors(config: mc.ModelConfig) -> bool:
    """The model's FORCE_CPU_ONLY_INPUT_TENSORS ("yes", the default, or "no"), as Triton reads
    it: exactly those two words; anything else fails the load (UNSUPPORTED in Triton)."""
    parameter = config.parameters.get("FORCE_CPU_ONLY_INPUT_TENSORS")
    if parameter is None:
        return True
    value = parameter.string_value
    if value not in ("yes", "no"):
        raise ModelLoadError(
            f"Unsupported: Incorrect value for FORCE_CPU_ONLY_INPUT_TENSORS: {value}'"
        )
    return value == "yes"


_KIND_NAMES = {
    mc.ModelInstanceGroup.KIND_AUTO: "CPU",
    mc.ModelInstanceGroup.KIND_CPU: "CPU",
    mc.ModelInstanceGroup.KIND_GPU: "GPU",
    mc.ModelInstanceGroup.KIND_MODEL: "MODEL",
}


def _execution_environment(
    config: mc.ModelConfig, model_dir: Path, limits: environments.EnvironmentLimits
) -> environments.ExecutionEnvironment | None:
    parameters = {key: value.string_value for key, value in config.parameters.items()}
    path = environments.environment_parameter(parameters, model_dir)
    return environments.prepare(path, limits) if path is not None else None


def _instance_specs(
    name: str,
    version: int,
    config: mc.ModelConfig,
    config_json: str,
    model_file: Path,
    instance_kind: str,
) -> list[tuple[InstanceSpec, bool]]:
    """One spec per instance, named `<group name>_<k>` as Triton names them, and whether it
    runs in a process of its own (isolation/kind.py)."""
    specs = []
    model_dir = str(model_file.parent.parent)
    for group in config.instance_group:
        kind = _KIND_NAMES[group.kind]
        isolated = runs_in_process(config, group, instance_kind)
        # A GPU group gets `count` instances on each listed device; CPU groups run on device 0.
        devices = list(group.gpus) if group.kind == mc.ModelInstanceGroup.KIND_GPU else []
        placements = [d for d in devices or [0] for _ in range(group.count)]
        for k, device_id in enumerate(placements):
            instance_name = f"{group.name}_{k}"
            args = {
                "model_config": config_json,
                "model_instance_kind": kind,
                "model_instance_name": instance_name,
                "model_instance_device_id": str(device_id),
                "model_repository": model_dir,
                "model_version": str(version),
                "model_name": name,
            }
            spec = InstanceSpec(name, instance_name, kind, device_id, model_file, version, args)
            specs.append((spec, isolated))
    return specs
