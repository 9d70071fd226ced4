"""A large request is decoded in slices that give the event loop back, to the same tensors as
the one-go decode of small requests (bridge/models/endpoint.py, benchmarks/loop_stalls.py)."""

from __future__ import annotations

import asyncio

import numpy as np

from bridge import codec
from bridge.codec import decode_request


def tensor(name: str, data_type: str, shape: list[int], values: list) -> dict:
    return {
        "metadata": {"name": name, "data_type": data_type, "shape": shape},
        "data": {"data_type": data_type, "values": values},
    }


def large_request() -> dict:
    n = codec.DECODE_SLICE * 2 + 7  # slices, and a short last one
    return {
        "id": "r1",
        "parameters": {"p": {"int64": 3}},
        "tensors": [
            tensor("SMALL", "Int32", [2], [1, 2]),
            tensor("BIG", "Float32", [n], [float(i) for i in range(n)]),
            tensor("GRID", "Float16", [2, n // 2 + 4], [15360] * (2 * (n // 2 + 4))),
            tensor("TEXT", "Bytes", [n], [[97, i % 256] for i in range(n)]),
        ],
    }


def test_sliced_decode_matches_the_one_go_decode() -> None:
    request = large_request()
    assert codec.request_elements(request) > codec.LARGE_REQUEST_ELEMENTS
    expected = decode_request(request)
    got = asyncio.run(codec.decode_request_in_slices(request))
    assert [t.name() for t in got.inputs] == ["SMALL", "BIG", "GRID", "TEXT"]
    for a, b in zip(got.inputs, expected.inputs, strict=True):
        assert repr(a) == repr(b)
        assert a.as_numpy().dtype == b.as_numpy().dtype
        np.testing.assert_array_equal(a.as_numpy(), b.as_numpy())
    assert (got.request_id, got.parameters) == (expected.request_id, expected.parameters)


def test_the_loop_runs_between_slices() -> None:
    async def run() -> int:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        task = asyncio.ensure_future(ticker())
        await asyncio.sleep(0)
        before = ticks
        await codec.decode_request_in_slices(large_request())
        task.cancel()
        return ticks - before

    # Once per slice at least: other requests are served meanwhile.
    assert asyncio.run(run()) >= 3
