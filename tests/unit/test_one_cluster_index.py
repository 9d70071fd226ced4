"""One `ClusterIndex` per process (issue 28): the composition root builds it and hands it to
every role that reads the cluster (the control port, the triton door, BLS across workers), so a
process has one cache and one refresh of the control endpoint's index, not one per reader."""

from __future__ import annotations

import ast
from pathlib import Path

BRIDGE = Path(__file__).resolve().parents[2] / "bridge"


def _builders() -> list[str]:
    """The files of bridge/ that call `ClusterIndex(...)`."""
    found = []
    for path in sorted(BRIDGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("ClusterIndex"):
                found.append(str(path.relative_to(BRIDGE.parent)))
    return found


def test_only_the_composition_root_builds_a_cluster_index() -> None:
    # Once in serve(), whatever the role: a split-role process builds exactly one too.
    assert _builders() == ["bridge/server.py"]
