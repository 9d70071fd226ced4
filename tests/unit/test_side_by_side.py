"""Two loaded repositories in one process each keep what their models reach through pb_utils:
BLS calls go to the caller's own repository, custom metrics land in its own registry, and
closing one leaves the other working.

Repository: tests/repositories/side_by_side (`caller` answers what `target` answers by BLS;
`target` answers its config parameter ANSWER), copied twice with different answers.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from model_repository_loader import pb_utils
from model_repository_loader.inference import InferRequest
from model_repository_loader.loader import LoadedRepository, load_repository

TEMPLATE = Path(__file__).resolve().parents[1] / "repositories" / "side_by_side"


def _copy_with_answer(folder: Path, answer: str) -> Path:
    for name in ("caller", "target"):
        shutil.copytree(TEMPLATE / name, folder / name)
    config = folder / "target" / "config.pbtxt"
    config.write_text(config.read_text().replace('string_value: "1"', f'string_value: "{answer}"'))
    return folder


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[LoadedRepository, LoadedRepository]]:
    left = load_repository([_copy_with_answer(tmp_path / "left", "10")])
    right = load_repository([_copy_with_answer(tmp_path / "right", "20")])
    yield left, right
    right.close()
    left.close()


def _call(repo: LoadedRepository) -> float:
    request = InferRequest([pb_utils.Tensor("IN", np.array([0.0], dtype=np.float32))])
    response = repo.models["caller"].infer(request, timeout=30)
    assert not response.has_error(), response.error()
    return float(response.output_tensors()[0].as_numpy()[0])


def test_bls_reaches_the_callers_own_repository(pair):
    left, right = pair
    assert left.failures == {} and right.failures == {}
    assert _call(left) == 10.0
    assert _call(right) == 20.0
    assert _call(left) == 10.0  # loading `right` later took nothing from `left`


def test_custom_metrics_land_in_each_repositorys_registry(pair):
    left, right = pair
    _call(left)
    _call(left)
    _call(right)
    assert "side_calls 2" in left.metrics.render_prometheus()
    assert "side_calls 1" in right.metrics.render_prometheus()
    assert "side_calls" not in pb_utils.metrics.render_prometheus()


def test_closing_one_leaves_the_other_serving(pair):
    left, right = pair
    left.close()
    assert _call(right) == 20.0
