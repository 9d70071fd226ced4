"""Keep large buffers in the C heap between requests (glibc's malloc), instead of fresh pages.

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
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

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
