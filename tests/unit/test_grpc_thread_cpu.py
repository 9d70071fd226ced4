"""`--grpc-thread-cpu` (bridge/tuning.py `grpc_thread_cpu`, `threads_on`): the gRPC server's
threads are started on one CPU, which they inherit; the starting thread keeps its own CPUs."""

from __future__ import annotations

import os
import threading

import pytest

from bridge.tuning import grpc_thread_cpu, threads_on

pytestmark = pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity"), reason="CPU affinity is Linux only"
)


@pytest.mark.parametrize(
    ("choice", "allowed", "expected"),
    [
        ("auto", {0, 1, 2, 3}, 3),  # the last CPU the process may use
        ("auto", {5}, None),  # one CPU: nothing to spare the threads from
        ("off", {0, 1}, None),
        ("0", {0, 1}, 0),
    ],
)
def test_the_choice(choice: str, allowed: set[int], expected: int | None) -> None:
    assert grpc_thread_cpu(choice, allowed) == expected


@pytest.mark.parametrize(
    ("choice", "text"),
    [("7", "CPU 7 is not one this process may use (0,1)"), ("many", "'many' is not auto")],
)
def test_a_cpu_it_cannot_use_is_refused(choice: str, text: str) -> None:
    with pytest.raises(ValueError, match=text.replace("(", r"\(").replace(")", r"\)")):
        grpc_thread_cpu(choice, {0, 1})


def _affinity_of_a_new_thread() -> set[int]:
    seen: dict[str, set[int]] = {}
    thread = threading.Thread(target=lambda: seen.update(cpus=os.sched_getaffinity(0)))
    thread.start()
    thread.join()
    return seen["cpus"]


def test_threads_started_inside_run_on_the_cpu_and_the_caller_keeps_its_own() -> None:
    before = os.sched_getaffinity(0)
    cpu = max(before)
    with threads_on(cpu):
        assert _affinity_of_a_new_thread() == {cpu}
    assert os.sched_getaffinity(0) == before
    assert _affinity_of_a_new_thread() == before
    with threads_on(None):
        assert _affinity_of_a_new_thread() == before
