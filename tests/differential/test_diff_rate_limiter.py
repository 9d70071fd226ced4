"""The rate limiter against real Triton: what a client can observe of `--rate-limit`.

- tests/repositories/rate_limiter_overask: an instance asks for 4 of "R" where
  `--rate-limit-resource=R:2` gives 2; both servers refuse the model with the same reason.
- tests/repositories/rate_limiter: `shared_a` and `shared_b` share one "R" (count 1 by Triton's
  default rule). Each `execute` records enter/exit in one file-locked log and waits, bounded, for
  the other to be inside. With `--rate-limit execution_count` neither ever sees the other
  (enter/exit never interleave); with `--rate-limit off` (the default) they run at once. The same
  concurrent calls go to both servers and the same pattern must come back.

The bridge runs its own door (`--frontend triton`) so that the repository index gives the reason.
The order of grants by priority is not observable from outside Triton (nothing says that an
instance waits); tests/unit/test_rate_limiter.py checks it on the bridge with real models.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.differential.support import REPOSITORIES
from tests.harness import BridgeServer, TritonOracle
from tests.harness.oracle import require_oracle
from tests.harness.repositories import materialize

pytestmark = pytest.mark.oracle

OVERASK = REPOSITORIES / "rate_limiter_overask"
SHARED = "rate_limiter"  # its models share model.py files: written whole (materialize)
ROUNDS = 2  # concurrent pairs per server: bounded, and each with limiter costs one patience
PATIENCE_S = "3"  # how long an execute looks for the other model; a bound, not an assertion


Server = TritonOracle | BridgeServer


def servers(
    root: Path, log: Path, *flags: str, failures: bool = False
) -> list[tuple[str, Callable[[], Server]]]:
    """Triton and the bridge on `root` with `flags`, not started; `failures`: a model is
    expected to fail to load (Triton then never turns ready)."""
    env = {"RATE_LIMITER_LOG": str(log), "RATE_LIMITER_PATIENCE_S": PATIENCE_S}
    wait_for = "live" if failures else "ready"
    return [
        (
            "triton",
            lambda: TritonOracle(
                root, *flags, env=env, log_path=log.with_suffix(".t"), wait_for=wait_for
            ),
        ),
        (
            "bridge",
            lambda: BridgeServer(
                root, "--frontend", "triton", *flags, env=env, log_path=log.with_suffix(".b")
            ),
        ),
    ]


def int32(value: int) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput("INPUT0", [1], "INT32")
    tensor.set_data_from_numpy(np.array([value], dtype=np.int32))
    return tensor


def concurrent_pairs(server: Server) -> None:
    """ROUNDS times: shared_a and shared_b called at once, both answered."""
    errors: list[BaseException] = []
    for _ in range(ROUNDS):

        def call(model: str) -> None:
            try:
                server.client().infer(model, [int32(1)], client_timeout=60)
            except BaseException as exc:  # reported below, on the test's thread
                errors.append(exc)

        threads = [threading.Thread(target=call, args=(m,)) for m in ("shared_a", "shared_b")]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(90)
        assert not errors, errors


def pattern(log: Path) -> tuple[bool, bool]:
    """(enter/exit ever interleaved, some execute saw the other model inside)."""
    lines = [line for line in log.read_text().splitlines() if line]
    inside = 0
    interleaved = False
    for line in lines:
        inside += 1 if line.startswith("enter ") else -1
        interleaved = interleaved or inside > 1
    return interleaved, any(line.endswith(" met") for line in lines)


@pytest.fixture(autouse=True)
def _oracle() -> None:
    require_oracle()


def test_resource_count_below_need_is_the_same_load_error(tmp_path: Path):
    flags = ("--rate-limit=execution_count", "--rate-limit-resource=R:2", "--exit-on-error=false")
    reasons = {}
    for name, make in servers(OVERASK, tmp_path / "log", *flags, failures=True):
        with make() as server:
            index = server.client().get_model_repository_index(as_json=True)["models"]
            reasons[name] = {entry["name"]: entry.get("reason") for entry in index}
    assert reasons["triton"] == {
        "greedy": 'Invalid argument: Resource count for "R" is limited to 2 which will prevent '
        "scheduling of one or more model instances, the minimum required count is 4"
    }
    assert reasons["bridge"] == reasons["triton"]


@pytest.mark.parametrize(
    "mode, expected",
    [
        # (interleaved, met): never inside together / both in flight at once
        ("execution_count", (False, False)),
        ("off", (True, True)),
    ],
)
def test_models_sharing_a_resource_overlap_only_without_the_limiter(
    tmp_path: Path, mode: str, expected: tuple[bool, bool]
):
    seen = {}
    root = materialize(SHARED, tmp_path)  # one copy: Triton and the bridge load the same files
    for name, make in servers(root, tmp_path / f"{mode}.log", f"--rate-limit={mode}"):
        log = tmp_path / f"{mode}.log"
        log.write_text("")
        with make() as server:
            concurrent_pairs(server)
        seen[name] = pattern(log)
    assert seen == {"triton": expected, "bridge": expected}
