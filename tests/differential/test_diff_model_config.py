"""ModelConfig, ModelMetadata and ModelReady of every model of every repository, vs Triton.

ModelConfig must be identical (the bridge registers the final config; the frontend serves it
as is). ModelMetadata differs only by `metadata_platform` and `metadata_versions`. A model that
failed to load is NOT_FOUND on both, in the frontend's own words (`unknown_model_text`).
"""

from __future__ import annotations

import pytest

from tests.differential.support import (
    EXAMPLES,
    REPOSITORIES,
    Failure,
    both,
    expected_bridge_metadata,
    expected_bridge_unknown_model,
    is_triton_unknown_model,
    model_names,
)

pytestmark = pytest.mark.oracle

# fixture name → repository root
REPOSITORY_FIXTURES = {
    "examples": EXAMPLES,
    "dtypes": REPOSITORIES / "dtypes",
    "errors": REPOSITORIES / "errors",
    "introspect": REPOSITORIES / "introspect",
    "load_failures": REPOSITORIES / "load_failures",
}

MODELS = [
    pytest.param(fixture, model, id=f"{fixture}/{model}")
    for fixture, root in REPOSITORY_FIXTURES.items()
    for model in model_names(root)
]


@pytest.fixture
def pair(request, fixture: str):
    return request.getfixturevalue(fixture)


@pytest.mark.parametrize(("fixture", "model"), MODELS)
def test_model_config_matches(pair, model: str):
    triton, bridge = both(pair, lambda c: c.get_model_config(model, as_json=True))
    if isinstance(triton, Failure):  # failed to load on Triton
        assert is_triton_unknown_model(triton, model), triton
        assert bridge == expected_bridge_unknown_model(model, triton)
    else:
        assert bridge == triton


@pytest.mark.parametrize(("fixture", "model"), MODELS)
def test_model_metadata_matches(pair, model: str):
    triton, bridge = both(pair, lambda c: c.get_model_metadata(model, as_json=True))
    if isinstance(triton, Failure):
        assert is_triton_unknown_model(triton, model), triton
        assert bridge == expected_bridge_unknown_model(model, triton)
    else:
        assert triton["platform"] == "python"
        assert bridge == expected_bridge_metadata(triton)


@pytest.mark.parametrize(("fixture", "model"), MODELS)
def test_model_ready_matches(pair, model: str):
    triton, bridge = both(pair, lambda c: c.is_model_ready(model))
    assert bridge == triton
