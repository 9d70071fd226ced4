"""The loader's seam to models other processes serve (composition/remote.py), without Dynamo.

`OtherRepository` implements `RemoteModels` over a second loaded repository, in this process: a
stand-in for "another process" that exercises exactly what the loader asks of the seam (the
bridge's Dynamo implementation is covered end to end by tests/e2e/test_bls_remote.py). Loading
happens with the seam set on the repository's scope, the order a composition root that makes its
runtime first uses. The two repositories share this process and each reaches its own models.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from model_repository_loader import pb_utils
from model_repository_loader.composition import RemoteModels, RemoteTarget
from model_repository_loader.inference import InferRequest
from model_repository_loader.loader import LoadedRepository, load_repository
from tests.harness.repositories import materialize, materialize_model

REPOSITORIES = Path(__file__).resolve().parents[1] / "repositories"
F = np.array([1.0, 2.0, 3.0, 4.0], dtype=np.float32)


class OtherRepository:
    """RemoteModels over the models of another LoadedRepository."""

    def __init__(self, models: dict[str, Any]) -> None:
        self.models = models
        self.submitted: list[str] = []

    def find(self, name: str) -> RemoteTarget | None:
        model = self.models.get(name)
        if model is None:
            return None
        return RemoteTarget(name, frozenset(model.versions), model.config)

    def submit(self, name: str, request: InferRequest, respond: Any) -> Any:
        self.submitted.append(name)
        submitting = [True]

        def adapter(response: pb_utils.InferenceResponse | None, final: bool) -> None:
            respond(response, final, submitting[0])

        handle = self.models[name].submit(request, adapter)
        submitting[0] = False
        return handle


def load_with_remote(folder: Path, remote: RemoteModels | None) -> LoadedRepository:
    loaded = LoadedRepository()
    loaded.scope.remote = remote
    return load_repository([folder], into=loaded)


@pytest.fixture(scope="module")
def other(tmp_path_factory) -> Iterator[OtherRepository]:
    loaded = load_repository([materialize("cluster_b", tmp_path_factory.mktemp("other"))])
    yield OtherRepository(loaded.models)
    loaded.close()


@pytest.fixture(scope="module")
def here(other, tmp_path_factory) -> Iterator[LoadedRepository]:
    folder = tmp_path_factory.mktemp("here")
    for name in ("scale", "remote_pipeline", "remote_raising"):
        materialize_model("cluster_a", name, folder)
    loaded = load_with_remote(folder, other)
    yield loaded
    loaded.close()


def test_an_ensemble_loads_with_a_step_another_process_serves(here, other):
    assert here.statuses["remote_pipeline"].ready, here.statuses["remote_pipeline"].reason
    response = here.models["remote_pipeline"].infer(
        InferRequest([pb_utils.Tensor("RAW", F)]), timeout=20
    )
    assert not response.has_error(), response.error()
    assert response.output_tensors()[0].as_numpy().tolist() == [3.0, 5.0, 7.0, 9.0]
    assert "add_sub" in other.submitted and "scale" not in other.submitted  # local stays local


def test_a_remote_step_error_ends_the_ensemble_with_its_text(here):
    response = here.models["remote_raising"].infer(
        InferRequest([pb_utils.Tensor("X", F)]), timeout=20
    )
    assert response.has_error()
    assert (
        response.error()
        .message()
        .startswith(
            "in ensemble 'remote_raising', Failed to process the request(s) for model 'raiser_0_0'"
        )
    )


def test_without_the_seam_a_missing_step_fails_the_load(tmp_path):
    for name in ("scale", "remote_pipeline"):
        materialize_model("cluster_a", name, tmp_path)
    loaded = load_with_remote(tmp_path, None)
    try:
        assert loaded.statuses["remote_pipeline"].reason == (
            "ensemble remote_pipeline contains models that are not available or ambiguous: add_sub"
        )
    finally:
        loaded.close()


def test_a_step_version_the_other_process_lacks_fails_the_load(other, tmp_path):
    folder = tmp_path / "pinned"
    shutil.copytree(REPOSITORIES / "cluster_a" / "remote_pipeline", folder)
    config = folder / "config.pbtxt"
    config.write_text(
        config.read_text().replace(
            '"add_sub"\n      model_version: -1', '"add_sub"\n      model_version: 3'
        )
    )
    materialize_model("cluster_a", "scale", tmp_path)
    loaded = load_with_remote(tmp_path, other)
    try:
        assert loaded.statuses["pinned"].reason == (
            "ensemble 'pinned' depends on 'add_sub' whose required version 3 is not loaded."
        )
    finally:
        loaded.close()
