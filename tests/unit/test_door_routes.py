"""The triton door's request-plane routes try again a request a stopping replica refused before
taking it, and nothing else (bridge/frontends/triton/routes.py; end to end in
tests/e2e/test_scale_out.py::test_replicas_stopped_under_load_fail_nothing)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from bridge.frontends.triton.routes import NOT_TAKEN_RETRIES, _first_taker, _not_started
from bridge.frontends.triton.service import without_loans
from bridge.transport.arrival import late_text

REFUSED = "Unavailable: Worker disconnected before response stream was established"


class Stopped:
    def __init__(self, stopped: bool = False) -> None:
        self.stopped = stopped

    def is_stopped(self) -> bool:
        return self.stopped


def starts(*outcomes: object):
    """start() for `_first_taker`: each call gives the next outcome (an exception it raises
    before any item, or a list of items, an exception among them raised there)."""
    calls = []

    async def stream(items: list) -> AsyncIterator[object]:
        for item in items:
            if isinstance(item, Exception):
                raise item
            yield item

    async def start() -> AsyncIterator[object]:
        outcome = outcomes[len(calls)]
        calls.append(outcome)
        if isinstance(outcome, Exception):
            raise outcome
        return stream(outcome)  # type: ignore[arg-type]

    return start, calls


async def collect(start, context) -> list:
    return [item async for item in _first_taker(start, context)]


def test_a_refused_request_is_tried_again() -> None:
    removed = RuntimeError("Worker removed before request could be sent (tombstoned instance)")
    start, calls = starts(RuntimeError(REFUSED), [RuntimeError(REFUSED)], removed, [1, 2])
    assert asyncio.run(collect(start, Stopped())) == [1, 2]
    assert len(calls) == 4


def test_only_so_often_and_never_after_an_item_or_for_other_errors() -> None:
    start, calls = starts(*[RuntimeError(REFUSED)] * (NOT_TAKEN_RETRIES + 1))
    with pytest.raises(RuntimeError, match="before response stream"):
        asyncio.run(collect(start, Stopped()))
    assert len(calls) == NOT_TAKEN_RETRIES + 1
    start, calls = starts([1, RuntimeError(REFUSED)], [2])
    with pytest.raises(RuntimeError):
        asyncio.run(collect(start, Stopped()))
    assert len(calls) == 1
    start, calls = starts(RuntimeError("model temporarily unavailable"), [2])
    with pytest.raises(RuntimeError, match="temporarily"):
        asyncio.run(collect(start, Stopped()))
    start, calls = starts(RuntimeError(REFUSED), [2])
    with pytest.raises(RuntimeError):
        asyncio.run(collect(start, Stopped(True)))  # the caller is gone: no second try
    assert len(calls) == 1


def test_a_replica_not_started_the_model_is_passed_by() -> None:
    unloading = {
        "error": {
            "code": "UNAVAILABLE",
            "message": "Model 'whoami' version 1 is not ready: it is being unloaded",
        },
        "final": True,
        "rejected": True,
    }
    queue_full = {"error": {"code": "UNAVAILABLE", "message": "Exceeds maximum queue size"},
                  "final": True, "rejected": True}  # fmt: skip
    late = {"error": {"code": "UNAVAILABLE", "message": late_text(1200)}, "final": True,
            "rejected": True}  # fmt: skip
    assert _not_started(unloading) and _not_started(late)
    assert not _not_started(queue_full) and not _not_started({"final": 1})
    assert not _not_started({**late, "rejected": False})  # an answer the model gave

    async def collect_refusing(start) -> list:
        return [i async for i in _first_taker(start, Stopped(), refused=_not_started)]

    start, calls = starts([unloading], [{"final": True, "tensors": []}])
    assert asyncio.run(collect_refusing(start)) == [{"final": True, "tensors": []}]
    start, calls = starts(*[[unloading]] * (NOT_TAKEN_RETRIES + 1))
    assert asyncio.run(collect_refusing(start)) == [unloading]  # the last answer is the caller's
    start, calls = starts([queue_full], [{"final": True}])
    assert asyncio.run(collect_refusing(start)) == [queue_full]
    assert len(calls) == 1


def test_a_body_for_another_process_carries_bytes_and_no_sinks():
    """What the door lends its own worker (shm.py) never goes onto the request plane."""
    lent = memoryview(bytearray(b"abcd"))
    plain = {"tensors": [{"metadata": {}, "data": {"values": b"xy"}}], "outputs": [{"name": "O"}]}
    assert without_loans(plain) is plain  # nothing lent: not copied
    body = {
        "tensors": [{"metadata": {"name": "I"}, "data": {"data_type": "Uint8", "values": lent}}],
        "outputs": [{"name": "O", "sink": object(), "parameters": {}}],
    }
    sent = without_loans(body)
    assert sent["tensors"][0]["data"] == {"data_type": "Uint8", "values": b"abcd"}
    assert sent["outputs"] == [{"name": "O", "parameters": {}}]
    assert body["tensors"][0]["data"]["values"] is lent  # the local body is left as it was
