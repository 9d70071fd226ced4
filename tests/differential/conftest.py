"""One oracle and one bridge per repository for the whole session (see tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.differential.http_support import DOOR_ARGS, HttpPair
from tests.differential.support import EXAMPLES, REPOSITORIES, Pair


@pytest.fixture(scope="session")
def pair_for(oracle_server, shared_bridge_server) -> Callable[..., Pair]:
    """`pair_for(root, expect_failures=False)`: Triton and the bridge on `root`, started once.

    A repository with models that must fail to load runs the oracle with
    `--exit-on-error=false` and waits only for ServerLive (ServerReady stays false there).
    """

    def start(root: Path, *, expect_failures: bool = False) -> Pair:
        if expect_failures:
            oracle = oracle_server(root, "--exit-on-error=false", wait_for="live")
        else:
            oracle = oracle_server(root)
        return Pair(oracle, shared_bridge_server(root), root)

    return start


@pytest.fixture(scope="session")
def dtypes(pair_for, repository) -> Pair:
    return pair_for(repository("dtypes"))  # its identity models share one model.py


@pytest.fixture(scope="session")
def errors(pair_for) -> Pair:
    return pair_for(REPOSITORIES / "errors")


@pytest.fixture(scope="session")
def introspect(pair_for, repository) -> Pair:
    return pair_for(repository("introspect"))  # some of its models share a model.py


@pytest.fixture(scope="session")
def examples(pair_for) -> Pair:
    return pair_for(EXAMPLES)


@pytest.fixture(scope="session")
def load_failures(pair_for, repository) -> Pair:
    # some of its models share `healthy`'s model.py
    return pair_for(repository("load_failures"), expect_failures=True)


@pytest.fixture(scope="session")
def http_pair_for(oracle_server, shared_bridge_server) -> Callable[..., HttpPair]:
    """`http_pair_for(root)`: Triton and the bridge's triton door on `root`, over HTTP."""

    def start(root: Path, *extra_args: str) -> HttpPair:
        oracle = oracle_server(root, *extra_args)
        return HttpPair(oracle, shared_bridge_server(root, *DOOR_ARGS, *extra_args), root)

    return start


@pytest.fixture(scope="session")
def http_dtypes(http_pair_for, repository) -> HttpPair:
    return http_pair_for(repository("dtypes"))


@pytest.fixture(scope="session")
def http_introspect(http_pair_for, repository) -> HttpPair:
    return http_pair_for(repository("introspect"))


@pytest.fixture(scope="session")
def http_errors(http_pair_for) -> HttpPair:
    return http_pair_for(REPOSITORIES / "errors")
