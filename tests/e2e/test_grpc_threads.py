"""The gRPC wire's threads (bridge/frontends/triton/grpc/server.py, issue 37): unary calls on a
pool of their own, each open stream on two threads of its own pools, at most
`--grpc-max-streams` streams at once. Idle or slow streams, and slow unary calls, leave room for
every other call; a stream past the limit is refused with RESOURCE_EXHAUSTED and the others go
on. Ordered by events (gate files, answers, the pending-request gauge), never by time.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from tests.e2e.metrics_support import scrape, value
from tests.e2e.support import WAIT_S, Gate, held_and_fast, wait_until

MAX_STREAMS = 8
HELD = 6  # slow unary calls held on the gate at once
CHANNELS = 2  # the streams' connections


def _request(model: str, number: int, parameters: dict[str, str] | None = None) -> Any:
    message = pb.ModelInferRequest(model_name=model)
    message.inputs.add(name="IN", datatype="INT32", shape=[1])
    message.raw_input_contents.append(np.array([number], np.int32).tobytes())
    for key, text in (parameters or {}).items():
        message.parameters[key].string_param = text
    return message


def _out(response: pb.ModelInferResponse) -> int:
    return int(np.frombuffer(response.raw_output_contents[0], np.int32)[0])


def _pending(metrics_port: int, model: str) -> float | None:
    return value(
        scrape(metrics_port), "nv_inference_pending_request_count", model=model, version="1"
    )


async def _seated_stream(stub: Any, number: int) -> Any:
    """A stream that has been answered once (so the server has seated it), then left idle."""
    call = stub.ModelStreamInfer()
    await call.write(_request("fast", number))
    answer = await asyncio.wait_for(call.read(), WAIT_S)
    assert answer.error_message == "" and _out(answer.infer_response) == number + 1
    return call


async def _streams_past_the_limit(url: str) -> None:
    channels = [grpc.aio.insecure_channel(url) for _ in range(CHANNELS + 1)]
    stubs = [service_pb2_grpc.GRPCInferenceServiceStub(c) for c in channels]
    streams: list[Any] = []
    try:
        for i in range(MAX_STREAMS):
            streams.append(await _seated_stream(stubs[1 + i % CHANNELS], i))
        # Every seat is taken: one more stream is refused, with the limit in its text.
        refused = stubs[0].ModelStreamInfer()
        try:
            # The refusal may come before the request is written (then the write raises it).
            await refused.write(_request("fast", 0))
            await asyncio.wait_for(refused.read(), WAIT_S)
            raise AssertionError("a stream past --grpc-max-streams was served")
        except grpc.aio.AioRpcError as exc:
            assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, exc
            assert f"at most {MAX_STREAMS}" in (exc.details() or ""), exc.details()
        # The open streams and unary calls go on.
        for number in range(20):
            assert _out(await stubs[0].ModelInfer(_request("fast", number), timeout=WAIT_S)) == (
                number + 1
            )
        await streams[0].write(_request("fast", 41))
        assert _out((await asyncio.wait_for(streams[0].read(), WAIT_S)).infer_response) == 42
        # A stream that ends gives its seat back.
        streams.pop().cancel()
        for _ in range(int(WAIT_S / 0.1)):
            try:
                streams.append(await _seated_stream(stubs[0], 7))
                break
            except grpc.aio.AioRpcError as exc:  # its handler has not finished yet
                assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, exc
                await asyncio.sleep(0.1)
        else:
            raise AssertionError("the seat of a cancelled stream never came back")
    finally:
        await _close(streams, channels)


def _serve(bridge_server: Any, tmp_path: Path) -> Any:
    server = bridge_server(held_and_fast(tmp_path / "repo"), f"--grpc-max-streams={MAX_STREAMS}")
    server.wait_model_ready("held")
    server.wait_model_ready("fast")
    return server


async def _close(calls: list[Any], channels: list[grpc.aio.Channel]) -> None:
    for call in calls:
        call.cancel()
    for channel in channels:
        await channel.close()


def test_a_stream_past_the_limit_is_refused_and_the_rest_go_on(bridge_server, tmp_path):
    server = _serve(bridge_server, tmp_path)
    asyncio.run(_streams_past_the_limit(server.grpc_url))


async def _slow_calls_and_open_streams(url: str, metrics_port: int, gate: Gate) -> None:
    channels = [grpc.aio.insecure_channel(url) for _ in range(CHANNELS + 1)]
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channels[0])
    streams: list[Any] = []
    held: list[asyncio.Future] = []
    try:
        held = [
            asyncio.ensure_future(
                stub.ModelInfer(_request("held", i, gate.params(f"u{i}")), timeout=WAIT_S * 4)
            )
            for i in range(HELD)
        ]

        # One held call runs (the model's one instance), the others wait in its queue: every
        # held call is on a thread of the server, waiting for the model.
        def all_submitted() -> bool:
            running = sum(gate.started(f"u{i}") for i in range(HELD))
            return running == 1 and _pending(metrics_port, "held") == HELD - 1

        await asyncio.to_thread(wait_until, all_submitted, "the held calls in the model's queue")
        for i in range(MAX_STREAMS - 2):  # idle streams
            stream_stub = service_pb2_grpc.GRPCInferenceServiceStub(channels[1 + i % CHANNELS])
            streams.append(await _seated_stream(stream_stub, i))
        slow_stream = stub.ModelStreamInfer()  # a stream whose request the gate holds
        streams.append(slow_stream)
        await slow_stream.write(_request("held", 100, gate.params("stream")))

        # Meanwhile unary calls and a new stream are answered.
        for number in range(20):
            assert _out(await stub.ModelInfer(_request("fast", number), timeout=WAIT_S)) == (
                number + 1
            )
        streams.append(await _seated_stream(stub, 5))
        assert not any(call.done() for call in held)

        gate.open()
        answers = await asyncio.gather(*held)
        assert [_out(a) for a in answers] == [i + 1 for i in range(HELD)]
        answer = await asyncio.wait_for(slow_stream.read(), WAIT_S)
        assert _out(answer.infer_response) == 101
    finally:
        gate.open()
        await _close([*held, *streams], channels)


def test_slow_unary_calls_and_open_streams_leave_room_for_other_calls(bridge_server, tmp_path):
    server = _serve(bridge_server, tmp_path)
    gates = tmp_path / "gates"
    gates.mkdir()
    asyncio.run(_slow_calls_and_open_streams(server.grpc_url, server.metrics_port, Gate(gates)))


def _allowed_cpus(status: str) -> set[int]:
    """`Cpus_allowed_list` of a /proc status file ("0-3,5") as a set."""
    line = next(x for x in status.splitlines() if x.startswith("Cpus_allowed_list:"))
    cpus: set[int] = set()
    for part in line.split(":", 1)[1].strip().split(","):
        low, _, high = part.partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    return cpus


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to choose from")
def test_the_grpc_threads_run_on_one_cpu_and_the_rest_on_all(bridge_server, tmp_path):
    """`--grpc-thread-cpu` by default: the gRPC server's threads (its poller, the threads of
    the calls) on the last CPU, the process's other threads (the loop's among them) on all."""
    server = _serve(bridge_server, tmp_path)

    async def calls() -> None:
        async with grpc.aio.insecure_channel(server.grpc_url) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            answers = await asyncio.gather(
                *(stub.ModelInfer(_request("fast", n), timeout=WAIT_S) for n in range(8))
            )
            assert [_out(a) for a in answers] == [n + 1 for n in range(8)]

    asyncio.run(calls())
    everywhere = os.sched_getaffinity(0)
    chosen = max(everywhere)
    assert f"its threads on CPU {chosen}" in server.log_text
    tasks = Path(f"/proc/{server.process.pid}/task")
    allowed = {int(t.name): _allowed_cpus((t / "status").read_text()) for t in tasks.iterdir()}
    assert allowed[server.process.pid] == everywhere  # the main thread: the event loop's
    assert sum(cpus == {chosen} for cpus in allowed.values()) >= 2  # the poller and a call's


INFER_THREADS = 2
FLOOD = 40  # calls to the held model at once: more than the server may hold


async def _flood_past_the_cap(url: str, gate: Gate, max_calls: int) -> None:
    async with grpc.aio.insecure_channel(url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        calls = [
            asyncio.ensure_future(
                stub.ModelInfer(_request("held", i, gate.params(f"f{i}")), timeout=WAIT_S * 4)
            )
            for i in range(FLOOD)
        ]
        try:
            # The gate holds every call the server took, so those past the cap, and only
            # those, end now.
            refused = FLOOD - max_calls

            def cap_reached() -> bool:
                return sum(call.done() for call in calls) >= refused

            await asyncio.to_thread(wait_until, cap_reached, "the calls past the cap refused")
            ended = [call for call in calls if call.done()]
            assert len(ended) == refused
            for call in ended:
                error = call.exception()
                assert isinstance(error, grpc.aio.AioRpcError), error
                assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error
            gate.open()
            answered = [(i, await call) for i, call in enumerate(calls) if call not in ended]
            assert [_out(answer) for _, answer in answered] == [i + 1 for i, _ in answered]
            # With room again, a call is answered.
            assert _out(await stub.ModelInfer(_request("fast", 9), timeout=WAIT_S)) == 10
        finally:
            gate.open()
            for call in calls:
                call.cancel()


def test_unary_calls_past_every_thread_and_the_waiting_room_are_refused(bridge_server, tmp_path):
    """`--grpc-infer-threads=N`: N ModelInfer calls run, N more wait for a thread, and the
    server holds at most every pool's threads plus those N (docs/security.md, "gRPC
    threads"); a call past that is refused with RESOURCE_EXHAUSTED, not queued without end."""
    server = bridge_server(
        held_and_fast(tmp_path / "repo"),
        f"--grpc-infer-threads={INFER_THREADS}",
        "--grpc-max-streams=1",
    )
    server.wait_model_ready("held")
    server.wait_model_ready("fast")
    gates = tmp_path / "gates"
    gates.mkdir()
    # every thread (N for ModelInfer, 16 for the other unary RPCs, 1 + 4 for streams) and N more
    max_calls = 2 * INFER_THREADS + 16 + 1 + 4
    asyncio.run(_flood_past_the_cap(server.grpc_url, Gate(gates), max_calls))
