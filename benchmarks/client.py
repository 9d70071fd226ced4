"""The load generator: grpc.aio, prebuilt raw requests, closed or open loop.

One cell is one workload against one server at one load:
* closed loop (`run_cell`): `concurrency` coroutines each send a request, wait for its whole
  answer, check it and send the next, until `max_requests` were sent or `max_seconds` passed;
* open loop (`run_open_cell`): requests start at a fixed rate whatever the answers do, and each
  one's latency counts from the moment it was due, so time spent queueing (in the server, or
  behind a client that fell behind) is in the figure instead of silently slowing the load.

The client is the same for every server, so its own cost (about the same per request) is part
of every number alike; its CPU time per request is recorded (`client_cpu_ms`) so a reader can
see how much of a small request's latency the client itself takes.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field
from typing import Any

import grpc
import numpy as np
from tritonclient.grpc import service_pb2

from .workloads import Workload

_INFER = "/inference.GRPCInferenceService/ModelInfer"
_STREAM_INFER = "/inference.GRPCInferenceService/ModelStreamInfer"
# Responses of 1M FP32 are 4 MB; gRPC's default receive cap is 4 MiB.
_CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.max_send_message_length", 64 << 20),
]


@dataclass
class CellResult:
    """What one server did in one cell. Latencies are in seconds, per request."""

    latencies: list[float] = field(default_factory=list)
    errors: int = 0
    first_error: str = ""
    elapsed: float = 0.0  # wall time of the measured window
    drained: int = 0  # requests finished after the measured window (checked, not measured)
    drain_max: float = 0.0  # the slowest of those, in seconds
    client_cpu: float = 0.0  # the client process's CPU seconds over the measured window
    # Per turn merged in (None for a turn with no answer): on a noisy machine the median of
    # per-round ratios is steadier than the ratio of pooled figures, and its range shows the
    # noise.
    turn_p50_ms: list[float | None] = field(default_factory=list)
    turn_p99_ms: list[float | None] = field(default_factory=list)
    turn_rps: list[float | None] = field(default_factory=list)

    def error(self, reason: str) -> None:
        self.errors += 1
        if not self.first_error:
            self.first_error = reason

    def merge(self, other: CellResult) -> None:
        ok = bool(other.latencies)
        lat = np.asarray(other.latencies) * 1000.0
        self.turn_p50_ms.append(float(np.percentile(lat, 50)) if ok else None)
        self.turn_p99_ms.append(float(np.percentile(lat, 99)) if ok else None)
        self.turn_rps.append(len(lat) / other.elapsed if ok and other.elapsed > 0 else None)
        self.latencies.extend(other.latencies)
        self.elapsed += other.elapsed
        self.client_cpu += other.client_cpu
        self.errors += other.errors
        self.first_error = self.first_error or other.first_error
        self.drained += other.drained
        self.drain_max = max(self.drain_max, other.drain_max)

    def summary(self) -> dict[str, float | int | str | None]:
        """p50 / p99 in ms and requests per second (None when nothing succeeded)."""
        ok = len(self.latencies)
        lat = np.asarray(self.latencies) * 1000.0
        return {
            "requests": ok,
            "errors": self.errors,
            "first_error": self.first_error,
            "p50_ms": float(np.percentile(lat, 50)) if ok else None,
            "p99_ms": float(np.percentile(lat, 99)) if ok else None,
            "mean_ms": float(lat.mean()) if ok else None,
            "rps": ok / self.elapsed if ok and self.elapsed > 0 else None,
            "seconds": self.elapsed,
            "drained": self.drained,
            "drain_max_ms": self.drain_max * 1000.0,
            "client_cpu_ms": self.client_cpu * 1000.0 / ok if ok else None,
            "turn_p50_ms": self.turn_p50_ms,
            "turn_p99_ms": self.turn_p99_ms,
            "turn_rps": self.turn_rps,
        }


class _WrongAnswer(Exception):
    pass


class _Caller:
    """Sends the workload's request once and checks the answer; raises on a wrong one."""

    def __init__(self, channel: grpc.aio.Channel, workload: Workload, timeout: float) -> None:
        self.workload = workload
        self.timeout = timeout
        # No request serializer: the request is already bytes.
        self._unary = channel.unary_unary(
            _INFER, response_deserializer=service_pb2.ModelInferResponse.FromString
        )
        self._stream = channel.stream_stream(
            _STREAM_INFER, response_deserializer=service_pb2.ModelStreamInferResponse.FromString
        )
        self._shared: _SharedStream | None = None

    async def __call__(self) -> None:
        workload = self.workload
        if not workload.streaming:
            problem = workload.check(await self._unary(workload.request, timeout=self.timeout))
            if problem:
                raise _WrongAnswer(problem)
            return
        if workload.shared_stream:
            if self._shared is None:
                self._shared = _SharedStream(self._stream(), workload)
            await asyncio.wait_for(self._shared.call(), self.timeout)
            return
        # One stream per request: Dynamo 1.6 serves the requests of one stream one at a time.
        call = self._stream(iter((workload.request,)), timeout=self.timeout)
        received = 0
        async for message in call:
            if message.error_message:
                raise _WrongAnswer(message.error_message)
            problem = workload.check_stream(received, message.infer_response)
            if problem:
                raise _WrongAnswer(problem)
            received += 1
        if received != workload.stream_responses:
            raise _WrongAnswer(f"{received} responses, expected {workload.stream_responses}")

    async def close(self) -> None:
        if self._shared is not None:
            await self._shared.close()
            self._shared = None


class _SharedStream:
    """One ModelStreamInfer call that every request of a turn shares: each request carries an
    id of its own, and a reader hands each response to the request its id names."""

    def __init__(self, call: Any, workload: Workload) -> None:
        self._call = call
        self._workload = workload
        self._template = service_pb2.ModelInferRequest.FromString(workload.request)
        self._next_id = 0
        self._waiting: dict[str, tuple[asyncio.Future[None], list[int]]] = {}
        self._write_lock = asyncio.Lock()
        self._reader = asyncio.ensure_future(self._read())

    async def call(self) -> None:
        self._next_id += 1
        request_id = str(self._next_id)
        self._template.id = request_id
        data = self._template.SerializeToString()
        done = asyncio.get_running_loop().create_future()
        self._waiting[request_id] = (done, [0])
        try:
            async with self._write_lock:  # one write at a time on a gRPC call
                await self._call.write(data)
            await done
        finally:
            self._waiting.pop(request_id, None)

    async def _read(self) -> None:
        workload = self._workload
        try:
            async for message in self._call:
                response = message.infer_response
                entry = self._waiting.get(response.id)
                if message.error_message or entry is None:
                    reason = message.error_message or f"a response for unknown id {response.id!r}"
                    for done, _ in self._waiting.values():
                        if not done.done():
                            done.set_exception(_WrongAnswer(reason))
                    continue
                done, received = entry
                if done.done():
                    continue
                problem = workload.check_stream(received[0], response)
                received[0] += 1
                if problem:
                    done.set_exception(_WrongAnswer(problem))
                elif received[0] == workload.stream_responses:
                    done.set_result(None)
        except Exception as exc:
            for done, _ in self._waiting.values():
                if not done.done():
                    done.set_exception(exc)

    async def close(self) -> None:
        try:
            await self._call.done_writing()
            await asyncio.wait_for(self._reader, 10)
        except Exception:  # the channel closes next anyway
            self._reader.cancel()
            self._call.cancel()


def _reason(exc: BaseException) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {exc.details()}"
    if isinstance(exc, asyncio.TimeoutError):
        return "timed out"
    return f"{type(exc).__name__}: {exc}"


async def _warm_up(
    call: _Caller, result: CellResult, concurrency: int, waves: int, max_seconds: float
) -> bool:
    """Unmeasured waves of `concurrency` requests; False (and the error kept) if one failed.

    At the cell's concurrency: Dynamo opens request-plane connections as concurrent requests
    first need them, which costs tens of ms the first time.
    """
    warm_start = time.perf_counter()
    for wave in range(waves):
        if wave and time.perf_counter() - warm_start > max_seconds:
            break  # large tensors at high concurrency: one wave has opened everything
        outcomes = await asyncio.gather(
            *(call() for _ in range(concurrency)), return_exceptions=True
        )
        failures = [o for o in outcomes if isinstance(o, BaseException)]
        if failures:
            result.error(_reason(failures[0]))
            return False
    return True


async def run_cell(
    url: str,
    workload: Workload,
    concurrency: int,
    max_requests: int,
    max_seconds: float,
    warmup: int = 3,
    request_timeout: float = 30.0,
) -> CellResult:
    """Measure one cell against the server at `url` (host:port).

    Up to `warmup` waves of `concurrency` requests go first, unmeasured (waves after the first
    only while the warm-up has taken less than `max_seconds`). If one fails the cell stops
    there with that error, so a server that cannot run the workload costs one wave, not
    the whole budget. In-flight requests still running `request_timeout` s after the deadline
    are cancelled and counted as errors.

    Only the steady state is measured: requests that finished while `concurrency` were in
    flight. The drain after the first coroutine runs out of budget runs at falling concurrency
    (and showed ~40 ms stalls on Dynamo 1.6); those answers are still checked, and counted in
    `drained`, but not in the latencies, unless the window held less than one wave.
    """
    result = CellResult()
    async with grpc.aio.insecure_channel(url, options=_CHANNEL_OPTIONS) as channel:
        call = _Caller(channel, workload, request_timeout)
        if not await _warm_up(call, result, concurrency, warmup, max_seconds):
            return result

        remaining = max_requests
        cpu_start = time.process_time()
        start = time.perf_counter()
        deadline = start + max_seconds
        window_end = math.inf  # when the first coroutine ran out of budget
        completions: list[tuple[float, float]] = []  # (finished at, latency)

        async def worker() -> None:
            nonlocal remaining, window_end
            while remaining > 0 and time.perf_counter() < deadline:
                remaining -= 1
                sent = time.perf_counter()
                try:
                    await call()
                except Exception as exc:
                    result.error(_reason(exc))
                    continue
                finished = time.perf_counter()
                completions.append((finished, finished - sent))
            window_end = min(window_end, time.perf_counter())

        tasks = [asyncio.ensure_future(worker()) for _ in range(concurrency)]
        _, pending = await asyncio.wait(tasks, timeout=max_seconds + request_timeout)
        for task in pending:
            task.cancel()
            result.error("cancelled: still running after the cell's deadline")
        await asyncio.gather(*pending, return_exceptions=True)
        end = time.perf_counter()
        result.client_cpu = time.process_time() - cpu_start
        await call.close()

    steady = [lat for finished, lat in completions if finished <= window_end]
    if len(steady) >= concurrency and window_end > start:
        drained = [lat for finished, lat in completions if finished > window_end]
        result.latencies = steady
        result.elapsed = window_end - start
        result.drained = len(drained)
        result.drain_max = max(drained, default=0.0)
    else:
        result.latencies = [lat for _, lat in completions]
        result.elapsed = end - start
    return result


# Open loop: at most this many requests in flight at once. Past it the server has fallen so far
# behind that the figures say enough; further arrivals are counted as errors, not sent.
MAX_OUTSTANDING = 4096


async def run_open_cell(
    url: str,
    workload: Workload,
    rate: float,
    max_requests: int,
    max_seconds: float,
    warmup: int = 3,
    request_timeout: float = 30.0,
) -> CellResult:
    """Measure one open-loop cell: requests due every 1/`rate` s, for at most `max_requests`
    requests or `max_seconds` of arrivals, whichever is fewer.

    Each request's latency runs from when it was due to its checked answer, so a client that
    could not send on time (a busy event loop) adds to the latency rather than thinning the
    load (no coordinated omission). Requests still running `request_timeout` s after the last
    arrival are cancelled and counted as errors. `rps` is answers over the time from the first
    arrival to the last answer.
    """
    result = CellResult()
    async with grpc.aio.insecure_channel(url, options=_CHANNEL_OPTIONS) as channel:
        call = _Caller(channel, workload, request_timeout)
        if not await _warm_up(call, result, 1, warmup, max_seconds):
            return result
        interval = 1.0 / rate
        count = max(1, min(max_requests, int(max_seconds * rate)))
        latencies: list[float] = []
        in_flight: set[asyncio.Task[None]] = set()

        async def one(due: float) -> None:
            try:
                await call()
            except Exception as exc:
                result.error(_reason(exc))
                return
            latencies.append(time.perf_counter() - due)

        cpu_start = time.process_time()
        start = time.perf_counter()
        for i in range(count):
            due = start + i * interval
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if len(in_flight) >= MAX_OUTSTANDING:
                result.error(f"not sent: {MAX_OUTSTANDING} requests already in flight")
                continue
            task = asyncio.ensure_future(one(due))
            in_flight.add(task)
            task.add_done_callback(in_flight.discard)
        if in_flight:
            _, pending = await asyncio.wait(set(in_flight), timeout=request_timeout)
            for task in pending:
                task.cancel()
                result.error("cancelled: still running after the cell's deadline")
            await asyncio.gather(*pending, return_exceptions=True)
        result.elapsed = time.perf_counter() - start
        result.client_cpu = time.process_time() - cpu_start
        result.latencies = latencies
        await call.close()
    return result
