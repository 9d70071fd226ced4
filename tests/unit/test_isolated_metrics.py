"""Custom metrics of process-isolated instances live in the server process's registry.

Repository: tests/repositories/isolated_metrics (model `metered`: two instance processes sharing
the family `metered_calls`). Loaded in-process through load_repository, with real child
processes; what /metrics would show is the repository's registry, `metrics`, in this
process (and nothing lands in the registry of models outside any repository).
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from model_repository_loader import pb_utils
from model_repository_loader.inference import InferRequest
from model_repository_loader.isolation import IsolatedInstance
from model_repository_loader.loader import LoadedRepository, load_repository
from tests.e2e.support import wait_until

REPOSITORY = Path(__file__).resolve().parents[1] / "repositories" / "isolated_metrics"
WAIT_S = 60.0


@pytest.fixture
def repo(caplog: pytest.LogCaptureFixture) -> Iterator[LoadedRepository]:
    caplog.set_level(logging.INFO)  # instance processes take the level in force when they start
    pb_utils.metrics.REGISTRY.clear()
    loaded = load_repository([REPOSITORY])
    assert all(isinstance(i, IsolatedInstance) for i in loaded.models["metered"].latest.instances)
    yield loaded
    loaded.close()


def _ask(repo: LoadedRepository, op: str, **parameters: str) -> dict:
    op_tensor = pb_utils.Tensor("OP", np.array([op.encode()], dtype=np.object_))
    response = repo.models["metered"].infer(
        InferRequest(inputs=[op_tensor], parameters=dict(parameters)), timeout=WAIT_S
    )
    assert not response.has_error(), response.error()
    return json.loads(response.output_tensors()[0].as_numpy()[0])


def _series(repo: LoadedRepository, name: str, labels: str) -> float | None:
    text = repo.metrics.render_prometheus()
    match = re.search(rf"^{name}{re.escape(labels)} (\S+)$", text, re.M)
    return float(match.group(1)) if match else None


def test_two_processes_share_one_series(repo: LoadedRepository, tmp_path: Path):
    # Both requests hold their instance until the gate opens: each instance counts once, and
    # each then reads the shared value the server process holds.
    gate = tmp_path / "gate"
    started = [tmp_path / "started-0", tmp_path / "started-1"]
    answers: list[dict] = []

    def count(marker: Path) -> None:
        answers.append(_ask(repo, "count", started=str(marker), gate=str(gate)))

    threads = [threading.Thread(target=count, args=(marker,)) for marker in started]
    for thread in threads:
        thread.start()
    wait_until(lambda: all(m.exists() for m in started), "both instances to count", WAIT_S)
    assert _series(repo, "metered_calls", '{by="model"}') == 2
    gate.write_text("open")
    for thread in threads:
        thread.join(WAIT_S)
    assert len(answers) == 2
    assert {a["instance"] for a in answers} == {"metered_0_0", "metered_0_1"}
    assert len({a["pid"] for a in answers} | {os.getpid()}) == 3  # two processes, not ours
    # value() is the server's current value, read synchronously (also during initialize).
    assert [a["value"] for a in answers] == [2.0, 2.0]
    assert [a["at_initialize"] for a in answers] == [0.0, 0.0]
    assert answers[0]["argv"] == [""]  # what Triton's stub shows a model


def test_errors_are_the_registry_texts(repo: LoadedRepository):
    answer = _ask(repo, "errors")
    prefix = r"Failed to process the request for model 'metered_0_[01]', message: "
    assert re.fullmatch(
        "Failed to increment metric value: " + prefix + "TRITONSERVER_METRIC_KIND_COUNTER can "
        "only be incremented monotonically by non-negative values.",
        answer["negative"],
    )
    assert re.fullmatch(
        "Error when creating MetricFamily: "
        + prefix
        + "Family name already exists with different type",
        answer["other_kind"],
    )
    # The server's registry refused it: the family there is untouched.
    assert "# TYPE metered_calls counter" in repo.metrics.render_prometheus()
    assert pb_utils.metrics.render_prometheus() == ""  # the repository's, not the process's


def test_deleting_the_family_object_first_makes_the_metric_unusable(repo: LoadedRepository):
    answer = _ask(repo, "drop")
    assert answer["after_drop"].startswith(
        "Failed to increment metric value: Invalid metric operation as the corresponding "
        "'MetricFamily' has been deleted."
    )


def test_families_go_when_the_model_unloads(
    repo: LoadedRepository, caplog: pytest.LogCaptureFixture
):
    assert _series(repo, "metered_calls", '{by="model"}') == 0
    repo.close()
    assert "metered_calls" not in repo.metrics.render_prometheus()
    # finalize could still use its metrics (the parent answered while the process finalized).
    for instance in ("metered_0_0", "metered_0_1"):
        assert f"{instance} finalize read 0.0" in caplog.text


def test_families_of_a_dead_process_go_with_it(repo: LoadedRepository, tmp_path: Path):
    gate = tmp_path / "gate"
    gate.write_text("open")
    _ask(repo, "count", started=str(tmp_path / "started"), gate=str(gate))
    assert _series(repo, "metered_calls", '{by="model"}') == 1
    # Both processes die: what they held goes with them; the restarted ones start from zero.
    instances = repo.models["metered"].latest.instances
    for instance in instances:
        instance.kill()
    wait_until(lambda: all(i.restarts == 1 for i in instances), "the restarts", WAIT_S)
    assert _series(repo, "metered_calls", '{by="model"}') == 0
