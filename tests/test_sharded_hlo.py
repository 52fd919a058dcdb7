"""The compiled ``sharded`` step moves halos only: no all-gather, no all-to-all, slab-sized permutes.

Read from the compiled HLO of one chunk (``jit(...).lower(...).compile().as_text()``, after SPMD
partitioning) for every grid model, boundary mixes (periodic, Dirichlet, Neumann, LBM wall and
lid, on either axis, on split and unsplit axes) and the meshes (8,), (1,8), (8,1), (2,4), (4,2),
(2,2,2). Each collective moves at most ``w`` x (block face with its halo) elements per array
(``w`` the halo width); the grids are chosen so that a whole block is larger than that bound.
The chunk is 2 exchanges (a ``fori_loop``, as in real runs). Results equal ``single`` bitwise
(``test_engines.py``, ``test_lbm.py``, ...); this file checks only what moves.
"""

import math

import numpy as np
import pytest

from simpar.grid import advection, gray_scott, heat, lbm_config, wave
from simpar.grid.boundary import Dirichlet, Neumann, Periodic
from simpar.grid.domain import Domain
from simpar.parallel.engines import make_engine
from simpar.parallel.hlo import collectives

PER = (Periodic(), Periodic())
DIR = (Dirichlet(0.5), Dirichlet(-1.0))
NEU = (Neumann(), Neumann())
MIX = (Dirichlet(0.5), Neumann())
WALL = ("wall", "wall")
LID = ("wall", "lid")
LPER = ("periodic", "periodic")


def _setup(kind, bcs, shape):
    """(model, host state, params) of a small float64 case."""
    d = len(shape)
    dom = Domain(shape, tuple(0.1 * n for n in shape), "float64")
    rng = np.random.default_rng(0)
    field = lambda: rng.random(shape)  # noqa: E731
    if kind in ("heat5", "heat9"):
        model = heat.make_model(d, bcs, kind[4:] + "pt")
        return model, {"u": field()}, heat.make_params(dom, 1.0, 1e-4)
    if kind == "wave":
        return (
            wave.make_model(d, bcs),
            {"u": field(), "u_prev": field()},
            wave.make_params(dom, 1.0, 1e-3),
        )
    if kind.startswith("advection"):
        scheme, flow = kind.split("_")[1:]
        model = advection.make_model(d, bcs, scheme, flow=flow)
        state = {"q": field()}
        if flow == "rotation":
            state.update(advection.rotation_velocity(dom, 1.0, [L / 2 for L in dom.length]))
            return model, state, advection.make_params(dom, 1e-3)
        return model, state, advection.make_params(dom, 1e-3, [1.0, -0.5, 0.25][:d])
    if kind == "gray_scott":
        return (
            gray_scott.make_model(d, bcs),
            {"u": field(), "v": field()},
            gray_scott.make_params(dom, 2e-5, 1e-5, 0.04, 0.06, 1.0),
        )
    s = lbm_config.lattice_setup(
        shape, walls=bcs, viscosity=0.05, u_lid=0.05 if LID in bcs else 0.0, dtype="float64"
    )
    return s.model, s.state, s.params


S2, S3 = (32, 32), (8, 8, 8)
MESHES_2D = [(8,), (1, 8), (8, 1), (2, 4), (4, 2)]
MESHES_4 = [(8,), (1, 8), (2, 4), (4, 2)]  # (8, 1) is the grid of (8,)
# (model, boundary conditions per axis, grid shape, meshes, halo width); every boundary kind
# sits on a split axis on some mesh and on an unsplit one on another
CASES = [
    ("heat5", (PER, PER), S2, MESHES_2D, 1),
    ("heat5", (MIX, PER), S2, MESHES_2D, 1),
    ("heat5", (PER, DIR), S2, MESHES_4, 1),
    ("heat5", (DIR, NEU), S2, [(8,), (2, 4)], 2),
    ("heat9", (MIX, (Neumann(), Dirichlet(1.0))), S2, MESHES_4, 1),
    ("wave", (DIR, PER), S2, [(8,), (1, 8), (4, 2)], 1),
    ("wave", (PER, NEU), S2, [(2, 4)], 1),
    ("advection_upwind_uniform", (PER, DIR), S2, [(1, 8), (4, 2)], 1),
    ("advection_muscl_uniform", (DIR, NEU), S2, [(8,), (2, 4)], 2),
    ("advection_muscl_rotation", (NEU, PER), S2, [(1, 8), (4, 2)], 2),
    ("gray_scott", (NEU, PER), S2, [(8,), (2, 4)], 1),
    ("gray_scott", (PER, PER), S2, [(1, 8)], 1),
    ("lbm", (LPER, LPER), S2, [(8,), (1, 8), (2, 4)], 1),
    ("lbm", (WALL, LID), S2, MESHES_4, 1),
    ("lbm", (LPER, WALL), S2, [(2, 4)], 1),
    ("heat5", (MIX, PER, (Neumann(), Dirichlet(1.0))), (16, 16, 8), [(2, 2, 2), (2, 4)], 1),
    ("lbm", (LPER, LPER, LPER), S3, [(2, 2, 2)], 1),
    ("lbm", (WALL, LPER, LID), S3, [(2, 2, 2)], 1),
]
PARAMS = [
    pytest.param(kind, bcs, shape, mesh, w, id=f"{kind}-{i}-{'x'.join(map(str, mesh))}")
    for i, (kind, bcs, shape, meshes, w) in enumerate(CASES)
    for mesh in meshes
]


def _face_bound(shape, mesh, w) -> int:
    """``w`` x the largest block face with its halo (elements): the most one halo slab holds."""
    grid = tuple(mesh) + (1,) * (len(shape) - len(mesh))
    block = [n // m for n, m in zip(shape, grid, strict=True)]
    faces = [math.prod(b + 2 * w for j, b in enumerate(block) if j != a) for a in range(len(block))]
    return w * max(faces)


@pytest.mark.slow
@pytest.mark.parametrize("kind,bcs,shape,mesh,w", PARAMS)
def test_sharded_step_moves_only_halo_slabs(kind, bcs, shape, mesh, w):
    model, state, params = _setup(kind, bcs, shape)
    e = make_engine("sharded", model, shape, mesh, w)
    steps = 2 * max(w // model.radius, 1)  # two exchanges, in a loop
    text = e.lowered_advance(e.place(state), params, steps).compile().as_text()
    found = collectives(text)
    ops = {c.op for c in found}
    assert not ops - {"collective-permute", "all-reduce"}, [
        (c.op, c.shapes) for c in found if c.op not in ("collective-permute", "all-reduce")
    ]
    grid = tuple(mesh) + (1,) * (len(shape) - len(mesh))
    block = math.prod(n // m for n, m in zip(shape, grid, strict=True))
    bound = _face_bound(shape, mesh, w)
    assert bound < block  # the check below tells a slab from a block
    assert "collective-permute" in ops  # every mesh here splits an axis
    for c in found:
        for dtype, dims in c.shapes:
            assert math.prod(dims) <= bound, (c.op, dtype, dims, f"bound {bound}", c.computation)
    # per exchange, at most two slabs per split axis and field
    split = sum(m > 1 for m in grid)
    assert sum(c.elements for c in found) <= 2 * split * len(state) * bound


@pytest.mark.parametrize(
    "kind,bcs,mesh",
    [("wave", (MIX, PER), (2, 4))],
    ids=["wave-2x4"],
)
def test_sharded_diagnostics_move_only_halo_slabs_and_equal_single(kind, bcs, mesh):
    """Diagnostics whose model sums read the halo (the wave energy's Laplacian) pad the blocks
    like a step; field sums and profiles reduce with all-reduces of at most a block face."""
    from simpar.testing import run_engine

    model, state, params = _setup(kind, bcs, S2)
    e = make_engine("sharded", model, S2, mesh, 1)
    found = collectives(e._compile_observe().lower(e.place(state), params).compile().as_text())
    assert {c.op for c in found} <= {"collective-permute", "all-reduce"}
    assert all(c.largest <= _face_bound(S2, mesh, 1) for c in found)
    _, ref = run_engine("single", model, state, params, 3)
    _, got = run_engine("sharded", model, state, params, 3, mesh, 1)
    assert set(got) == set(ref)
    for k in ref:
        np.testing.assert_allclose(got[k], ref[k], rtol=1e-12, atol=1e-14, err_msg=k)


# --------------------------------------------------------------------------------------------
# parallel.halo: validated and honoured like on the per-block engines
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "config,args,message",
    [
        (
            "experiments/advection2d.toml",
            ["--set", "parallel.halo=1"],
            "parallel.halo: halo width 1 is below the stencil radius 2 of model advection",
        ),
        (
            "experiments/heat2d.toml",
            ["--mesh", "8x1", "--set", "grid.shape=[32,32]", "--set", "parallel.halo=8"],
            "parallel.halo: halo width 8 exceeds the block size 4 along x",
        ),
    ],
    ids=["muscl-halo-1", "halo-wider-than-block"],
)
def test_sharded_refuses_the_halo_the_other_engines_refuse(tmp_path, capsys, config, args, message):
    from simpar.cli import main

    for engine in ("shard_map", "sharded"):
        out = tmp_path / f"{engine}.nc"
        code = main(["run", config, "--engine", engine, "--out", str(out), *args])
        err = capsys.readouterr().err
        assert code == 2, (engine, err)
        assert message in err, (engine, err)
        assert "Traceback" not in err and not out.exists()


def test_sharded_runs_the_configured_halo_and_labels_it(tmp_path):
    """halo 3 on a 2x4 mesh: three steps per exchange, bitwise equal to single, file says 3."""
    import h5py

    from simpar.cli import main

    files = {}
    for engine in ("single", "sharded"):
        files[engine] = tmp_path / f"{engine}.h5"
        args = ["run", "experiments/heat2d.toml", "--engine", engine, "--out", str(files[engine])]
        args += ["--set", "grid.shape=[32,32]", "--set", "time.dt=5e-5", "--steps", "7"]
        args += ["--set", "output.every=7", "--set", "parallel.halo=3"]
        assert main(args + (["--mesh", "2x4"] if engine == "sharded" else [])) == 0
    with h5py.File(files["sharded"]) as f, h5py.File(files["single"]) as g:
        assert np.ravel(f.attrs["halo_width"]).tolist() == [3]
        assert list(f.attrs["device_mesh"]) == [2, 4]
        np.testing.assert_array_equal(f["u"][-1], g["u"][-1])
