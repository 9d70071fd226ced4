"""bridge/frontends/triton/grpc/on_loop.py's reading of a stream's requests, in memory: a
request is taken from gRPC only once the handler asks for it, so a handler that stops asking
(a stream's requests in flight at their bound, servicer.py) stops the reading, and gRPC's flow
control then holds the client's sends."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

from bridge.frontends.triton.grpc.on_loop import _Incoming


class Counted:
    """A client's requests as gRPC's request iterator gives them, counting what was taken."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.taken = 0

    def __iter__(self) -> Iterator[int]:
        return self

    def __next__(self) -> int:
        if self.taken == self.count:
            raise StopIteration
        self.taken += 1
        return self.taken


def test_requests_are_read_as_the_handler_asks_for_them() -> None:
    requests = Counted(10_000)

    async def main() -> None:
        incoming = _Incoming(asyncio.get_running_loop())
        reader = threading.Thread(target=incoming.read, args=(requests,))
        reader.start()
        received = incoming.iterate()
        assert [await anext(received) for _ in range(3)] == [1, 2, 3]
        await asyncio.sleep(0.2)  # a reader running ahead would take thousands meanwhile
        assert requests.taken <= 4  # the three asked for, and at most the one being asked
        incoming.close()  # the call is over: the reader waiting to be asked ends
        await asyncio.to_thread(reader.join, 10)
        assert not reader.is_alive()

    asyncio.run(main())


def test_the_end_and_a_failure_reach_the_handler() -> None:
    async def main() -> None:
        incoming = _Incoming(asyncio.get_running_loop())
        threading.Thread(target=incoming.read, args=(Counted(2),)).start()
        assert [request async for request in incoming.iterate()] == [1, 2]

        def broken() -> Iterator[int]:
            yield 1
            raise RuntimeError("the call broke")

        incoming = _Incoming(asyncio.get_running_loop())
        threading.Thread(target=incoming.read, args=(broken(),)).start()
        received = incoming.iterate()
        assert await anext(received) == 1
        try:
            await anext(received)
        except RuntimeError as exc:
            assert str(exc) == "the call broke"
        else:
            raise AssertionError("the failure did not reach the handler")

    asyncio.run(main())
