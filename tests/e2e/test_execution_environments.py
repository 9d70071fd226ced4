"""Per-model Python environments (`EXECUTION_ENV_PATH`): a model that needs numpy 1.x
(`np.NINF`, gone in numpy 2) serves unmodified from its own environment, beside a model on the
server's numpy 2, in one server; as an archive (conda-pack style: the environment's folder in a
.tar.gz) and as a plain venv folder. The archive is unpacked once into a cache keyed by its
content, reused by a restart; errors name the path and the reason, and the other models serve.

The environment is a real venv made here with numpy 1.x from the package index (once per
session): the server runs its interpreter.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from model_repository_loader.inference import InferRequest
from model_repository_loader.isolation.environments import CACHE_ENV, content_key
from model_repository_loader.loader import load_repository
from tests.e2e.support import REPOSITORIES

SOURCE = REPOSITORIES / "environments"


@pytest.fixture(scope="session")
def numpy1_env(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A venv with numpy 1.x, and the same packed as a .tar.gz (made once per session). Its
    interpreter is a copy: a venv's usual `bin/python3.x` links to an absolute path, which an
    archive may not hold (conda-pack's hold relative links only)."""
    root = tmp_path_factory.mktemp("environments")
    env = root / "numpy1"
    subprocess.run([sys.executable, "-m", "venv", "--copies", str(env)], check=True, timeout=120)
    subprocess.run(
        [
            str(env / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "numpy<2",
        ],
        check=True,
        timeout=600,
    )
    packed = root / "numpy1.tar.gz"
    with tarfile.open(packed, "w:gz", compresslevel=1) as archive:
        archive.add(env, arcname=".")
    return env, packed


@pytest.fixture
def repository(tmp_path: Path, numpy1_env: tuple[Path, Path]) -> Path:
    env, packed = numpy1_env
    repo = tmp_path / "repo"
    shutil.copytree(SOURCE, repo, ignore=shutil.ignore_patterns("README.md"))
    (repo / "numpy1" / "numpy1.tar.gz").hardlink_to(packed)
    (repo / "numpy1_folder" / "env").symlink_to(env, target_is_directory=True)
    (repo / "numpy1_folder" / "1").mkdir()
    shutil.copyfile(repo / "numpy1" / "1" / "model.py", repo / "numpy1_folder" / "1" / "model.py")
    return repo


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv(CACHE_ENV, str(folder))
    return folder


def _answer(client: grpcclient.InferenceServerClient, model: str) -> dict[str, object]:
    result = client.infer(model, [])
    return {name: result.as_numpy(name)[0] for name in ("OUT", "NUMPY", "OTHER")}


def test_a_numpy1_model_serves_beside_the_servers_numpy(
    bridge_server, repository: Path, cache: Path
) -> None:
    # The triton door: Dynamo's drops the outputs of a request with no inputs (a door matter,
    # not an environment's).
    server = bridge_server(repository, "--frontend", "triton", env={CACHE_ENV: str(cache)})
    client = server.client()
    for model in ("numpy1", "numpy1_folder"):
        answer = _answer(client, model)
        assert answer["OUT"] == -np.inf  # np.NINF: numpy 1.x
        assert str(answer["NUMPY"], "utf-8").startswith("1.")
        # BLS from the environment's process to the server's own model works as from any.
        assert answer["OTHER"] == np.__version__.encode()
    server_numpy = client.infer("server_numpy", []).as_numpy("NUMPY")[0]
    assert server_numpy == np.__version__.encode() and not server_numpy.startswith(b"1.")
    assert "Traceback" not in server.log_text


def test_the_archive_is_unpacked_once_by_content(repository: Path, cache: Path) -> None:
    archive = repository / "numpy1" / "numpy1.tar.gz"
    key = content_key(archive)
    (cache / f"{key}.partial-crashed").mkdir(parents=True)  # left by a crash mid-unpack
    first = load_repository([repository], only=["numpy1", "server_numpy"])
    try:
        assert not first.failures, first.failures
    finally:
        first.close()
    unpacked = cache / key
    assert unpacked.is_dir() and not list(cache.glob(f"{key}.partial-*"))
    marker = unpacked / "unpacked-by-the-first-load"
    marker.touch()

    # A restart (a new load of the same content, under another name) unpacks nothing again.
    renamed = repository / "numpy1" / "renamed.tar.gz"
    shutil.copyfile(archive, renamed)  # the same content under another name
    archive.unlink()
    config = repository / "numpy1" / "config.pbtxt"
    config.write_text(config.read_text().replace("numpy1.tar.gz", "renamed.tar.gz"))
    second = load_repository([repository], only=["numpy1", "server_numpy"])
    try:
        assert not second.failures, second.failures
        answer = second.models["numpy1"].infer(InferRequest([]), timeout=60)
        assert not answer.has_error(), answer.error().message()
    finally:
        second.close()
    assert marker.exists()
    assert sorted(p.name for p in cache.iterdir() if not p.name.endswith(".lock")) == [key]


def _write_env_config(model_dir: Path, value: str) -> None:
    config = model_dir / "config.pbtxt"
    text = config.read_text()
    start = text.index('string_value: "') + len('string_value: "')
    end = text.index('"', start)
    config.write_text(text[:start] + value + text[end:])


@pytest.mark.parametrize(
    ("setup", "reason"),
    [
        ("missing", "Failed to get the canonical path for"),
        ("corrupt", "failed to unpack the Python environment"),
        ("no_numpy", "cannot import numpy"),
        ("no_interpreter", "has no bin/python3 or bin/python"),
        ("broken_interpreter", "does not start"),
    ],
)
def test_a_bad_environment_fails_that_model_only(
    repository: Path, cache: Path, tmp_path: Path, setup: str, reason: str
) -> None:
    model = repository / "numpy1_folder"
    (model / "env").unlink()
    target = tmp_path / setup
    if setup == "missing":
        _write_env_config(model, str(target))
    elif setup == "corrupt":
        target = tmp_path / "corrupt.tar.gz"
        target.write_bytes(b"\x1f\x8b not really gzip")
        _write_env_config(model, str(target))
    elif setup == "no_numpy":
        subprocess.run(
            [sys.executable, "-m", "venv", "--without-pip", str(target)], check=True, timeout=120
        )
        _write_env_config(model, str(target))
    elif setup == "no_interpreter":
        (target / "bin").mkdir(parents=True)
        _write_env_config(model, str(target))
    else:
        (target / "bin").mkdir(parents=True)
        script = target / "bin" / "python3"
        script.write_text("#!/bin/sh\necho 'this interpreter is broken' >&2\nexit 3\n")
        script.chmod(0o755)
        _write_env_config(model, str(target))
    loaded = load_repository([repository], only=["numpy1_folder", "server_numpy"])
    try:
        assert set(loaded.failures) == {"numpy1_folder"}
        assert reason in loaded.failures["numpy1_folder"]
        assert str(target) in loaded.failures["numpy1_folder"] or setup == "missing"
        answer = loaded.models["server_numpy"].infer(InferRequest([]), timeout=60)
        assert not answer.has_error()
    finally:
        loaded.close()


@pytest.mark.oracle
def test_the_archive_model_answers_as_on_triton(
    oracle_server, bridge_server, repository: Path, cache: Path
) -> None:
    """Triton 2.51 serves the same conda-pack-style archive with its own stub (a Python 3.11
    environment, as the stub needs): the model answers alike. Triton resolves a relative
    EXECUTION_ENV_PATH from its working folder, not the model's ("Failed to get the canonical
    path for env."), so `numpy1_folder` is left out there; the server's own numpy differs (the
    oracle's is 1.x), so only the environment's model is compared."""
    shutil.rmtree(repository / "numpy1_folder")
    triton = oracle_server(repository)
    ours = bridge_server(repository, env={CACHE_ENV: str(cache)})
    answers = [
        {name: server.client().infer("numpy1", []).as_numpy(name)[0] for name in ("OUT", "NUMPY")}
        for server in (triton, ours)
    ]
    assert answers[0]["OUT"] == -np.inf and answers[1] == answers[0]
