"""No import cycle between the files of `bridge/` and `model_repository_loader/`.

Every import counts, at module level or inside a function (a deferred import that breaks a cycle
only hides who should build whom), except those under `if TYPE_CHECKING:`. A module importing
its own package's `__init__` is no edge (that is how a package exposes its parts). And
`model_repository_loader` never imports `bridge`.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("bridge", "model_repository_loader")


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _type_only(tree: ast.Module) -> set[int]:
    """ids of the nodes under `if TYPE_CHECKING:`."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(child) for child in ast.walk(node))
    return skipped


def _imported(module: str, path: Path, node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        package = package[: len(package) - node.level + 1]
        base = ".".join(package + ([node.module] if node.module else []))
    return [f"{base}.{alias.name}" for alias in node.names] + [base]


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text())
        skipped = _type_only(tree)
        edges = set()
        for node in ast.walk(tree):
            if id(node) in skipped or not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            for name in _imported(module, path, node):
                while name and name not in modules:
                    name = name.rpartition(".")[0]
                if name and name != module and not module.startswith(name + "."):
                    edges.add(name)
        graph[module] = edges
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                other = stack.pop()
                on_stack.discard(other)
                component.append(other)
                if other == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle() -> None:
    assert _cycles(_graph()) == []


def test_the_loader_never_imports_the_bridge() -> None:
    graph = _graph()
    crossing = {
        (module, target)
        for module, targets in graph.items()
        if module.startswith("model_repository_loader")
        for target in targets
        if target.startswith("bridge")
    }
    assert crossing == set()


def test_the_check_sees_a_cycle() -> None:
    """The check itself: a cycle of three and a module on its own."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def _crossing(graph: dict[str, set[str]], source: str, targets: tuple[str, ...]) -> set:
    def inside(module: str, package: str) -> bool:
        return module == package or module.startswith(package + ".")

    return {
        (module, target)
        for module, imported in graph.items()
        if inside(module, source)
        for target in imported
        if any(inside(target, package) for package in targets)
    }


def test_the_model_side_never_imports_the_cluster() -> None:
    """The roles build what crosses processes and hand it to the manager (bridge/roles/)."""
    assert _crossing(_graph(), "bridge.models", ("bridge.cluster",)) == set()


def test_the_cluster_never_imports_the_models_or_a_door() -> None:
    """The control endpoint answers from the `ServedModels` Protocol; the door and BLS read the
    cluster's protocol and index, never the other way round."""
    graph = _graph()
    assert _crossing(graph, "bridge.cluster", ("bridge.models", "bridge.frontends")) == set()


def test_an_instance_process_imports_no_server_dependency() -> None:
    """An instance in a model's own environment (EXECUTION_ENV_PATH) runs an interpreter that
    has numpy and nothing of ours but this package (isolation/environments.py): what its entry
    point imports must not reach tritonclient, protobuf, gRPC or Dynamo. A fresh interpreter,
    because this one has imported everything already."""
    check = (
        "import sys\n"
        "import model_repository_loader.isolation.child\n"
        "bad = sorted({m.split('.')[0] for m in sys.modules}\n"
        "             & {'tritonclient', 'google', 'grpc', 'dynamo', 'bridge'})\n"
        "print(','.join(bad))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", check], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "", done.stdout
