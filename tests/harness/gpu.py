"""Whether this host can run GPU tests: NVML finds a GPU (as the server finds them) and the
installed torch has CUDA (the GPU test models drive the GPU with torch, as Triton's own do)."""

from __future__ import annotations

import functools

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
