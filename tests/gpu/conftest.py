"""The GPU suite: every test here is marked `gpu` and runs only where a GPU can be used.

"Can be used" means NVML finds a GPU (gpu/devices.py, as the server finds them) and the torch
installed has CUDA (the suite's models drive the GPU with torch, as most Triton models do);
elsewhere each test is skipped with the reason. Run it on a GPU host with
`bash scripts/test_gpu.sh` (README, "GPU").
"""

from __future__ import annotations

import functools

import pytest

from model_repository_loader.gpu.devices import visible_devices


@functools.cache
def gpu_missing() -> str | None:
    """Why the GPU suite cannot run here, or None."""
    if not visible_devices():
        return "no NVIDIA GPU found through NVML (nvidia-ml-py and a driver)"
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return f"the installed torch ({torch.__version__}) has no CUDA"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/gpu/" not in item.nodeid.replace("\\", "/"):
            continue
        item.add_marker(pytest.mark.gpu)
        reason = gpu_missing()
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=f"GPU suite: {reason}"))
