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
    assert users <= {"run", "cli", "simpar", "models"}, (
        f"only the entry points use the driver: {users}"
    )


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


def _module(path: Path) -> str:
    """Dotted module name of a source file (``simpar.drive.nbody``; packages by ``__init__``)."""
    parts = ("simpar", *path.relative_to(_SIMPAR).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_graph() -> dict[str, set[str]]:
    """Module -> the ``simpar`` modules it imports (lazy imports inside functions included;
    ``from simpar.a import b`` names module ``simpar.a.b`` when that is a module)."""
    files = {_module(f): f for f in _SIMPAR.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for mod, f in files.items():
        out = graph.setdefault(mod, set())
        for n in ast.walk(ast.parse(f.read_text())):
            names: list[str] = []
            if isinstance(n, ast.ImportFrom) and n.level == 0 and n.module:
                if n.module == "simpar" or n.module.startswith("simpar."):
                    subs = [f"{n.module}.{a.name}" for a in n.names]
                    names = [s for s in subs if s in files] or [n.module]
                    names += [n.module] if len(names) < len(subs) else []
            elif isinstance(n, ast.Import):
                names = [a.name for a in n.names if a.name.startswith("simpar.")]
            out.update(m for m in names if m in files and m != mod and m != "simpar")
    return graph


def test_no_module_imports_itself_through_another():
    cycle = _find_cycle(module_graph())
    assert cycle is None, f"import cycle between simpar modules: {' -> '.join(cycle)}"


def test_no_private_name_is_imported_across_packages():
    bad = []
    for f in sorted(_SIMPAR.rglob("*.py")):
        mine = _node(f)
        for n in ast.walk(ast.parse(f.read_text())):
            if isinstance(n, ast.ImportFrom) and n.level == 0 and n.module:
                if not n.module.startswith("simpar.") or _target(n.module) == mine:
                    continue
                private = [a.name for a in n.names if a.name.startswith("_")]
                private += [n.module] if any(p.startswith("_") for p in n.module.split(".")) else []
                bad += [f"{f.relative_to(_SIMPAR)}: {n.module} {p}" for p in private]
    assert not bad, f"private names imported across packages: {bad}"


ENGINE_NAMES = {"single", "pmap", "shard_map", "sharded"}


def engine_name_comparisons(path: Path) -> int:
    """Comparisons (``==``, ``!=``, ``in``) with an engine name as a string constant."""

    def strings(node) -> set:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return {node.value}
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return set().union(*(strings(e) for e in node.elts)) if node.elts else set()
        return set()

    return sum(
        1
        for n in ast.walk(ast.parse(path.read_text()))
        if isinstance(n, ast.Compare)
        and any(strings(p) & ENGINE_NAMES for p in (n.left, *n.comparators))
    )


def test_engine_names_are_compared_only_in_the_mapping():
    """Which engine does what is ``simpar.parallel.mapping``'s business (``kind(engine)``);
    the command line parses the option. Nowhere else compares an engine name."""
    allowed = {"parallel/mapping.py", "cli.py"}
    assert engine_name_comparisons(Path(__file__)) > 0  # the counter counts this file's own
    found = {
        str(f.relative_to(_SIMPAR)): k
        for f in sorted(_SIMPAR.rglob("*.py"))
        if (k := engine_name_comparisons(f)) and str(f.relative_to(_SIMPAR)) not in allowed
    }
    assert not found, f"engine names compared outside simpar.parallel.mapping: {found}"


def _compares_engines_for_the_counter_test(engine):  # counted by the test above
    return engine == "pmap"
