"""Our configuration pipeline against what real Triton 2.51 answered for the same directories.

The expectations in fixtures/oracle_configs.json were captured from the real server by
fixtures/capture_oracle_configs.py; nothing in them comes from our code.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from google.protobuf import json_format

from model_repository_loader import repository
from model_repository_loader.config import (
    ConfigOptions,
    config_to_args_json,
    load_config,
    read_model_config,
)
from model_repository_loader.errors import ModelLoadError
from model_repository_loader.loader import PollError, load_model

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "oracle_configs.json").read_text())
REPO_MARK = FIXTURE["repo_mark"]
CASES = {case["name"]: case for case in FIXTURE["cases"]}
OPTIONS = {
    "default": ConfigOptions(),
    "no_auto_complete": ConfigOptions(auto_complete=False),
    "model_config_name": ConfigOptions(model_config_name="alt"),
    "two_repositories": ConfigOptions(),
}


def load_model_class(path: Path) -> type:
    """Import a model file the way the Python backend names it ("<version>.<stem>")."""
    module_name = f"{path.parent.name}.{path.stem}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.TritonPythonModel


def build(case: dict, root: Path) -> repository.ModelSource:
    """Write the case's model directory(ies) and scan them as the server did."""
    repos = {key: root / key for key in ("a", "b")}
    for key in case.get("repositories", ["a"]):
        model_dir = repos[key] / case["name"]
        model_dir.mkdir(parents=True)
        for rel, content in case["files"].items():
            if content.startswith("@"):
                content = FIXTURE["sources"][content[1:]]
            (model_dir / rel).parent.mkdir(parents=True, exist_ok=True)
            (model_dir / rel).write_text(content)
        for rel in case["dirs"]:
            (model_dir / rel).mkdir(parents=True, exist_ok=True)
    paths = [repos[key] for key in sorted(case.get("repositories", ["a"]))]
    (source,) = [s for s in repository.scan(paths) if s.name == case["name"]]
    return source


@pytest.fixture
def capture_dir(tmp_path, monkeypatch) -> Path:
    directory = tmp_path / "capture"
    directory.mkdir()
    monkeypatch.setenv("CAPTURE_DIR", str(directory))
    return directory


def _marked(text: str, root: Path) -> str:
    for key in ("a", "b"):
        text = text.replace(str(root / key), REPO_MARK)
    return text


# Map fields: Triton prints their entries in hash-table order, we print them sorted.
MAP_FIELDS = {"parameters", "cc_model_filenames", "metric_tags", "priority_queue_policy"}


def _maps_sorted(value):
    if isinstance(value, dict):
        items = {k: _maps_sorted(v) for k, v in value.items()}
        for key in MAP_FIELDS & items.keys():
            if isinstance(items[key], dict):
                items[key] = dict(sorted(items[key].items()))
        return items
    if isinstance(value, list):
        return [_maps_sorted(v) for v in value]
    return value


def _canonical(args_json: str) -> str:
    """The args JSON with map entries sorted; everything else (order, number forms) kept."""
    return json.dumps(_maps_sorted(json.loads(args_json)), separators=(",", ":"))


def _head_and_user_frames(message: str) -> tuple[str, list[str]]:
    """Split a load error into its text and the frames inside the model directory.

    Frames of Triton's own triton_python_backend_utils.py (or of our pb_utils, or of the test's
    importer) differ by construction; the model's frames and everything else must match.
    """
    if message.endswith(";\n"):
        message = message[:-2]
    head, _, tail = message.partition("\n\nAt:\n")
    frames = [line.strip() for line in tail.splitlines() if f"{REPO_MARK}/" in line]
    return head, frames


# When auto_complete_config returns JSON that is not a ModelConfig, Triton keeps the old
# configuration but the python backend still hands initialize() the returned JSON. We keep the
# old configuration for both (documented difference).
ARGS_DIFFER = {"config_auto_complete_bad_json_ignored"}

SUCCESS = sorted(name for name, case in CASES.items() if "config" in case["expected"])
FAILURE = sorted(name for name, case in CASES.items() if "error" in case["expected"])


def test_fixture_covers_the_cases_we_care_about():
    assert FIXTURE["triton_version"].startswith("2.")
    assert len(SUCCESS) >= 20 and len(FAILURE) >= 30


@pytest.mark.parametrize("name", SUCCESS)
def test_normalized_config_matches_triton(name, tmp_path, capture_dir):
    case = CASES[name]
    expected = case["expected"]
    source = build(case, tmp_path)
    options = OPTIONS[case["group"]]

    config = load_config(source, options, load_model_class)

    # What the KServe ModelConfig RPC returns (clients render it with defaults omitted).
    assert json_format.MessageToDict(config, preserving_proto_field_name=True) == expected["config"]
    # The exact string initialize() gets as args["model_config"].
    ours = config_to_args_json(config)
    if "args_model_config" not in expected:
        assert config.platform == "ensemble"  # no Python instance, nothing initialized
    elif name in ARGS_DIFFER:
        assert ours != expected["args_model_config"]
    else:
        assert _canonical(ours) == _canonical(expected["args_model_config"])
        if _canonical(expected["args_model_config"]) == expected["args_model_config"]:
            assert ours == expected["args_model_config"]  # byte for byte
    # Versions the policy loads.
    polled = read_model_config(source, options)
    assert repository.select_versions(source, polled) == expected["loaded_versions"]
    # Instance names are "<group name>_<k>".
    top = str(max(expected["loaded_versions"]))
    triton_instances = sorted(
        i["model_instance_name"] for i in expected.get("instances", []) if i["model_version"] == top
    )
    ours = sorted(f"{g.name}_{k}" for g in config.instance_group for k in range(g.count))
    assert ours == triton_instances

    ac_file = capture_dir / f"{name}.ac_in.json"
    if "auto_complete_input" in expected:
        received = json.loads(ac_file.read_text())
        assert received == expected["auto_complete_input"]
        assert list(received) == list(expected["auto_complete_input"])  # same key order
    else:
        assert not ac_file.exists()


def _load_failure(source: repository.ModelSource, options: ConfigOptions) -> ModelLoadError:
    """Load like the server does (`loader.load_model`) and return how it failed."""
    try:
        model = load_model(source, options)
    except ModelLoadError as exc:
        return exc
    model.close()
    raise AssertionError(f"model {source.name} loaded, Triton refused it")


@pytest.mark.parametrize("name", FAILURE)
def test_load_error_matches_triton(name, tmp_path, capture_dir):
    """The loader tells which kind of failure it was and why; Triton's client text is made of
    those (bridge/manager.py words it: tests/e2e/test_model_control.py checks that)."""
    case = CASES[name]
    expected = case["expected"]
    source = build(case, tmp_path)

    error = _load_failure(source, OPTIONS[case["group"]])

    reason = _marked(str(error), tmp_path)
    if isinstance(error, PollError):
        # The client only hears "failed to poll"; the reason is in Triton's log.
        assert expected["error"]["message"] == (
            f"failed to load '{name}', failed to poll from model repository"
        )
        assert expected["error"]["status"] == "StatusCode.INTERNAL"
        assert any(reason in line for line in expected["log"]), (reason, expected["log"])
        return
    assert expected["error"]["status"] == "StatusCode.INVALID_ARGUMENT"
    if error.version is None:
        message = f"load failed for model '{name}': {reason}\n"
    else:
        message = (
            f"load failed for model '{name}': version {error.version} is at UNAVAILABLE "
            f"state: {reason};\n"
        )
    assert _head_and_user_frames(message) == _head_and_user_frames(expected["error"]["message"])
