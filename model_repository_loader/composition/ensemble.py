"""Ensembles (`platform: "ensemble"`): a dataflow of composing models, served as one model.

`EnsembleModel` has the surface the bridge uses for a `Model` (`name`, `config`, `versions`,
`submit(request, respond)`, `infer`, `close`). Each request becomes an `EnsembleRun`:

- a step is submitted, with `Model.submit`, as soon as every ensemble tensor its `input_map`
  reads exists, so independent steps run in parallel;
- the tensors a step returns are renamed by its `output_map` (no copy: the arrays are shared)
  and may make further steps ready;
- only the steps needed for the requested outputs run; when nothing more can run and an output
  of the ensemble is still missing, the request fails with Triton's "unexpected deadlock" [V];
- a step's error ends the request with `in ensemble '<name>', <the step's error>` and the
  step's code [V];
- a decoupled step streams: each of its responses runs the steps after it again, and every
  time all requested outputs have new values they go out as one response of the ensemble; the
  one made when no step is left in flight carries FINAL, else FINAL goes alone (as Triton's).

With `ensemble_scheduling { max_inflight_requests: N }` (Triton 2.63 on) each step has a
`StepLimiter` shared by every request of the ensemble: at most N of that step's requests are in
flight at once. A step made ready by a model's response waits for a slot on that model's thread
(its `send()` blocks: backpressure on a decoupled producer, as in Triton); one made ready on an
event loop (a request's first steps) waits in the limiter's queue instead and is submitted by
the thread that frees a slot. A cancelled request waits for nothing.

Composing models are looked up by name when a step runs, in the loaded repository (hot reload
replaces entries of that dict in place), then among the models other processes serve when a
`RemoteModels` is installed (remote.py): a remote step streams and fails exactly as a local one.

Once `close` begins, a new request is answered UNAVAILABLE at once (as a closing Model does).

Statistics (`stats`, Triton's ModelStatistics and metrics), as Triton 2.51 keeps an ensemble's
[V]: a request that completes counts as one success and one execution of its batch size, the
whole run as its compute_infer time; a failed run counts twice in `fail` (as Triton counts it)
and leaves `last_inference` alone; a request refused by the checks before the run (shape,
datatype) is not counted.

With the response cache (`cache`, when the server has one and the ensemble's config enables it),
a top-level request whose answer is cached skips the steps altogether, and a completed run's
answer is stored, as Triton caches an ensemble's requests (model_repository_loader/
response_cache.py); the statistics count hits and misses as a model's.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from .. import pb_utils
from ..inference import InferRequest, Respond, answer_of
from ..model import unavailable_text
from ..readiness import Reason
from ..response_cache import CacheKeys, ResponseCache
from ..scheduling.stats import ModelStats
from ..validation import RequestError, RequestValidator, triton_input_order, unknown_model_error
from .scope import Scope
from .tensors import handed_over

log = logging.getLogger(__name__)

# A step ready to be sent: (submit id, step index, the step, its inputs).
ReadyStep = tuple[int, int, Any, list[pb_utils.Tensor]]

# How long a step waits for a slot before it goes ahead anyway (Triton's kMutexTimeoutSeconds).
LIMITER_WAIT_S = 300.0


class StepLimiter:
    """Triton's StepInflightRequestLimiter: one step's requests in flight, across all requests
    of the ensemble, at most `limit`."""

    def __init__(self, limit: int, ensemble: str, step: int) -> None:
        self.limit = limit
        self.ensemble = ensemble
        self.step = step
        self._count = 0
        self._changed = threading.Condition()
        # Submissions that could not wait where they were made (on an event loop), in order.
        self._deferred: deque[tuple[EnsembleRun, Callable[[], None]]] = deque()

    def acquire(self, cancelled: Callable[[], bool], timeout: float = LIMITER_WAIT_S) -> None:
        """Wait for a slot and take it; a cancelled request, or one that waited `timeout`,
        takes one anyway (Triton's words for the latter)."""
        with self._changed:
            fits = self._changed.wait_for(
                lambda: cancelled() or (self._count < self.limit and not self._deferred),
                timeout,
            )
            if not fits:
                log.error(
                    "[Internal Error] Ensemble '%s' unable to schedule step %d (inflight: %d >= "
                    "limit: %d) for %d seconds. Proceeding to avoid deadlock.",
                    self.ensemble,
                    self.step,
                    self._count,
                    self.limit,
                    timeout,
                )
            self._count += 1

    def acquire_or_defer(self, run: EnsembleRun, submit: Callable[[], None]) -> bool:
        """Take a slot now (True), or queue `submit` to be called, holding a slot, once one is
        free (False). Never waits."""
        with self._changed:
            if run.cancelled or (self._count < self.limit and not self._deferred):
                self._count += 1
                return True
            self._deferred.append((run, submit))
            return False

    def release(self) -> None:
        with self._changed:
            if self._count == 0:
                log.error("[Internal Error] step inflight request limiter underflow")
                return
            self._count -= 1
            ready = None
            if self._deferred and self._count < self.limit:
                ready = self._deferred.popleft()[1]
                self._count += 1
            self._changed.notify()
        if ready is not None:
            ready()

    def cancelled(self, run: EnsembleRun) -> None:
        """`run` was cancelled: its queued submissions go now, and its waits end."""
        with self._changed:
            mine = [submit for owner, submit in self._deferred if owner is run]
            self._deferred = deque(item for item in self._deferred if item[0] is not run)
            self._count += len(mine)
            self._changed.notify_all()
        for submit in mine:
            submit()


def _on_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class EnsembleModel:
    """One ensemble version (Triton serves ensembles as a single version)."""

    def __init__(
        self,
        name: str,
        version: int,
        config: mc.ModelConfig,
        scope: Scope | None = None,
        cache: ResponseCache | None = None,
    ) -> None:
        self.name = name
        self.version = version
        self.config = config
        self.versions = {version: self}
        self.latest = self
        self.decoupled = config.model_transaction_policy.decoupled
        self.validator = RequestValidator(config)
        self.all_outputs = frozenset(o.name for o in config.output)
        self.instances: list[Any] = []  # none of its own: its steps' instances do the work
        self.scope = scope if scope is not None else Scope()
        self._steps = list(config.ensemble_scheduling.step)
        limit = config.ensemble_scheduling.max_inflight_requests
        self.limiters: list[StepLimiter] = []
        if limit > 0:
            log.info("Ensemble model '%s' configured with max_inflight_requests: %d", name, limit)
            self.limiters = [StepLimiter(limit, name, i) for i in range(len(self._steps))]
        self._runs: set[EnsembleRun] = set()
        self._idle = threading.Condition()
        self._closing = False
        self.stats = ModelStats()
        enabled = config.response_cache.enable and not self.decoupled
        self.cache = cache if enabled else None
        self._cache_owner = self.cache.new_owner() if self.cache is not None else 0
        self._cache_keys = CacheKeys(config)

    @property
    def ready(self) -> bool:
        """Always, once loaded: its steps' models report their own readiness."""
        return True

    def check_ready(self) -> Reason:
        """An ensemble has no instances to ask: Triton's default model readiness (ready)."""
        return None

    @property
    def models(self) -> Mapping[str, Any]:
        return self.scope.models

    def submit(self, request: InferRequest, respond: Respond) -> EnsembleRun | Answered | None:
        """Validate and start `request`; None when it was refused (answered already), an
        `Answered` when the response cache answered it."""
        if self._closing:
            message = unavailable_text(self.name, self.version)
            respond(_error(message, pb_utils.TritonError.UNAVAILABLE), True)
            return None
        if request.model_version not in (-1, self.version):
            message = unknown_model_error(self.name, request.model_version)
            respond(_error(message, pb_utils.TritonError.NOT_FOUND), True)
            return None
        try:
            batch_size = self.validator.validate(
                request.request_id, request.inputs, request.requested_outputs
            )
        except RequestError as exc:
            respond(_error(str(exc), exc.code), True)
            return None
        if request.trace is not None:  # no compute of its own: its steps have theirs
            request.trace.admitted(self.name, self.version, request.inputs)
            request.trace.queued()
        run = EnsembleRun(self, request, respond, batch_size)
        if self.cache is not None:
            arrival = time.monotonic_ns()
            key = (self._cache_owner, self._cache_keys.digest(request, run._requested))
            cached = self.cache.lookup(key)
            lookup_ns = time.monotonic_ns() - arrival
            if cached is not None:
                self.stats.record_cache_hit(time.monotonic_ns() - arrival, 0, lookup_ns)
                respond(cached, True)
                return ANSWERED
            run.cache_miss = (key, lookup_ns)
        with self._idle:
            self._runs.add(run)
        run.start()
        return run

    def _finished(self, run: EnsembleRun) -> None:
        with self._idle:
            self._runs.discard(run)
            self._idle.notify_all()

    def infer(
        self, request: InferRequest, timeout: float | None = None
    ) -> pb_utils.InferenceResponse:
        """Run one request and wait for its last response. For in-process use."""
        return answer_of(self.submit, request, timeout, f"ensemble '{self.name}'")

    def close(self, timeout: float | None = 30.0) -> bool:
        """Refuse new requests and wait (up to `timeout` s) for in-flight ones; False if some
        are still running. The composing models are closed on their own, and a closing one
        answers the steps it still holds, so no run waits on it for good."""
        with self._idle:
            self._closing = True
            idle = self._idle.wait_for(lambda: not self._runs, timeout=timeout)
        if self.cache is not None:  # an unloaded or replaced ensemble's answers go with it
            self.cache.drop(self._cache_owner)
        return idle


class Answered:
    """What `submit` returns for a request the response cache answered: nothing to cancel."""

    def cancel(self) -> None:
        pass


ANSWERED = Answered()


class EnsembleRun:
    """One request through an ensemble: its tensors, the steps in flight, what was sent."""

    def __init__(
        self, ensemble: EnsembleModel, request: InferRequest, respond: Respond, batch_size: int = 1
    ) -> None:
        self.ensemble = ensemble
        self.request = request
        self._batch_size = batch_size
        self._started_ns = time.monotonic_ns()
        self._respond = respond
        self._lock = threading.Lock()
        self._tensors: dict[str, pb_utils.Tensor] = {t.name(): t for t in request.inputs}
        # Each tensor's batch size, 0 where it comes from a model that does not batch (Triton's
        # TensorData::batch_size_): a tensor passes between a batching and a non-batching
        # model by gaining or losing a batch dimension of 1 (`_reshaped_dims`).
        batching = ensemble.config.max_batch_size > 0
        self._batch: dict[str, int] = {
            name: batch_size if batching else 0 for name in self._tensors
        }
        self._step_batch: dict[int, int] = {}  # submit id -> its request's batch size
        self._held: dict[int, StepLimiter] = {}  # submit id -> the limiter it holds a slot of
        self._fresh: set[str] = set()  # requested outputs produced since the last response
        self._requested = (
            frozenset(request.requested_outputs)
            if request.requested_outputs
            else ensemble.all_outputs
        )
        self._steps = _needed_steps(ensemble._steps, self._requested)
        # (cache key, lookup ns) when the response cache missed: the answer is stored at the end.
        self.cache_miss: tuple[tuple[int, bytes], int] | None = None
        self._fired: set[int] = set()
        self._in_flight: dict[int, Any] = {}  # submit id -> what Model.submit returned
        self._next_id = 0
        self._closed = False
        self._cancelled = False
        # Triton's ensemble responses carry the request's sequence fields as parameters [V].
        params = request.parameters
        self._sequence_parameters = json.dumps(
            {
                "sequence_id": params.get("sequence_id", 0),
                "sequence_start": bool(params.get("sequence_start", False)),
                "sequence_end": bool(params.get("sequence_end", False)),
            }
        )

    # -- driving ---------------------------------------------------------------------------------

    def start(self) -> None:
        with self._lock:
            ready = self._ready_steps(set(self._tensors))
        self._submit_all(ready)
        self._maybe_finish()

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def cancel(self) -> None:
        with self._lock:
            self._cancelled = True
            handles = list(self._in_flight.values())
        for handle in handles:
            if handle is not None and hasattr(handle, "cancel"):
                handle.cancel()
        for limiter in self.ensemble.limiters:
            limiter.cancelled(self)

    def _ready_steps(self, changed: set[str]) -> list[ReadyStep]:
        """Steps to (re)submit after `changed` tensors got values (called under the lock)."""
        ready = []
        for index, step in self._steps:
            reads = set(step.input_map.values())
            if not reads & changed or not reads <= self._tensors.keys():
                continue
            if index in self._fired and not self.ensemble.decoupled:
                continue
            self._fired.add(index)
            config = self._step_config(step)
            batching = config is not None and config.max_batch_size > 0
            dims = {i.name: list(i.dims) for i in config.input} if config is not None else {}
            inputs = []
            for step_input, tensor in step.input_map.items():
                value = handed_over(self._tensors[tensor], step_input)
                if step_input in dims:
                    shape = _reshaped_dims(
                        dims[step_input], batching, self._batch[tensor], value.shape()
                    )
                    if shape != value.shape():
                        value = value._reshaped(shape)
                inputs.append(value)
            submit_id = self._next_id
            self._next_id += 1
            self._in_flight[submit_id] = None
            shapes = [i.shape() for i in inputs]
            self._step_batch[submit_id] = shapes[0][0] if batching and shapes[0] else 0
            ready.append((submit_id, index, step, inputs))
        return ready

    def _step_config(self, step: Any) -> mc.ModelConfig | None:
        """The config of the model a step runs, where this process serves it."""
        model = self.ensemble.models.get(step.model_name)
        return getattr(model, "config", None) if model is not None else None

    def _submit_all(self, ready: list[ReadyStep]) -> None:
        limiters = self.ensemble.limiters
        for submit_id, index, step, inputs in ready:
            if not limiters:
                self._submit(submit_id, step, inputs)
                continue
            limiter = limiters[index]
            with self._lock:
                self._held[submit_id] = limiter
            if _on_event_loop():  # never wait there: the submission queues instead

                def submit(submit_id: int = submit_id, step: Any = step, inputs: Any = inputs):
                    self._submit(submit_id, step, inputs)

                if not limiter.acquire_or_defer(self, submit):
                    continue
            else:
                limiter.acquire(lambda: self._cancelled)
            self._submit(submit_id, step, inputs)

    def _release(self, submit_id: int) -> None:
        """The step's request ended: its slot is free (called outside the lock)."""
        with self._lock:
            limiter = self._held.pop(submit_id, None)
        if limiter is not None:
            limiter.release()

    def _submit(self, submit_id: int, step: Any, inputs: list[pb_utils.Tensor]) -> None:
        """Send one step's request (holding its limiter's slot, where it has one)."""
        with self._lock:
            queued_in_vain = self._closed and submit_id in self._held
        if queued_in_vain:  # the run failed while it waited for a slot: nothing is sent
            self._release(submit_id)
            return
        request = InferRequest(
            inputs=inputs,
            requested_outputs=sorted(step.output_map.keys()),
            request_id=self.request.request_id,
            parameters=dict(self.request.parameters),
            model_version=step.model_version,
        )

        def respond(
            response: pb_utils.InferenceResponse | None,
            final: bool,
            submit_id: int = submit_id,
            step: Any = step,
        ) -> None:
            self._step_responded(submit_id, step, response, final)

        model = self.ensemble.models.get(step.model_name)
        remote = self.ensemble.scope.remote if model is None else None
        if self.request.trace is not None and (model is not None or remote is not None):
            request.trace = self.request.trace.child("ENSEMBLE_STEP")
        if model is not None:
            handle = model.submit(request, respond)
        elif remote is not None:
            # Served by another process: the same step, through the remote seam.
            handle = remote.submit(step.model_name, request, _remote_respond(step, respond))
        else:
            message = unknown_model_error(step.model_name)
            respond(_error(message, pb_utils.TritonError.NOT_FOUND), True)
            return
        with self._lock:
            if submit_id in self._in_flight:
                self._in_flight[submit_id] = handle
            cancelled = self._cancelled
        if cancelled and handle is not None and hasattr(handle, "cancel"):
            handle.cancel()

    def _step_responded(
        self,
        submit_id: int,
        step: Any,
        response: pb_utils.InferenceResponse | None,
        final: bool,
    ) -> None:
        if final:
            self._release(submit_id)
        error = response.error() if response is not None else None
        if error is not None:
            message = f"in ensemble '{self.ensemble.name}', {error.message()}"
            self._close(_error(message, error.code()))
            return
        ready: list[ReadyStep] = []
        outgoing = None
        with self._lock:
            if self._closed:
                return
            if response is not None:
                outgoing, ready = self._consume(step, response, self._step_batch[submit_id])
            # The last step's final response: nothing can run any more (steps it made ready
            # are in flight already), so whatever it made is the run's last response.
            last = final and self._in_flight.keys() == {submit_id}
            if last:
                del self._in_flight[submit_id]
        if last:
            self._finish(outgoing)
            return
        if outgoing is not None:
            if self.request.trace is not None:
                self.request.trace.responded(outgoing)
            self._respond(outgoing, False)
        self._submit_all(ready)
        if final:
            # Only once `outgoing` is sent: the run's final response must never overtake it.
            with self._lock:
                self._in_flight.pop(submit_id, None)
            self._maybe_finish()

    def _consume(
        self, step: Any, response: pb_utils.InferenceResponse, batch_size: int
    ) -> tuple[pb_utils.InferenceResponse | None, list[ReadyStep]]:
        """Take a step's outputs (under the lock): a decoupled ensemble's next response once
        every requested output has a new value, and the steps now ready (marked in flight)."""
        changed = set()
        for tensor in response.output_tensors():
            target = step.output_map.get(tensor.name())
            if target is None:
                continue
            self._tensors[target] = handed_over(tensor, target)
            self._batch[target] = batch_size
            changed.add(target)
            if target in self._requested:
                self._fresh.add(target)
        outgoing = None
        if self.ensemble.decoupled and self._requested <= self._fresh:
            outgoing = self._outputs()
            self._fresh.clear()
        return outgoing, self._ready_steps(changed)

    def _maybe_finish(self) -> None:
        with self._lock:
            if self._closed or self._in_flight:
                return
        self._finish(None)

    def _finish(self, last: pb_utils.InferenceResponse | None) -> None:
        """End the run, no step being in flight. A decoupled ensemble sends `last` (the
        response the last step's final answer made, if it made one) with the FINAL flag, as
        Triton does; with none, the FINAL flag goes alone [core EnsembleContext::FinishEnsemble].
        """
        if self.ensemble.decoupled:
            self._close(last)
            return
        with self._lock:
            missing = [o.name for o in self.ensemble.config.output if o.name not in self._tensors]
        if missing:
            rid = self.request.request_id or "<id_unknown>"
            message = (
                f"in ensemble '{self.ensemble.name}', [request id: {rid}] unexpected deadlock, "
                "at least one output is not set while no more ensemble steps can be made"
            )
            self._close(_error(message, pb_utils.TritonError.INVALID_ARG))
        else:
            with self._lock:
                response = self._outputs()
            self._close(response)

    def _close(self, response: pb_utils.InferenceResponse | None) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            handles = [h for h in self._in_flight.values() if h is not None]
        failed = response is not None and response.has_error()
        if failed:
            for handle in handles:  # the rest of the graph is not needed any more
                if hasattr(handle, "cancel"):
                    handle.cancel()
        self._record(failed)
        if self.cache_miss is not None and self.ensemble.cache is not None:
            key, lookup_ns = self.cache_miss
            start = time.monotonic_ns()
            stored = None if failed else response
            if self.ensemble.cache.insert(key, stored):
                self.ensemble.stats.record_cache_miss(lookup_ns + time.monotonic_ns() - start)
        trace = self.request.trace
        if trace is not None:
            trace.responded(response)
        self._respond(response, True)
        if trace is not None:
            trace.end()
        self.ensemble._finished(self)

    def _record(self, failed: bool) -> None:
        elapsed = time.monotonic_ns() - self._started_ns
        stats = self.ensemble.stats
        if failed:
            reason = "CANCELED" if self._cancelled else "BACKEND"
            # Triton 2.51 counts a run that fails in a step twice in `fail` [V: one failed
            # request through raising_ens is fail count 2, three are 6]; every failure here.
            for _ in range(1 if self._cancelled else 2):
                stats.record_request(False, self._batch_size, elapsed, reason, touch_last=False)
        else:
            stats.record_execution(self._batch_size, 1, 0, 0, elapsed, 0)
            stats.record_request(True, self._batch_size, elapsed)

    def _outputs(self) -> pb_utils.InferenceResponse:
        # Triton collects the outputs in a std::unordered_map filled in config order, and
        # answers in that map's order [V: pipeline answers SUM before RESULT].
        config = self.ensemble.config
        names = tuple(o.name for o in config.output if o.name in self._requested)
        dims = {o.name: list(o.dims) for o in config.output}
        batching = config.max_batch_size > 0
        tensors = []
        for name in triton_input_order(names):
            tensor = self._tensors[name]
            shape = _reshaped_dims(dims[name], batching, self._batch.get(name, 0), tensor.shape())
            tensors.append(tensor if shape == tensor.shape() else tensor._reshaped(shape))
        return pb_utils.InferenceResponse._create(tensors, None, self._sequence_parameters)


def _remote_respond(step: Any, respond: Respond) -> Any:
    """The RemoteRespond of a step served by another process (remote.py)."""

    def remote_respond(
        response: pb_utils.InferenceResponse | None, final: bool, rejected: bool
    ) -> None:
        if response is None and rejected:  # no process serves it (any more)
            message = unknown_model_error(step.model_name)
            response = _error(message, pb_utils.TritonError.NOT_FOUND)
        respond(response, final)

    return remote_respond


def _reshaped_dims(
    config_dims: list[int], allow_batching: bool, batch_size: int, dims: list[int]
) -> list[int]:
    """Triton's EnsembleContext::ReshapeTensorDims: a tensor from a non-batching model that
    matches a batching model's dims gains a batch dimension of 1; a batch of 1 going to a
    non-batching model whose dims it does not match loses it; otherwise it stays as it is."""
    if allow_batching == (batch_size != 0):
        return dims
    if allow_batching:
        return [1, *dims] if _dims_match(config_dims, dims) else dims
    if not _dims_match(config_dims, dims) and batch_size == 1:
        return dims[1:]
    return dims


def _dims_match(config_dims: list[int], dims: list[int]) -> bool:
    """Triton's CompareDimsWithWildcard: the same rank, each dim equal or -1 in the config."""
    return len(config_dims) == len(dims) and all(
        c == -1 or c == d for c, d in zip(config_dims, dims, strict=True)
    )


def _needed_steps(steps: list[Any], requested: frozenset[str]) -> list[tuple[int, Any]]:
    """The steps whose outputs lead to a requested output, in config order (Triton prunes)."""
    needed_tensors = set(requested)
    keep: set[int] = set()
    changed = True
    while changed:
        changed = False
        for index, step in enumerate(steps):
            if index in keep or not set(step.output_map.values()) & needed_tensors:
                continue
            keep.add(index)
            needed_tensors |= set(step.input_map.values())
            changed = True
    return [(i, s) for i, s in enumerate(steps) if i in keep]


def _error(message: str, code: Any) -> pb_utils.InferenceResponse:
    return pb_utils.InferenceResponse._create([], pb_utils.TritonError(message, code))
