"""bridge/tuning.py: after keep_large_buffers(), a request-sized buffer freed and allocated
again reuses the heap instead of fresh pages (which the kernel must fault in and zero)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# In a fresh interpreter: the allocator's settings are process-wide.
SCRIPT = textwrap.dedent(
    """
    import resource, sys
    import numpy as np
    from bridge.tuning import keep_large_buffers
    if not keep_large_buffers():
        print("unsupported")
        sys.exit(0)
    def cycle():
        for _ in range(20):
            array = np.ones(1 << 20, np.float32)  # 4 MB, written: FP32 x 1M
            data = array.tobytes()
            del array, data
    cycle()  # the heap grows once
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    cycle()
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    """
)


def test_large_buffers_are_reused_not_faulted_in_again():
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    if done.stdout.strip() == "unsupported":
        pytest.skip("not glibc: keep_large_buffers() does nothing")
    faults = int(done.stdout)
    # 40 buffers of 4 MB on fresh pages would be ~40,000 page faults (glibc's defaults here:
    # ~30,000); reused, the cycles fault in less than one buffer's 1,024 pages.
    assert faults < 1024, faults
