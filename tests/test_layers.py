"""The package's imports point one way: every module's AST walked, lazy imports included.

Between top-level parts (docs/design.md, "Layout"): each part imports only the parts listed in
``ALLOWED``, and no two parts may import each other: the parts stand on floors, run files
(``runfiles``) and features on the ground floor, the probe above them, the generators
(``datasets``) above the probe; guard/ and service/ reach the predictor only through
``predictor.core``; features/, runfiles/, predictor/ and service/ never import torch.
Inside predictor/ the layers are ordered ``core <- evaluate <- training <- lifecycle <-
cli``: a module imports its own layer or one below. Inside service/ the sides are ordered
``client <- middleware <- server`` the same way: what a training loop imports (the client
and the wire format) knows nothing of the server; the guard may import the client side only,
the command line the server side only. No import circle anywhere, counting
imports inside functions (the kind ``import x`` in a fresh interpreter cannot see) and
``if TYPE_CHECKING:`` imports (they never run, but a circle of names is a circle of
design all the same). An old path of a module moved to runfiles/ counts as its new home (``MOVED``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "collapse_guard"
LAYERS = ("core", "evaluate", "training", "lifecycle", "cli")  # each imports only those before
SIDES = ("client", "middleware", "server")  # service/'s, each imports only those before
# part -> the parts it may import; shared leaves (errors, signals, _config, ...) are open to all
LEAVES = {"errors", "signals", "_config", "_durable", "_scheduler", "_chained"}
ALLOWED: Mapping[str, set[str]] = {
    "runfiles": set(),
    "features": set(),
    "probe": {"runfiles"},  # the run recorder writes run files
    "datasets": {"runfiles", "probe", "features"},
    # datasets: the bundled model's synthetic runs, the training's progress bar
    "predictor": {"features", "runfiles", "datasets"},
    "service": {"features", "predictor.core"},
    "guard": {"probe", "features", "runfiles", "predictor.core", "service.client"},
    "integrations": {"guard"},
    "cli": {"datasets", "demo", "predictor", "service.server"},
    "demo": {"probe", "features", "runfiles", "datasets", "predictor", "guard"},
}
# The floors ALLOWED makes, lowest first: each part imports only parts on floors below it.
FLOORS = [
    {"features", "runfiles"},
    {"probe"},
    {"datasets"},
    {"predictor"},
    {"service"},
    {"guard"},
    {"demo", "integrations"},
    {"cli"},
]
NO_TORCH = ("features", "runfiles", "predictor", "service")
# Modules moved to runfiles/, their old paths kept for one release as thin re-exports: an
# import of one is an import of its new home (drop an entry with its re-export).
MOVED = {
    f"collapse_guard.datasets.{old}": f"collapse_guard.runfiles.{new}"
    for old, new in {
        "runfile": "format",  # and writer, reader: all three in runfiles
        "label": "label",
        "censor": "censoring",
        "relabel": "relabel",
        "ingest": "ingest",
        "summary": "card",
        "runs": "records",
    }.items()
}


@dataclass(frozen=True)
class Edge:
    source: str  # importing module, dotted
    target: str  # imported module (a submodule when ``from pkg import sub`` names one)
    line: int


def module_name(path: Path, root: Path = PACKAGE) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(
    name: str, source: str, known: set[str], *, is_package: bool = False
) -> Iterator[Edge]:
    """Every import in ``source`` (module ``name``), at any depth, relative ones resolved."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Edge(name, alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = name.split(".") if is_package else name.split(".")[:-1]
                package = package[: len(package) - node.level + 1]
                base = ".".join([*package, base] if base else package)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                yield Edge(name, sub if sub in known else base, node.lineno)


def part_of(module: str) -> str:
    """``predictor.<layer>`` inside predictor/, ``service.<side>`` inside service/ (or the
    old flat module's name), else the top-level part."""
    parts = module.split(".")
    if len(parts) > 2 and parts[1] in ("predictor", "service"):
        return f"{parts[1]}.{parts[2]}"
    return parts[1] if len(parts) > 1 else parts[0]


def _inner(order: tuple[str, ...], layer: str, dst_layer: str, strict: bool) -> bool:
    """Whether ``layer`` may import ``dst_layer`` inside one part whose inner layers are
    ``order``; outside ``order`` (service's old flat modules, kept for one release)
    anything of the part, unless ``strict``."""
    if layer not in order:
        return not strict
    return dst_layer in order and order.index(dst_layer) <= order.index(layer)


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
        dst_part = part_of(MOVED.get(dst, dst))
        top, dst_top = src.split(".")[0], dst_part.split(".")[0]
        if dst_top in LEAVES or src == dst_part:
            continue
        if top == dst_top and top in ("predictor", "service"):
            layer, dst_layer = src.partition(".")[2], dst_part.partition(".")[2]
            order = LAYERS if top == "predictor" else SIDES
            if not _inner(order, layer, dst_layer, strict=top == "predictor"):
                found.append(f"{e.source}:{e.line} ({layer}) imports {dst}")
            continue
        allowed = ALLOWED.get(top, set())  # "predictor": any layer; "predictor.core": that one
        if top != dst_top and dst_part not in allowed and dst_top not in allowed:
            found.append(f"{e.source}:{e.line} ({top}) imports {dst}")
    return found


def two_way(allowed: Mapping[str, set[str]]) -> list[tuple[str, str]]:
    """Pairs of parts that each may import the other (``predictor.core`` counts as predictor)."""
    tops = {part: {p.split(".")[0] for p in parts} for part, parts in allowed.items()}
    return sorted((a, b) for a in tops for b in tops[a] if a < b and a in tops.get(b, ()))


def floors(allowed: Mapping[str, set[str]]) -> list[set[str]]:
    """The parts by floor, lowest first: each on the floor above the highest it may import."""
    below = {part: {p.split(".")[0] for p in parts} - {part} for part, parts in allowed.items()}
    placed: set[str] = set()
    found: list[set[str]] = []
    while len(placed) < len(below):
        floor = {part for part, needs in below.items() if part not in placed and needs <= placed}
        if not floor:
            raise ValueError(f"no floor for {sorted(set(below) - placed)}: a circle of permits")
        found.append(floor)
        placed |= floor
    return found


def circles(edges: list[Edge]) -> list[list[str]]:
    """Strongly connected groups of modules (Tarjan), every kind of import counted."""
    graph: dict[str, set[str]] = {}
    for e in edges:
        graph.setdefault(e.source, set())
        if e.target != e.source and e.target.startswith("collapse_guard"):
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


def test_no_two_parts_permit_each_other():
    assert two_way(ALLOWED) == []
    # the check sees one: the probe and datasets as they were before runfiles/
    assert two_way({"probe": {"datasets"}, "datasets": {"probe", "features"}}) == [
        ("datasets", "probe")
    ]
    assert two_way({"guard": {"predictor.core"}, "predictor": {"guard"}}) == [
        ("guard", "predictor")
    ]


def test_the_parts_stand_on_floors_run_files_on_the_ground():
    assert floors(ALLOWED) == FLOORS
    with pytest.raises(ValueError, match="a circle of permits"):
        floors({"a": {"b"}, "b": {"c"}, "c": {"a"}})


def test_package_modules_import_moved_modules_by_their_new_path(package_edges):
    # only the old paths themselves (the re-exports of datasets/) may name an old path
    old = {e.source for e in package_edges if e.target in MOVED}
    assert sorted(m for m in old if m not in MOVED) == []


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
    assert violations(_edges("collapse_guard.service.server.scoring", package)) == [
        "collapse_guard.service.server.scoring:1 (service) imports collapse_guard.predictor"
    ]
    assert violations(_edges("collapse_guard.service.server.scoring", torch)) == [
        "collapse_guard.service.server.scoring:2 imports torch"
    ]
    assert violations(_edges("collapse_guard.guard.guard", torch)) == []  # the guard may
    assert violations(_edges("collapse_guard.features.stats", package)) == [
        "collapse_guard.features.stats:1 (features) imports collapse_guard.predictor"
    ]


def test_the_client_side_knows_nothing_of_the_server_and_the_guard_only_the_client():
    server = "from collapse_guard.service.server.scoring import Scorer\n"
    client = "from collapse_guard.service.client.wire import RiskResult\n"
    assert violations(_edges("collapse_guard.service.client.risk_client", server)) == [
        "collapse_guard.service.client.risk_client:1 (client) imports "
        "collapse_guard.service.server.scoring"
    ]
    assert violations(_edges("collapse_guard.service.server.scoring", client)) == []
    assert violations(_edges("collapse_guard.guard.risk_spec", client)) == []
    assert violations(_edges("collapse_guard.guard.risk_spec", server)) == [
        "collapse_guard.guard.risk_spec:1 (guard) imports collapse_guard.service.server.scoring"
    ]


def test_relative_imports_resolve_and_lazy_and_type_checking_imports_close_a_circle():
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
    assert circles(
        _edges("collapse_guard.predictor.core.risk", a)
        + _edges("collapse_guard.predictor.training.train", typed)
    ) == [["collapse_guard.predictor.core.risk", "collapse_guard.predictor.training.train"]]
