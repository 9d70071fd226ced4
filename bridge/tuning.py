"""Process-wide tuning measured on the serving path: the C heap, the threads' scheduling, and
the size of Dynamo's runtime's blocking pool.

## Keep large buffers in the C heap between requests (glibc's malloc), instead of fresh pages

Every tensor a request carries is copied a few times on its way (gRPC's receive buffer, the
protobuf message, the numpy input, the output bytes, the response). With glibc's defaults a
buffer from 128 KiB up may be served by its own `mmap` and returned with `munmap` when freed,
and freed memory at the top of a heap is given back to the kernel: the next request's buffers
are fresh pages, which the kernel must fault in and zero one 4 KiB page at a time. Measured on
the triton door with FP32 × 1M (4 MB) at concurrency 1: 73% of the process's CPU in the kernel
(page faults, page clearing) and a p50 of 30 ms; with the buffers kept, 11 ms.

`keep_large_buffers()` raises the mmap threshold to glibc's maximum (32 MiB on 64-bit: larger
buffers still get their own mapping) and the trim threshold with it, so freed buffers stay in
the heap for the next request. The cost is memory: up to TRIM_THRESHOLD of freed memory may stay
held per malloc arena. Elsewhere than glibc this does nothing.

## SCHED_BATCH for the triton door's process (`batch_scheduling`)

Measured on the door: every RPC wakes gRPC's poller threads and the model's instance thread
several times, and each of them preempted the event loop's thread while it held the GIL, only
to block on the GIL at once (8 involuntary switches per add_sub request at c=32; with
SCHED_BATCH 0.25, and 11-25% less CPU per request; docs/benchmarks.md).

## Dynamo's blocking threads (`runtime_threads`)

Dynamo 1.6.1 sizes its tokio runtime from the CPUs: `num_worker_threads` and
`max_blocking_threads` both 2 on a 2-CPU host (its start-up line says so at DYN_LOG=debug). Its
model watcher prepares each discovered model with `block_in_place` + `block_on`, which needs a
blocking thread to take over the worker's core; measured with etcd discovery and the NATS
request plane, a frontend started after a worker already serving 10 models never came up (both
runtime threads blocked there, SIGTERM ignored; Dynamo's own standalone frontend too). With
`DYN_RUNTIME_MAX_BLOCKING_THREADS=4` it did. So, when the user has set neither that nor
`DYN_RUNTIME_NUM_WORKER_THREADS`, the bridge sets the blocking pool to
max(MIN_BLOCKING_THREADS, 4 × CPUs) before Dynamo's runtime is made (threads are started only
when needed: the cap costs nothing until then).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
from collections.abc import MutableMapping

log = logging.getLogger(__name__)

RUNTIME_THREAD_VARIABLES = ("DYN_RUNTIME_MAX_BLOCKING_THREADS", "DYN_RUNTIME_NUM_WORKER_THREADS")
MIN_BLOCKING_THREADS = 16


def runtime_threads(environ: MutableMapping[str, str], cpus: int | None = None) -> str | None:
    """Set DYN_RUNTIME_MAX_BLOCKING_THREADS unless the user chose the runtime's threads; the
    value set, or None. Before Dynamo is imported: it reads DYN_RUNTIME_* when a runtime is
    made (its Python binding may make one of its own early)."""
    if any(environ.get(name) for name in RUNTIME_THREAD_VARIABLES):
        return None
    count = cpus if cpus is not None else (os.cpu_count() or 1)
    value = str(max(MIN_BLOCKING_THREADS, 4 * count))
    environ["DYN_RUNTIME_MAX_BLOCKING_THREADS"] = value
    return value


# mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # glibc's largest accepted value on 64-bit (HEAP_MAX_SIZE / 2)
TRIM_THRESHOLD = 128 << 20


def keep_large_buffers() -> bool:
    """Tune glibc's malloc as above; True when it took effect."""
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    done = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
    done = mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1 and done
    if not done:
        log.debug("mallopt refused the large-buffer settings")
    return done


def batch_scheduling() -> int:
    """Put every thread of this process in SCHED_BATCH; returns how many it changed.

    Same share of the CPU as SCHED_OTHER, but a woken thread waits for the running one to
    block instead of preempting it. Every RPC wakes gRPC's completion-queue poller and event
    engine threads and the model's instance thread several times; each of those preempted the
    event loop's thread while it held the GIL (8 involuntary switches per add_sub request at
    c=32), only to block on the GIL at once. Threads started later inherit the policy. Best
    effort: where the policy cannot be set nothing changes.
    """
    policy = getattr(os, "SCHED_BATCH", None)
    if policy is None or not hasattr(os, "sched_setscheduler"):
        return 0
    changed = 0
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return 0
    for task in tasks:
        try:
            os.sched_setscheduler(int(task), policy, os.sched_param(0))
            changed += 1
        except OSError:  # a thread that ended meanwhile, or not allowed
            pass
    return changed
