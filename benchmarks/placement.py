"""Where the client and the servers run: on separate CPUs when the machine has two or more.

A client on the same CPUs as the servers takes its share from them, and a different share for a
faster or a slower server. With `--pin auto` (every benchmark's default) and at least two CPUs
in this process's affinity mask, the client gets the first CPU and the servers all the others
(on a 2-CPU machine: client on one, every server on the other). The servers inherit their CPUs
at start: the thread that starts them is pinned first, and each server process (with whatever
it starts later: Triton's Python stubs, the bridge's instance processes) inherits its mask. The
client's own threads are pinned once the servers are up. With one CPU, or `--pin off`, nothing
is pinned; the client's CPU time per request is reported either way.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

PIN_CHOICES = ("auto", "off")


@dataclass(frozen=True)
class Placement:
    client: frozenset[int]
    servers: frozenset[int]

    def describe(self) -> str:
        return f"client on CPU {_cpus(self.client)}, servers on CPU {_cpus(self.servers)}"

    def pin_server_side(self) -> None:
        """Pin the calling thread: the threads and processes it starts next inherit this."""
        os.sched_setaffinity(0, self.servers)

    def pin_client(self) -> None:
        """Pin every thread of this process to the client's CPUs."""
        for task in os.listdir("/proc/self/task"):
            try:
                os.sched_setaffinity(int(task), self.client)
            except OSError:  # a thread that ended meanwhile
                pass


def _cpus(cpus: frozenset[int]) -> str:
    return ",".join(str(c) for c in sorted(cpus))


def choose(mode: str) -> Placement | None:
    """The placement for `--pin mode`, or None (no pinning: `off`, or fewer than 2 CPUs)."""
    if mode == "off" or not hasattr(os, "sched_getaffinity"):
        return None
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None
    return Placement(client=frozenset(cpus[:1]), servers=frozenset(cpus[1:]))


def describe(placement: Placement | None) -> str:
    if placement is None:
        return "not pinned: client and servers share every CPU (client CPU time reported)"
    return placement.describe()
