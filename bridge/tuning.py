"""Process-wide tuning measured on the serving path: the C heap, the threads' scheduling, the
size of Dynamo's runtime's blocking pool, gRPC's server I/O, and the request plane's timeout.

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

## Bound what the heap keeps over reloads (`arena_max`, `release_free_memory`)

The same settings made a reload-heavy server's RSS grow in steps (issue 22: 20 MiB models,
160 → 325 MB over 22 reloads) with every retired generation freed: each generation's threads
(its load, its instances) allocate in malloc arenas of their own, up to 8 per core, and each
arena kept up to TRIM_THRESHOLD of what they freed. `malloc_trim(0)` alone gives back the free
memory of the main arena, but not the free top of the others (glibc 2.36). So
`keep_large_buffers` also caps the arenas at the CPU count (more buy nothing when no more threads
run at once; glibc's own MALLOC_ARENA_MAX, when set, wins), and the ModelManager calls
`release_free_memory` (off the loop) once a burst of unloads is over: the serving path keeps its
buffers between requests, and what finalized generations held goes back to the kernel. Measured
with benchmarks/reload_rss.py (docs/benchmarks.md): 181 → 304 MiB over 22 reloads before,
flat at about 163 MiB after.

## SCHED_BATCH for the triton door's process (`batch_scheduling`)

Measured on the door: every RPC wakes gRPC's poller threads and the model's instance thread
several times, and each of them preempted the event loop's thread while it held the GIL, only
to block on the GIL at once (8 involuntary switches per add_sub request at c=32; with
SCHED_BATCH 0.25, and 11-25% less CPU per request; docs/benchmarks.md).

## Open files up to the hard limit (`open_files_to_hard_limit`)

Every connection is a file descriptor. With a soft RLIMIT_NOFILE of 1024 (a common default)
one listener's idle connections could take them all, and then gRPC, HTTP, metrics and Dynamo's
request plane all fail (issue 22). The soft limit is raised to the hard one at start, so the
HTTP listeners' caps (`--http-max-connections`, 1024 each by default) sit well below it, and the
gRPC door's (`--grpc-max-connections`) is by default what is left (bridge/server.py); when the
hard limit itself is lower than the caps need, the bridge says so.

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

On the nats request plane the worker threads are raised too, to max(NATS_MIN_WORKER_THREADS,
CPUs): there `DistributedRuntime.endpoint()` waits for Dynamo's runtime while holding the GIL,
and each worker thread completing a Python awaitable of Dynamo's waits for the GIL; with every
worker thread in that wait the process wedges for good (bridge/dynamo_endpoints.py). Measured
with 16 streams in flight (tests/e2e/test_nats_startup.py): 2, 8 worker threads wedged at the
first or second `endpoint()`, 32 and 64 made 300 without one; 96 streams wedged 64 threads too.
So the threads raise the bound, they do not remove it (the tcp plane has none).

## The gRPC wire's threads on one CPU (`threads_on`, `grpc_thread_cpu`)

Every thread of the door's synchronous gRPC server (its poller and the pools it starts:
frontends/triton/grpc/methods.py) runs Python, so only one of them runs at a time (the GIL).
Spread over several CPUs, each hand-over of the GIL wakes a thread on another CPU: measured on
2 CPUs, add_sub c=32, the door unpinned answered 2,580-2,670 req/s, the same door pinned whole
to one CPU 5,710, with only the gRPC threads on one CPU 4,920-5,240 (FP32 × 100K: 1,423 → 1,682;
docs/benchmarks.md). So `--grpc-thread-cpu` (default: the last CPU this process may use, when it
may use more than one) is where the server's threads are started; threads inherit their
creator's CPUs, so everything the server starts stays there. The loop, the models' instance
threads, Dynamo's and gRPC core's own threads keep every CPU.

## gRPC's server I/O on the server's own poller thread (`grpc_server_io`)

grpcio enables gRPC core's EventEngine for Python (from 2026), whose listener reads and writes
the server's connections on EventEngine threads of its own: each call's bytes then cross one
more thread before the server's poller thread sees them. With the listener experiment off
(`GRPC_EXPERIMENTS=-event_engine_listener`, gRPC's documented switch) the server's poller
thread polls the connections itself: a bare synchronous server with one thread hop goes from 10
to 7 context switches a call (grpcio 1.85.3). Measured on the door, one server CPU, two doors
side by side (docs/benchmarks.md): FP32 × 4 c=1 305 → 270 µs of CPU a request and p50 0.449 →
0.428 ms, FP32 × 100K c=1 p50 0.660 → 0.602 ms; add_sub and FP32 × 100K at c=32 unchanged
within the noise; a 4 MB request 6% slower (p50 4.24 → 4.48 ms, still under Triton's). So the
bridge sets it while grpc is first imported (gRPC reads the variable once, when its core is
loaded: bridge/entry.py; then it is taken out of the environment again, not to reach the
processes the bridge starts), unless the user set GRPC_EXPERIMENTS, and only on grpcio releases
known to have the experiment (GRPC_LISTENER_KNOWN_FROM through GRPC_LISTENER_KNOWN_UNTIL, the
last measured): gRPC logs an experiment it does not know as an error.

## How long a caller waits for a worker to take a request (`request_plane_timeout`)

On the TCP request plane the caller waits `DYN_TCP_REQUEST_TIMEOUT` seconds (Dynamo's default:
5) for the worker to acknowledge a request; the worker acknowledges on receipt, before the
model runs (measured: a 3 s model answered with the timeout at 1 s). Until then a worker cut
off by a partition holds every request sent its way, and a timeout is what ejects it
(bridge/cluster/instances.py): measured on three network namespaces, a 20 s cut of one of two
workers took the door from ~800 req/s to 0-16 req/s for the whole cut. The bridge therefore
sets 1 s (the variable's smallest value: whole seconds) unless the user set it. The bound covers
the transfer of the request itself, so a link that needs more than a second for the largest
request (32 MiB at most, `DYN_TCP_MAX_MESSAGE_SIZE`: 0.3 s at 1 Gbit/s) needs a larger value.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import logging
import os
import re
import resource
from collections.abc import Iterator, MutableMapping

log = logging.getLogger(__name__)

RUNTIME_THREAD_VARIABLES = ("DYN_RUNTIME_MAX_BLOCKING_THREADS", "DYN_RUNTIME_NUM_WORKER_THREADS")
MIN_BLOCKING_THREADS = 16
NATS_MIN_WORKER_THREADS = 64


def runtime_threads(
    environ: MutableMapping[str, str], request_plane: str = "tcp", cpus: int | None = None
) -> dict[str, str]:
    """Dynamo's runtime threads unless the user chose them (either variable set): the blocking
    pool always, the worker threads too on the nats request plane (see the module doc); what
    was set. Before Dynamo is imported: it reads DYN_RUNTIME_* when a runtime is made (its
    Python binding may make one of its own early)."""
    if any(environ.get(name) for name in RUNTIME_THREAD_VARIABLES):
        return {}
    count = cpus if cpus is not None else (os.cpu_count() or 1)
    chosen = {"DYN_RUNTIME_MAX_BLOCKING_THREADS": str(max(MIN_BLOCKING_THREADS, 4 * count))}
    if request_plane == "nats":
        chosen["DYN_RUNTIME_NUM_WORKER_THREADS"] = str(max(NATS_MIN_WORKER_THREADS, count))
    environ.update(chosen)
    return chosen


GRPC_EXPERIMENTS_VARIABLE = "GRPC_EXPERIMENTS"
GRPC_LISTENER_OFF = "-event_engine_listener"
# grpcio releases whose core knows the listener experiment: from one well after it came (2023),
# through the last measured (a later one may drop it, and gRPC would log the name as an error).
GRPC_LISTENER_KNOWN_FROM = (1, 60)
GRPC_LISTENER_KNOWN_UNTIL = (1, 85)


# What this process set GRPC_EXPERIMENTS to while grpc loaded (grpc_server_io), if anything.
_grpc_experiments_set: str | None = None


@contextlib.contextmanager
def grpc_server_io(
    environ: MutableMapping[str, str], grpcio_version: str | None
) -> Iterator[str | None]:
    """While grpc is imported inside it: EventEngine's listener off (module doc), unless the
    user set GRPC_EXPERIMENTS or `grpcio_version` (None: not installed) is not known to have
    the experiment; yields what was set. gRPC's core reads the variable once, when it loads;
    then it is taken out again, so that the processes this one starts (model instances, a
    model's environment with a grpcio of its own, which may not know the name) do not inherit
    it."""
    global _grpc_experiments_set
    chosen = None
    if GRPC_EXPERIMENTS_VARIABLE not in environ and grpcio_version is not None:
        release = tuple(int(part) for part in re.findall(r"\d+", grpcio_version)[:2])
        if GRPC_LISTENER_KNOWN_FROM <= release <= GRPC_LISTENER_KNOWN_UNTIL:
            chosen = environ[GRPC_EXPERIMENTS_VARIABLE] = GRPC_LISTENER_OFF
    try:
        yield chosen
    finally:
        if chosen is not None:
            environ.pop(GRPC_EXPERIMENTS_VARIABLE, None)
            _grpc_experiments_set = chosen


def grpc_experiments() -> str | None:
    """The GRPC_EXPERIMENTS gRPC's core loaded with here: the bridge's (grpc_server_io) or
    the user's."""
    return _grpc_experiments_set or os.environ.get(GRPC_EXPERIMENTS_VARIABLE)


REQUEST_PLANE_TIMEOUT_VARIABLE = "DYN_TCP_REQUEST_TIMEOUT"
REQUEST_PLANE_TIMEOUT_S = 1


def request_plane_timeout(environ: MutableMapping[str, str]) -> int:
    """Set DYN_TCP_REQUEST_TIMEOUT to REQUEST_PLANE_TIMEOUT_S unless the user chose it; the
    seconds in force (Dynamo reads whole seconds; a value it cannot read leaves its 5)."""
    value = environ.setdefault(REQUEST_PLANE_TIMEOUT_VARIABLE, str(REQUEST_PLANE_TIMEOUT_S))
    try:
        return max(0, int(value))
    except ValueError:
        return 5


# mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
MMAP_THRESHOLD = 32 << 20  # glibc's largest accepted value on 64-bit (HEAP_MAX_SIZE / 2)
TRIM_THRESHOLD = 128 << 20


@functools.cache
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        return ctypes.CDLL(name)
    except OSError:
        return None


def keep_large_buffers() -> bool:
    """Tune glibc's malloc as above; True when it took effect."""
    mallopt = getattr(_libc(), "mallopt", None)
    if mallopt is None:  # no C library found, or not glibc
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    done = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
    done = mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1 and done
    if not _arena_max_given():
        done = mallopt(_M_ARENA_MAX, arena_max()) == 1 and done
    if not done:
        log.debug("mallopt refused the large-buffer settings")
    return done


def arena_max() -> int:
    """The most malloc arenas worth having: one per CPU this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _arena_max_given() -> bool:
    """glibc's own setting of the arena count is in the environment (the user's wins)."""
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    return "MALLOC_ARENA_MAX" in os.environ or "glibc.malloc.arena_max" in tunables


def release_free_memory() -> bool:
    """glibc's malloc_trim(0), as above: True when it gave memory back. Blocking (it walks
    every arena; ctypes lets go of the GIL meanwhile): call it off the event loop."""
    trim = getattr(_libc(), "malloc_trim", None)
    if trim is None:  # no C library found, or not glibc
        return False
    trim.argtypes = (ctypes.c_size_t,)
    trim.restype = ctypes.c_int
    return trim(0) == 1


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


OPEN_FILES_CEILING = 1 << 20  # when the hard limit is unlimited: the kernel's usual nr_open


def grpc_thread_cpu(choice: str, allowed: set[int] | None = None) -> int | None:
    """`--grpc-thread-cpu`: "auto" (the last of the CPUs this process may use, None when it
    may use one), "off" (None), or a CPU number this process may use; ValueError otherwise."""
    cpus = allowed if allowed is not None else os.sched_getaffinity(0)
    if choice == "off":
        return None
    if choice == "auto":
        return max(cpus) if len(cpus) > 1 else None
    try:
        cpu = int(choice)
    except ValueError:
        raise ValueError(f"'{choice}' is not auto, off or a CPU number") from None
    if cpu not in cpus:
        shown = ",".join(str(c) for c in sorted(cpus))
        raise ValueError(f"CPU {cpu} is not one this process may use ({shown})")
    return cpu


@contextlib.contextmanager
def threads_on(cpu: int | None) -> Iterator[None]:
    """Threads started inside run on `cpu` (Linux: a new thread inherits its creator's CPUs);
    the calling thread's own CPUs are as before afterwards. None: nothing changes."""
    if cpu is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def open_files_to_hard_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit; the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = OPEN_FILES_CEILING if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.debug("cannot raise RLIMIT_NOFILE from %d to %d: %s", soft, target, exc)
    return soft
