"""System shared memory keys and regions (bridge/frontends/triton/shm.py), on the real /dev/shm.

A key is a `shm_open` name, never a path (issue 22, finding 1): traversal, a symlink, an inner
`/`, a directory are refused with Triton's INTERNAL "Unable to open shared memory region", and
the file named is untouched. A region on an object its client truncated after registration is
an INVALID_ARG, never SIGBUS (finding 8). Texts are Triton's: 2.51's [V] for what its
shm_open refuses, src/common.cc `ValidateSharedMemoryKey` (≥ 2.61) for the all-slash key and
the reserved prefix.

The bridge's own regions (issue 38, finding 1) are never a client's: their prefix is refused as
Triton's reserved one, and so is a hard link to a region the door made (its pool's, a request's
inputs'), for as long as the door uses that region.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from bridge.frontends.triton.door_error import DoorError
from bridge.frontends.triton.shm import LEND_MIN_BYTES, RESERVED_PREFIX, SharedMemory
from bridge.transport import shm_regions
from bridge.transport.shm_exchange import ShmDoor
from bridge.transport.shm_pool import POOL_BYTES
from model_repository_loader.pb_utils.errors import ErrorCode

SHM = Path("/dev/shm")
SECRET = b"root-only secret, 32 bytes long!" * 4  # 128 bytes

pytestmark = pytest.mark.skipif(not SHM.is_dir(), reason="no /dev/shm on this host")


@pytest.fixture
def memory() -> Iterator[SharedMemory]:
    memory = SharedMemory()
    yield memory
    memory.close()


@pytest.fixture
def made() -> Iterator[list[Path]]:
    """Paths under /dev/shm a test made, removed afterwards."""
    paths: list[Path] = []
    yield paths
    for path in reversed(paths):
        if path.is_dir() and not path.is_symlink():
            path.rmdir()
        else:
            path.unlink(missing_ok=True)


def new_object(made: list[Path], size: int = 8192, name: str = "") -> str:
    """A /dev/shm object of `size` zero bytes; its key (with the leading slash)."""
    path = SHM / (name or f"bridge_test_shm_{uuid.uuid4().hex}")
    path.write_bytes(bytes(size))
    made.append(path)
    return "/" + path.name


def refusal(memory: SharedMemory, key: str, name: str = "r") -> tuple[ErrorCode, str]:
    with pytest.raises(DoorError) as caught:
        memory.register(name, key, 0, 64)
    assert memory.regions == {}
    return caught.value.code, caught.value.message


def unable_to_open(key: str) -> tuple[ErrorCode, str]:
    return ErrorCode.INTERNAL, f"Unable to open shared memory region: '{key}'"


# -- keys ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("leading", ["", "/"])
def test_a_traversal_key_opens_no_file_outside_dev_shm(memory, tmp_path, leading):
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET)
    key = leading + os.path.relpath(secret, SHM)  # ../../tmp/.../secret
    assert key.lstrip("/").startswith("../")
    assert refusal(memory, key) == unable_to_open(key)
    assert secret.read_bytes() == SECRET


def test_a_symlink_in_dev_shm_is_not_followed(memory, tmp_path, made):
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET)
    link = SHM / f"bridge_test_link_{uuid.uuid4().hex}"
    link.symlink_to(secret)
    made.append(link)
    assert refusal(memory, "/" + link.name) == unable_to_open("/" + link.name)
    assert secret.read_bytes() == SECRET


def test_a_key_with_an_inner_slash_is_refused(memory, made):
    folder = SHM / f"bridge_test_dir_{uuid.uuid4().hex}"
    folder.mkdir()
    made.append(folder)
    (folder / "object").write_bytes(bytes(64))
    made.append(folder / "object")
    for key in (f"/{folder.name}/object", f"{folder.name}/object", f"/{folder.name}/"):
        assert refusal(memory, key) == unable_to_open(key)
    # A folder is no object either (our isolated instances keep their segments in folders).
    assert refusal(memory, "/" + folder.name) == unable_to_open("/" + folder.name)


@pytest.mark.parametrize(
    "key", [".", "..", "/..", "/.", "/a\0b", "/" + "a" * 256, "/\ud800", "a/", "x/../y"]
)
def test_what_shm_open_refuses_is_unable_to_open(memory, key):
    assert refusal(memory, key) == unable_to_open(key)


def test_a_fifo_is_no_object(memory, made):
    fifo = SHM / f"bridge_test_fifo_{uuid.uuid4().hex}"
    os.mkfifo(fifo)
    made.append(fifo)
    assert refusal(memory, "/" + fifo.name) == unable_to_open("/" + fifo.name)


@pytest.mark.parametrize("key", ["", "/", "///"])
def test_a_key_of_slashes_alone_is_triton_s_invalid_key(memory, key):
    assert refusal(memory, key, "mine") == (
        ErrorCode.INVALID_ARG,
        f"cannot register shared memory region 'mine' - invalid shm key '{key}'",
    )


@pytest.mark.parametrize("slashes", ["", "/", "///"])
def test_triton_s_reserved_prefix_is_refused_even_when_the_object_exists(memory, made, slashes):
    key = slashes + new_object(made, 64, f"{RESERVED_PREFIX}{uuid.uuid4().hex}").lstrip("/")
    assert refusal(memory, key, "mine") == (
        ErrorCode.INVALID_ARG,
        f"cannot register shared memory region 'mine' with key '{key}' as the key contains the "
        "reserved prefix 'triton_python_backend_shm_region_'",
    )


def reserved(name: str, key: str, prefix: str) -> tuple[ErrorCode, str]:
    return (
        ErrorCode.INVALID_ARG,
        f"cannot register shared memory region '{name}' with key '{key}' as the key contains the "
        f"reserved prefix '{prefix}'",
    )


@pytest.mark.parametrize("kind", ["i", "o0", "p"])
@pytest.mark.parametrize("slashes", ["", "/"])
def test_the_bridge_s_own_region_names_are_refused(memory, made, kind, slashes):
    # A real region of this process's kind `kind`, as a door and its workers name them.
    name = f"{shm_regions.request_prefix(10**9 + len(slashes))}{kind}"
    os.close(shm_regions.create(name, 8192))
    made.append(SHM / name)
    key = slashes + name
    assert refusal(memory, key, "theirs") == reserved("theirs", key, shm_regions.PREFIX)
    # The prefix alone, whatever follows it: refused before any object is looked for.
    assert refusal(memory, "/dynbridge-x") == reserved("r", "/dynbridge-x", "dynbridge-")


def hard_link(made: list[Path], name: str) -> str:
    """A second name in /dev/shm for the object `name` (what a local user of the server's uid
    could make); its key."""
    link = SHM / f"bridge_test_link_{uuid.uuid4().hex}"
    os.link(SHM / name, link)
    made.append(link)
    return "/" + link.name


def refused_as_the_server_s(memory: SharedMemory, key: str) -> None:
    assert refusal(memory, key, "theirs") == (
        ErrorCode.INVALID_ARG,
        f"cannot register shared memory region 'theirs' with key '{key}' as the key names a "
        "shared memory region of the server",
    )


@pytest.fixture
def door() -> Iterator[ShmDoor]:
    made = ShmDoor(threshold=1024, pool_bytes=POOL_BYTES)
    yield made
    made.close()


def test_a_hard_link_to_a_pooled_region_is_refused_while_the_pool_has_it(door, made):
    memory = SharedMemory(bridge_made=door.made)
    try:
        region = door.pool.take(4096)
        assert region is not None
        region.unlock()
        key = hard_link(made, region.name)
        refused_as_the_server_s(memory, key)
        door.pool.give_back(region)
        refused_as_the_server_s(memory, key)  # free, but still the pool's
        door.pool.close()  # the region is dropped: the object left is the link's alone
        memory.register("theirs", key, 0, 64)
    finally:
        memory.close()


def test_a_hard_link_to_a_request_s_inputs_is_refused_while_the_request_lasts(made):
    door = ShmDoor(threshold=1024, pool_bytes=0)  # no pool: the request makes its own region
    door.hosts[7] = door.host
    memory = SharedMemory(bridge_made=door.made)
    try:
        exchange = door.exchange()
        assert exchange is not None
        secret = {"metadata": {"name": "A"}, "data": {"data_type": "Bytes", "values": SECRET * 64}}
        sent = exchange.request_for(7, {"bridge_form": 1, "tensors": [secret]})
        name = sent["shm"]["region"]
        made.append(SHM / name)
        key = hard_link(made, name)
        refused_as_the_server_s(memory, key)
        exchange.close(answered=True)
        memory.register("theirs", key, 0, 64)  # the request is over: no longer the door's
    finally:
        memory.close()
        door.close()


def test_a_bad_key_is_refused_before_a_taken_name(memory, made):
    memory.register("mine", new_object(made), 0, 64)
    with pytest.raises(DoorError) as caught:
        memory.register("mine", "/", 0, 64)
    assert caught.value.code == ErrorCode.INVALID_ARG  # Triton ≥ 2.61 validates the key first


def test_leading_slashes_are_skipped_as_shm_open_skips_them(memory, made):
    key = new_object(made)
    memory.register("one", key, 0, 64)
    memory.register("two", "//" + key.lstrip("/"), 4096, 64)
    memory.register("three", key.lstrip("/"), 0, 8)
    assert sorted(memory.regions) == ["one", "three", "two"]


def test_a_missing_object_and_a_region_past_its_end(memory, made):
    missing = f"/bridge_test_missing_{uuid.uuid4().hex}"
    assert refusal(memory, missing) == unable_to_open(missing)
    key = new_object(made, 64)
    with pytest.raises(DoorError) as caught:
        memory.register("big", key, 0, 65)
    assert (caught.value.code, caught.value.message) == (
        ErrorCode.INVALID_ARG,
        "failed to register shared memory region 'big': invalid args",
    )
    with pytest.raises(DoorError) as caught:
        memory.register("empty", key, 0, 0)
    assert (caught.value.code, caught.value.message) == (
        ErrorCode.INVALID_ARG,
        "failed to register shared memory region 'empty': unable to process address space"
        "Invalid argument",
    )


# -- regions ---------------------------------------------------------------------------------------


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_one_descriptor_per_object_whatever_its_keys(memory, made):
    key = new_object(made)
    before = open_descriptors()
    for n in range(1, 6):
        memory.register(f"r{n}", "/" * n + key.lstrip("/"), 0, 64)
    assert open_descriptors() == before + 1
    memory.unregister("r1")
    memory.write("r2", 0, 4, "OUT", b"abcd")
    assert memory.read("r5", 0, 4) == b"abcd"
    memory.unregister("")
    assert open_descriptors() == before


def test_read_and_write_go_to_the_object(memory, made):
    key = new_object(made)
    memory.register("r", key, 4096, 4096)
    memory.write("r", 8, 16, "OUT", b"0123456789abcdef")
    assert (SHM / key[1:]).read_bytes()[4096 + 8 : 4096 + 24] == b"0123456789abcdef"
    assert memory.read("r", 8, 16) == b"0123456789abcdef"
    with pytest.raises(DoorError, match="Invalid offset \\+ byte size for shared memory region"):
        memory.read("r", 4090, 16)


@pytest.mark.parametrize("size", [0, 4096, 4100])
def test_a_truncated_object_is_an_error_not_sigbus(memory, made, size):
    """Region 4096..8192 of an object then cut to `size` bytes; on the old code (a mapping)
    this test dies with SIGBUS."""
    key = new_object(made)
    path = SHM / key[1:]
    memory.register("r", key, 4096, 4096)
    os.truncate(path, size)
    past_end = "Invalid offset \\+ byte size for shared memory region: 'r'"
    with pytest.raises(DoorError, match=past_end) as caught:
        memory.read("r", 0, 16)
    assert caught.value.code == ErrorCode.INVALID_ARG
    with pytest.raises(DoorError, match=past_end):
        memory.write("r", 0, 16, "OUT", bytes(16))
    assert path.stat().st_size == size  # a refused write does not grow the object
    os.truncate(path, 8192)  # the client gives the bytes back: the region works again
    memory.write("r", 0, 4, "OUT", b"back")
    assert memory.read("r", 0, 4) == b"back"


def test_a_copy_holds_no_lock_and_outlives_an_unregistering(memory, made):
    """A copy (`read`, `write`, on a thread for a large request) works through its own
    duplicate of the region's descriptor: the loop's unregistering, and every other request's
    region lookup, do not wait for it, and its descriptor stays the object's after the region
    is gone (never closed, nor reused for another file, under the copy)."""
    key = new_object(made)
    (SHM / key[1:]).write_bytes(b"x" * 4096 + b"inside the span!" + bytes(4080))
    memory.register("r", key, 4096, 4096)
    with memory._open_span("r", 0, 16) as (fd, start):
        assert memory._descriptors.acquire(blocking=False)  # the lock is free mid-copy
        memory._descriptors.release()
        memory.unregister("r")  # closes the region's own descriptor, at once
        assert not memory.regions
        other = new_object(made)  # a new object may take the closed descriptor's number
        memory.register("other", other, 0, 4096)
        assert os.pread(fd, 16, start) == b"inside the span!"
        during = len(os.listdir("/proc/self/fd"))
    assert len(os.listdir("/proc/self/fd")) == during - 1  # the duplicate goes with the copy


def test_an_object_unlinked_after_registration_stays_readable(memory, made):
    key = new_object(made)
    memory.register("r", key, 0, 64)
    memory.write("r", 0, 2, "OUT", b"ok")
    (SHM / key[1:]).unlink()
    assert memory.read("r", 0, 2) == b"ok"  # as Triton's mapping outlives the name


# -- lent to the door's own worker (issue 27) --------------------------------------------------

BIG = LEND_MIN_BYTES * 2


def test_an_input_of_ours_is_lent_as_a_private_writable_mapping(memory, made):
    key = new_object(made, BIG)
    path = SHM / key[1:]
    path.write_bytes(b"\x01" * BIG)
    memory.register("r", key, 0, BIG)
    view = memory.lend_input("r", 100, LEND_MIN_BYTES)
    assert view is not None and len(view) == LEND_MIN_BYTES and not view.readonly
    with open(path, "r+b") as client:  # the client's later writes are seen: a view, no copy
        client.seek(100)
        client.write(b"\x02")
    assert view[0] == 2
    view[1] = 9  # the model's writes stay its own
    assert path.read_bytes()[101] == 1
    memory.unregister("r")  # the mapping outlives the registration
    assert view[0] == 2


def test_a_small_input_is_copied(memory, made):
    memory.register("r", new_object(made, BIG), 0, BIG)
    assert memory.lend_input("r", 0, LEND_MIN_BYTES - 1) is None
    assert memory.lend_output("r", 0, LEND_MIN_BYTES - 1) is None


def test_an_output_writer_writes_into_the_object_and_refuses_what_does_not_fit(memory, made):
    key = new_object(made, BIG + 4096)
    memory.register("r", key, 4096, BIG)
    writer = memory.lend_output("r", 8, LEND_MIN_BYTES)
    assert writer is not None
    memory.unregister("r")  # its own descriptor: still writes
    assert writer.write(memoryview(b"abcd"))
    assert (SHM / key[1:]).read_bytes()[4096 + 8 : 4096 + 12] == b"abcd"
    assert not writer.write(memoryview(bytes(LEND_MIN_BYTES + 1)))  # the door says why
    os.truncate(SHM / key[1:], 4096)
    assert not writer.write(memoryview(b"abcd"))  # past the object's end now: no signal
    assert (SHM / key[1:]).stat().st_size == 4096


def test_a_truncated_object_of_ours_is_not_lent(memory, made):
    key = new_object(made, BIG)
    memory.register("r", key, 0, BIG)
    os.truncate(SHM / key[1:], 4096)
    with pytest.raises(DoorError) as caught:
        memory.lend_input("r", 0, BIG)
    assert caught.value.code == ErrorCode.INVALID_ARG


@pytest.mark.skipif(os.geteuid() != 0, reason="giving an object to another uid needs root")
def test_an_input_of_another_uid_is_copied_not_mapped(memory, made):
    key = new_object(made, BIG)
    os.chown(SHM / key[1:], 65534, 65534)
    memory.register("r", key, 0, BIG)
    assert memory.lend_input("r", 0, BIG) is None
    assert memory.read("r", 0, 4) == bytes(4)  # copied instead


def test_a_region_held_by_a_request_is_unregistered_when_it_ends(memory, made):
    key = new_object(made, 8192)
    memory.register("r", key, 0, 8192)
    memory.register("other", new_object(made), 0, 8192)
    with memory.holding(["r", "r", "unknown"]):
        memory.unregister("")
        assert list(memory.regions) == ["r"]  # still listed and usable, as Triton ≥ 2.53
        memory.write("r", 0, 4, "OUTPUT0", b"abcd")
    assert memory.regions == {}
    assert (SHM / key[1:]).read_bytes()[:4] == b"abcd"


# -- the cap on regions (--max-shm-regions) --------------------------------------------------------


def full() -> tuple[ErrorCode, str]:
    return (
        ErrorCode.UNAVAILABLE,
        "failed to register shared memory region 'past': the server holds 2 shared memory "
        "regions, its limit (--max-shm-regions); unregister one first",
    )


def test_past_the_cap_a_registration_is_refused_and_opens_nothing(made):
    memory = SharedMemory(max_regions=2)
    try:
        memory.register("a", new_object(made), 0, 64)
        memory.register("b", new_object(made), 0, 64)
        before = open_descriptors()
        with pytest.raises(DoorError) as caught:
            memory.register("past", new_object(made), 0, 64)
        assert (caught.value.code, caught.value.message) == full()
        assert open_descriptors() == before
        assert sorted(memory.regions) == ["a", "b"]
        memory.unregister("a")  # a slot freed is a slot taken
        memory.register("past", new_object(made), 0, 64)
        assert sorted(memory.regions) == ["b", "past"]
    finally:
        memory.close()


def test_at_the_cap_the_request_s_own_faults_come_first(made):
    memory = SharedMemory(max_regions=1)
    try:
        key = new_object(made)
        memory.register("a", key, 0, 64)
        with pytest.raises(DoorError) as taken:
            memory.register("a", new_object(made), 0, 64)
        assert taken.value.code == ErrorCode.ALREADY_EXISTS
        with pytest.raises(DoorError) as same_key:
            memory.register("b", key, 0, 64)
        assert same_key.value.code == ErrorCode.INTERNAL
    finally:
        memory.close()


def test_a_region_in_use_counts_until_its_last_request_ends(made):
    memory = SharedMemory(max_regions=2)
    try:
        memory.register("a", new_object(made), 0, 64)
        memory.register("b", new_object(made), 0, 64)
        with memory.holding(["a"]):
            memory.unregister("a")  # deferred: it still holds its descriptor
            with pytest.raises(DoorError) as caught:
                memory.register("past", new_object(made), 0, 64)
            assert (caught.value.code, caught.value.message) == full()
        memory.register("past", new_object(made), 0, 64)
    finally:
        memory.close()
