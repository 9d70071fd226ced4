"""Shared pytest plumbing: the `oracle` marker and server factories (see tests/harness/).

Fixtures
--------
oracle_server(repo, *extra_args, wait_for="ready") -> TritonOracle
    Session-scoped factory: the real tritonserver on `repo`, started once per distinct
    (repo, extra_args, wait_for) and stopped at the end of the session.
bridge_server(repo, *extra_args, env=None, startup_timeout=60.0) -> BridgeServer
    Function-scoped factory: a fresh `python -m bridge` process, stopped after the test
    (its `returncode` and `log_text` stay readable).
shared_bridge_server(repo, *extra_args, env=None) -> BridgeServer
    Session-scoped, cached like oracle_server, for read-only tests that can share a process.
repository(name) -> Path
    Session-scoped: tests/repositories/<name> written whole once (tests/harness/repositories.py:
    models that share another's model.py get it), the one read-only copy that Triton and the
    bridge are both given.
e2e_load_failures, e2e_multi_a, e2e_multi_b, e2e_no_config -> Path
    `repository(...)` of the repository of that name (their working models share
    e2e_load_failures/healthy's model.py).

Tests marked `oracle` fail in CI (env CI=true) and are skipped elsewhere when the oracle
environment (DYNAMO_BRIDGE_ORACLE_PYTHON, default /work/oracle/bin/python) is missing.

scripts/test.sh runs two pytest-xdist workers (`-n 2 --dist loadfile`): each worker is a session
of its own (its own session-scoped servers above), a file's tests stay on one worker in order,
and a test of another file may run at the same time. So a test claims nothing machine-wide:
ports from tests/harness/ports.py (the kernel's), its own tmp_path, DYN_FILE_KV, etcd and
namespace (tests/harness/cluster.py), only its own processes' /dev/shm regions and fds; Triton's
qa clients that need the fixed ports 8000-8002 run in a network namespace of their own
(tests/upstream/netns_driver.py).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # the packages under test, when not installed

from tests.harness.bridge_server import BridgeServer  # noqa: E402
from tests.harness.oracle import TritonOracle, require_oracle  # noqa: E402
from tests.harness.process import ServerProcess  # noqa: E402
from tests.harness.repositories import materialize  # noqa: E402

Server = TypeVar("Server", bound=ServerProcess)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "oracle: needs the real Triton server from nvidia-pytriton (tests/harness)"
    )


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("oracle") is not None:
        require_oracle()


@contextlib.contextmanager
def _session_servers() -> Iterator[Callable[[tuple, Callable[[], Server]], Server]]:
    """Servers shared by the session, one per key: get(key, create) returns the running one or
    starts create() (again, if the last one died); all are stopped on exit."""
    servers: dict[tuple, Server] = {}

    def get(key: tuple, create: Callable[[], Server]) -> Server:
        server = servers.get(key)
        if server is not None and server.running:
            return server
        if server is not None:
            server.stop()  # reap what the dead server left in its process group
        server = servers[key] = create().start()
        return server

    try:
        yield get
    finally:
        # Side by side: each stop is a graceful shutdown of its own (seconds), all independent.
        if servers:
            with ThreadPoolExecutor(max_workers=len(servers)) as pool:
                list(pool.map(lambda server: server.stop(), servers.values()))


@pytest.fixture(scope="session")
def oracle_server(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[..., TritonOracle]]:
    with _session_servers() as get:

        def start(repo: str | Path, *extra_args: str, wait_for: str = "ready") -> TritonOracle:
            require_oracle()
            return get(
                (str(Path(repo).resolve()), extra_args, wait_for),
                lambda: TritonOracle(
                    repo,
                    *extra_args,
                    wait_for=wait_for,
                    log_path=tmp_path_factory.mktemp("oracle") / "tritonserver.log",
                ),
            )

        yield start


@pytest.fixture
def bridge_server(tmp_path: Path) -> Iterator[Callable[..., BridgeServer]]:
    started: list[BridgeServer] = []

    def start(
        repo: str | Path,
        *extra_args: str,
        env: Mapping[str, str] | None = None,
        startup_timeout: float = 60.0,
    ) -> BridgeServer:
        log_path = tmp_path / f"bridge-{len(started)}.log"
        server = BridgeServer(
            repo, *extra_args, env=env, startup_timeout=startup_timeout, log_path=log_path
        )
        started.append(server)
        return server.start()

    yield start
    for server in started:
        server.stop()


@pytest.fixture(scope="session")
def shared_bridge_server(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[..., BridgeServer]]:
    with _session_servers() as get:

        def start(
            repo: str | Path, *extra_args: str, env: Mapping[str, str] | None = None
        ) -> BridgeServer:
            return get(
                (str(Path(repo).resolve()), extra_args, tuple(sorted((env or {}).items()))),
                lambda: BridgeServer(
                    repo,
                    *extra_args,
                    env=env,
                    log_path=tmp_path_factory.mktemp("bridge") / "bridge.log",
                ),
            )

        yield start


@pytest.fixture(scope="session")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    written: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in written:
            written[name] = materialize(name, tmp_path_factory.mktemp("repositories"))
        return written[name]

    return get


@pytest.fixture(scope="session")
def e2e_load_failures(repository: Callable[[str], Path]) -> Path:
    return repository("e2e_load_failures")


@pytest.fixture(scope="session")
def e2e_multi_a(repository: Callable[[str], Path]) -> Path:
    return repository("e2e_multi_a")


@pytest.fixture(scope="session")
def e2e_multi_b(repository: Callable[[str], Path]) -> Path:
    return repository("e2e_multi_b")


@pytest.fixture(scope="session")
def e2e_no_config(repository: Callable[[str], Path]) -> Path:
    return repository("e2e_no_config")
