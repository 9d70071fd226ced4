"""Stopping a server subprocess started in its own process group."""

from __future__ import annotations

import os
import signal
import subprocess


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # nothing left in the group


def stop_process_group(process: subprocess.Popen, timeout: float) -> int:
    """SIGTERM the server, SIGKILL its whole group after `timeout` s; returns the exit code.

    The server must have been started with `start_new_session=True`, so its group holds only it
    and the processes it spawned (Triton's python stubs, the bridge's instance workers). Those
    are killed as well once the server is gone, so a killed server leaves no orphans behind.
    """
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            _kill_group(process.pid)
            process.wait()
    _kill_group(process.pid)
    return process.returncode
