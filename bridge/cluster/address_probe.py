"""Whether this process can reach the request-plane address a worker advertises, asked before
anything is sent to it.

A worker advertises where it takes requests (its DYN_TCP_RPC_HOST and port) in its discovery
record; Dynamo's client lists it from the moment the record appears, whether or not this process
can open a connection there. A worker whose address the cluster cannot reach (an unset
DYN_TCP_RPC_HOST on a host whose default route is on another network; a firewall) reported
READY while every request sent to it failed, or waited out a timeout (issue 39). So the
process's one ClusterIndex (index.py) asks this probe about every worker (control instance)
before it asks the worker for its index, and leaves a worker it cannot reach out of everything:

* its `index` answer is not asked for, so none of its models is ready through it (ModelReady,
  the door's routing, BLS across workers);
* its instances are left out of every model endpoint's client (`ReachableClient`): a request
  goes to a replica, or finds no instance, rather than to an address that does not answer;
* one line says so, naming the address and the variable to look at; another when it answers.

The probe is a TCP connection to the advertised address (`Instance.transport`, "host:port/…"
for the tcp request plane), within PROBE_TIMEOUT_S. It only reaches the worker's side; the
other direction (the worker's responses to this process's DYN_TCP_RESPONSE_STREAM_HOST) is
checked by each process at start-up (roles/runtime.py) and by the `index` round trip itself.
On the nats request plane requests travel through NATS: there is no address to probe. A worker
found unreachable is probed again every PROBE_AGAIN_S while rounds are asked (so a network
that heals lets it back); one found reachable is not probed again (a worker that goes away
later is the request path's to find: routes.py).

An instance is a process: Dynamo gives every endpoint of one runtime the same instance id (its
connection id, measured with ai-dynamo-runtime 1.6.1), so the control endpoint's instance ids
name the model endpoints' instances of the same workers.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

# A worker that accepts connections does so within milliseconds on any network a cluster runs
# on; one that has not in 2 s is not reachable (a dropped SYN retries after 1 s, then 3 s).
PROBE_TIMEOUT_S = 2.0
# How often a worker found unreachable is probed again (while rounds are asked).
PROBE_AGAIN_S = 5.0


def advertised_address(instance: Any) -> tuple[str, int] | None:
    """(host, port) of a Dynamo `Instance`'s tcp request-plane address; None for other
    transports (nats) or an address that does not parse."""
    transport = getattr(instance, "transport", None)
    if transport is None or str(getattr(transport, "kind", "")) != "tcp":
        return None
    where = str(getattr(transport, "address", "")).split("/", 1)[0]  # host:port/<id>/<path>
    host, _, port = where.rpartition(":")
    if not host or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


async def accepts(host: str, port: int, timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """None when host:port accepts a TCP connection within `timeout`, else why not."""
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    except asyncio.TimeoutError:
        return f"no answer within {timeout:.0f} s"
    except OSError as exc:
        return exc.strerror or str(exc)
    writer.close()
    return None


@dataclass
class _Probed:
    address: str  # host:port as advertised
    reachable: bool
    at: float  # time.monotonic() of the probe


class AddressProbe:
    """The workers (instance ids) this process cannot reach, as last probed. `on_change` is
    called when one found unreachable answers again (the index then asks a new round)."""

    def __init__(self, on_change: Callable[[], None] | None = None) -> None:
        self._probed: dict[int, _Probed] = {}
        self._again: dict[int, asyncio.Future[None]] = {}  # probes again, in the background
        self._on_change = on_change
        self.unreachable: frozenset[int] = frozenset()

    async def check(self, instances: Iterable[Any]) -> frozenset[int]:
        """Probe the instances never probed (awaited: nothing is asked of a worker before);
        start probing again, in the background, those found unreachable PROBE_AGAIN_S ago or
        more (a worker cut off must not hold every round up for its timeout); forget those no
        longer listed. The ids unreachable now."""
        listed: dict[int, tuple[str, int]] = {}
        for instance in instances:
            address = advertised_address(instance)
            if address is not None:
                listed[int(instance.instance_id)] = address
        for gone in set(self._probed) - set(listed):
            del self._probed[gone]
        new = [(i, address) for i, address in listed.items() if i not in self._probed]
        failures = await asyncio.gather(*(accepts(*address) for _, address in new))
        for (instance_id, address), failure in zip(new, failures, strict=True):
            self._record(instance_id, address, failure)
        now = time.monotonic()
        for instance_id, probed in self._probed.items():
            due = not probed.reachable and now - probed.at >= PROBE_AGAIN_S
            if due and instance_id not in self._again:
                task = asyncio.ensure_future(self._again_of(instance_id, listed[instance_id]))
                self._again[instance_id] = task
        self._settle()
        return self.unreachable

    async def _again_of(self, instance_id: int, address: tuple[str, int]) -> None:
        try:
            failure = await accepts(*address)
            if instance_id in self._probed:  # still listed
                self._record(instance_id, address, failure)
                if failure is None:
                    self._settle()
                    if self._on_change is not None:
                        self._on_change()
        finally:
            self._again.pop(instance_id, None)

    def _settle(self) -> None:
        self.unreachable = frozenset(i for i, p in self._probed.items() if not p.reachable)

    def _record(self, instance_id: int, address: tuple[str, int], failure: str | None) -> None:
        host, port = address
        where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        before = self._probed.get(instance_id)
        self._probed[instance_id] = _Probed(where, failure is None, time.monotonic())
        if failure is not None and (before is None or before.reachable):
            log.error(
                "worker %x advertises %s for the request plane, which this process cannot "
                "reach (%s): nothing is sent to it and its models are not ready through it "
                "until it answers (probed every %.0f s); set DYN_TCP_RPC_HOST on that worker "
                "to an address this host reaches",
                instance_id,
                where,
                failure,
                PROBE_AGAIN_S,
            )
        elif failure is None and before is not None and not before.reachable:
            log.warning("worker %x at %s answers now: requests go to it again", instance_id, where)

    def close(self) -> None:
        """Stop the probes running in the background."""
        for task in list(self._again.values()):
            task.cancel()


class ReachableClient:
    """A Dynamo client of a model endpoint that lists only the instances the probe did not find
    unreachable; everything else is the client's own. With none left out it is the client."""

    def __init__(self, client: Any, probe: AddressProbe) -> None:
        self.client = client
        self._probe = probe
        self._turn = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)

    def instance_ids(self) -> list[int]:
        ids = self.client.instance_ids()
        left_out = self._probe.unreachable
        return [i for i in ids if i not in left_out] if left_out else list(ids)

    async def round_robin(self, request: Any, **kwargs: Any) -> Any:
        """Dynamo's round robin, over the reachable instances when some are left out."""
        if not self._probe.unreachable:
            return await self.client.round_robin(request, **kwargs)
        ids = sorted(self.instance_ids())
        if not ids:  # Dynamo's own answer for an endpoint with no instance
            return await self.client.round_robin(request, **kwargs)
        self._turn += 1
        return await self.client.direct(request, ids[self._turn % len(ids)], **kwargs)
