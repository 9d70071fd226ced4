"""Test model repositories whose models share one model.py, written out whole before use.

Several fixture models differ from a sibling only in their name and config.pbtxt (a thread and a
process instance kind, a batching and a plain config, two priorities of one rate limiter
resource). Their code lives once, in the folder of the model named below; the others keep only
their config.pbtxt. `materialize` copies such a repository into a folder of the test's and
gives each of those models its template's version folders, so that Triton (the oracle) and the
bridge load the very same files: call it once and hand the one path to both.

The differential tests compare behaviour with real Triton, so the copy must be what a user's
repository would be: plain files, no links (a link may be refused or resolved elsewhere).
"""

from __future__ import annotations

import shutil
from pathlib import Path

REPOSITORIES = Path(__file__).resolve().parents[1] / "repositories"

# {repository: {model: the model whose version folders (model.py) it takes}}
SAME_CODE: dict[str, dict[str, str]] = {
    "rate_limiter": {"shared_b": "shared_a", "heavy": "gate_hold", "light": "gate_hold"},
    "stream_flood": {"flood_process": "flood"},
    "response_sender": {"sender_batching": "sender", "sender_process": "sender"},
    "argv": {"argv_process": "argv", "unittest_main_process": "unittest_main"},
    "isolation": {"thread_pids": "proc_pids"},
}


def _version_folders(model: Path) -> list[Path]:
    return [path for path in model.iterdir() if path.is_dir() and path.name.isdigit()]


def materialize(name: str, into: Path) -> Path:
    """The repository `name` of tests/repositories, whole, at `into`/`name` (returned)."""
    target = into / name
    shutil.copytree(REPOSITORIES / name, target)
    for model, template in SAME_CODE.get(name, {}).items():
        for version in _version_folders(target / template):
            shutil.copytree(version, target / model / version.name)
    return target


def materialize_model(repository: str, model: str, into: Path) -> Path:
    """One model of `repository`, whole, at `into`/`model` (returned)."""
    source = REPOSITORIES / repository / model
    target = into / model
    shutil.copytree(source, target)
    template = SAME_CODE.get(repository, {}).get(model)
    if template is not None:
        for version in _version_folders(REPOSITORIES / repository / template):
            shutil.copytree(version, target / version.name)
    return target


__all__ = ["REPOSITORIES", "SAME_CODE", "materialize", "materialize_model"]
