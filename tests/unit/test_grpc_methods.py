"""Which pool of threads each RPC of the door's synchronous gRPC server runs on
(bridge/frontends/triton/grpc/methods.py): the pools are kept apart, so that no kind of call can
take another's threads. gRPC Python runs an RPC on the pool its handler function carries
(`experimental_thread_pool`), else on the server's own (`Threads.infer`)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import grpc
import pytest
from tritonclient.grpc import service_pb2 as pb

from bridge.frontends.triton.grpc.methods import SERVICE, Threads, method_handlers
from bridge.frontends.triton.grpc.servicer import TritonServicer

RPCS = [m.name for m in pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods]


class _Call(grpc.HandlerCallDetails):
    def __init__(self, name: str) -> None:
        self.method = f"/{SERVICE}/{name}"
        self.invocation_metadata = ()


@pytest.fixture
def threads() -> Iterator[Threads]:
    pools = Threads(max_streams=4)
    yield pools
    pools.shutdown()


def _pool_of(threads: Threads, name: str) -> object:
    loop = asyncio.new_event_loop()
    try:
        handler = method_handlers(TritonServicer(None), loop, threads).service(_Call(name))  # type: ignore[arg-type]
    finally:
        loop.close()
    assert handler is not None, name
    behavior = handler.unary_unary or handler.stream_stream
    return getattr(behavior, "experimental_thread_pool", threads.infer)


@pytest.mark.parametrize("name", RPCS)
def test_each_rpc_runs_on_its_kind_s_pool(threads: Threads, name: str) -> None:
    expected = {"ModelInfer": threads.infer, "ModelStreamInfer": threads.streams}
    assert _pool_of(threads, name) is expected.get(name, threads.other)


def test_the_pools_are_bounded_and_apart(threads: Threads) -> None:
    pools = [threads.infer, threads.other, threads.streams, threads.readers]
    assert len({id(p) for p in pools}) == 4
    assert threads.streams._max_workers == 4 + 4  # the seats, and room to refuse one more
    assert threads.readers._max_workers == 4
    assert threads.other._max_workers < threads.infer._max_workers
