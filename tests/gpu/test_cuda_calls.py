"""The loader's two ways to CUDA (model_repository_loader/gpu/): cuda-bindings and the driver's
libcuda.so.1 through ctypes, each through the same calls, on a real GPU.

The ctypes way is what an EXECUTION_ENV_PATH environment without the bindings uses; here both
are made to do the same work and must agree: copies every way, the thread's context as the
runtime keeps it, and CUDA IPC into another process (the way GPU tensors reach an instance
process and the door opens a client's CUDA region).
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from model_repository_loader.gpu.bindings import Bindings
from model_repository_loader.gpu.cuda import CudaUnavailable
from model_repository_loader.gpu.libcuda import LibCuda
from tests.harness.gpu import on_fresh_thread

IMPLEMENTATIONS = {"cuda-bindings": Bindings, "libcuda": LibCuda}


def _made(name: str):
    try:
        return IMPLEMENTATIONS[name]()
    except CudaUnavailable as exc:  # cuda-bindings not installed on this GPU host
        pytest.skip(f"{name}: {exc}")


@pytest.fixture(params=sorted(IMPLEMENTATIONS))
def implementation(request):
    return _made(request.param)


def test_there_is_a_device(implementation) -> None:
    assert implementation.device_count() >= 1


def test_copies_every_way(implementation) -> None:
    implementation.set_device(0)
    data = np.arange(1 << 16, dtype=np.float32)
    first = implementation.allocate(data.nbytes)
    second = implementation.allocate(data.nbytes)
    try:
        implementation.copy(first, data.ctypes.data, data.nbytes, 1)
        implementation.copy(second, first, data.nbytes, 1)
        back = np.zeros_like(data)
        implementation.copy(back.ctypes.data, second, data.nbytes, 1)
        implementation.synchronize(1)
        np.testing.assert_array_equal(back, data)
        assert implementation.allocation_size(first) == data.nbytes
        assert implementation.allocation_size(first + 400) == data.nbytes - 400
    finally:
        implementation.free(first)
        implementation.free(second)


def test_a_fresh_thread_has_no_context_until_a_device_is_made_current(implementation) -> None:
    def steps() -> list[object]:
        before = implementation.current_context()
        implementation.set_device(0)
        made = implementation.current_context()
        implementation.set_context(0)
        after = implementation.current_context()
        return [before, made == implementation.primary_context(0) != 0, after]

    seen = on_fresh_thread(steps)
    assert seen == [0, True, 0], seen


def test_both_ways_make_the_same_primary_context_current() -> None:
    """torch, cupy and the runtime all use a device's primary context; so must the ctypes way."""
    contexts = []
    for implementation in (_made("cuda-bindings"), _made("libcuda")):
        implementation.set_device(0)
        contexts.append(implementation.current_context())
        contexts.append(implementation.primary_context(0))
    assert len(set(contexts)) == 1 and contexts[0] != 0


_READER = """
import sys
import numpy as np
from model_repository_loader.gpu.{module} import {name}
calls = {name}()
calls.set_device(0)
pointer = calls.ipc_open(bytes.fromhex(sys.argv[1]))
back = np.zeros(int(sys.argv[2]), dtype=np.float32)
calls.copy(back.ctypes.data, pointer, back.nbytes, 1)
calls.synchronize(1)
calls.ipc_close(pointer)
print(back.sum())
"""


@pytest.mark.parametrize("reader", ["bindings.Bindings", "libcuda.LibCuda"])
def test_ipc_hands_memory_to_another_process(implementation, reader: str) -> None:
    if reader.startswith("bindings"):
        _made("cuda-bindings")  # skips where it is not installed
    implementation.set_device(0)
    data = np.arange(1024, dtype=np.float32)
    pointer = implementation.allocate(data.nbytes)
    try:
        implementation.copy(pointer, data.ctypes.data, data.nbytes, 1)
        implementation.synchronize(1)
        handle = implementation.ipc_handle(pointer)
        assert len(handle) == 64
        module, name = reader.split(".")
        done = subprocess.run(
            [sys.executable, "-c", _READER.format(module=module, name=name)]
            + [handle.hex(), str(data.size)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        assert float(done.stdout) == float(data.sum())
    finally:
        implementation.free(pointer)
