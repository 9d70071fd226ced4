"""One loaded model served as one Dynamo TensorBased endpoint.

The endpoint is registered with the serialized Triton `ModelConfig` as `triton_model_config`, so
the KServe frontend answers ModelConfig and ModelMetadata exactly from it. Requests arrive on the
runtime's event loop; the handler only decodes and queues them, and the model runs on its
instance threads (model_repository_loader), so the loop never waits on model code. A large
request is decoded in slices that give the loop back in between, so one big tensor does not
stall every other request.

After a reload or unload the retired generation's endpoint stays served (Dynamo 1.6 has no
per-endpoint stop). A generation owns its retirement (`retire`, one call): from the moment it is
unregistered it takes no new work: a late request is answered by the model now serving the name,
or refused at once with Triton's answer for an unloading model (NOT_FOUND, "has no available
versions" [V]) — never queued behind the requests the generation is still draining. Once quiet
it is withdrawn from discovery and lets go of its model, which its owner then closes.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import re
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from dynamo.llm import ModelInput, ModelType, WorkerType, register_model, unregister_model
from dynamo.runtime import DistributedRuntime, Endpoint
from tritonclient.grpc import model_config_pb2 as mc

from model_repository_loader.errors import TritonStatusError, failed_requests_text
from model_repository_loader.inference import InferRequest, respond_may_wait
from model_repository_loader.model import Cancellable, ServedModel
from model_repository_loader.pb_utils import InferenceResponse, TritonError
from model_repository_loader.tracing import RequestTrace
from model_repository_loader.validation import (
    RequestError,
    no_available_versions_error,
    parse_model_version,
)

from ..codec import (
    LARGE_REQUEST_ELEMENTS,
    OFF_LOOP_BYTES,
    PONG,
    TO_DYNAMO,
    bridge_error,
    decode_request,
    decode_request_in_slices,
    empty_final_response,
    encode_bridge_response,
    encode_response,
    is_ping,
    output_sinks,
    raw_bytes_size,
    release_raw_inputs,
    request_elements,
    wants_bridge_form,
    wants_empty_final_response,
)
from ..dynamo_endpoints import dynamo_endpoint
from ..errors import request_failed, to_dynamo_exception
from ..serialized_bytes import BytesLimits
from ..transport.arrival import ARRIVALS
from ..transport.shm_exchange import open_inputs

log = logging.getLogger(__name__)

# How long a traced request's final answer waits for its trace to end (`execute` to return,
# which is usually at once: a decoupled model may send its final response before it returns).
# Past it the answer goes without the rest of the trace rather than never.
TRACE_WAIT_S = 30.0
# How long start() waits for discovery to show the new endpoint's instance before it gives up
# (the load then fails): the model card must not come before the instance record.
INSTANCE_WAIT_S = 30.0
# Large raw BYTES inputs are decoded here, off the event loop and one request at a time: the
# loop keeps serving other models meanwhile, and only one object array is being built at once.
_BYTES_DECODER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bytes-decode")

_CONFIG_DTYPE_TO_KSERVE = {
    name: ("BYTES" if name == "TYPE_STRING" else name.removeprefix("TYPE_"))
    for name in mc.DataType.keys()
    if name != "TYPE_INVALID"
}


def component_name(model_name: str, generation: int = 1) -> str:
    """A Dynamo-safe component name for a model: `[a-z0-9_-]`, unique per model name.

    Discovery matches endpoint paths by prefix, so a short hash of the exact name keeps `m` and
    `m_2` (or `M` and `m`) apart. Every reload serves the model on a new component
    (`<slug>-g2-<hash>`, ...): Dynamo refuses a changed config on a registered endpoint, and a
    new endpoint lets the old and new generations overlap with no gap (bridge/reload.py). The
    hash stays last so that no generation's name is a prefix of another's.
    """
    slug = re.sub(r"[^a-z0-9_-]+", "-", model_name.lower()).strip("-")[:40] or "model"
    digest = hashlib.sha1(model_name.encode()).hexdigest()[:8]
    if generation > 1:
        slug = f"{slug}-g{generation}"
    return f"{slug}-{digest}"


def tensor_model_config(model_name: str, config: mc.ModelConfig) -> dict[str, Any]:
    """What `register_model` needs for a TensorBased model, the Triton config included."""
    batch = [-1] if config.max_batch_size > 0 else []

    def describe(tensors: Any) -> list[dict[str, Any]]:
        return [
            {
                "name": t.name,
                "data_type": TO_DYNAMO[_CONFIG_DTYPE_TO_KSERVE[mc.DataType.Name(t.data_type)]],
                "shape": batch + list(t.dims),
            }
            for t in tensors
        ]

    return {
        "name": model_name,
        "inputs": describe(config.input),
        "outputs": describe(config.output),
        "triton_model_config": config.SerializeToString(),
    }


class ModelWorker:
    """Registers a model with Dynamo and answers its requests."""

    def __init__(
        self,
        runtime: DistributedRuntime,
        namespace: str,
        model: ServedModel,
        generation: int = 1,
        serving: Callable[[], ServedModel | None] | None = None,
        bytes_limits: BytesLimits | None = None,
        serve_calls: list[asyncio.Future[Any]] | None = None,
    ) -> None:
        self.model: ServedModel | None = model  # None once retired: see retire()
        self.bytes_limits = bytes_limits or BytesLimits()
        # The model that answers new requests: during a reload, the frontend may still route
        # to a retiring generation for a moment; those requests go to the newest model, so
        # no client sees the old version again once the new one has answered.
        self._serving_model = serving or (lambda: None)
        self.name = model.name
        self.generation = generation
        # `<namespace>.<component>.generate`: what the control endpoint's index names.
        self.path = f"{namespace}.{component_name(model.name, generation)}.generate"
        self.endpoint: Endpoint = dynamo_endpoint(runtime, self.path)
        # Where start() leaves its serve_endpoint call, for the owner to let it return at
        # shutdown (a retired endpoint stays served: Dynamo 1.6 has no per-endpoint stop).
        self._serve_calls = serve_calls if serve_calls is not None else []
        self._routable: asyncio.Future[None] | None = None
        self._decoupled = model.config.model_transaction_policy.decoupled
        self._cancellations = _CancellationPoller()
        # Requests inside generate() that may still submit to (or wait on) this worker's own
        # model; retire() withdraws this generation only once this is zero (or at its bound).
        # Counted by the loop and by the door's gRPC threads (answer_on_thread): under a lock.
        self.in_flight = 0
        self._counting = threading.Lock()
        self.last_arrival = 0.0  # time.monotonic() of the last request that arrived
        self._loop = asyncio.get_running_loop()  # made on the loop: where the drain waits
        self._loop_thread = threading.get_ident()
        self.draining = False  # unregistered (retire()): its own model takes no new request
        self._idle: asyncio.Event | None = None

    async def start(self) -> None:
        """Serve the endpoint, wait until discovery shows its instance, register the model."""
        # Serve first, then advertise: a request routed here finds a handler. serve_endpoint
        # publishes the instance record in the background; the model card must not come
        # before it, or during a reload the frontend can pick this generation while it has no
        # instance yet and answer "model temporarily unavailable".
        model = self.model
        assert model is not None, "start() after retire()"
        serving = asyncio.ensure_future(self.endpoint.serve_endpoint(self.generate))
        # Kept by the owner even if what follows fails: Dynamo serves the endpoint until the
        # runtime shuts down, and the call must be let return then (ModelManager.wait_served).
        self._serve_calls.append(serving)
        client = await self.endpoint.client()
        await asyncio.wait_for(client.wait_for_instances(), timeout=INSTANCE_WAIT_S)
        await register_model(
            ModelInput.Tensor,
            ModelType.TensorBased,
            self.endpoint,
            self.name,
            self.name,
            worker_type=WorkerType.Aggregated,
            tensor_model_config=tensor_model_config(self.name, model.config),
        )
        watch = getattr(self.model, "watch_readiness", None)  # ensembles have no instances
        if watch is not None:
            loop = asyncio.get_running_loop()
            watch(lambda ready: loop.call_soon_threadsafe(self._readiness_changed, ready))

    async def retire(
        self, quiet: float, timeout: float, drain: bool = True
    ) -> asyncio.Future[None]:
        """Take this generation out of service without failing a request routed to it.

        In this order: the model card goes now (no new work here: a late request goes to the
        model now serving the name, or is refused, generate()), and this returns. Then, on the
        returned future: once no request has arrived for `quiet` seconds since then (the
        frontends route elsewhere; Dynamo 1.6 offers no confirmation of that) and, with
        `drain`, none is in flight any more, at most after `timeout` (logged when draining),
        the instance record goes too, and the worker lets go of its model. The caller closes
        the model once the future is done. `drain=False` (shutdown): requests in flight are
        not waited for here; closing the models drains them.
        """
        try:
            await self._unregister()
        except Exception as exc:  # withdraw and close all the same
            log.warning("unregistering '%s' failed: %s", self.name, exc)
        since = time.monotonic()
        return asyncio.ensure_future(self._withdraw_when_quiet(since, quiet, timeout, drain))

    async def _withdraw_when_quiet(
        self, since: float, quiet: float, timeout: float, drain: bool
    ) -> None:
        if not await self._until_quiet(since, quiet, timeout, drain) and drain:
            log.warning(
                "'%s' (generation %d): %d request(s) still in flight (or arriving) after "
                "%.0f s; closing it anyway",
                self.name,
                self.generation,
                self.in_flight,
                timeout,
            )
        # Before the model closes: from here on nothing is routed to this generation, and a
        # late request goes to the name's live model or is answered UNAVAILABLE at once.
        await self._withdraw()
        # Nothing served by this worker keeps the model alive past its close.
        self.model = None

    async def _until_quiet(self, since: float, quiet: float, timeout: float, drain: bool) -> bool:
        """After unregistering: until no request has arrived for `quiet` seconds (counted from
        `since`, the unregister) and, with `drain`, none is inside generate() here. False at
        the `timeout` bound (requests still running or arriving)."""
        deadline = time.monotonic() + timeout
        while True:
            now = time.monotonic()
            if drain and self.in_flight:
                if now >= deadline:
                    return False
                if self._idle is None:
                    self._idle = asyncio.Event()
                try:
                    await asyncio.wait_for(self._idle.wait(), timeout=deadline - now)
                except asyncio.TimeoutError:
                    pass
                continue
            quiet_at = max(since, self.last_arrival) + quiet
            if now >= quiet_at:
                return True
            if now >= deadline:
                return False
            await asyncio.sleep(min(quiet_at, deadline) - now)

    def _readiness_changed(self, ready: bool) -> None:
        """An isolated instance died or came back: route to this model only while it can answer.

        Taking the endpoint instance out makes ModelReady false (and new requests UNAVAILABLE)
        while no instance is alive; Triton keeps saying ready there.
        """
        self._routable = asyncio.ensure_future(self._set_routable(ready, self._routable))

    async def _set_routable(self, ready: bool, previous: asyncio.Future[None] | None) -> None:
        if previous is not None:
            await asyncio.wait([previous])  # keep the calls in the order the changes happened
        if self.model is None or ready != self.model.ready:
            return  # changed again meanwhile (or retired); the later call settles it
        try:
            if ready:
                await self.endpoint.register_endpoint_instance()
            else:
                await self.endpoint.unregister_endpoint_instance()
        except Exception as exc:
            log.warning("'%s': could not change its routing (ready=%s): %s", self.name, ready, exc)

    async def _unregister(self) -> None:
        """Stop advertising the model and taking new work for it; requests already routed
        here still finish. A new request goes to the model now serving the name, or is refused
        (generate): Triton takes an unloading model out of its table at once, while the
        requests it runs finish [V]."""
        self.draining = True
        await unregister_model(self.endpoint)

    async def _withdraw(self) -> None:
        """Once quiet: remove the endpoint's instance record too, before the model closes.

        The endpoint keeps being served (Dynamo 1.6 has no per-endpoint stop); without its
        instance record nothing is routed to it. Not done together with the unregister: a
        request the frontend routed here just before fails with "Worker disconnected before
        response stream was established" when the instance goes (reproduced under traffic by
        tests/e2e/test_lifecycle.py). A late request that still arrives goes to the model now
        serving the name (generate).
        """
        try:
            await self.endpoint.unregister_endpoint_instance()
        except Exception as exc:  # best effort: the model card is already gone
            log.debug("'%s': withdrawing generation %d: %s", self.name, self.generation, exc)

    async def _admit(
        self,
        request: dict[str, Any],
        bridge: bool,
        answers: _Responses | _Collected,
        local: bool = False,
    ) -> tuple[TritonError | None, Cancellable | None, ServedModel | None, RequestTrace | None]:
        """Decode `request`, choose the model that answers it and submit it, its responses going
        to `answers` (whose `encode` is set here for the bridge form; `local`: the answers stay
        in this process, codec.encode_raw_tensor).

        Returns (refused, pending, model, trace): `refused` is Triton's error for a request no
        model took (undecodable, or the model is gone); `pending` is None when the model
        answered at once (its checks refused the request). The request
        counts as in flight here until `_request_done`, unless it was refused or another
        generation's model took it (not this generation's drain).
        """
        loop = asyncio.get_running_loop()
        self._arrive()
        trace: RequestTrace | None = None
        try:
            try:
                # A request from a door on this host: its large inputs are in shared memory.
                placer = open_inputs(request)
                limits = self.bytes_limits
                if raw_bytes_size(request) > OFF_LOOP_BYTES:
                    inference = await loop.run_in_executor(
                        _BYTES_DECODER, decode_request, request, self.name, limits
                    )
                elif request_elements(request) > LARGE_REQUEST_ELEMENTS:
                    inference = await decode_request_in_slices(request, self.name, limits)
                else:
                    inference = decode_request(request, self.name, limits)
                # The tensors own (or view) their data now: the request's bytes need not stay
                # beside them while the model runs (an in-process door's dict lives that long).
                release_raw_inputs(request)
                if bridge:
                    inference.model_version = parse_model_version(
                        str(request.get("model_version") or "")
                    )
                    if "trace" in request:  # a traced request (docs/worker_protocol.md §2)
                        trace = RequestTrace("TENSORS" in request["trace"]["level"])
                        inference.trace = trace
            except RequestError as exc:
                self._request_done()
                return TritonError(exc.message, exc.code), None, None, None
            # Chosen after the decode (which may have yielded): never a model retired
            # meanwhile, nor this generation's own once it is draining.
            model = self._serving_model() or (None if self.draining else self.model)
            if model is None:
                # Unloaded (or being unloaded) while the request was on its way: answer now,
                # as Triton does (NOT_FOUND with this text [V]).
                self._request_done()
                message = no_available_versions_error(self.name)
                return TritonError(message, TritonError.NOT_FOUND), None, None, None
            if bridge:
                version = _answering_version(model, inference.model_version)
                answers.encode = functools.partial(
                    encode_bridge_response,
                    self.name,
                    version,
                    place=placer.place if placer is not None else None,
                    sinks=output_sinks(request),
                    local=local,
                )
            pending = model.submit(inference, answers.respond)
        except BaseException:
            self._request_done()
            raise
        if model is not self.model:
            self._request_done()  # not this generation's model: not its drain
        return None, pending, model, trace

    async def generate(self, request: dict[str, Any], context: Any) -> AsyncIterator[dict]:
        """Answer one request: every response the model sends, in order, as it is sent.

        The worker cannot tell ModelStreamInfer from ModelInfer (the request is the same), so
        every response carries `triton_final_response` as Triton sets it on streams, and a
        decoupled model's flag-only FINAL becomes an empty response when the client asked for
        one. When the client goes away (cancel, deadline, disconnect) the request is cancelled
        for the model and its later responses are dropped.

        A request in the bridge form (`"bridge_form": 1`, codec.py) selects its version with
        `model_version` and gets raw outputs, `final` on every answer, every flag-only FINAL,
        and its errors as items (the stream goes on after an error that is not final).
        """
        if is_ping(request):  # a caller's probe: this worker answers (bridge/cluster/instances.py)
            yield dict(PONG)
            return
        loop = asyncio.get_running_loop()
        bridge = wants_bridge_form(request)
        # Triton sends the empty final response only for decoupled models [V].
        empty_final = self._decoupled and wants_empty_final_response(request)
        responses = _Responses(loop, self.name)
        request_id = request.get("id") or ""
        # Not started when its caller already gave up on it (bridge/transport/arrival.py).
        late = ARRIVALS.refusal(request, context, self.name)
        if late is not None:
            if not bridge:
                raise to_dynamo_exception(late)
            yield bridge_error(late, final=True, rejected=True)
            return
        refused, pending, model, trace = await self._admit(request, bridge, responses)
        if refused is not None:
            failure = request_failed(self.name, request_id, refused)  # logs its one line
            if not bridge:
                raise failure
            yield bridge_error(refused, final=True, rejected=True)
            return
        mine = model is self.model
        # In the bridge form, an error answered while submitting means the request checks
        # refused it: the caller (BLS) words those differently.
        rejected = bridge and pending is None
        watching = context is not None and pending is not None
        if watching:
            self._cancellations.watch(loop, responses, context)
        finished = False
        try:
            while True:
                item, final = await responses.next()
                if item is _GONE:
                    return
                if isinstance(item, TritonError):
                    failure = request_failed(self.name, request_id, item)  # logs its one line
                    if not bridge:
                        # Dynamo ends the request at an error, even one the model sent
                        # mid-stream (stream_error_ends_request): the model is told by
                        # cancellation below.
                        finished = final
                        raise failure
                out = _item(item, final, rejected, responses.encode, empty_final or bridge)
                if final and trace is not None:
                    out = await _with_trace(out, trace)
                if out is not None:
                    yield out
                if final:
                    finished = True
                    return
        finally:
            if watching:
                self._cancellations.unwatch(responses)
            if not finished and pending is not None:
                pending.cancel()  # first: a sender let go below sees is_cancelled() at once
            responses.close()
            if mine:
                self._request_done()

    async def answer(self, request: dict[str, Any], context: Any = None) -> list[dict]:
        """Every item generate() would yield for a bridge-form request, at once: a unary call
        from this process's own door (routes.py LocalRoute). Without a stream's machinery:
        the model's thread keeps the responses and wakes the loop once, with the final one.

        The request is cancelled for the model when the caller's task is cancelled, or when
        `context` is stopped (then nothing is answered: []). A request that is not decoupled
        gets one response and perhaps a flag-only FINAL, so nothing here needs a bound (a
        decoupled model is never asked through a unary call: the door refuses it first).
        """
        loop = asyncio.get_running_loop()
        collected = _Collected(loop, self.name)
        request_id = request.get("id") or ""
        refused, pending, model, trace = await self._admit(request, True, collected, local=True)
        if refused is not None:
            return self._refused(request, refused)
        mine = model is self.model
        watching = context is not None and pending is not None
        if watching:
            self._cancellations.watch(loop, collected, context)
        finished = False
        try:
            await collected.done
            if collected.gone:
                return []
            rejected = pending is None  # the request checks refused it
            out = _answers(self.name, request_id, collected.items, rejected, collected.encode)
            if trace is not None and out:
                last = await _with_trace(out[-1], trace)
                assert last is not None
                out[-1] = last
            finished = True
            return out
        finally:
            if watching:
                self._cancellations.unwatch(collected)
            if not finished and pending is not None:
                pending.cancel()
            collected.close()
            if mine:
                self._request_done()

    def thread_answer(self) -> ThreadAnswer:
        """Where `answer_on_thread` keeps a request's responses (made first: cancellable)."""
        return ThreadAnswer(self.name)

    def answer_on_thread(
        self, request: InferRequest, answer: ThreadAnswer, encode: Encoder
    ) -> list[Any | TritonError]:
        """`answer()` for a caller on a thread that may wait, not the loop, with the request
        already in the loader's form (the door's synchronous gRPC wire, which converts it
        itself: frontends/triton/grpc/unary.py): submitted on that thread and returned with the
        model's final response. `encode(version, response, final)` makes each successful
        response what the caller sends, on the model's thread as the model sends it (`version`:
        the one answering). Returns the encoded responses and the errors, each error logged in
        its one line; [] once `answer.cancel()` (any thread: the client cancelled, its deadline
        passed) gave the request up, which cancels it for the model."""
        self._arrive()
        mine = True
        try:
            model = self._serving_model() or (None if self.draining else self.model)
            if model is None:  # unloaded, or being unloaded: Triton's answer [V]
                refusal = TritonError(no_available_versions_error(self.name), TritonError.NOT_FOUND)
                request_failed(self.name, request.request_id, refusal)
                return [refusal]
            mine = model is self.model
            if not mine:
                self._request_done()  # not this generation's model: not its drain
            answer.encode = functools.partial(
                encode, _answering_version(model, request.model_version)
            )
            return answer.wait(model.submit(request, answer.respond), request.request_id)
        finally:
            if mine:
                self._request_done()

    def _refused(self, request: dict[str, Any], refusal: TritonError) -> list[dict]:
        """A unary request no model took: its one log line, and `refusal` as its answer."""
        request_failed(self.name, request.get("id") or "", refusal)
        return [bridge_error(refusal, final=True, rejected=True)]

    def _arrive(self) -> None:
        """A request is in flight here until `_request_done` (any thread)."""
        with self._counting:
            self.in_flight += 1
            self.last_arrival = time.monotonic()

    def _request_done(self) -> None:
        with self._counting:
            self.in_flight -= 1
            idle = self._idle if self.in_flight == 0 else None
            if idle is not None:
                self._idle = None
        if idle is None:
            return
        if threading.get_ident() == self._loop_thread:
            idle.set()
        else:
            self._loop.call_soon_threadsafe(idle.set)


# `answer_on_thread`'s encoder: (answering version, response, final) → what the caller sends.
Encoder = Callable[[str, InferenceResponse, bool], Any]

# Put in a request's responses when the client is gone.
_GONE: Any = object()


def _item(
    item: dict | TritonError | None,
    final: bool,
    rejected: bool,
    encode: Callable[[InferenceResponse | None, bool], dict],
    flag_final: bool,
) -> dict | None:
    """A response as its caller gets it: an encoded response as it is, an error as an error
    item (`rejected`: the request checks refused it), a flag-only FINAL (None) as an empty
    final answer when `flag_final` (the bridge form, or a client that asked for it)."""
    if isinstance(item, TritonError):
        return bridge_error(item, final, rejected)
    if item is not None:
        return item
    if final and flag_final:
        return encode(None, True)
    return None


def _answers(
    name: str,
    request_id: str,
    items: list[tuple[dict | TritonError | None, bool]],
    rejected: bool,
    encode: Callable[[InferenceResponse | None, bool], dict],
) -> list[dict]:
    """A unary request's kept responses as its caller gets them (`_item`, the bridge form);
    each error logged in its one line."""
    out = []
    for item, final in items:
        if isinstance(item, TritonError):
            request_failed(name, request_id, item)
        answer = _item(item, final, rejected, encode, True)
        if answer is not None:
            out.append(answer)
    return out


def _encoded(
    encode: Callable[[InferenceResponse, bool], Any],
    response: InferenceResponse | None,
    final: bool,
    name: str,
) -> Any | TritonError | None:
    """On the model's thread: `response` encoded for its caller, its error, or None for a
    flag-only FINAL. A response the wire cannot carry fails the request with a clear text (the
    encoder's own Triton status and text when it refuses with one): nothing of the bridge's
    raises into the model's thread."""
    if response is None:
        return None
    if response.has_error():
        return response.error()
    try:
        return encode(response, final)
    except TritonStatusError as exc:
        return exc.triton_error()
    except Exception as exc:
        log.exception("'%s': a response could not be encoded", name)
        what = f"the response could not be encoded: {exc!r}"
        return TritonError(failed_requests_text(name, what), TritonError.INTERNAL)


async def _with_trace(item: dict | None, trace: RequestTrace) -> dict | None:
    """The final answer with its request's trace, once the trace is complete: its REQUEST_END
    comes when `execute` returns, which may be after the final response was sent."""
    if "REQUEST_START" not in trace.times:  # refused before a model took it: nothing to wait for
        return item
    done = asyncio.get_running_loop().create_future()

    def settle() -> None:
        if not done.done():
            done.set_result(None)

    def complete() -> None:
        done.get_loop().call_soon_threadsafe(settle)

    if trace.when_complete(complete):
        try:
            await asyncio.wait_for(done, TRACE_WAIT_S)
        except TimeoutError:
            log.warning("trace of a '%s' request not complete; sent as it is", trace.model_name)
    if item is None:
        return None
    return {**item, "trace": trace.to_wire()}


def _standard_response(name: str, response: InferenceResponse | None, final: bool) -> dict:
    # The standard form has no flag-only FINAL of its own: generate() decides whether the
    # client gets Triton's empty final response.
    return (
        encode_response(name, response, final)
        if response is not None
        else empty_final_response(name)
    )


def _answering_version(model: ServedModel, requested: int) -> str:
    """The version that answers a request for `requested` (-1: the model's default)."""
    if requested != -1:
        return str(requested)
    return str(getattr(model.latest, "version", ""))


# How many responses of one request may wait for its client before the model's `send()` blocks
# (backpressure). A client that keeps up never comes near it (the loop takes each response as
# it comes); one that stops reading holds at most 32 responses here (a token stream: a few KB;
# 1 MB tensors: 32 MB) instead of everything the model can produce (issue 22: 1.3 GB and more).
# A waiting sender goes on once the client has taken half of them, so a model ahead of its
# client costs one thread wake-up per 16 responses, not one per response.
RESPONSES_AHEAD = 32
_RESUME_AT = RESPONSES_AHEAD // 2
_MAKING_ROOM = threading.Lock()


class _Responses:
    """One request's responses, handed from the model's threads to the event loop in order.

    The model's thread appends to a deque and wakes the loop with `call_soon_threadsafe` only
    when no wake-up is already on its way, so a burst of streamed responses costs the loop one
    wake-up, not one per response. Every flag here is a plain attribute: reads and writes of
    one attribute are atomic under the GIL, and the loop only clears `_wake_pending` before it
    looks at the deque again, so no response can be left behind without a wake-up.

    The queue is bounded: a response that finds RESPONSES_AHEAD others waiting blocks its
    sender's thread until the loop has taken half of them, the client is gone (`close`), or a
    final response came (a closing model fails what is open). A final response, a response given on
    the loop's own thread (early errors, cancellation callbacks) and one the loader says must
    not wait (`respond_may_wait`: preserve_ordering's shared gate) never wait, so the loop
    itself is never blocked. A sender counts itself in `_senders_waiting` before it looks at
    the length again under `_room`'s lock, and the loop pops before it reads the count: one of
    them always sees the other, so no wake-up is lost.
    """

    __slots__ = (
        "_loop",
        "_loop_thread",
        "_name",
        "encode",
        "_items",
        "_waiter",
        "_wake_pending",
        "_room",
        "_senders_waiting",
        "_ended",
        "gone",
    )

    def __init__(self, loop: asyncio.AbstractEventLoop, name: str) -> None:
        self._loop = loop
        self._loop_thread = threading.get_ident()  # built on the loop (generate)
        self._name = name
        # encode(response or None, final) -> the dict yielded: the standard form unless the
        # request asked for the bridge form.
        self.encode: Callable[[InferenceResponse | None, bool], dict] = functools.partial(
            _standard_response, name
        )
        self._items: deque[tuple[Any, bool]] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._wake_pending = False
        # Made by the first sender that must wait (_wait_for_room): most requests never need
        # one, and a Condition costs every request a few microseconds on the loop.
        self._room: threading.Condition | None = None
        self._senders_waiting = 0
        self._ended = False  # a final response is queued: nothing after it is read
        self.gone = False  # nobody listens any more: drop what the model sends

    def respond(self, response: InferenceResponse | None, final: bool) -> None:
        """The loader's `Respond`: runs on the model's thread (or the loop, for early errors)."""
        if self.gone:
            return
        # Encode here, so the event loop only hands the dict over.
        item = _encoded(self.encode, response, final, self._name)
        if final:
            self._ended = True
            if self._senders_waiting:
                self._release()
        elif len(self._items) >= RESPONSES_AHEAD and self._may_wait():
            self._wait_for_room()
            if self.gone:
                return
        self._items.append((item, final))
        if not self._wake_pending:
            self._wake_pending = True
            self._loop.call_soon_threadsafe(self._wake)

    def _may_wait(self) -> bool:
        # Never the loop itself, and never a thread that holds a lock the loop may need.
        return threading.get_ident() != self._loop_thread and respond_may_wait()

    def _wait_for_room(self) -> None:
        """On the sender's thread: wait until the client took half the queue, or left."""
        room = self._room
        if room is None:
            with _MAKING_ROOM:  # two senders of one request must make the same Condition
                room = self._room
                if room is None:
                    room = self._room = threading.Condition(threading.Lock())
        with room:
            self._senders_waiting += 1
            try:
                while len(self._items) > _RESUME_AT and not (self.gone or self._ended):
                    # The timeout only guards against a wake-up this class forgot to give.
                    room.wait(1.0)
            finally:
                self._senders_waiting -= 1

    def _release(self) -> None:
        # Called only when a sender counts itself waiting, so after it made `_room`.
        room = self._room
        if room is not None:
            with room:
                room.notify_all()

    def close(self) -> None:
        """On the loop: nobody reads this request's responses any more. Later ones are
        dropped, and a sender waiting for room goes on (its response dropped too)."""
        self.gone = True
        # Lets go of the output sinks the request gave (codec.output_sinks): the loader may
        # keep this object's `respond` until the instance's next request.
        self.encode = functools.partial(_standard_response, self._name)
        if self._senders_waiting:
            self._release()

    def client_gone(self) -> None:
        """On the loop: the client cancelled, timed out or disconnected."""
        self._items.append((_GONE, True))
        self._wake()

    def _wake(self) -> None:
        self._wake_pending = False
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def next(self) -> tuple[Any, bool]:
        items = self._items
        while not items:
            self._waiter = waiter = self._loop.create_future()
            try:
                await waiter
            finally:
                self._waiter = None
        item = items.popleft()
        if self._senders_waiting and len(items) <= _RESUME_AT:
            self._release()
        return item


class _Collected:
    """One unary request's responses (ModelWorker.answer), kept as the model's thread gives
    them and handed to the event loop once: `done` is set with the final one."""

    __slots__ = ("_loop", "_loop_thread", "_name", "done", "encode", "items", "gone")

    def __init__(self, loop: asyncio.AbstractEventLoop, name: str) -> None:
        self._loop = loop
        self._loop_thread = threading.get_ident()  # built on the loop (answer)
        self._name = name
        self.done: asyncio.Future[None] = loop.create_future()
        # Set by ModelWorker._admit for the bridge form, as _Responses.encode.
        self.encode: Callable[[InferenceResponse | None, bool], dict] = functools.partial(
            _standard_response, name
        )
        self.items: list[tuple[dict | TritonError | None, bool]] = []
        self.gone = False  # nobody waits any more: drop what the model sends

    def respond(self, response: InferenceResponse | None, final: bool) -> None:
        """The loader's `Respond`: on the model's thread (or the loop, for early errors)."""
        if self.gone:
            return
        self.items.append((_encoded(self.encode, response, final, self._name), final))
        if final:
            if threading.get_ident() == self._loop_thread:
                self._settle()
            else:
                self._loop.call_soon_threadsafe(self._settle)

    def _settle(self) -> None:
        if not self.done.done():
            self.done.set_result(None)

    def client_gone(self) -> None:
        """On the loop: the client cancelled, timed out or disconnected."""
        self.gone = True
        self._settle()

    def close(self) -> None:
        """On the loop: later responses are dropped, and the output sinks let go of."""
        self.gone = True
        self.encode = functools.partial(_standard_response, self._name)


class ThreadAnswer:
    """One unary request's responses for a caller on a thread of its own
    (ModelWorker.answer_on_thread): kept, encoded, as the model's thread gives them; `wait`
    returns them with the final one, or at once when `cancel` (any thread) gives the request
    up."""

    __slots__ = ("_name", "encode", "_items", "gone", "_pending", "_ready", "_settled")

    def __init__(self, name: str) -> None:
        self._name = name
        # Set by answer_on_thread to the caller's encoder, its version bound.
        self.encode: Callable[[InferenceResponse, bool], Any] = _unset_encoder
        self._items: list[Any | TritonError | None] = []
        self.gone = False  # nobody waits any more: drop what the model sends
        self._pending: Cancellable | None = None
        self._ready = threading.Lock()
        self._ready.acquire()  # released once: by the final response, or by cancel
        self._settled = threading.Lock()

    def respond(self, response: InferenceResponse | None, final: bool) -> None:
        """The loader's `Respond`: on the model's thread (or the caller's, for the request
        checks' refusals and response cache hits)."""
        if self.gone:
            return
        self._items.append(_encoded(self.encode, response, final, self._name))
        if final:
            self._settle()

    def _settle(self) -> None:
        if self._settled.acquire(blocking=False):
            self._ready.release()

    def wait(self, pending: Cancellable | None, request_id: str) -> list[Any | TritonError]:
        """The request's encoded responses and errors once the final response came (`pending`:
        what `Model.submit` returned, None if it answered at once), a flag-only FINAL left
        out; [] if it was given up."""
        self._pending = pending
        if self.gone and pending is not None:  # cancelled while it was being submitted
            pending.cancel()
        self._ready.acquire()
        if self.gone:
            return []
        # Answered: gRPC's call-end callback (`cancel`, after every call) has nothing to cancel.
        self._pending = None
        out = []
        for item in self._items:
            if isinstance(item, TritonError):
                request_failed(self._name, request_id, item)
            if item is not None:
                out.append(item)
        return out

    def cancel(self) -> None:
        """The caller gave up (client cancel, deadline, disconnect, shutdown)."""
        self.gone = True
        pending = self._pending
        if pending is not None:
            pending.cancel()
        self._settle()


def _unset_encoder(response: InferenceResponse, final: bool) -> Any:
    raise RuntimeError("a response came before answer_on_thread set its encoder")


class _CancellationPoller:
    """Tells a request's `_Responses` when Dynamo says its client is gone.

    Dynamo does not cancel the handler when the client cancels, times out or disconnects; it
    stops the request's context within ~15 ms. One timer polls `is_stopped()` of every request
    in flight every POLL_SECONDS, and runs only while requests are in flight: a timer per
    worker costs a request two dict operations, where an `async_killed_or_stopped()` task per
    request cost a task, a Rust future and two loop wake-ups.
    """

    POLL_SECONDS = 0.01

    def __init__(self) -> None:
        self._watched: dict[_Responses | _Collected, Any] = {}
        self._timer: asyncio.TimerHandle | None = None

    def watch(
        self, loop: asyncio.AbstractEventLoop, responses: _Responses | _Collected, context: Any
    ) -> None:
        self._watched[responses] = context
        if self._timer is None:
            self._timer = loop.call_later(self.POLL_SECONDS, self._poll, loop)

    def unwatch(self, responses: _Responses | _Collected) -> None:
        self._watched.pop(responses, None)

    def _poll(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        for responses, context in list(self._watched.items()):
            try:
                stopped = context.is_stopped() or context.is_killed()
            except Exception as exc:  # never fail the request over the watcher
                log.debug("cancellation check failed: %r", exc)
                stopped = False
            if stopped:
                del self._watched[responses]
                responses.client_gone()
        if self._watched:
            self._timer = loop.call_later(self.POLL_SECONDS, self._poll, loop)
