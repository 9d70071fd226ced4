"""The GPU suite: every test here is marked `gpu` and runs only where a GPU can be used.

"Can be used" means NVML finds a GPU (gpu/devices.py, as the server finds them) and the torch
installed has CUDA (the suite's models drive the GPU with torch, as most Triton models do);
elsewhere each test is skipped with the reason. Run it on a GPU host with
`bash scripts/test_gpu.sh` (README, "GPU").
"""

from __future__ import annotations

import pytest

from tests.harness.gpu import gpu_missing


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/gpu/" not in item.nodeid.replace("\\", "/"):
            continue
        item.add_marker(pytest.mark.gpu)
        reason = gpu_missing()
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=f"GPU suite: {reason}"))
