"""Files from outside are untrusted, memory limits are the real ones (issue 17, items 3 and 4).

Each damaged or crafted HDF5 file is built here: huge dims (refused from the metadata, never
allocated), string / int8 / compound dtypes, a string or negative ``step``, a scalar state,
HDF5 external storage pointing at another file, a virtual dataset, external and soft links;
H5MD inputs with huge dims, box edges of 1e12, a bad ``boundary``. Every one gives a
``ConfigError`` naming the file and the dataset, and through the command line exit 2 with no
traceback. Memory: ``RLIMIT_AS`` set in a subprocess caps what a run may allocate. LJ and
N-body checkpoints: ``tests/test_untrusted_particles.py``.
"""

import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from simpar import memory
from simpar.errors import ConfigError
from simpar.io import checkpoint, h5md

ROOT = Path(__file__).resolve().parents[1]
SHAPE = (16, 16)
EXPECTED = {"u": (SHAPE, np.dtype("float32"))}


def _cli(*args, rlimit_as=None, timeout=300):
    """``python -m simpar ARGS`` in a fresh process; with ``rlimit_as`` (bytes) under that
    address-space limit (set by the child itself before it starts simpar: no fork-time hook
    in this multithreaded test process)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    prefix = ["-m", "simpar"]
    if rlimit_as is not None:
        code = (
            f"import os, resource, sys; limit = {int(rlimit_as)}; "
            "resource.setrlimit(resource.RLIMIT_AS, (limit, limit)); "
            "os.execv(sys.executable, [sys.executable, '-m', 'simpar', *sys.argv[1:]])"
        )
        prefix = ["-c", code]
    return subprocess.run(
        [sys.executable, *prefix, *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=timeout,
    )


def _good_checkpoint(path: Path) -> None:
    checkpoint.save(path, {"u": np.zeros(SHAPE, np.float32)}, 4, "[model]\nname='heat'\n", "heat")


def _rewrite(path: Path, build) -> None:
    """Replace ``/state/u`` (and maybe attributes) of a good checkpoint with ``build(f, g)``."""
    with h5py.File(path, "a") as f:
        del f["state"]["u"]
        build(f, f["state"])


def _raw(tmp: Path) -> Path:
    other = tmp / "secret.bin"
    other.write_bytes(np.arange(256, dtype=np.float32).tobytes())
    return other


def _virtual(f, g, tmp):
    src = tmp / "src.h5"
    with h5py.File(src, "w") as s:
        s["x"] = np.ones(SHAPE, np.float32)
    layout = h5py.VirtualLayout(shape=SHAPE, dtype="f4")
    layout[:] = h5py.VirtualSource(str(src), "x", shape=SHAPE)
    g.create_virtual_dataset("u", layout)


def _external_link(f, g, tmp):
    src = tmp / "src.h5"
    with h5py.File(src, "w") as s:
        s["x"] = np.ones(SHAPE, np.float32)
    g["u"] = h5py.ExternalLink(str(src), "/x")


def _soft_link(f, g, tmp):
    f["elsewhere"] = np.ones(SHAPE, np.float32)
    g["u"] = h5py.SoftLink("/elsewhere")


def _string_step(f, g, tmp):
    g["u"] = np.zeros(SHAPE, np.float32)
    f.attrs["step"] = "4"


def _negative_step(f, g, tmp):
    g["u"] = np.zeros(SHAPE, np.float32)
    f.attrs["step"] = np.int64(-3)


# name -> (build(f, state_group, tmp), what the message must name, refused without expected)
CRAFTED = {
    "huge dims": (
        lambda f, g, t: g.create_dataset("u", (300_000, 300_000), "f4", chunks=(64, 64)),
        "/state/u",
        True,
    ),
    "vlen string": (lambda f, g, t: g.create_dataset("u", data=["a"] * 16), "/state/u", True),
    "int8": (lambda f, g, t: g.create_dataset("u", SHAPE, "i1"), "/state/u", False),
    "fixed bytes": (lambda f, g, t: g.create_dataset("u", SHAPE, "S8"), "/state/u", False),
    "compound": (
        lambda f, g, t: g.create_dataset("u", SHAPE, np.dtype([("a", "f4"), ("b", "i4")])),
        "/state/u",
        True,
    ),
    "scalar state": (lambda f, g, t: g.create_dataset("u", data=np.float32(1)), "/state/u", False),
    "external storage": (
        lambda f, g, t: g.create_dataset(
            "u", SHAPE, "f4", external=[(str(_raw(t)), 0, h5py.h5f.UNLIMITED)]
        ),
        "/state/u",
        True,
    ),
    "virtual dataset": (_virtual, "/state/u", True),
    "external link": (_external_link, "/state/u", True),
    "soft link": (_soft_link, "/state/u", True),
    "string step": (_string_step, "'step'", True),
    "negative step": (_negative_step, "'step'", True),
    "NaN state": (
        lambda f, g, t: g.create_dataset("u", data=np.full(SHAPE, np.nan, np.float32)),
        "/state/u",
        False,
    ),
}


@pytest.mark.parametrize("case", sorted(CRAFTED))
def test_crafted_grid_checkpoints_are_refused_before_reading(tmp_path, case):
    build, names, refused_anyway = CRAFTED[case]
    path = tmp_path / "run.nc.ckpt"
    _good_checkpoint(path)
    assert checkpoint.load(path, expected=EXPECTED)[1] == 4  # the good one loads
    _rewrite(path, lambda f, g: build(f, g, tmp_path))
    with pytest.raises(ConfigError) as e:
        checkpoint.load(path, expected=EXPECTED)
    assert e.value.key == "--resume" and names in str(e.value) and str(path) in str(e.value)
    if refused_anyway:  # particle runs read without ``expected``: still refused
        with pytest.raises(ConfigError) as e:
            checkpoint.load(path)
        assert names in str(e.value)
    else:  # plain numbers of any shape are read when the caller expects nothing
        assert "u" in checkpoint.load(path)[0]


def test_expected_reads_only_what_the_run_needs(tmp_path):
    path = tmp_path / "run.nc.ckpt"
    _good_checkpoint(path)
    with h5py.File(path, "a") as f:  # an extra member is never read, however it is stored
        f["state"]["junk"] = h5py.ExternalLink(str(tmp_path / "nope.h5"), "/x")
    state, step, _, model = checkpoint.load(path, expected=EXPECTED)
    assert list(state) == ["u"] and step == 4 and model == "heat"
    with pytest.raises(ConfigError, match="/state/v"):
        checkpoint.load(path, expected={"v": (SHAPE, np.float32)})
    assert checkpoint.expected_of({"u": np.zeros(SHAPE, np.float32)}) == EXPECTED


def test_a_checkpoint_larger_than_memory_is_refused_without_allocating(tmp_path, monkeypatch):
    path = tmp_path / "run.nc.ckpt"
    _good_checkpoint(path)
    monkeypatch.setattr(memory, "memory_limits", lambda: {"test limit": 512})
    with pytest.raises(ConfigError, match=r"/state/u.*GiB are available"):
        checkpoint.load(path)  # 1 KiB > 512 bytes


@pytest.fixture(scope="module")
def heat_run(tmp_path_factory):
    """A 16x16 heat run of 4 steps with its checkpoint (through the command line)."""
    tmp = tmp_path_factory.mktemp("heat")
    out = tmp / "run.nc"
    sets = ["grid.shape=[16,16]", "time.dt=1e-4", "output.every=2"]
    r = _cli(
        "run",
        "experiments/heat2d.toml",
        "--steps",
        "4",
        "--out",
        str(out),
        *sum((["--set", s] for s in sets), []),
    )
    assert r.returncode == 0, r.stderr
    return out, sets


@pytest.mark.parametrize(
    "case", ["huge dims", pytest.param("external storage", marks=pytest.mark.slow), "string step"]
)
def test_resume_from_a_crafted_checkpoint_exits_2_naming_the_dataset(heat_run, case, tmp_path):
    out, sets = heat_run
    run = tmp_path / "run.nc"
    run.write_bytes(out.read_bytes())
    ck = checkpoint.checkpoint_path(run)
    ck.write_bytes(checkpoint.checkpoint_path(out).read_bytes())
    build, names, _ = CRAFTED[case]
    _rewrite(ck, lambda f, g: build(f, g, tmp_path))
    r = _cli(
        "run",
        "experiments/heat2d.toml",
        "--steps",
        "8",
        "--out",
        str(run),
        "--resume",
        *sum((["--set", s] for s in sets), []),
    )
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and names in r.stderr and str(ck) in r.stderr


# ---- H5MD inputs (system.file) --------------------------------------------------------------


def _h5md(path: Path, n: int = 8, edges=(4.0, 4.0, 4.0)) -> Path:
    rng = np.random.default_rng(0)
    with h5md.H5MDWriter(path, n, dtype="float64", rng_key=True, mass=np.ones(n)) as w:
        w.append(
            0,
            0.0,
            rng.random((n, 3)) * 4,
            box=np.asarray(edges),
            velocity=np.zeros((n, 3)),
            rng_key=np.zeros(2, np.uint32),
        )
    return path


def _swap(path: Path, where: str, build) -> None:
    with h5py.File(path, "a") as f:
        parent, name = where.rsplit("/", 1)
        del f[parent][name]
        build(f[parent], name)


H5MD_CRAFTED = {
    "huge dims": (
        "particles/trajectory/position/value",
        lambda g, n: g.create_dataset(n, (1, 10**12, 3), "f8", chunks=(1, 1024, 3)),
    ),
    "string dtype": (
        "particles/trajectory/position/value",
        lambda g, n: g.create_dataset(n, (1, 8, 3), h5py.string_dtype()),
    ),
    "int8 velocity": (
        "particles/trajectory/velocity/value",
        lambda g, n: g.create_dataset(n, (1, 8, 3), "i1"),
    ),
    "velocity of another shape": (
        "particles/trajectory/velocity/value",
        lambda g, n: g.create_dataset(n, (1, 7, 3), "f8"),
    ),
    "external link": (
        "particles/trajectory/position/value",
        lambda g, n: g.__setitem__(n, h5py.ExternalLink("/etc/hostname", "/x")),
    ),
    "external storage": (
        "particles/trajectory/velocity/value",
        lambda g, n: g.create_dataset(n, (1, 8, 3), "f8", external=[("/etc/hostname", 0, 192)]),
    ),
    "compound mass": (
        "particles/trajectory/mass",
        lambda g, n: g.create_dataset(n, (8,), np.dtype([("a", "f4"), ("b", "i4")])),
    ),
}


@pytest.mark.parametrize("case", sorted(H5MD_CRAFTED))
def test_crafted_h5md_inputs_are_refused_naming_the_dataset(tmp_path, case):
    path = _h5md(tmp_path / "in.h5md")
    assert h5md.read_frame(path)["position"].shape == (8, 3)
    where, build = H5MD_CRAFTED[case]
    _swap(path, where, build)
    with pytest.raises(ConfigError) as e:
        h5md.read_frame(path)
    assert e.value.key == "system.file"
    assert "/" + where in str(e.value) and str(path) in str(e.value)


def test_h5md_box_edges_and_boundary_are_checked(tmp_path):
    path = _h5md(tmp_path / "big.h5md", edges=(1e12, 1e12, 1e12))
    assert h5md.read_frame(path)["box"].tolist() == [1e12] * 3  # no cell length: just read
    with pytest.raises(ConfigError, match="/particles/trajectory/box/edges/value.*cells"):
        h5md.read_frame(path, cell_length=2.8)  # cutoff 2.5 + skin 0.3: 4.6e34 cells
    assert h5md.read_frame(_h5md(tmp_path / "ok.h5md"), cell_length=2.8)["box"].tolist() == [4] * 3
    for edges in ([np.inf, 1, 1], [-1.0, 1, 1]):
        with pytest.raises(ConfigError, match="finite edge lengths"):
            h5md.check_box(path, edges, ["periodic"] * 3, None)
    with h5py.File(path, "a") as f:
        f["particles/trajectory/box"].attrs["boundary"] = ["banana"] * 3
    with pytest.raises(ConfigError, match="boundary.*banana"):
        h5md.read_frame(path)


def test_system_file_with_huge_dims_exits_2(tmp_path):
    path = _h5md(tmp_path / "in.h5md")
    where, build = H5MD_CRAFTED["huge dims"]
    _swap(path, where, build)
    cfg = tmp_path / "lj.toml"
    cfg.write_text(
        f'[model]\nname = "lj"\n[system]\ninit = "h5md"\nfile = "{path}"\n'
        f'[time]\ndt = 0.005\nsteps = 2\n[output]\npath = "{tmp_path / "out.h5md"}"\n'
    )
    r = _cli("run", str(cfg))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "/" + where in r.stderr and not (tmp_path / "out.h5md").exists()


# ---- memory limits --------------------------------------------------------------------------


def test_available_memory_is_the_smallest_limit(tmp_path, monkeypatch):
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "memory.max").write_text(f"{3 * memory.GIB}\n")
    (v2 / "memory.current").write_text(f"{memory.GIB}\n")
    assert memory.cgroup_available(v2)[0] == 2 * memory.GIB
    assert "memory.max" in memory.cgroup_available(v2)[1]
    (v2 / "memory.max").write_text("max\n")
    assert memory.cgroup_available(v2) is None
    v1 = tmp_path / "v1" / "memory"
    v1.mkdir(parents=True)
    (v1 / "memory.limit_in_bytes").write_text(f"{5 * memory.GIB}\n")
    (v1 / "memory.usage_in_bytes").write_text(f"{memory.GIB}\n")
    assert memory.cgroup_available(tmp_path / "v1")[0] == 4 * memory.GIB
    (v1 / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # v1's "no limit"
    assert memory.cgroup_available(tmp_path / "v1") is None
    monkeypatch.setattr(memory, "CGROUP_ROOT", str(tmp_path / "v1"))
    (v1 / "memory.limit_in_bytes").write_text(f"{5 * memory.GIB}\n")
    limits = memory.memory_limits()
    assert any("cgroup v1" in k for k in limits) and "free RAM (MemAvailable)" in limits
    got = memory.available()
    assert got == (min(limits.values()), min(limits, key=limits.get))
    with pytest.raises(
        ConfigError, match=r"grid.shape: the run needs about 1e\+03 GiB .*limited by cgroup v1"
    ):
        memory.check_fits(1000 * memory.GIB, "grid.shape", "a test", "reduce it")


def test_ulimit_v_caps_a_grid_run():
    r = _cli(
        "run",
        "experiments/heat2d.toml",
        "--set",
        "grid.shape=[30000,30000]",
        "--out",
        "/nonexistent/never.nc",
        rlimit_as=8 << 30,
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "grid.shape" in r.stderr and "RLIMIT_AS" in r.stderr and "GiB" in r.stderr


def test_device_count_cap():
    memory.check_device_count(8, "--devices", 4096)
    for bad in (0, 5000, 2.0, True):
        with pytest.raises(ConfigError, match="1 .. 4096"):
            memory.check_device_count(bad, "--mesh", 4096)


def test_h5md_links_outside_the_read_elements_are_never_followed(tmp_path):
    path = _h5md(tmp_path / "in.h5md")
    other = _h5md(tmp_path / "other.h5md")
    with h5py.File(path, "a") as f:  # informative parts pointing at another file: skipped
        f["observables/extra/value"] = h5py.ExternalLink(str(other), "/observables")
        del f["h5md/modules"]
        f["h5md/modules"] = h5py.ExternalLink(str(other), "/h5md/modules")
    fr = h5md.read_frame(path)
    assert "extra" not in fr["observables"] and fr["unit_system"] == "lj"  # from /parameters
    with h5py.File(path, "a") as f:  # a link to the particles: refused, naming it
        del f["particles/trajectory"]
        f["particles/trajectory"] = h5py.ExternalLink(str(other), "/particles/trajectory")
    with pytest.raises(ConfigError, match="/particles/trajectory is an external link"):
        h5md.read_frame(path)
