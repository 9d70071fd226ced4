"""The python_backend examples, each laid out as its README says and checked by its own client
script, unmodified, against the bridge's default door on Triton's ports.

One server serves every example's models (their names do not collide), in a network namespace
of its own; each client is a test of its own. jax runs when the jax package is installed.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.upstream.support import Run, place, run_in_namespace, unpack

# model folder name -> (example file of model.py, example file of config.pbtxt or None)
MODELS = {
    "add_sub": ("add_sub/model.py", "add_sub/config.pbtxt"),
    "pytorch": ("pytorch/model.py", "pytorch/config.pbtxt"),
    "nobatch_auto_complete": ("auto_complete/nobatch_model.py", None),
    "batch_auto_complete": ("auto_complete/batch_model.py", None),
    "bls_sync": ("bls/sync_model.py", "bls/sync_config.pbtxt"),
    "bls_async": ("bls/async_model.py", "bls/async_config.pbtxt"),
    "bls_decoupled_sync": ("bls_decoupled/sync_model.py", "bls_decoupled/sync_config.pbtxt"),
    "bls_decoupled_async": ("bls_decoupled/async_model.py", "bls_decoupled/async_config.pbtxt"),
    "repeat_int32": ("decoupled/repeat_model.py", "decoupled/repeat_config.pbtxt"),
    "square_int32": ("decoupled/square_model.py", "decoupled/square_config.pbtxt"),
    "custom_metrics": ("custom_metrics/model.py", "custom_metrics/config.pbtxt"),
    "jax": ("jax/model.py", "jax/config.pbtxt"),
}
CLIENTS = [
    "add_sub/client.py",
    "pytorch/client.py",
    "auto_complete/client.py",
    "bls/sync_client.py",
    "bls/async_client.py",
    "bls_decoupled/sync_client.py",
    "bls_decoupled/async_client.py",
    "decoupled/repeat_client.py",
    "decoupled/square_client.py",
    "custom_metrics/client.py",
    "jax/client.py",
]
HAS_JAX = importlib.util.find_spec("jax") is not None


@pytest.fixture(scope="module")
def examples_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Run, Path]]:
    root = unpack(tmp_path_factory.mktemp("upstream"))
    examples = root / "python_backend" / "examples"
    models = root / "models"
    for name, (model_file, config_file) in MODELS.items():
        if name == "jax" and not HAS_JAX:
            continue
        place(examples / model_file, models / name / "1" / "model.py")
        if config_file is not None:
            place(examples / config_file, models / name / "config.pbtxt")
    clients = [
        f"{sys.executable} {examples / client}"
        for client in CLIENTS
        if HAS_JAX or not client.startswith("jax/")
    ]
    yield run_in_namespace(models, root, clients), examples


@pytest.mark.parametrize("client", CLIENTS)
def test_example_client_passes(examples_run: tuple[Run, Path], client: str) -> None:
    if client.startswith("jax/") and not HAS_JAX:
        pytest.skip("jax is not installed in this environment")
    run, examples = examples_run
    command = f"{sys.executable} {examples / client}"
    status = run.clients.get(command)
    assert status == 0, run.client_output(command) + run.output[-6000:]


def test_the_server_stopped_cleanly(examples_run: tuple[Run, Path]) -> None:
    run, _ = examples_run
    assert run.server_status == 0, run.output[-6000:]
