"""Several --model-repository paths, a model name found twice, and the auto-complete flags."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2 as mc

from tests.e2e.support import int32_input, status_rows


def assert_echoes(client, model: str) -> None:
    result = client.infer(model, [int32_input([5])])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.array([5], np.int32))


def test_models_of_every_repository_are_served(
    bridge_server, e2e_multi_a: Path, e2e_no_config: Path
) -> None:
    server = bridge_server(e2e_multi_a, "--model-repository", str(e2e_no_config))
    client = server.client()
    for model in ("alpha", "common", "configured", "unconfigured"):
        assert client.is_model_ready(model), model
        assert_echoes(client, model)
    assert set(status_rows(server.log_text)) == {"alpha", "common", "configured", "unconfigured"}


def test_model_store_alias(bridge_server, e2e_multi_a: Path, e2e_multi_b: Path) -> None:
    server = bridge_server(e2e_multi_a, "--model-store", str(e2e_multi_b))
    assert server.client().is_model_ready("beta")


def test_duplicate_name_fails_only_that_model(
    bridge_server, e2e_multi_a: Path, e2e_multi_b: Path
) -> None:
    server = bridge_server(e2e_multi_a, "--model-repository", str(e2e_multi_b))
    client = server.client()
    for model in ("alpha", "beta"):
        assert client.is_model_ready(model), model
        assert_echoes(client, model)
    assert not client.is_model_ready("common")
    # Triton: the name is refused in every repository, with this reason.
    assert (
        "failed to poll model 'common': not unique across all model repositories" in server.log_text
    )
    assert not any(s == "READY" for _, s in status_rows(server.log_text).get("common", []))


def test_auto_complete_fills_a_missing_config(shared_bridge_server, e2e_no_config: Path) -> None:
    client = shared_bridge_server(e2e_no_config).client()
    assert client.is_model_ready("unconfigured")
    config = json_format.ParseDict(
        client.get_model_config("unconfigured", as_json=True)["config"], mc.ModelConfig()
    )
    assert [(t.name, t.data_type, list(t.dims)) for t in config.input] == [
        ("INPUT0", mc.TYPE_INT32, [1])
    ]
    assert [t.name for t in config.output] == ["OUTPUT0"]
    assert_echoes(client, "unconfigured")


@pytest.mark.parametrize(
    "flags",
    [
        ["--disable-auto-complete-config"],
        ["--strict-model-config"],
        ["--strict-model-config=true"],
        ["--strict-model-config", "true"],
    ],
)
def test_without_auto_complete_a_model_needs_its_config(
    bridge_server, flags, e2e_no_config: Path
) -> None:
    server = bridge_server(e2e_no_config, *flags)
    client = server.client()
    assert client.is_model_ready("configured")
    assert_echoes(client, "configured")
    assert not client.is_model_ready("unconfigured")
    missing = e2e_no_config / "unconfigured" / "config.pbtxt"
    # Triton's reason [V], spec §2.2.
    assert (
        f"failed to open text file for read {missing}: No such file or directory" in server.log_text
    )


def test_strict_model_config_false_keeps_auto_complete(bridge_server, e2e_no_config: Path) -> None:
    server = bridge_server(e2e_no_config, "--strict-model-config=false")
    assert server.client().is_model_ready("unconfigured")
