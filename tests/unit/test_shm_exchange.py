"""The shared memory form between a door and a worker (bridge/transport/), on real /dev/shm
regions: the door's and the worker's halves in one process, what each refuses (never trusting
a size or a name from the request plane), and the sweep. The processes and their crashes are
tests/e2e/test_shm_transport.py's."""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Iterator

import numpy as np
import pytest

from bridge import codec
from bridge.codec import bridge_error
from bridge.transport import shm_regions
from bridge.transport.shm_exchange import OFF_LOOP_BYTES, REFUSED, ShmDoor, open_inputs
from model_repository_loader.pb_utils import Tensor, TritonError
from model_repository_loader.pb_utils.errors import ErrorCode
from model_repository_loader.validation import RequestError

WORKER = 7  # an instance id


def _tensor(name: str, array: np.ndarray) -> dict:
    return codec.encode_raw_tensor(Tensor(name, array))


@pytest.fixture
def door() -> Iterator[ShmDoor]:
    made = ShmDoor(threshold=1024)
    made.hosts[WORKER] = made.host
    assert made.host, "this host has no shared memory form"
    yield made
    for name in shm_regions.names():
        parsed = shm_regions.parse(name)
        if parsed is not None and parsed[1] == os.getpid():
            shm_regions.unlink(name)


def _mine() -> list[str]:
    return [n for n in shm_regions.names() if (p := shm_regions.parse(n)) and p[1] == os.getpid()]


def test_round_trip_views_and_clean_up(door: ShmDoor) -> None:
    large = np.arange(4096, dtype=np.float32)
    small = np.array([1, 2], np.int32)
    body = {"bridge_form": 1, "tensors": [_tensor("A", large), _tensor("B", small)]}
    exchange = door.exchange()
    assert exchange is not None
    sent = exchange.request_for(WORKER, body)
    assert sent is not body and "values" not in sent["tensors"][0]["data"]
    assert sent["tensors"][1] == body["tensors"][1]  # small: inline
    assert exchange.request_for(99, body) is body  # another host's instance: the bytes form

    placer = open_inputs(sent)
    inference = codec.decode_request(sent, "m")
    a = inference.inputs[0].as_numpy()
    np.testing.assert_array_equal(a, large)
    assert a.flags.writeable
    a[0] = -5  # copy-on-write: the door's region keeps its bytes
    fd = shm_regions.open_sized(sent["shm"]["region"], sent["shm"]["size"])
    assert np.frombuffer(os.pread(fd, 4, 0), np.float32)[0] == 0
    os.close(fd)

    assert placer is not None
    output = Tensor("OUT", large * 2)
    tensors, shm = placer.place([output, Tensor("S", small)])
    assert shm is not None and shm["region"].startswith(exchange.prefix + "o")
    item = exchange.receive({"tensors": tensors, "shm": shm, "final": True})
    assert shm["region"] not in shm_regions.names()  # read, then unlinked
    response, final, _ = codec.decode_bridge_item(item)
    assert response is not None and final
    out, small_out = response._output_tensors
    np.testing.assert_array_equal(out.as_numpy(), large * 2)
    np.testing.assert_array_equal(small_out.as_numpy(), small)
    exchange.close(answered=True)
    assert _mine() == []
    np.testing.assert_array_equal(a[1:], large[1:])  # the view outlives the name


def test_an_unfinished_request_frees_the_answers_it_never_read(door: ShmDoor) -> None:
    exchange = door.exchange()
    assert exchange is not None
    sent = exchange.request_for(WORKER, {"tensors": [_tensor("A", np.zeros(1024, np.float32))]})
    placer = open_inputs(sent)
    assert placer is not None
    placer.place([Tensor("OUT", np.zeros(1024, np.float32))])  # never read by the door
    assert len(_mine()) == 2
    exchange.close(answered=False)
    assert _mine() == []


def _refused(request: dict) -> str:
    with pytest.raises(RequestError) as caught:
        open_inputs(request)
    assert caught.value.code == ErrorCode.INTERNAL
    assert str(caught.value).startswith(REFUSED)
    return str(caught.value)


def test_the_worker_trusts_no_size_span_name_or_host(door: ShmDoor) -> None:
    exchange = door.exchange()
    assert exchange is not None
    sent = exchange.request_for(WORKER, {"tensors": [_tensor("A", np.zeros(512, np.float32))]})
    shm = sent["shm"]

    def variant(**changes: object) -> dict:
        return {**sent, "tensors": [dict(t, data=dict(t["data"])) for t in sent["tensors"]],
                "shm": {**shm, **changes}}  # fmt: skip

    assert "holds 2048 bytes, the message says 4096" in _refused(variant(size=4096))
    bad_span = variant()
    bad_span["tensors"][0]["data"]["shm"] = [1024, 2048]
    assert "does not lie in region" in _refused(bad_span)
    assert "another host" in _refused(variant(host="elsewhere"))
    assert "malformed" in _refused(variant(prefix="../../etc/"))
    assert "malformed" in _refused(variant(region="dynbridge-1-2-3-o0"))
    shm_regions.unlink(shm["region"])
    assert "does not exist" in _refused(variant())
    exchange.close(answered=True)


def test_the_door_reads_only_its_own_regions_at_their_size(door: ShmDoor) -> None:
    exchange = door.exchange()
    assert exchange is not None
    with pytest.raises(shm_regions.RegionError, match="not its own"):
        exchange.receive({"shm": {"region": "dynbridge-1-1-1-o0", "size": 64}, "tensors": []})
    name = exchange.prefix + "o0"
    os.close(shm_regions.create(name, 64))
    with pytest.raises(shm_regions.RegionError, match="holds 64 bytes"):
        exchange.receive({"shm": {"region": name, "size": 128}, "tensors": []})
    os.close(shm_regions.create(name, 64))
    spans = [{"metadata": {}, "data": {"data_type": "Float32", "shm": [32, 64]}}]
    with pytest.raises(shm_regions.RegionError, match="does not lie"):
        exchange.receive({"shm": {"region": name, "size": 64}, "tensors": spans})
    assert name not in shm_regions.names()  # unlinked whatever was wrong
    exchange.close(answered=True)


def test_sweep_frees_dead_doors_and_requests_that_are_over() -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    namespace = shm_regions.pid_namespace()
    gone = f"dynbridge-{namespace}-{dead.pid}-1-i"
    other_namespace = f"dynbridge-{namespace + 1}-{dead.pid}-1-i"
    over = f"dynbridge-{namespace}-{os.getpid()}-900001-o0"
    going = f"dynbridge-{namespace}-{os.getpid()}-900002-i"
    for name in (gone, other_namespace, over, going):
        os.close(shm_regions.create(name, 64))
    try:
        shm_regions.sweep()  # a worker's sweep: never this process's own
        assert gone not in shm_regions.names()
        assert {other_namespace, over, going} <= set(shm_regions.names())
        shm_regions.sweep(lambda: [900002])  # a door's: its requests still going are kept
        assert over not in shm_regions.names()
        assert {other_namespace, going} <= set(shm_regions.names())
    finally:
        for name in (gone, other_namespace, over, going):
            shm_regions.unlink(name)


def test_a_worker_that_refuses_the_form_gets_the_bytes_from_then_on(door: ShmDoor) -> None:
    body = {"tensors": [_tensor("A", np.zeros(512, np.float32))]}
    exchange = door.exchange()
    assert exchange is not None
    sent = exchange.request_for(WORKER, body)
    assert "shm" in sent
    try:
        open_inputs({**sent, "shm": {**sent["shm"], "host": "elsewhere"}})
    except RequestError as exc:
        item = bridge_error(TritonError(exc.message, exc.code), final=True, rejected=True)
    other = bridge_error(TritonError("boom", TritonError.INTERNAL), final=True, rejected=True)
    assert not exchange.refused(other)
    assert exchange.refused(item)
    assert exchange.request_for(WORKER, body) is body  # this request, sent again
    later = door.exchange()
    assert later is not None and later.request_for(WORKER, body) is body
    exchange.close(answered=True)
    later.close(answered=True)
    assert _mine() == []


def test_large_copies_are_made_ahead_and_read_on_a_thread(door: ShmDoor) -> None:
    large = np.arange(OFF_LOOP_BYTES // 4, dtype=np.float32)  # exactly OFF_LOOP_BYTES
    body = {"tensors": [_tensor("A", large)]}
    exchange = door.exchange()
    assert exchange is not None

    async def run() -> dict:
        await exchange.prepare(body, [99])  # no instance on this host: nothing made
        assert _mine() == []
        await exchange.prepare(body, [99, WORKER])
        assert len(_mine()) == 1  # made before any instance is chosen
        sent = exchange.request_for(WORKER, body)
        placer = open_inputs(sent)
        assert placer is not None
        tensors, shm = placer.place([Tensor("OUT", large)])
        return await exchange.take({"tensors": tensors, "shm": shm, "final": True})

    item = asyncio.run(run())
    np.testing.assert_array_equal(np.frombuffer(item["tensors"][0]["data"]["values"], "<f4"), large)
    exchange.close(answered=True)
    assert _mine() == []
