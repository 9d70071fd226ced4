"""bridge/offload.py: a request's large work off the event loop, on a pool of its own, and
waited for to its end when the request is cancelled (a thread left writing outputs into a
region the request gave back could reach another client's region)."""

from __future__ import annotations

import asyncio
import contextvars
import threading

import pytest

from bridge.offload import THREADS, run_off_loop

REQUEST = contextvars.ContextVar("REQUEST", default="none")


def test_the_work_runs_on_the_pool_with_the_caller_s_context() -> None:
    def work() -> tuple[str, str]:
        return threading.current_thread().name, REQUEST.get()

    async def main() -> tuple[str, str]:
        REQUEST.set("request 7")
        return await run_off_loop(work)

    thread, seen = asyncio.run(main())
    assert thread.startswith("offload")  # not asyncio's default executor, which loads models
    assert seen == "request 7"


@pytest.mark.parametrize("cancels", [1, 2])  # 2: e.g. a shutdown's cancel after the request's
def test_a_cancelled_request_lets_go_only_once_its_work_has_ended(cancels: int) -> None:
    started, release, ended = threading.Event(), threading.Event(), threading.Event()

    def work() -> None:
        started.set()
        release.wait(30)
        ended.set()
        raise OSError("the region went away")  # a failure nobody is left to hear

    async def main() -> None:
        request = asyncio.ensure_future(run_off_loop(work))
        await asyncio.to_thread(started.wait, 30)
        for _ in range(cancels):
            request.cancel()
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.1)
        assert not request.done()  # still waiting for its thread
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await request
        assert ended.is_set()

    asyncio.run(main())


def test_cancelled_work_that_has_not_started_never_runs() -> None:
    release = threading.Event()
    ran: list[int] = []

    async def main() -> None:
        busy = [
            asyncio.ensure_future(run_off_loop(lambda: release.wait(30))) for _ in range(THREADS)
        ]
        queued = asyncio.ensure_future(run_off_loop(lambda: ran.append(1)))
        await asyncio.sleep(0.1)
        queued.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(queued, 5)  # at once: it waits for no thread
        release.set()
        await asyncio.gather(*busy)
        await asyncio.sleep(0.1)

    asyncio.run(main())
    assert ran == []


def test_a_failure_reaches_the_caller() -> None:
    def work() -> None:
        raise ValueError("bad tensor")

    with pytest.raises(ValueError, match="bad tensor"):
        asyncio.run(run_off_loop(work))
