"""Whether this host can run GPU tests: NVML finds a GPU (as the server finds them) and the
installed torch has CUDA (the GPU test models drive the GPU with torch, as Triton's own do)."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable

from model_repository_loader.gpu.devices import visible_devices


@functools.cache
def gpu_missing() -> str | None:
    """Why GPU tests cannot run here, or None when they can."""
    if not visible_devices():
        return "no NVIDIA GPU found through NVML (nvidia-ml-py and a driver)"
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return f"the installed torch ({torch.__version__}) has no CUDA"
    return None


@functools.cache
def cuda_usable() -> bool:
    """Whether CUDA itself works here (a driver and a device), torch or not: where it does, the
    server registers CUDA shared memory and copies GPU tensors for real."""
    from model_repository_loader.gpu import cuda

    try:
        cuda.require_device()
    except cuda.CudaUnavailable:
        return False
    return True


def on_fresh_thread(steps: Callable[[], list[object]]) -> list[object]:
    """What `steps` returns when run on a new thread (one that has never used CUDA), or the
    exception it raised there (a thread's exception would otherwise be lost)."""
    seen: list[object] = []

    def run() -> None:
        try:
            seen.extend(steps())
        except Exception as exc:
            seen.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return seen
