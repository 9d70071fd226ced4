"""A model that fails to load is reported and skipped; `--exit-on-error` makes that fatal.

Reasons are Triton's texts (spec §2.1-§2.3, tests/repositories/load_failures/README.md).
"""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from tests.e2e.reload_support import control
from tests.e2e.support import int32_input, status_rows
from tests.harness import BridgeServer
from tests.harness.ports import free_port

FAILING = ["bad_config", "init_raises", "syntax_error"]


# model -> text Triton gives as the reason it failed to load
def reasons(root: Path) -> dict[str, str]:
    return {
        "syntax_error": "Internal: SyntaxError: expected ':' (model.py, line 4)",
        "init_raises": "Internal: RuntimeError: e2e init_raises refuses to start",
        "bad_config": f"failed to read text proto from {root / 'bad_config' / 'config.pbtxt'}",
    }


@pytest.fixture
def server(shared_bridge_server, e2e_load_failures: Path):
    return shared_bridge_server(e2e_load_failures)


def test_server_starts_despite_failed_models(server) -> None:
    client = server.client()
    assert client.is_server_live()
    assert client.is_model_ready("healthy")
    result = client.infer("healthy", [int32_input([7])])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.array([7], np.int32))


@pytest.mark.parametrize("model", FAILING)
def test_failed_model_is_not_ready(server, model: str) -> None:
    assert not server.client().is_model_ready(model)


@pytest.mark.parametrize("model", FAILING)
def test_failed_model_refuses_requests(server, model: str) -> None:
    with pytest.raises(InferenceServerException):
        server.client().infer(model, [int32_input([1])])


@pytest.mark.parametrize("model", FAILING)
def test_log_gives_triton_reason(server, model: str, e2e_load_failures: Path) -> None:
    assert reasons(e2e_load_failures)[model] in server.log_text


def test_status_table_marks_failures(server) -> None:
    rows = status_rows(server.log_text)
    assert rows["healthy"] == [("1", "READY")]
    # Triton lists models that failed after the repository poll as UNAVAILABLE (bad_config
    # fails at the poll: Triton leaves it out of the table; see the xfail test below).
    for model in ("init_raises", "syntax_error"):
        assert len(rows[model]) == 1, rows[model]
        assert rows[model][0][1].startswith("UNAVAILABLE: "), rows[model]
    assert not any(s == "READY" for _, s in rows.get("bad_config", []))


def test_status_table_rows(server) -> None:
    # Triton 2.51 shows the same rows for the models that reached a version, but leaves
    # bad_config (failed at the repository poll) out of its table. We list it, with "-", so a
    # broken config.pbtxt is visible at start-up.
    rows = status_rows(server.log_text)
    assert rows == {
        "healthy": [("1", "READY")],
        "init_raises": [
            ("1", "UNAVAILABLE: Internal: RuntimeError: e2e init_raises refuses to start")
        ],
        "syntax_error": [
            ("1", "UNAVAILABLE: Internal: SyntaxError: expected ':' (model.py, line 4)")
        ],
        "bad_config": [("-", rows["bad_config"][0][1])],
    }
    assert rows["bad_config"][0][1].startswith("UNAVAILABLE: failed to read text proto from")


def test_status_table_explains_strict_readiness(server) -> None:
    # Triton's ServerReady is false here (strict readiness), the triton door's too; Dynamo's
    # frontend says true, so the table says so, naming the models that are not ready.
    text = server.log_text
    assert "Not ready: bad_config, init_raises, syntax_error. Triton's strict readiness" in text
    assert "Dynamo's frontend (--frontend dynamo) answers ServerReady true regardless" in text


def http_status(server, path: str) -> int:
    """The status of GET `path` on the bridge's metrics port, with a real HTTP client."""
    url = f"http://127.0.0.1:{server.metrics_port}{path}"
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def test_health_ready_on_the_metrics_port_is_strict(server) -> None:
    # Triton 2.51's HTTP port answers 400 (empty body) while a model failed to load, 200 for
    # live [V]; the metrics port serves both paths as Triton's HTTP port does.
    assert http_status(server, "/v2/health/ready") == 400
    assert http_status(server, "/v2/health/live") == 200
    # The triton door's ServerReady is strict too, as Triton's (Dynamo's frontend says true:
    # server_ready_with_failures, tests/differential/test_diff_load_failures.py).
    assert not server.client().is_server_ready()


def test_health_ready_follows_loads_and_unloads(bridge_server, e2e_load_failures: Path) -> None:
    # Triton 2.51's HTTP port gave the same answers to the same sequence [V]: an unloaded model
    # makes the server not ready until it loads again; a failed load does too, and unloading
    # the model that never loaded does not undo it.
    port = free_port()
    server = bridge_server(
        e2e_load_failures,
        "--model-control-mode=explicit",
        "--load-model=healthy",
        f"--control-port={port}",
    )
    assert http_status(server, "/v2/health/ready") == 200
    assert "Not ready:" not in server.log_text
    assert control(port, "/v2/repository/models/healthy/unload")[0] == 200
    assert http_status(server, "/v2/health/ready") == 400
    assert control(port, "/v2/repository/models/healthy/load")[0] == 200
    assert http_status(server, "/v2/health/ready") == 200
    assert control(port, "/v2/repository/models/init_raises/load")[0] == 400
    assert http_status(server, "/v2/health/ready") == 400
    assert control(port, "/v2/repository/models/init_raises/unload")[0] == 200
    assert http_status(server, "/v2/health/ready") == 400


def test_init_traceback_names_model_file(server, e2e_load_failures: Path) -> None:
    # Triton's reason carries the traceback: "<file>(<line>): initialize".
    model_file = e2e_load_failures / "init_raises" / "1" / "model.py"
    assert f"{model_file}(6): initialize" in server.log_text


@pytest.mark.parametrize("flag", ["--exit-on-error", "--exit-on-error=true"])
def test_exit_on_error_stops_start_up(tmp_path, flag: str, e2e_load_failures: Path) -> None:
    server = BridgeServer(e2e_load_failures, flag, log_path=tmp_path / "bridge.log")
    with pytest.raises(RuntimeError, match="exited with code"):
        server.start()
    assert server.returncode not in (None, 0)
    assert "error: creating server: Internal - failed to load all models" in server.log_text
    assert "Not ready:" not in server.log_text  # no readiness note: the server does not serve
    # Every failure is still explained before the process gives up.
    for reason in reasons(e2e_load_failures).values():
        assert reason in server.log_text


def test_exit_on_error_false_serves(bridge_server, e2e_load_failures: Path) -> None:
    server = bridge_server(e2e_load_failures, "--exit-on-error=false")
    assert server.client().is_model_ready("healthy")
    assert not server.client().is_model_ready("init_raises")


def test_exit_on_error_with_every_model_loaded_serves(bridge_server, e2e_no_config: Path) -> None:
    server = bridge_server(e2e_no_config, "--exit-on-error")
    assert server.client().is_model_ready("configured")
    assert server.client().is_model_ready("unconfigured")
