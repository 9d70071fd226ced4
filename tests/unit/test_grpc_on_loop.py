"""bridge/frontends/triton/grpc/on_loop.py's reading of a stream's requests, in memory: the
reader takes requests from gRPC at most READ_AHEAD ahead of the handler, so a handler that
stops asking (a stream's requests in flight at their bound, servicer.py) stops the reading,
and gRPC's flow control then holds the client's sends."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

from bridge.frontends.triton.grpc.on_loop import READ_AHEAD, _Incoming


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


def test_requests_are_read_at_most_read_ahead_of_the_handler() -> None:
    requests = Counted(10_000)

    async def main() -> None:
        incoming = _Incoming(asyncio.get_running_loop())
        reader = threading.Thread(target=incoming.read, args=(requests,))
        reader.start()
        received = incoming.iterate()
        assert [await anext(received) for _ in range(3)] == [1, 2, 3]
        await asyncio.sleep(0.2)  # a reader without a bound would take thousands meanwhile
        assert requests.taken <= 3 + READ_AHEAD  # the three taken, and no more than room for
        incoming.close()  # the call is over: the reader waiting for room ends
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
