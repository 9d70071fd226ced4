"""The triton door puts its process's threads in SCHED_BATCH (bridge/tuning.py `batch_scheduling`).

Run in a subprocess: the policy must not leak into the test process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from tests.harness.bridge_server import PROJECT_ROOT

pytestmark = pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="SCHED_BATCH is Linux only")

SCRIPT = textwrap.dedent(
    """
    import os, threading
    from bridge.tuning import batch_scheduling

    release = threading.Event()
    before = threading.Thread(target=release.wait)
    before.start()
    changed = batch_scheduling()
    seen = {}
    after = threading.Thread(target=lambda: seen.update(after=os.sched_getscheduler(0)))
    after.start()
    after.join()
    print(changed, os.sched_getscheduler(0), os.sched_getscheduler(before.native_id),
          seen["after"], os.SCHED_BATCH)
    release.set()
    """
)


def test_every_thread_and_later_ones_run_in_sched_batch() -> None:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        cwd=PROJECT_ROOT,
        env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.split()
    changed, main, before, after, batch = (int(v) for v in out)
    assert changed >= 2  # the main thread and the one started before
    assert main == before == after == batch
