"""Layers a newcomer can read (issue 16, item 4): no import cycles between the packages of
``simpar``, the lower layers import nothing above them, and no module is over ~500 lines.

The import graph is read from the source (``ast``), lazy imports inside functions included,
so a cycle hidden behind a function-level import is found too. Nodes are the subpackages
(``grid``, ``particles``, ``parallel``, ``io``, ``drive``) and the top-level modules
(``config``, ``errors``, ``cli`` ...).
"""

from __future__ import annotations

import ast
from pathlib import Path

_SIMPAR = Path(__file__).resolve().parents[1] / "simpar"
_MAX_LINES = 520  # "about 500"


def _node(path: Path) -> str:
    """Graph node of a source file: its subpackage, or its module name at the top level."""
    rel = path.relative_to(_SIMPAR).parts
    if len(rel) > 1:
        return rel[0]
    return "simpar" if rel[0] == "__init__.py" else rel[0][:-3]


def _target(module: str) -> str | None:
    """Graph node of an imported ``simpar...`` module name (None for ``simpar`` itself)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def import_graph() -> dict[str, set[str]]:
    """Node -> the other nodes its files import (absolute ``simpar`` imports, lazy ones too)."""
    graph: dict[str, set[str]] = {}
    for f in sorted(_SIMPAR.rglob("*.py")):
        src = _node(f)
        out = graph.setdefault(src, set())
        for n in ast.walk(ast.parse(f.read_text())):
            names: list[str] = []
            if isinstance(n, ast.ImportFrom) and n.level == 0 and n.module:
                if n.module == "simpar":  # from simpar import errors, __version__
                    names = [f"simpar.{a.name}" for a in n.names]
                elif n.module.startswith("simpar."):
                    names = [n.module]
            elif isinstance(n, ast.Import):
                names = [a.name for a in n.names if a.name.startswith("simpar.")]
            for m in names:
                dst = _target(m)
                known = dst and ((_SIMPAR / dst).is_dir() or (_SIMPAR / f"{dst}.py").exists())
                if known and dst != src:  # not __version__ and the like
                    out.add(dst)
    return graph


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a node list (first node repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(u: str) -> list[str] | None:
        state[u] = 1
        stack.append(u)
        for v in sorted(graph.get(u, ())):
            if state.get(v) == 1:
                return stack[stack.index(v) :] + [v]
            if v not in state and (c := visit(v)):
                return c
        stack.pop()
        state[u] = 2
        return None

    for u in sorted(graph):
        if u not in state and (c := visit(u)):
            return c
    return None


def test_find_cycle_finds_one():
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycles_between_packages():
    graph = import_graph()
    assert {"grid", "particles", "parallel", "io", "drive"} <= set(graph)
    cycle = _find_cycle(graph)
    assert cycle is None, f"import cycle between simpar packages: {' -> '.join(cycle)}"


def test_lower_layers_import_nothing_above_them():
    graph = import_graph()
    # what each package may import (besides the leaf modules errors, axes, precision,
    # config, memory): kernels and devices below, the driver above them all
    above = {
        "io": {"grid", "particles", "parallel", "drive", "cli", "run"},
        "parallel": {"grid", "particles", "io", "drive", "cli", "run"},
        "grid": {"particles", "parallel", "io", "drive", "cli", "run"},
        "particles": {"io", "drive", "cli", "run"},  # grid: e.g. a particle-mesh solver
    }
    for pkg, forbidden in above.items():
        bad = graph[pkg] & forbidden
        assert not bad, f"simpar.{pkg} imports {sorted(bad)} (a layer above it)"
    users = {node for node, deps in graph.items() if "drive" in deps}
    # models: the registry (simpar.models.grid_model builds a grid model of the driver)
    assert users <= {"run", "cli", "simpar", "models"}, f"only the entry points use the driver: {users}"


def test_no_module_over_about_500_lines():
    sizes = {
        str(f.relative_to(_SIMPAR)): len(f.read_text().splitlines()) for f in _SIMPAR.rglob("*.py")
    }
    big = {k: v for k, v in sizes.items() if v > _MAX_LINES}
    assert not big, f"modules over {_MAX_LINES} lines (split them): {big}"


def test_readme_layout_names_every_module_in_layer_order():
    """docs/architecture.md "Layout" is the module map: every module is named, and the
    top-level entries are listed lowest layer first (each imports only entries above it)."""
    readme = (_SIMPAR.parent / "docs" / "architecture.md").read_text()
    block = readme.split("## Layout\n", 1)[1].split("```", 2)[1]
    for f in _SIMPAR.rglob("*.py"):
        if f.name not in ("__init__.py", "__main__.py"):
            where = f.relative_to(_SIMPAR)
            assert f" {f.name}" in block, f"docs/architecture.md Layout does not name {where}"
    top = [
        line.split()[0].rstrip("/").removesuffix(".py")
        for line in block.splitlines()
        if line.startswith("  ") and not line.startswith("   ") and line.strip()
    ]
    rank = {name: i for i, name in enumerate(top)}
    for node, deps in import_graph().items():
        if node in ("simpar", "__main__"):
            continue
        assert node in rank, f"docs/architecture.md Layout does not list {node}"
        late = sorted(d for d in deps if rank[d] >= rank[node])
        assert not late, f"docs/architecture.md Layout lists {node} above {late}, which it imports"
