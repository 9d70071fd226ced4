"""Choosing an endpoint's instance (bridge/cluster/instances.py) and refusing requests that
arrived after their caller gave up (bridge/transport/arrival.py), in memory. End to end, on three
network namespaces with a link cut: tests/e2e/test_multi_host.py and benchmarks/partition.py.

`Endpoint` below stands for a Dynamo endpoint client: it has the two calls `Instances` makes
(`instance_ids`, `direct`), and answers them as ai-dynamo-runtime 1.6.1 was measured to
(the texts are the runtime's)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from bridge.cluster.instances import Failure, Instances, classify
from bridge.codec import PING, PONG
from bridge.transport import arrival
from bridge.transport.arrival import Arrivals, stamp

TIMED_OUT = RuntimeError("DeadlineExceeded: TCP request to 10.213.0.11:44429 timed out")
REFUSED = RuntimeError("Unavailable: TCP connection to 10.213.0.11:44429 failed: refused")


class Endpoint:
    """Instances that answer at once (a list of items), fail to open (an exception), or hold the
    request open until `release` (a stalled worker). A ping is answered like a request, with
    PONG where the instance answers."""

    def __init__(self, **behaviour: Any) -> None:
        self.behaviour = {int(k[1:]): v for k, v in behaviour.items()}  # "i1" -> 1
        self.sent: list[int] = []
        self.pinged: list[int] = []
        self.release = asyncio.Event()

    def instance_ids(self) -> list[int]:
        return list(self.behaviour)

    async def direct(self, request: Any, instance_id: int, **_: Any) -> AsyncIterator[dict]:
        if request == PING:
            self.pinged.append(instance_id)
        else:
            self.sent.append(instance_id)
        outcome = self.behaviour[instance_id]
        if isinstance(outcome, Exception):
            raise outcome
        return self._items(outcome, request == PING)

    async def _items(self, outcome: Any, ping: bool) -> AsyncIterator[dict]:
        if outcome == "stall":
            await self.release.wait()
        yield dict(PONG) if ping else {"final": True}


async def drain(stream: AsyncIterator[dict]) -> list[dict]:
    return [item async for item in stream]


def test_the_failures_are_told_apart() -> None:
    assert classify(TIMED_OUT) is Failure.UNREACHABLE
    assert classify(REFUSED) is Failure.GONE
    assert classify(RuntimeError("Unavailable: unknown endpoint x")) is Failure.GONE
    assert classify(RuntimeError("InvalidRequest: ValueError: bad")) is Failure.OTHER


def test_new_requests_pass_a_stalled_instance_by() -> None:
    """A worker that holds its requests (cut off) gets no more while a replica answers."""

    async def run() -> list[int]:
        endpoint = Endpoint(i1="stall", i2=[])
        instances = Instances(endpoint)
        held = asyncio.ensure_future(drain(await instances.open({}, None)))
        await asyncio.sleep(0)
        for _ in range(6):
            await drain(await instances.open({}, None))
        endpoint.release.set()
        await held
        return endpoint.sent

    sent = asyncio.run(run())
    assert sent.count(1) == 1 and sent.count(2) == 6


def test_replicas_share_requests_while_they_answer() -> None:
    async def run() -> list[int]:
        endpoint = Endpoint(i1=[], i2=[], i3=[])
        instances = Instances(endpoint)
        for _ in range(9):
            await drain(await instances.open({}, None))
        return endpoint.sent

    sent = asyncio.run(run())
    assert sorted(sent.count(i) for i in (1, 2, 3)) == [3, 3, 3]


def test_an_unreachable_instance_is_ejected_and_its_request_not_sent_again() -> None:
    async def run() -> tuple[list[int], list[int], int]:
        endpoint = Endpoint(i1=TIMED_OUT, i2=[])
        instances = Instances(endpoint)
        failed = 0
        for _ in range(5):
            try:
                await drain(await instances.open({}, None))
            except RuntimeError as exc:
                assert exc is TIMED_OUT
                failed += 1
        ejected = instances.ejected()
        instances.close()
        return endpoint.sent, ejected, failed

    sent, ejected, failed = asyncio.run(run())
    assert ejected == [1] and failed == sent.count(1) == 1  # once ejected, nothing more went
    assert sent.count(2) == 4


def test_an_ejected_instance_comes_back_when_it_answers_its_ping() -> None:
    """The ping goes through the endpoint's own client, as its requests do."""

    async def run() -> tuple[list[int], list[int], list[int], list[int]]:
        endpoint = Endpoint(i1=TIMED_OUT, i2=[])
        instances = Instances(endpoint)
        for _ in range(2):
            with contextlib.suppress(RuntimeError):
                await drain(await instances.open({}, None))
        out = instances.ejected()
        await asyncio.sleep(0.7)  # a probe period: its ping fails too, still out
        still_out = instances.ejected()
        endpoint.behaviour[1] = []  # the link is back
        await asyncio.sleep(0.7)
        return out, still_out, instances.ejected(), endpoint.pinged

    out, still_out, after, pinged = asyncio.run(run())
    assert out == [1] and still_out == [1] and after == []
    assert set(pinged) == {1}


def test_an_instance_that_cannot_be_pinged_is_tried_again_later() -> None:
    async def run() -> tuple[list[int], list[int]]:
        endpoint = Endpoint(i1=TIMED_OUT)
        instances = Instances(endpoint, pingable=False)
        with contextlib.suppress(RuntimeError):
            await drain(await instances.open({}, None))
        out = instances.ejected()
        instances.close()
        return out, endpoint.pinged

    assert asyncio.run(run()) == ([1], [])  # never pinged (a foreign worker has no PONG)


def test_a_gone_instance_is_passed_by_at_once() -> None:
    async def run() -> list[int]:
        endpoint = Endpoint(i1=REFUSED, i2=[])
        instances = Instances(endpoint)
        for _ in range(3):
            await drain(await instances.open({}, None))
        return endpoint.sent

    sent = asyncio.run(run())
    assert sent.count(1) == 1 and sent.count(2) == 3  # the refused request went to 2 too


def test_when_every_instance_is_out_one_is_still_tried() -> None:
    async def run() -> list[int]:
        endpoint = Endpoint(i1=TIMED_OUT)
        instances = Instances(endpoint)
        for _ in range(2):
            with contextlib.suppress(RuntimeError):
                await drain(await instances.open({}, None))
        instances.close()
        return endpoint.sent

    assert asyncio.run(run()) == [1, 1]


# -- arrival.py -------------------------------------------------------------------------------


@pytest.fixture
def caller_waits_1s() -> Any:
    arrival.set_caller_timeout(1.0)
    yield
    arrival.set_caller_timeout(None)


def sent_ago(seconds: float, sender: str = "door") -> list:
    return [sender, time.monotonic_ns() - int(seconds * 1e9), 1000]


def test_a_request_later_than_its_callers_wait_is_refused(caller_waits_1s: Any) -> None:
    arrivals = Arrivals()
    assert arrivals.late_ms(sent_ago(0.002)) is None  # the first sets the smallest delay
    assert arrivals.late_ms(sent_ago(0.5)) is None
    late = arrivals.late_ms(sent_ago(3.0))
    assert late is not None and 1900 < late < 2100
    error = arrivals.refusal({"sent": sent_ago(3.0)}, None, "m")
    assert error is not None and error.code() == error.UNAVAILABLE
    assert "arrived after its caller gave up" in error.message()


def test_the_clocks_of_two_hosts_need_not_agree(caller_waits_1s: Any) -> None:
    """Only the delay beyond the smallest one counts: a caller whose clock is 1 h behind."""
    arrivals = Arrivals()
    assert arrivals.late_ms(sent_ago(3600.001, "far")) is None
    assert arrivals.late_ms(sent_ago(3600.4, "far")) is None
    assert arrivals.late_ms(sent_ago(3602.0, "far")) is not None
    assert arrivals.late_ms(sent_ago(0.001, "near")) is None  # callers are kept apart


def test_unstamped_requests_and_stopped_contexts(caller_waits_1s: Any) -> None:
    class Context:
        def __init__(self, stopped: bool) -> None:
            self.stopped = stopped

        def is_stopped(self) -> bool:
            return self.stopped

        def is_killed(self) -> bool:
            return False

    arrivals = Arrivals()
    assert arrivals.refusal({}, Context(False), "m") is None
    refused = arrivals.refusal({}, Context(True), "m")
    assert refused is not None and refused.code() == refused.UNAVAILABLE
    assert stamp({})["sent"][2] == 1000
    arrival.set_caller_timeout(None)
    assert "sent" not in stamp({})  # no known wait (NATS): not stamped
