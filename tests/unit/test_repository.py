"""Repository scan, version directories, version policies and model files.

Expected behaviour is Triton's (spec §2.1, §3.1; version parsing and texts verified on the
oracle, see fixtures/oracle_configs.json for the end-to-end replay).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from model_repository_loader import repository
from model_repository_loader.config import ConfigError


def model_dir(root: Path, name: str, versions=("1",), filename="model.py") -> Path:
    path = root / name
    path.mkdir(parents=True)
    for version in versions:
        (path / version).mkdir()
        (path / version / filename).write_text("class TritonPythonModel: pass\n")
    return path


def config(text: str) -> mc.ModelConfig:
    return text_format.Parse(text, mc.ModelConfig())


def test_scan_lists_model_directories_sorted(tmp_path):
    model_dir(tmp_path, "zeta")
    model_dir(tmp_path, "alpha")
    (tmp_path / "README.md").write_text("not a model")
    (tmp_path / ".git").mkdir()
    (tmp_path / "__pycache__").mkdir()
    sources = repository.scan([tmp_path])
    assert [s.name for s in sources] == ["alpha", "zeta"]
    assert sources[0] == repository.ModelSource("alpha", tmp_path / "alpha", tmp_path)
    assert sources[0].error is None


def test_scan_merges_repositories_and_flags_names_found_twice(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    model_dir(first, "shared")
    model_dir(first, "only_a")
    model_dir(second, "shared")
    model_dir(second, "only_b")
    sources = {s.name: s for s in repository.scan([first, str(second)])}
    assert sorted(sources) == ["only_a", "only_b", "shared"]
    assert sources["only_b"].repository == second
    assert sources["only_a"].error is None
    error = sources["shared"].error
    assert isinstance(error, ConfigError)
    assert str(error) == "failed to poll model 'shared': not unique across all model repositories"
    assert error.stage == "poll"


def test_scan_of_a_missing_repository_fails(tmp_path):
    with pytest.raises(FileNotFoundError):
        repository.scan([tmp_path / "nope"])


@pytest.mark.parametrize(
    ("name", "version"),
    [
        ("1", 1),
        ("10", 10),
        ("0", 0),
        ("3_old", 3),  # std::stoll reads the leading number
        ("-1", -1),
        ("01", None),  # leading zero: ignored
        ("abc", None),
        ("warmup", None),
        ("initial_state", None),
        ("99999999999999999999", None),
    ],
)
def test_parse_version(name, version):
    assert repository.parse_version(name) == version


def test_list_versions_ignores_files_and_odd_names(tmp_path):
    path = model_dir(tmp_path, "m", versions=("1", "2", "10", "01", "abc"))
    (path / "7").write_text("a file, not a directory")
    source = repository.scan([tmp_path])[0]
    assert repository.list_versions(source) == [1, 2, 10]


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("", [10]),
        ("version_policy { latest { num_versions: 2 } }", [2, 10]),
        ("version_policy { latest { num_versions: 9 } }", [1, 2, 10]),
        ("version_policy { all { } }", [1, 2, 10]),
        ("version_policy { specific { versions: [10, 1, 5] } }", [1, 10]),
    ],
)
def test_select_versions(tmp_path, policy, expected):
    model_dir(tmp_path, "m", versions=("1", "2", "10"))
    source = repository.scan([tmp_path])[0]
    assert repository.select_versions(source, config(policy)) == expected


@pytest.mark.parametrize(
    "policy",
    [
        "version_policy { latest { num_versions: 0 } }",
        "version_policy { specific { versions: [3] } }",
    ],
)
def test_select_versions_none_available(tmp_path, policy):
    model_dir(tmp_path, "m", versions=("1",))
    source = repository.scan([tmp_path])[0]
    with pytest.raises(ConfigError) as info:
        repository.select_versions(source, config(policy))
    assert str(info.value) == (
        "at least one version must be available under the version policy of model 'm'"
    )
    assert info.value.stage == "versions"


def test_model_file_default_and_custom_names(tmp_path):
    model_dir(tmp_path, "m", versions=("1",))
    model_dir(tmp_path, "c", versions=("2",), filename="my_model.py")
    m, c = sorted(repository.scan([tmp_path]), key=lambda s: s.name, reverse=True)
    assert repository.model_file(m, 1, mc.ModelConfig()) == tmp_path / "m" / "1" / "model.py"
    custom = config('default_model_filename: "my_model.py"')
    assert repository.model_file(c, 2, custom) == tmp_path / "c" / "2" / "my_model.py"


def test_model_file_missing(tmp_path):
    model_dir(tmp_path, "m", versions=("1",), filename="other.py")
    source = repository.scan([tmp_path])[0]
    with pytest.raises(ConfigError) as info:
        repository.model_file(source, 1, config('default_model_filename: "model.py"'))
    path = tmp_path / "m" / "1" / "model.py"
    assert str(info.value) == (
        f"Failed to preinitialize Python stub: Python model file not found in '{path}'"
    )
    assert info.value.stage == "load"


def test_config_path_with_model_config_name(tmp_path):
    path = model_dir(tmp_path, "m")
    source = repository.scan([tmp_path])[0]
    assert repository.config_path(source) == path / "config.pbtxt"
    assert repository.config_path(source, "alt") == path / "config.pbtxt"
    (path / "configs").mkdir()
    (path / "configs" / "alt.pbtxt").write_text("")
    assert repository.config_path(source, "alt") == path / "configs" / "alt.pbtxt"
