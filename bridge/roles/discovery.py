"""Whether etcd discovery still works in this process: readiness, and the restart on a lost lease.

With etcd discovery every Dynamo runtime holds one etcd lease, and every record it publishes
(instances, model cards) lives on that lease. What Dynamo does when etcd goes away (ai-dynamo-
runtime 1.6.1, measured with etcd stopped under load, and read in lib/runtime/src/transports/
etcd.rs and etcd/lease.rs):

* While the lease lasts (ETCD_LEASE_TTL), requests keep flowing on what discovery had cached,
  and an outage that ends in time costs nothing.
* Once the keep-alive cannot reach etcd before the lease's deadline, the lease task logs
  "Unable to maintain lease" and cancels the runtime's primary token: Dynamo shuts the whole
  `DistributedRuntime` down ("If the lease expires, the Runtime will be shutdown", etcd.rs
  `Client::new`). Every `serve_endpoint` returns, the request-plane handlers are removed, the
  system status server (DYN_SYSTEM_PORT) stops, and the records expire with the lease. That
  runtime never serves again, even after etcd returns; the process itself lives on, and before
  this module every health surface of it kept answering ready.

A new `DistributedRuntime` made in the same process does get a new lease and serve (measured),
but everything bound to the old one (each model generation's endpoint and model card, the
control endpoint, BLS clients, the door's directory, Dynamo's KServe frontend) would have to be
rebuilt on it, while reloads may be in flight. The bridge starts the whole process again
instead, which builds all of it the one way it is always built: it says so in one ERROR line,
shuts down as on SIGTERM (its ports close: not ready), waits until etcd answers, and re-executes
itself (same pid, same arguments and environment; composition root, bridge/server.py), which
loads the models and registers them with a new lease. Traffic resumes with no supervisor
involved. With `--exit-on-lease-loss` it exits with status 1 instead, for an orchestrator that
prefers to restart it.

So `DiscoveryWatch`:
* probes etcd (the ETCD_ENDPOINTS addresses) every PROBE_S; while no address answers (after
  PROBE_FAILURES probes in a row), the process is not ready (every health surface: the door's
  ServerReady and /v2/health/ready, the metrics port, Dynamo's /health on the system port, the
  control port) and says so in one ERROR line, then one line when etcd answers again;
* serves one sentinel endpoint whose `serve_endpoint` returns only when the runtime shuts down:
  if that happens while the bridge is not stopping, the runtime was shut down under it (the lease
  was lost), and `on_lost` runs (the composition root stops the process, then starts it again
  once etcd answers, or exits with status 1 under `--exit-on-lease-loss`).

Lost leases in a row back off (issue 38 finding 5: with an etcd anyone on the host may use, a
local user revoking the leases made every process re-execute 4 times a minute, each a full
outage). The count of re-executions survives the exec in REEXECS_VARIABLE, with the time of the
last one (time.monotonic(): the system's monotonic clock, the same before and after exec): a loss
within STABLE_S of the last re-execution waits 1 s, then 2, 4, ... up to BACKOFF_MAX_S before
starting again, with one WARNING line; STABLE_S of serving start the count over. Backing off
bounds the loop; only etcd's auth (docs/security.md) keeps other users from revoking at all.

With `mem` or `file` discovery there is no lease and nothing to watch.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator, Callable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from dynamo.runtime import DistributedRuntime

from ..dynamo_endpoints import dynamo_endpoint
from .runtime import Service, needed_services

log = logging.getLogger("dynamo_bridge")

# Between probes of etcd: an outage is seen within a few seconds (PROBE_FAILURES probes, each
# bounded by PROBE_TIMEOUT_S), at the cost of one small request a second.
PROBE_S = 1.0
PROBE_TIMEOUT_S = 2.0  # one probe's bound: an etcd that accepts but never answers is down
# Probes that must fail in a row before etcd counts as away: one slow answer on a busy loop
# must not make the process unready (nor log an ERROR).
PROBE_FAILURES = 2
# The sentinel's component: not a model's (those are `<slug>-<hash>`,
# bridge/models/endpoint.py), and never routed to (no model card names it).
SENTINEL_ENDPOINT = "bridge.runtime"
# Re-executions after lost leases, kept across them: "<count in a row> <monotonic time of the
# last>", set by the process itself just before it re-executes.
REEXECS_VARIABLE = "DYN_BRIDGE_LEASE_REEXECS"
BACKOFF_FIRST_S = 1.0  # the wait before the second re-execution in a row
BACKOFF_MAX_S = 60.0  # the longest: a revoke a minute then costs a minute, not a loop
# Serving this long since the last re-execution: the next lost lease starts the count over (a
# process that re-executed once for an etcd outage hours ago starts again at once).
STABLE_S = 300.0


@dataclass(frozen=True, slots=True)
class Reexecs:
    """The re-executions in a row behind this process (none: count 0)."""

    count: int = 0
    last: float = 0.0  # time.monotonic() when the last one happened

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> Reexecs:
        try:
            count, last = environ.get(REEXECS_VARIABLE, "").split()
            return cls(max(int(count), 0), float(last))
        except ValueError:  # unset, or not ours: no history
            return cls()

    def in_a_row(self, now: float) -> int:
        """Re-executions in a row so far, forgetting them after STABLE_S of serving."""
        return self.count if now - self.last < STABLE_S else 0

    def backoff_s(self, now: float) -> float:
        """How long to wait before the next re-execution."""
        count = self.in_a_row(now)
        return 0.0 if count == 0 else min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2 ** (count - 1))

    def next(self, now: float) -> Reexecs:
        return Reexecs(self.in_a_row(now) + 1, now)


async def back_off_before_reexec(environ: MutableMapping[str, str]) -> None:
    """Wait as the re-executions so far say (one line when waiting), then count this one in
    `environ`, which the exec passes on."""
    history = Reexecs.from_environ(environ)
    delay = history.backoff_s(time.monotonic())
    if delay:
        log.warning(
            "lease lost after %d re-execution(s) in a row, each within %.0f s of the last: "
            "backing off %.0f s before starting this process again (doubling up to %.0f s; "
            "etcd's auth keeps other users from revoking leases, docs/security.md)",
            history.count,
            STABLE_S,
            delay,
            BACKOFF_MAX_S,
        )
        await asyncio.sleep(delay)
    following = history.next(time.monotonic())
    environ[REEXECS_VARIABLE] = f"{following.count} {following.last:.3f}"


class DiscoveryWatch:
    """Readiness of discovery (`usable()`) and the lease-loss signal (`on_lost`); see module doc."""

    def __init__(
        self, etcd: Service | None, on_lost: Callable[[], None], exit_on_loss: bool = False
    ) -> None:
        self.etcd = etcd  # None: not etcd discovery, nothing to watch
        self._on_lost = on_lost
        self.exit_on_loss = exit_on_loss  # --exit-on-lease-loss (else: re-executed)
        self.reachable = True
        self.lost = False
        self._stopping = False
        self._probe: asyncio.Future[None] | None = None
        self._sentinel: asyncio.Future[Any] | None = None
        self._down_since = 0.0

    @classmethod
    def for_backend(
        cls,
        discovery: str,
        request_plane: str,
        on_lost: Callable[[], None],
        exit_on_loss: bool = False,
    ) -> DiscoveryWatch:
        """The watch of this process's discovery backend (etcd: as the runtime finds it)."""
        services = needed_services(discovery, request_plane, os.environ)
        etcd = next((s for s in services if s.variable == "ETCD_ENDPOINTS"), None)
        return cls(etcd, on_lost, exit_on_loss)

    def usable(self) -> bool:
        """Discovery answers and the runtime still holds its lease."""
        return self.reachable and not self.lost

    def start(self, runtime: DistributedRuntime, namespace: str) -> None:
        if self.etcd is None:
            return
        self._probe = asyncio.ensure_future(self._probe_forever(self.etcd))
        endpoint = dynamo_endpoint(runtime, f"{namespace}.{SENTINEL_ENDPOINT}")
        self._sentinel = asyncio.ensure_future(endpoint.serve_endpoint(_never_called))
        self._sentinel.add_done_callback(self._runtime_ended)

    async def settle(self, timeout: float) -> None:
        """Something else ended first (Dynamo's KServe frontend returns when the runtime shuts
        down): give the sentinel `timeout` seconds to tell whether the runtime went too."""
        if self._sentinel is not None and not self._stopping:
            await asyncio.wait({self._sentinel}, timeout=timeout)
            await asyncio.sleep(0)  # its done callback runs

    def stopping(self) -> None:
        """The bridge itself is about to shut the runtime down: that is not a lost lease."""
        self._stopping = True
        if self._probe is not None:
            self._probe.cancel()

    # -- the lease -----------------------------------------------------------------------------

    def _runtime_ended(self, serving: asyncio.Future[Any]) -> None:
        if self._stopping or self.lost:
            return
        self.lost = True
        failure = None if serving.cancelled() else serving.exception()
        assert self.etcd is not None
        if not self.reachable:
            down = asyncio.get_running_loop().time() - self._down_since
            cause = (
                f"its etcd lease expired: etcd at {self.etcd.value} ({self.etcd.variable}) has "
                f"not answered for {down:.0f} s"
            )
        else:
            cause = str(failure) if failure is not None else "its etcd lease was lost"
        log.error(
            "Dynamo shut this process's runtime down (%s); every model and endpoint it served "
            "is gone from discovery and cannot come back on that runtime: %s",
            cause,
            "exiting with status 1 to be restarted with a new lease (--exit-on-lease-loss)"
            if self.exit_on_loss
            else "not ready; the process starts again by itself once etcd answers",
        )
        self._on_lost()

    async def until_etcd_answers(self) -> None:
        """Return once etcd answers again (probed every PROBE_S, for as long as it takes)."""
        assert self.etcd is not None
        scheme = scheme_of(self.etcd.value)
        while True:
            checks = [etcd_answers(scheme, host, port) for host, port in self.etcd.addresses]
            if any(await asyncio.gather(*checks)):
                return
            await asyncio.sleep(PROBE_S)

    # -- etcd's reachability -------------------------------------------------------------------

    async def _probe_forever(self, etcd: Service) -> None:
        loop = asyncio.get_running_loop()
        failures, failing_since = 0, 0.0
        while True:
            started = loop.time()
            scheme = scheme_of(etcd.value)
            checks = [etcd_answers(scheme, host, port) for host, port in etcd.addresses]
            if any(await asyncio.gather(*checks)):
                failures = 0
            else:
                failing_since = started if failures == 0 else failing_since
                failures += 1
            reachable = failures < PROBE_FAILURES
            if reachable != self.reachable:
                self.reachable = reachable
                if not reachable:
                    self._down_since = failing_since
                    log.error(
                        "cannot reach etcd at %s (%s): not ready until it answers; Dynamo drops "
                        "this process's models from discovery if it stays away past the lease "
                        "(ETCD_LEASE_TTL)",
                        etcd.value,
                        etcd.variable,
                    )
                elif not self.lost:
                    log.warning(
                        "etcd at %s answers again after %.0f s: ready",
                        etcd.value,
                        loop.time() - self._down_since,
                    )
            await asyncio.sleep(PROBE_S)


def scheme_of(value: str) -> str:
    first = value.split(",")[0].strip()
    return urlsplit(first).scheme if "://" in first else "http"


async def etcd_answers(scheme: str, host: str, port: int) -> bool:
    """etcd at host:port answers: over plain HTTP its /health gives any HTTP answer; over TLS
    (no client certificate here) the TCP connection is all that is checked."""
    try:
        async with asyncio.timeout(PROBE_TIMEOUT_S):
            reader, writer = await asyncio.open_connection(host, port)
            try:
                if scheme == "https":
                    return True
                request = (
                    f"GET /health HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n"
                )
                writer.write(request.encode())
                await writer.drain()
                return (await reader.readline()).startswith(b"HTTP/")
            finally:
                writer.close()
    except (OSError, TimeoutError):
        return False


async def _never_called(request: Any, context: Any = None) -> AsyncIterator[dict[str, Any]]:
    """The sentinel's handler: nothing routes to it (no model card names it)."""
    yield {}
