"""dynamo-bridge split into roles for the scale-out tests: workers, frontends, their shared
environment, and a bounded load generator that records every request's outcome.

* `Cluster`: what every process of one test shares: the discovery backend (`file` with a
  DYN_FILE_KV dir of the test's own, or `etcd`), the request plane (`tcp` or `nats`), the
  etcd / NATS addresses and a Dynamo namespace unique to the test, so tests sharing one etcd
  never see each other's models.
* `Cluster.worker()` and `Cluster.frontend()`: the role launcher's processes (roles.py) with the
  cluster's flags and environment; a worker is ready when Dynamo's system status server
  (DYN_SYSTEM_PORT) answers /health with 200, which the bridge does only once every model of its
  start-up set is ready; a frontend when ServerLive answers (tests wait for their models with
  `wait_model_ready`). `kill()` is SIGKILL, `stop()` SIGTERM.
* `LoadGenerator`: threads, each with its own tritonclient gRPC client, sending requests back to
  back, bounded in count and time; each outcome (ok, or the status code and message) is kept
  with its send and answer times.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from .ports import LOCALHOST, free_port
from .roles import Frontend, RoleProcess, Worker


@dataclass
class Cluster:
    """The discovery backend, request plane and namespace shared by one test's processes."""

    workdir: Path
    discovery: str = "file"  # file | etcd
    request_plane: str = "tcp"  # tcp | nats
    etcd_endpoint: str | None = None
    nats_url: str | None = None
    namespace: str = field(default_factory=lambda: f"t{uuid.uuid4().hex[:12]}")
    extra_env: dict[str, str] = field(default_factory=dict)
    # Every process made through worker() / frontend(); stop() stops them all.
    processes: list[RoleProcess] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        if self.discovery == "etcd" and not self.etcd_endpoint:
            raise ValueError("etcd discovery needs etcd_endpoint")
        if self.request_plane == "nats" and not self.nats_url:
            raise ValueError("the nats request plane needs nats_url")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.file_kv = self.workdir / "dyn_file_kv"

    def flags(self) -> list[str]:
        return [
            "--discovery-backend", self.discovery,
            "--request-plane", self.request_plane,
            "--namespace", self.namespace,
        ]  # fmt: skip

    def environ(self) -> dict[str, str]:
        """The variables set in each process (on top of the test's own environment)."""
        env = {
            "DYN_FILE_KV": str(self.file_kv),
            "DYN_NAMESPACE": self.namespace,
            # Loopback only: Dynamo's default picks the host's primary interface.
            "DYN_TCP_RPC_HOST": LOCALHOST,
            "DYN_TCP_RESPONSE_STREAM_HOST": LOCALHOST,
        }
        if self.etcd_endpoint:
            env["ETCD_ENDPOINTS"] = self.etcd_endpoint
        # Set only when used: a NATS_SERVER Dynamo cannot reach stalls every process.
        if self.request_plane == "nats" and self.nats_url:
            env["NATS_SERVER"] = self.nats_url
        env.update(self.extra_env)
        return env

    def worker(
        self,
        model_repository: str | os.PathLike[str],
        *extra_args: str,
        name: str = "worker",
        env: dict[str, str] | None = None,
        **kwargs: Any,
    ) -> Worker:
        """A worker of this cluster (not started), ready once Dynamo's /health on its system
        port says 200; stopped by stop(). kwargs as Worker."""
        process = Worker(
            model_repository, *extra_args, ready_on="system", **self._settings(name, env, kwargs)
        )
        self.processes.append(process)
        return process

    def frontend(
        self, *extra_args: str, name: str = "frontend", env: dict[str, str] | None = None,
        **kwargs: Any,
    ) -> Frontend:  # fmt: skip
        """A frontend of this cluster (not started), stopped by stop(); kwargs as Frontend."""
        process = Frontend(*extra_args, **self._settings(name, env, kwargs))
        self.processes.append(process)
        return process

    def _settings(
        self, name: str, env: dict[str, str] | None, kwargs: dict[str, Any]
    ) -> dict[str, Any]:
        """What each process of the cluster is given: its flags, its environment (the test's
        `env` on top), a log in the cluster's folder, and time to finish what it serves."""
        return {
            "name": name,
            "role_flags": self.flags(),
            "env": {**self.environ(), **(env or {})},
            "log_path": self.workdir / f"{name}.log",
            "stop_timeout": 30.0,
            **kwargs,
        }

    def stop(self, timeout: float = 10.0) -> None:
        """Stop every process of the cluster still running (SIGTERM, then SIGKILL)."""
        for process in self.processes:
            process.stop(timeout=timeout)


def start_all(processes: Iterable[RoleProcess]) -> None:
    """Start processes in parallel (each start waits for its own readiness); raise the first
    error after every start returned."""
    errors: list[BaseException] = []

    def run(process: RoleProcess) -> None:
        try:
            process.start()
        except BaseException as exc:  # re-raised below, in the caller's thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(p,), daemon=True) for p in processes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


# -- load ------------------------------------------------------------------------------------


@dataclass
class Outcome:
    """One request: when it was sent and answered (time.monotonic()), and how it ended."""

    sent: float
    answered: float
    ok: bool
    status: str = ""  # e.g. StatusCode.UNAVAILABLE, when not ok
    message: str = ""
    value: Any = None  # what `keep` returned for an ok answer


class LoadGenerator:
    """`threads` clients sending `model` requests back to back until stop(), `max_requests`
    requests in all, or `max_seconds`, whichever comes first.

    `inputs()` builds one request's inputs (called once per thread); `keep(result)` picks what
    to remember of an ok answer (e.g. the answering worker's pid).
    """

    def __init__(
        self,
        url: str,
        model: str,
        inputs: Callable[[], list[grpcclient.InferInput]],
        threads: int = 4,
        max_requests: int = 20000,
        max_seconds: float = 60.0,
        pause_after_failure: float = 0.0,
        keep: Callable[[grpcclient.InferResult], Any] | None = None,
        client_timeout: float = 30.0,
        **infer_kwargs: Any,
    ) -> None:
        self.url, self.model = url, model
        self._inputs, self._keep = inputs, keep
        self.max_requests, self.max_seconds = max_requests, max_seconds
        # A failed request waits this long before the next (a server down fails at once: the
        # budget would go in a burst of refusals).
        self._pause_after_failure = pause_after_failure
        self._client_timeout = client_timeout
        self._infer_kwargs = infer_kwargs
        self.outcomes: list[Outcome] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._budget = max_requests
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]

    def __enter__(self) -> LoadGenerator:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> LoadGenerator:
        self._deadline = time.monotonic() + self.max_seconds
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> list[Outcome]:
        self._stop.set()
        for thread in self._threads:
            thread.join(self._client_timeout + 10)
        return self.snapshot()

    @property
    def running(self) -> bool:
        return any(thread.is_alive() for thread in self._threads)

    def _take_one(self) -> bool:
        with self._lock:
            if self._budget <= 0:
                return False
            self._budget -= 1
            return True

    def _run(self) -> None:
        client = grpcclient.InferenceServerClient(self.url)
        inputs = self._inputs()
        try:
            while not self._stop.is_set() and time.monotonic() < self._deadline:
                if not self._take_one():
                    return
                sent = time.monotonic()
                try:
                    result = client.infer(
                        self.model, inputs, client_timeout=self._client_timeout,
                        **self._infer_kwargs,
                    )  # fmt: skip
                    value = self._keep(result) if self._keep is not None else None
                    outcome = Outcome(sent, time.monotonic(), True, value=value)
                except InferenceServerException as exc:
                    outcome = Outcome(
                        sent, time.monotonic(), False, str(exc.status()), exc.message() or ""
                    )
                except Exception as exc:  # anything else is a failure too; keep counting
                    outcome = Outcome(sent, time.monotonic(), False, type(exc).__name__, str(exc))
                with self._lock:
                    self.outcomes.append(outcome)
                if not outcome.ok and self._pause_after_failure:
                    self._stop.wait(self._pause_after_failure)
        finally:
            client.close()

    # -- reading the record ----------------------------------------------------------------

    def snapshot(self) -> list[Outcome]:
        with self._lock:
            return list(self.outcomes)

    def failures(self) -> list[Outcome]:
        return [o for o in self.snapshot() if not o.ok]

    def ok_values(self) -> list[Any]:
        return [o.value for o in self.snapshot() if o.ok]

    def wait_for(
        self, predicate: Callable[[list[Outcome]], Any], what: str, timeout: float = 60.0
    ) -> Any:
        """Poll `predicate(outcomes so far)` until truthy; fail after `timeout` or when the
        load ended without it."""
        deadline = time.monotonic() + timeout
        while True:
            alive = self.running  # read first: the last outcomes land before threads end
            value = predicate(self.snapshot())
            if value:
                return value
            if not alive:
                raise AssertionError(f"the load ended before {what}")
            if time.monotonic() >= deadline:
                raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
            time.sleep(0.02)


def describe(outcomes: Iterable[Outcome], limit: int = 5) -> str:
    """A short account of failures for assertion messages: count per status, first messages."""
    failed = [o for o in outcomes if not o.ok]
    counts: dict[str, int] = {}
    for outcome in failed:
        counts[outcome.status] = counts.get(outcome.status, 0) + 1
    first = "; ".join(f"{o.status}: {o.message[:200]}" for o in failed[:limit])
    return f"{len(failed)} failed {counts} first: {first}"


__all__ = [
    "Cluster",
    "LoadGenerator",
    "Outcome",
    "describe",
    "free_port",
    "start_all",
]
