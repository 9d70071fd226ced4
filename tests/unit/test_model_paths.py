"""Names and paths from outside never leave their model folder (loader alone, no server).

A model name given to the loading API must be one folder name; `file:` keys of an override and
`default_model_filename` must stay inside the model folder; a refused override leaves nothing
behind. Texts are Triton's where it has them (core: ValidateModelName, LocalizeRepoAgent).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from model_repository_loader import repository
from model_repository_loader.config.load import ConfigOptions
from model_repository_loader.errors import ModelLoadError
from model_repository_loader.loader import PollError, load_model_with_config, override_source

ROOT = Path(__file__).resolve().parents[2]
PLAIN = ROOT / "tests" / "repositories" / "reload" / "models" / "plain"
CONFIG = {
    "backend": "python",
    "max_batch_size": 0,
    "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
    "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
}
TRAVERSAL = "invalid model name '{}', model name must not contain path traversal characters"


@pytest.mark.parametrize(
    "name", ["plain", "a.b", "..a", "a..b", "模型", "x" * 255, ".hidden", "a\\b"]
)
def test_one_folder_names_are_model_names(name: str) -> None:
    assert repository.invalid_model_name(name) is None


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("../escaped_dir", TRAVERSAL.format("../escaped_dir")),
        ("/abs/model", TRAVERSAL.format("/abs/model")),
        ("..", TRAVERSAL.format("..")),
        (" .. ", TRAVERSAL.format(" .. ")),  # Triton trims before comparing
        (".", TRAVERSAL.format(".")),
        ("a\0b", "invalid model name 'a\\0b', model name must not contain NUL characters"),
        ("", "Model name cannot be empty. Please enter a valid name to deploy."),
        ("  ", "Model name cannot be empty. Please enter a valid name to deploy."),
    ],
)
def test_names_that_leave_the_folder_are_refused(name: str, reason: str) -> None:
    assert repository.invalid_model_name(name) == reason


def test_a_name_longer_than_a_file_name_is_refused() -> None:
    assert "at most 255 bytes (got 256)" in repository.invalid_model_name("x" * 256)
    assert "at most 255 bytes" in repository.invalid_model_name("é" * 128)  # 256 bytes


def files_under(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*"))


@pytest.mark.parametrize("name", ["../escaped_dir", "..", "a/b", "a\0b"])
def test_override_refuses_unsafe_names_and_writes_nothing(tmp_path: Path, name: str) -> None:
    root = tmp_path / "root"
    root.mkdir()
    with pytest.raises(PollError, match="invalid model name"):
        override_source(name, {"file:1/model.py": b"x"}, root)
    assert files_under(tmp_path) == [root]


def test_an_absolute_name_does_not_overwrite_a_live_model(tmp_path: Path) -> None:
    live = tmp_path / "repo" / "live"
    (live / "1").mkdir(parents=True)
    (live / "1" / "model.py").write_text("LIVE")
    root = tmp_path / "root"
    root.mkdir()
    with pytest.raises(PollError):
        override_source(str(live), {"file:1/model.py": b"EVIL"}, root)
    assert (live / "1" / "model.py").read_text() == "LIVE"
    assert files_under(root) == []


@pytest.mark.parametrize(
    "files",
    [
        {"file:../escaped.py": b"x"},
        {"file:1/../../escaped.py": b"x"},
        {"file:/../escaped.py": b"x"},
        {"file://1/../../escaped.py": b"x"},
        {"file:": b"x"},
        {"file:/": b"x"},
        {"file:1/x.py": b"ok", "file:1/x.py/y.py": b"x"},
        {"file:1/x.py": b"ok", "file:1": b"x"},
        {"file:1/x.py": b"ok", "file:1/a\0b": b"x"},
        {"file:1/x.py": b"ok", "model.py": b"no prefix"},
    ],
)
def test_override_refuses_bad_keys_and_leaves_nothing(tmp_path: Path, files: dict) -> None:
    root = tmp_path / "root"
    root.mkdir()
    with pytest.raises(PollError):
        override_source("m", files, root)
    assert files_under(tmp_path) == [root]


def test_a_key_leaving_the_folder_gets_tritons_text(tmp_path: Path) -> None:
    with pytest.raises(PollError, match=r"^Invalid file parameter 'file:\.\./x' with normalized "):
        override_source("m", {"file:../x": b""}, tmp_path)
    with pytest.raises(PollError, match="must stay within model directory.$"):
        override_source("m", {"file:../x": b""}, tmp_path)


def test_override_never_writes_into_an_existing_folder(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "keep").write_text("mine")
    with pytest.raises(PollError):
        override_source("m", {"file:1/model.py": b"x"}, tmp_path)
    assert files_under(tmp_path / "m") == [tmp_path / "m" / "keep"]


def test_override_writes_inside(tmp_path: Path) -> None:
    source = override_source("m", {"file:1/model.py": b"x", "file:1/sub/../w.bin": b"w"}, tmp_path)
    assert source.path == tmp_path / "m"
    assert (tmp_path / "m" / "1" / "model.py").read_bytes() == b"x"
    assert (tmp_path / "m" / "1" / "w.bin").read_bytes() == b"w"


def test_a_leading_slash_is_inside_the_model_folder(tmp_path: Path) -> None:
    # Triton appends the key's path to the folder: qa model_control writes "file:/1/model.py"
    # and Triton answers 200 [V: 2.51].
    root = tmp_path / "root"
    root.mkdir()
    override_source("m", {"file:/1/model.py": b"x", "file://tmp/escaped.py": b"t"}, root)
    assert files_under(root) == [
        root / "m",
        root / "m" / "1",
        root / "m" / "1" / "model.py",
        root / "m" / "tmp",
        root / "m" / "tmp" / "escaped.py",
    ]


def probe(folder: Path) -> Path:
    """A model file that marks (folder/ran) when imported."""
    folder.mkdir(parents=True, exist_ok=True)
    code = "import os\nopen(os.path.join(os.path.dirname(__file__), 'ran'), 'w').close()\n"
    (folder / "model.py").write_text(code + (PLAIN / "1" / "model.py").read_text())
    return folder / "ran"


@pytest.mark.parametrize("relative", [False, True])
def test_default_model_filename_cannot_leave_the_model_folder(
    tmp_path: Path, relative: bool
) -> None:
    ran = probe(tmp_path / "elsewhere")
    source = override_source("m", {"file:1/model.py": b"x"}, tmp_path / "root")
    filename = "../../../elsewhere/model.py" if relative else str(tmp_path / "elsewhere/model.py")
    config = json.dumps(CONFIG | {"default_model_filename": filename})
    with pytest.raises(ModelLoadError, match="invalid default_model_filename") as failure:
        load_model_with_config(source, config)
    assert failure.value.version == 1
    assert not ran.exists()


def test_default_model_filename_may_name_another_file_inside(tmp_path: Path) -> None:
    source = override_source("m", {"file:2/model.py": b"x"}, tmp_path)
    ran = probe(tmp_path / "m" / "1")
    config = json.dumps(CONFIG | {"default_model_filename": "../1/model.py"})
    model = load_model_with_config(source, config)
    try:
        assert ran.exists()
    finally:
        model.close()


STUB_NAME = "Invalid argument: Invalid stub name: contains invalid characters"


@pytest.mark.parametrize("char", list(";|&$`<>()[]{}\\\"'*?~#!"))
def test_a_python_model_name_with_a_shell_character_is_refused_before_its_code_runs(
    tmp_path: Path, char: str
) -> None:
    # python_backend (25.09 on) names the auto-complete stub after the model and refuses it.
    name = f"model{char}test"
    source = override_source(name, {"file:1/model.py": b""}, tmp_path)
    ran = probe(source.path / "1")
    with pytest.raises(ModelLoadError) as failure:
        load_model_with_config(source, json.dumps(CONFIG | {"name": name}))
    assert (str(failure.value), failure.value.version) == (STUB_NAME, 1)
    assert not ran.exists()


def test_an_instance_group_name_with_a_shell_character_is_refused(tmp_path: Path) -> None:
    # Without auto-complete only the instances' stubs start: `<group name>_<k>` is checked.
    source = override_source("m", {"file:1/model.py": b""}, tmp_path)
    probe(source.path / "1")
    config = json.dumps(CONFIG | {"instance_group": [{"name": "g;rm", "kind": "KIND_CPU"}]})
    with pytest.raises(ModelLoadError, match=f"^{STUB_NAME}$"):
        load_model_with_config(source, config, ConfigOptions(auto_complete=False))


@pytest.mark.parametrize("name", ["TestModel123", "model-with-hyphens", "model_with_underscores"])
def test_names_without_shell_characters_load(tmp_path: Path, name: str) -> None:
    source = override_source(name, {"file:1/model.py": b""}, tmp_path)
    probe(source.path / "1")
    load_model_with_config(source, json.dumps(CONFIG | {"name": name})).close()


def test_within_is_lexical() -> None:
    folder = Path("/repo/m")
    assert repository.within(folder, "1/model.py")
    assert repository.within(folder, "1/../2/model.py")
    assert not repository.within(folder, "../other/1/model.py")
    assert not repository.within(folder, "/etc/passwd")
    assert not repository.within(folder, "1/../../m2/model.py")
