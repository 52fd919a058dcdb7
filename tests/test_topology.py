"""Device grids: neighbour pairs, row/column groups, mesh parsing and the errors users see."""

import ast
import re
from pathlib import Path

import pytest

from simpar.errors import ConfigError
from simpar.parallel import blocks, mapping
from simpar.parallel.topology import DeviceGrid, make_device_grid, parse_mesh


def test_shift_pairs_periodic_and_not():
    g = DeviceGrid((2, 4), (True, False))
    # along axis 1 (not periodic): 0->1, 1->2, 2->3 in each row, no wrap
    assert g.shift_pairs(1, +1) == [(0, 1), (1, 2), (2, 3), (4, 5), (5, 6), (6, 7)]
    assert g.shift_pairs(1, -1) == [(1, 0), (2, 1), (3, 2), (5, 4), (6, 5), (7, 6)]
    # along axis 0 (periodic, 2 devices): each sends to the other
    assert sorted(g.shift_pairs(0, +1)) == [
        (0, 4),
        (1, 5),
        (2, 6),
        (3, 7),
        (4, 0),
        (5, 1),
        (6, 2),
        (7, 3),
    ]
    assert g.axis_pairs(1, +1) == [(0, 1), (1, 2), (2, 3)]
    assert g.axis_pairs(0, -1) == [(0, 1), (1, 0)]


def test_groups_are_rows_and_columns():
    g = DeviceGrid((2, 4), (True, True))
    assert g.groups((0,)) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert g.groups((1,)) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    g3 = DeviceGrid((2, 2, 2), (True,) * 3)
    assert g3.groups((0, 1)) == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert g3.coords(5) == (1, 0, 1) and g3.index((1, 0, 1)) == 5


@pytest.mark.parametrize("text,shape", [("8", (8,)), ("2x4", (2, 4)), ("2X2x2", (2, 2, 2))])
def test_parse_mesh(text, shape):
    assert parse_mesh(text) == shape


@pytest.mark.parametrize("text", ["", "2x", "0x4", "a", "1x1x1x1"])
def test_parse_mesh_rejects(text):
    with pytest.raises(ConfigError, match="--mesh"):
        parse_mesh(text)


def test_mesh_must_divide_domain():
    with pytest.raises(ConfigError, match=r"grid shape 30x64 does not divide over device mesh 4x2"):
        make_device_grid((4, 2), (30, 64), (True, True), 1)
    with pytest.raises(ConfigError, match="more axes"):
        make_device_grid((2, 2, 2), (16, 16), (True, True), 1)
    with pytest.raises(ConfigError, match="halo width 3 exceeds the block size 2"):
        make_device_grid((8,), (16, 16), (True, True), 3)
    assert make_device_grid((8,), (16, 16), (True, False), 2).shape == (8, 1)


# ------------------------------------------------- one place for meshes; layers without cycles

_SIMPAR = Path(__file__).resolve().parents[1] / "simpar"
# parallel/domain.py (decomposed MD) is being split; it imports particles until then
_PENDING: set[str] = set()  # every parallel module follows the layer rules


def _imports(path: Path) -> set[str]:
    """Every ``simpar`` module named by an import statement of ``path`` (lazy ones included)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("simpar"):
            out |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("simpar")}
    return out


def test_parallel_imports_no_model_and_models_import_no_parallel_topology():
    for f in sorted((_SIMPAR / "parallel").glob("*.py")):
        if f.name in _PENDING:
            continue
        bad = {m for m in _imports(f) if m.startswith(("simpar.grid", "simpar.particles"))}
        assert not bad, f"parallel/{f.name} imports {sorted(bad)}: pass kernels in instead"
    for f in sorted((_SIMPAR / "grid").rglob("*.py")):
        bad = {m for m in _imports(f) if m.startswith("simpar.parallel")}
        assert not bad, f"grid/{f.name} imports {sorted(bad)}"


def test_meshes_and_mapped_programs_are_built_only_in_blocks():
    built = re.compile(r"\bMesh\(|jax\.pmap\(|jax\.shard_map\(|NamedSharding\(|make_mesh\(")
    for f in sorted(_SIMPAR.rglob("*.py")):
        if f.parent.name == "parallel" and f.name in {"blocks.py", *_PENDING}:
            continue
        text = re.sub(r"blocks\.make_mesh\(", "", f.read_text())
        assert not built.search(text), f"{f.relative_to(_SIMPAR)} builds a mesh or a mapped program"
    engines = [
        f
        for f in _SIMPAR.rglob("*.py")
        if '("single", "pmap", "shard_map", "sharded")' in f.read_text()
        or '"single": EngineKind(' in f.read_text()
    ]
    assert [f.name for f in engines if f.parent.name == "parallel"] == ["mapping.py"]


def test_default_mesh_and_device_checks():
    assert mapping.default_mesh("single", (2, 4), 8) == (1,)
    assert mapping.default_mesh("pmap", None, 8) == (8,)
    assert mapping.default_mesh("sharded", None, 8, members=4) == (2,)
    assert mapping.default_mesh("shard_map", [2, 4], 8) == (2, 4)
    blocks.require_devices((2, 4), 8)
    with pytest.raises(ConfigError, match=r"mesh 4x4 needs 16 devices but only 8") as err:
        blocks.require_devices((4, 4), 8)
    assert err.value.key == "--mesh"
    with pytest.raises(ConfigError, match=r"2 members x mesh 2x4 need 16 devices"):
        blocks.require_devices((2, 4), 8, "ensemble.members", members=2)
    with pytest.raises(ConfigError, match=r"9 devices requested, JAX sees 8"):
        blocks.require_count(9)
    with pytest.raises(ConfigError, match=r"unknown engine 'gpu'; choose one of single, pmap"):
        mapping.check_engine("gpu")
