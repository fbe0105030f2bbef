"""The package's imports point one way: every module's AST walked, lazy imports included.

Between top-level parts (DESIGN.md "Layout"): each part imports only the parts listed in
``ALLOWED``; guard/ and service/ reach the predictor only through ``predictor.core``;
features/, predictor/ and service/ never import torch. Inside predictor/ the layers are
ordered ``core <- evaluate <- training <- lifecycle <- cli``: a module imports its own
layer or one below. No import circle anywhere, counting imports inside functions (the
kind ``import x`` in a fresh interpreter cannot see); only ``if TYPE_CHECKING:`` imports
are left out of the circle check, since they never run.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "collapse_guard"
LAYERS = ("core", "evaluate", "training", "lifecycle", "cli")  # each imports only those before
# part -> the parts it may import; shared leaves (errors, signals, _config, ...) are open to all
LEAVES = {"errors", "signals", "_config", "_durable", "_scheduler"}
ALLOWED: Mapping[str, set[str]] = {
    "probe": {"datasets"},  # the run recorder writes run files
    "features": set(),
    "datasets": {"probe", "features"},
    "predictor": {"features", "datasets"},
    "service": {"features", "predictor.core"},
    "guard": {"probe", "features", "datasets", "predictor.core", "service"},
    "integrations": {"guard"},
    "cli": {"datasets", "demo", "predictor", "service"},
    "demo": {"probe", "features", "datasets", "predictor", "guard"},
}
NO_TORCH = ("features", "predictor", "service")


@dataclass(frozen=True)
class Edge:
    source: str  # importing module, dotted
    target: str  # imported module (a submodule when ``from pkg import sub`` names one)
    line: int
    type_checking: bool  # under ``if TYPE_CHECKING:``: never runs


def module_name(path: Path, root: Path = PACKAGE) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(
    name: str, source: str, known: set[str], *, is_package: bool = False
) -> Iterator[Edge]:
    """Every import in ``source`` (module ``name``), at any depth, relative ones resolved."""
    tree = ast.parse(source)
    guarded = {
        id(node)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
        for stmt in block.body
        for node in ast.walk(stmt)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Edge(name, alias.name, node.lineno, id(node) in guarded)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = name.split(".") if is_package else name.split(".")[:-1]
                package = package[: len(package) - node.level + 1]
                base = ".".join([*package, base] if base else package)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                yield Edge(name, sub if sub in known else base, node.lineno, id(node) in guarded)


def part_of(module: str) -> str:
    """``predictor.<layer>`` inside predictor/, else the top-level part."""
    parts = module.split(".")
    if len(parts) > 2 and parts[1] == "predictor":
        return f"predictor.{parts[2]}"
    return parts[1] if len(parts) > 1 else parts[0]


def violations(edges: list[Edge]) -> list[str]:
    """What breaks the rules of the module docstring, one line each (empty: none)."""
    found = []
    for e in edges:
        src, dst = part_of(e.source), e.target
        if dst.split(".")[0] == "torch":
            if src.split(".")[0] in NO_TORCH:
                found.append(f"{e.source}:{e.line} imports torch")
            continue
        if not dst.startswith("collapse_guard."):
            continue
        dst_part = part_of(dst)
        top, dst_top = src.split(".")[0], dst_part.split(".")[0]
        if dst_top in LEAVES or src == dst_part:
            continue
        if top == "predictor" and dst_top == "predictor":
            layer, dst_layer = src.split(".")[1], dst_part.partition(".")[2]
            if dst_layer not in LAYERS or LAYERS.index(dst_layer) > LAYERS.index(layer):
                found.append(f"{e.source}:{e.line} ({layer}) imports {dst}")
            continue
        allowed = ALLOWED.get(top, set())  # "predictor": any layer; "predictor.core": that one
        if top != dst_top and dst_part not in allowed and dst_top not in allowed:
            found.append(f"{e.source}:{e.line} ({top}) imports {dst}")
    return found


def circles(edges: list[Edge]) -> list[list[str]]:
    """Strongly connected groups of modules (Tarjan), TYPE_CHECKING imports left out."""
    graph: dict[str, set[str]] = {}
    for e in edges:
        graph.setdefault(e.source, set())
        if not e.type_checking and e.target != e.source and e.target.startswith("collapse_guard"):
            graph[e.source].add(e.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while (w := stack.pop()) != v:
                group.append(w)
            if group:
                found.append(sorted([v, *group]))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


@pytest.fixture(scope="module")
def package_edges() -> list[Edge]:
    paths = sorted(PACKAGE.rglob("*.py"))
    known = {module_name(p) for p in paths}
    return [
        edge
        for p in paths
        for edge in imports_of(
            module_name(p), p.read_text(), known, is_package=p.name == "__init__.py"
        )
    ]


def test_the_package_keeps_its_layers(package_edges):
    assert len(package_edges) > 500  # the walk saw the package, not an empty folder
    assert violations(package_edges) == []


def test_the_package_has_no_import_circle_lazy_imports_included(package_edges):
    assert circles(package_edges) == []


def test_every_predictor_module_sits_in_a_layer():
    loose = [p.name for p in (PACKAGE / "predictor").glob("*.py") if p.name != "__init__.py"]
    layers = sorted(
        p.name for p in (PACKAGE / "predictor").iterdir() if (p / "__init__.py").exists()
    )
    assert loose == [] and layers == sorted(LAYERS)


# ------------------------------------------------- the walker catches what it should

_KNOWN = {
    "collapse_guard.predictor.core.risk",
    "collapse_guard.predictor.cli.commands",
    "collapse_guard.predictor.training.train",
    "collapse_guard.predictor.core",
}


def _edges(name: str, source: str) -> list[Edge]:
    return list(imports_of(name, source, _KNOWN))


def test_a_lazy_upward_import_inside_a_function_is_a_violation():
    source = "def f():\n    from collapse_guard.predictor.cli.commands import train_command\n"
    (line,) = violations(_edges("collapse_guard.predictor.core.risk", source))
    assert line == (
        "collapse_guard.predictor.core.risk:2 (core) imports collapse_guard.predictor.cli.commands"
    )
    # the same import one layer up is allowed: cli imports core, never the reverse
    reverse = "from collapse_guard.predictor.core import risk\n"
    assert violations(_edges("collapse_guard.predictor.cli.commands", reverse)) == []


def test_guard_and_service_may_reach_only_the_core_and_no_torch_in_the_service():
    training = "from collapse_guard.predictor.training.train import train_risk_model\n"
    package = "from collapse_guard.predictor import RiskModel\n"
    torch = "def g():\n    import torch.nn\n"
    assert violations(_edges("collapse_guard.guard.risk_source", training)) == [
        "collapse_guard.guard.risk_source:1 (guard) imports collapse_guard.predictor.training.train"
    ]
    assert violations(_edges("collapse_guard.service.scoring", package)) == [
        "collapse_guard.service.scoring:1 (service) imports collapse_guard.predictor"
    ]
    assert violations(_edges("collapse_guard.service.scoring", torch)) == [
        "collapse_guard.service.scoring:2 imports torch"
    ]
    assert violations(_edges("collapse_guard.guard.guard", torch)) == []  # the guard may
    assert violations(_edges("collapse_guard.features.stats", package)) == [
        "collapse_guard.features.stats:1 (features) imports collapse_guard.predictor"
    ]


def test_relative_imports_resolve_and_type_checking_imports_close_no_circle():
    edges = _edges("collapse_guard.predictor.core.risk", "from .. import core\nfrom . import x\n")
    assert [e.target for e in edges] == [
        "collapse_guard.predictor.core",
        "collapse_guard.predictor.core",
    ]
    a = "from collapse_guard.predictor.training import train\n"
    b = "def f():\n    from collapse_guard.predictor.core import risk\n"
    lazy = _edges("collapse_guard.predictor.core.risk", a) + _edges(
        "collapse_guard.predictor.training.train", b
    )
    assert circles(lazy) == [
        ["collapse_guard.predictor.core.risk", "collapse_guard.predictor.training.train"]
    ]
    typed = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    " + b.split("\n")[1].strip()
    assert (
        circles(
            _edges("collapse_guard.predictor.core.risk", a)
            + _edges("collapse_guard.predictor.training.train", typed)
        )
        == []
    )
