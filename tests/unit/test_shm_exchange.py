"""The shared memory form between a door and a worker (bridge/transport/), on real /dev/shm
regions: the door's and the worker's halves in one process, what each refuses (never trusting
a size or a name from the request plane), and the sweep. The processes and their crashes are
tests/e2e/test_shm_transport.py's."""

from __future__ import annotations

import asyncio
import fcntl
import mmap
import os
import subprocess
from collections.abc import Iterator

import numpy as np
import pytest

from bridge import codec
from bridge.codec import bridge_error
from bridge.transport import shm_regions
from bridge.transport.shm_exchange import OFF_LOOP_BYTES, REFUSED, Exchange, ShmDoor, open_inputs
from bridge.transport.shm_pool import POOL_BYTES, Pooled
from model_repository_loader.pb_utils import Tensor, TritonError
from model_repository_loader.pb_utils.errors import ErrorCode
from model_repository_loader.validation import RequestError

WORKER = 7  # an instance id


def _tensor(name: str, array: np.ndarray) -> dict:
    return codec.encode_raw_tensor(Tensor(name, array))


def _door(pool_bytes: int) -> Iterator[ShmDoor]:
    made = ShmDoor(threshold=1024, pool_bytes=pool_bytes)
    made.hosts[WORKER] = made.host
    assert made.host, "this host has no shared memory form"
    try:
        yield made
    finally:
        made.close()
        left = _mine(kinds="p")
        for name in _mine(kinds="iop"):
            shm_regions.unlink(name)
    assert not left, "the door's pooled regions outlive it"


@pytest.fixture(params=[POOL_BYTES, 0], ids=["pooled", "own-regions"])
def door(request: pytest.FixtureRequest) -> Iterator[ShmDoor]:
    """A door with its pool of regions, and one without (every request makes its own)."""
    yield from _door(request.param)


@pytest.fixture
def pooling() -> Iterator[ShmDoor]:
    yield from _door(POOL_BYTES)


def _mine(kinds: str = "io") -> list[str]:
    """This process's regions of `kinds`: a request's own (`i`, `o`), pooled (`p`)."""
    return [
        n
        for n in shm_regions.names()
        if (p := shm_regions.parse(n)) and p[1] == os.getpid() and p[3] in kinds
    ]


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
    offset = sent["tensors"][0]["data"]["shm"][0]
    assert np.frombuffer(os.pread(fd, 4, offset), np.float32)[0] == 0
    os.close(fd)

    assert placer is not None
    output = Tensor("OUT", large * 2)
    tensors, shm = placer.place([output, Tensor("S", small)])
    assert shm is not None
    if door.pool.limit:  # into the region the door offered, which it keeps
        assert shm["region"] == sent["shm"]["reply"]["region"]
    else:  # into one of its own, which the door unlinks once read
        assert shm["region"].startswith(exchange.prefix + "o")
    item = exchange.receive({"tensors": tensors, "shm": shm, "final": True})
    assert (shm["region"] in shm_regions.names()) == bool(door.pool.limit)
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
    for _ in range(2):  # a decoupled model's two answers, never read by the door
        placer.place([Tensor("OUT", np.zeros(1024, np.float32))])
    # The first answer went into the region the door offered (pooled), or one of its own.
    assert len(_mine("o")) == (1 if door.pool.limit else 2)
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

    assert f"holds {shm['size']} bytes, the message says 4096" in _refused(variant(size=4096))
    bad_span = variant()
    bad_span["tensors"][0]["data"]["shm"] = [shm["size"] - 1024, 2048]
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
        assert _mine("iop") == []
        await exchange.prepare(body, [99, WORKER])
        # Made before any instance is chosen: the inputs' region (and, pooled, the answer's).
        assert len(_mine("iop")) == (2 if door.pool.limit else 1)
        sent = exchange.request_for(WORKER, body)
        placer = open_inputs(sent)
        assert placer is not None
        tensors, shm = placer.place([Tensor("OUT", large)])
        return await exchange.take({"tensors": tensors, "shm": shm, "final": True})

    item = asyncio.run(run())
    np.testing.assert_array_equal(np.frombuffer(item["tensors"][0]["data"]["values"], "<f4"), large)
    exchange.close(answered=True)
    assert _mine() == []


# -- the door's pool (bridge/transport/shm_pool.py) ---------------------------------------------


def _sent(door: ShmDoor, values: np.ndarray) -> tuple[Exchange, dict]:
    exchange = door.exchange()
    assert exchange is not None
    return exchange, exchange.request_for(WORKER, {"tensors": [_tensor("A", values)]})


def _worker_maps(region: Pooled) -> mmap.mmap:
    """What open_inputs does with a pooled region: a shared lock, then a mapping that keeps it."""
    fd = shm_regions.open_sized(region.name, region.size)
    try:
        shm_regions.hold(fd, region.name, region.generation)
        return shm_regions.map_private(fd, region.size)
    finally:
        os.close(fd)


def test_the_pool_rewrites_no_region_a_worker_still_maps(pooling: ShmDoor) -> None:
    pool = pooling.pool
    first = pool.take(4096)
    assert first is not None
    first.unlock()
    mapping = _worker_maps(first)
    pool.give_back(first)
    second = pool.take(4096)
    assert second is not None and second.name != first.name  # the mapped one is skipped
    second.unlock()
    pool.give_back(second)
    mapping.close()  # the worker's last view goes, and its lock with it
    both = [pool.take(4096), pool.take(4096)]
    assert {r.name for r in both if r is not None} == {first.name, second.name}
    assert len(_mine("p")) == 2  # reused, none made


def test_the_pool_keeps_to_its_limit_and_lets_idle_regions_go() -> None:
    for door in _door(3 << 20):
        pool = door.pool
        small, large = pool.take(1000), pool.take((1 << 20) + 1)  # 1 MiB and 2 MiB
        assert small is not None and large is not None
        assert pool.take(1000) is None  # 3 MiB taken: no room for another
        small.unlock()
        pool.give_back(small)
        again = pool.take(1000)
        assert again is small and again.generation > 2  # reused, under a new generation
        again.unlock()
        pool.give_back(again)
        assert pool.take(3 << 20) is None  # a 4 MiB region: above the limit, nothing dropped
        assert sorted(_mine("p")) == sorted([small.name, large.name])
        assert pool.take(2 << 20) is None  # 2 MiB more: no room while `large` is taken...
        assert _mine("p") == [large.name]  # ...even with the free one dropped
        shm_regions.sweep(door.kept)
        assert _mine("p") == [large.name]  # the door's own sweep keeps its pool
        large.unlock()
        pool.give_back(large)
        assert pool.trim(idle_s=60) == 0 and pool.trim(idle_s=0) == 1
        assert _mine("p") == []
    for door in _door(0):
        assert door.exchange() is not None and door.pool.take(1) is None  # no pool


def test_a_late_worker_finds_its_regions_given_to_another_request(pooling: ShmDoor) -> None:
    values = np.arange(1024, dtype=np.float32)
    late, late_sent = _sent(pooling, values)
    late.close(answered=False)  # the door gave up before the worker opened the inputs
    now, now_sent = _sent(pooling, values + 1)

    def regions(sent: dict) -> set[str]:  # the inputs' and the one offered for the answer
        return {sent["shm"]["region"], sent["shm"]["reply"]["region"]}

    assert regions(now_sent) == regions(late_sent)  # both reused, under new generations
    with pytest.raises(RequestError) as caught:
        open_inputs(late_sent)
    assert "belongs to another request" in str(caught.value)
    # Not a refusal of the form: the door goes on sending this worker shared memory.
    item = bridge_error(TritonError(caught.value.message, caught.value.code), final=True)
    assert not now.refused({**item, "rejected": True})
    placer = open_inputs(now_sent)
    inputs = codec.decode_request(now_sent, "m").inputs[0].as_numpy()
    np.testing.assert_array_equal(inputs, values + 1)
    assert placer is not None
    now.close(answered=True)


def test_a_late_answer_cannot_write_into_a_region_given_to_another_request(
    pooling: ShmDoor,
) -> None:
    values = np.arange(1024, dtype=np.float32)
    late, late_sent = _sent(pooling, values)
    late_placer = open_inputs(late_sent)  # the worker maps the inputs: that region stays its own
    late.close(answered=False)
    now, now_sent = _sent(pooling, values + 1)
    # The late request's offered region now holds this request's inputs.
    assert now_sent["shm"]["region"] == late_sent["shm"]["reply"]["region"]
    assert late_placer is not None
    tensors, shm = late_placer.place([Tensor("OUT", values * 3)])
    assert shm is not None and shm["region"].startswith(late.prefix + "o")  # its own
    open_inputs(now_sent)
    inputs = codec.decode_request(now_sent, "m").inputs[0].as_numpy()
    np.testing.assert_array_equal(inputs, values + 1)  # untouched
    now.close(answered=True)


def test_an_answer_larger_than_the_offer_gets_a_region_of_its_own(pooling: ShmDoor) -> None:
    exchange, sent = _sent(pooling, np.zeros(1024, np.float32))
    placer = open_inputs(sent)
    assert placer is not None
    big = np.arange(sent["shm"]["reply"]["size"] // 4, dtype=np.float32)
    tensors, shm = placer.place([Tensor("OUT", big)])
    assert shm is not None and shm["region"].startswith(exchange.prefix + "o")
    item = exchange.receive({"tensors": tensors, "shm": shm, "final": True})
    np.testing.assert_array_equal(np.frombuffer(item["tensors"][0]["data"]["values"], "<f4"), big)
    exchange.close(answered=True)
    assert _mine() == []
    # The next request of the model is offered room for an answer that size.
    bigger = pooling.exchange(exchange.answer_bytes)
    assert bigger is not None
    offer = bigger.request_for(WORKER, {"tensors": []})["shm"]["reply"]
    assert offer["size"] >= big.nbytes + shm_regions.HEADER
    bigger.close(answered=True)


def test_a_model_whose_answers_come_inline_is_offered_no_region(pooling: ShmDoor) -> None:
    exchange, sent = _sent(pooling, np.zeros(1024, np.float32))
    assert "reply" in sent["shm"]  # not knowing the model's answers: room like the inputs
    small = {"tensors": [_tensor("OUT", np.zeros(2, np.float32))], "final": True}
    assert asyncio.run(exchange.take(small)) is small
    exchange.close(answered=True)
    assert exchange.answer_bytes == 0
    later = pooling.exchange(exchange.answer_bytes)
    assert later is not None
    assert (
        "reply"
        not in later.request_for(WORKER, {"tensors": [_tensor("A", np.zeros(1024, np.float32))]})[
            "shm"
        ]
    )
    later.close(answered=True)


def test_a_request_cancelled_while_its_inputs_are_written_waits_for_the_writer(
    pooling: ShmDoor,
) -> None:
    large = np.arange(4 * OFF_LOOP_BYTES // 4, dtype=np.float32)  # written on a thread
    exchange = pooling.exchange()
    assert exchange is not None

    async def cancelled() -> None:
        task = asyncio.ensure_future(exchange.prepare({"tensors": [_tensor("A", large)]}, [WORKER]))
        await asyncio.sleep(0.001)  # the thread has begun writing
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancelled())
    assert _mine("p")
    for name in _mine("p"):  # the writer is done with them: the door no longer holds one
        fd = os.open(os.path.join(shm_regions.SHM_DIRECTORY, name), os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
    exchange.close(answered=False)
