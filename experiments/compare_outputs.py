"""Compare each experiment's output file between two checkouts of simpar (issue 16, item 6).

What it shows: that a restructuring left every experiment's output file with the same layout
(datasets, shapes, dtypes, storage, attributes) and the same values, bitwise. For each experiment TOML
present in both checkouts it runs ``python -m simpar run`` once with each checkout on
``PYTHONPATH`` (few steps, same engine), then walks both HDF5 files (netCDF4 and H5MD are
HDF5), and their restart checkpoints, and prints one JSON object: per run, the differences
found (an empty list = identical).

Attributes that carry versions, paths, host names or timestamps are skipped (``IGNORED_ATTRS``);
dimension-scale references are compared by the names they point to. The XDMF sidecar is
compared as text after the file name is replaced.

Runtime: about 5-10 minutes on 2 loaded CPU cores with the defaults (16 runs, 20 steps).

Run::

    OLD=$(mktemp -d) && git archive 78984a9 | tar -x -C "$OLD"    # the old tree, a plain copy
    python experiments/compare_outputs.py --old "$OLD" --new . --steps 20 --every 10
    python experiments/compare_outputs.py --old "$OLD" --new . --only heat2d lj_melt
    python experiments/compare_outputs.py --files A.nc B.nc      # compare two files only

``--old`` is a plain copy of the old tree (``git archive``, as above). The runs' files go to
``--workdir`` (default: a new temporary directory, named on stderr).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time

import h5py
import numpy as np

# Attribute names whose values legitimately differ between two runs or two code versions.
IGNORED_ATTRS = re.compile(
    r"^(_NCProperties|.*_version|jax_backend|author|created|.*timestamp|.*wall.*|.*_path)$",
    re.IGNORECASE,
)

# (name, extra CLI arguments): every experiment on `single`, plus the two parallel runs that
# item 6 names. Steps and output cadence are added by the runner.
RUNS = {
    "advection2d": ["--engine", "single"],
    "cavity_re100": ["--engine", "single"],
    "cavity_re1000": ["--engine", "single"],
    "gray_scott": ["--engine", "single"],
    "heat2d": ["--engine", "single"],
    "heat2d@shard_map_2x4": ["--engine", "shard_map", "--devices", "8", "--mesh", "2x4"],
    "heat_ensemble": ["--engine", "single"],
    "kolmogorov": ["--engine", "single"],  # spectral_ns: skipped where a checkout lacks it
    "lbm3d": ["--engine", "single"],
    "lj_bench": ["--engine", "single"],
    "lj_melt": ["--engine", "single"],
    "lj_melt@pmap_2x2x2": ["--engine", "pmap", "--devices", "8", "--mesh", "2x2x2"],
    "nbody_plummer": ["--engine", "single"],
    "taylor_green": ["--engine", "single"],
    "wave2d": ["--engine", "single"],
    # one decomposed engine per family behind simpar.parallel.mapping (issue 27)
    "wave2d@sharded_2x4": ["--engine", "sharded", "--devices", "8", "--mesh", "2x4"],
    "heat_ensemble@pmap": ["--engine", "pmap", "--devices", "8"],
    "kolmogorov@pmap_2x4": ["--engine", "pmap", "--devices", "8", "--mesh", "2x4"],
    "nbody_plummer@shard_map_8": ["--engine", "shard_map", "--devices", "8"],
    "pm_plane_wave": ["--engine", "single"],
    "pm_plane_wave@shard_map_2x4": ["--engine", "shard_map", "--devices", "8", "--mesh", "2x4"],
}

# Fewer steps for the expensive runs (32 000 atoms).
STEPS_OVERRIDE = {"lj_bench": (4, 2)}


def _attr_value(f: h5py.File, value):
    """An attribute value in a comparable form (references -> the names they point to)."""
    if isinstance(value, h5py.Reference):
        return f[value].name if value else None
    if isinstance(value, np.ndarray) and value.dtype.names:
        return [_attr_value(f, v) for v in value.ravel()]
    if isinstance(value, np.ndarray) and value.dtype == object:
        return [_attr_value(f, v) for v in value.ravel().tolist()]
    if isinstance(value, np.void):
        return [_attr_value(f, v) for v in value.tolist()]
    if isinstance(value, tuple):
        return [_attr_value(f, v) for v in value]
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, np.ndarray):
        return (str(value.dtype), value.shape, value.tobytes().hex())
    if isinstance(value, np.generic):
        return (str(value.dtype), value.tobytes().hex())
    return value


def _attrs(f: h5py.File, obj) -> dict:
    return {
        k: _attr_value(f, obj.attrs[k]) for k in obj.attrs.keys() if not IGNORED_ATTRS.search(k)
    }


def _walk(f: h5py.File) -> dict:
    """{name: ("group"|"dataset", shape, dtype, attrs, obj)} for every object in the file."""
    out = {"/": ("group", None, None, _attrs(f, f), f)}

    def visit(name, obj):
        if isinstance(obj, h5py.Dataset):
            dtype = str(obj.dtype)
            out["/" + name] = ("dataset", obj.shape, dtype, _attrs(f, obj), obj)
        else:
            out["/" + name] = ("group", None, None, _attrs(f, obj), obj)

    f.visititems(visit)
    return out


def _storage(ds: h5py.Dataset) -> str:
    """How a dataset is stored: chunks, filters, fill value, maximum shape."""
    return repr((ds.chunks, ds.compression, ds.compression_opts, ds.shuffle, ds.maxshape,
                 np.asarray(ds.fillvalue).tobytes().hex()))  # fmt: skip


def _values_equal(a: h5py.Dataset, b: h5py.Dataset) -> tuple[bool, str]:
    x, y = a[()], b[()]
    if isinstance(x, np.ndarray) and x.dtype.kind in "fciub":
        same = x.tobytes() == y.tobytes()
        if same:
            return True, ""
        with np.errstate(invalid="ignore"):
            diff = np.nanmax(np.abs(x.astype(np.float64) - y.astype(np.float64)))
        return False, f"values differ (max |a-b| = {diff:.3g})"
    same = np.array_equal(np.asarray(x, dtype=object), np.asarray(y, dtype=object))
    return bool(same), "" if same else "values differ"


def compare_files(old: str, new: str) -> list[str]:
    """Differences between two HDF5 files (layout, attributes, values); [] if identical.

    Args:
        old: path of the reference file.
        new: path of the file to check.

    Returns:
        One line per difference, naming the object and what differs.
    """
    diffs: list[str] = []
    with h5py.File(old, "r", locking=False) as fa, h5py.File(new, "r", locking=False) as fb:
        wa, wb = _walk(fa), _walk(fb)
        for name in sorted(set(wa) - set(wb)):
            diffs.append(f"{name}: only in old")
        for name in sorted(set(wb) - set(wa)):
            diffs.append(f"{name}: only in new ({wb[name][0]} {wb[name][1]} {wb[name][2]})")
        for name in sorted(set(wa) & set(wb)):
            ka, sa, da, aa, oa = wa[name]
            kb, sb, db, ab, ob = wb[name]
            if (ka, sa, da) != (kb, sb, db):
                diffs.append(f"{name}: {ka} {sa} {da} -> {kb} {sb} {db}")
                continue
            for k in sorted(set(aa) - set(ab)):
                diffs.append(f"{name}@{k}: attribute only in old")
            for k in sorted(set(ab) - set(aa)):
                diffs.append(f"{name}@{k}: attribute only in new = {ab[k]!r:.80}")
            for k in sorted(set(aa) & set(ab)):
                if aa[k] != ab[k]:
                    diffs.append(f"{name}@{k}: {aa[k]!r:.80} -> {ab[k]!r:.80}")
            if ka == "dataset":
                if _storage(oa) != _storage(ob):
                    diffs.append(f"{name}: storage {_storage(oa)} -> {_storage(ob)}")
                ok, why = _values_equal(oa, ob)
                if not ok:
                    diffs.append(f"{name}: {why}")
    for path_a, path_b in ((old + ".xdmf", new + ".xdmf"),):
        if os.path.exists(path_a) or os.path.exists(path_b):
            if not (os.path.exists(path_a) and os.path.exists(path_b)):
                diffs.append("xdmf sidecar: present in only one run")
                continue
            ta = pathlib.Path(path_a).read_text().replace(os.path.basename(old), "FILE")
            tb = pathlib.Path(path_b).read_text().replace(os.path.basename(new), "FILE")
            if ta != tb:
                diffs.append("xdmf sidecar: text differs")
    return diffs


def _run(tree: str, config: str, args: list[str], out: str) -> dict:
    tree = str(pathlib.Path(tree).resolve())
    env = dict(os.environ, PYTHONPATH=tree)
    # ``python -m`` puts the working directory first on sys.path: run from a folder without a
    # ``simpar`` package, so that PYTHONPATH picks the checkout; the run prints which one.
    probe = "import simpar, sys; sys.stderr.write('SIMPAR ' + simpar.__file__ + chr(10)); "
    probe += "from simpar.cli import run_main; sys.argv[0] = 'simpar'; run_main()"
    cmd = [sys.executable, "-c", probe, "run", str(pathlib.Path(config).resolve())]
    cmd += ["--out", out, "--quiet", *args]
    t0 = time.perf_counter()
    proc = subprocess.run(
        cmd, env=env, capture_output=True, text=True, timeout=900, cwd=os.path.dirname(out)
    )
    used = proc.stderr.split("SIMPAR ", 1)[-1].split("\n", 1)[0]
    if not used.startswith(tree + os.sep):
        raise RuntimeError(f"run imported simpar from {used!r}, not from {tree!r}")
    return {
        "rc": proc.returncode,
        "seconds": round(time.perf_counter() - t0, 1),
        "stderr_tail": proc.stderr[-400:] if proc.returncode else "",
    }


def main(argv: list[str] | None = None) -> int:
    """Run the comparisons and print the JSON report; exit 1 if any run differs or fails."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--old", help="old checkout (plain tree); required unless --files")
    p.add_argument("--new", default=".", help="new checkout")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--every", type=int, default=10)
    p.add_argument("--workdir", help="folder for the runs' files (default: a new temporary one)")
    p.add_argument("--only", nargs="*", help="run names (keys of RUNS) to do")
    p.add_argument("--files", nargs=2, metavar=("OLD", "NEW"), help="compare two files only")
    a = p.parse_args(argv)
    if a.files:
        diffs = compare_files(*a.files)
        print(json.dumps({"old": a.files[0], "new": a.files[1], "diffs": diffs}, indent=1))
        return 1 if diffs else 0
    if not a.old:
        p.error("--old is required (a plain copy of the old tree), unless --files is given")
    work = pathlib.Path(a.workdir or tempfile.mkdtemp(prefix="compare_outputs-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"runs' files in {work}", file=sys.stderr)
    report = {}
    failed = False
    for name, extra in RUNS.items():
        if a.only and name not in a.only and name.split("@")[0] not in a.only:
            continue
        base = name.split("@")[0]
        rel = f"experiments/{base}.toml"
        if not (pathlib.Path(a.old) / rel).exists() or not (pathlib.Path(a.new) / rel).exists():
            report[name] = {"skipped": "config missing in one checkout"}
            continue
        steps, every = STEPS_OVERRIDE.get(base, (a.steps, a.every))
        suffix = ".h5md" if base.startswith(("lj", "nbody", "pm_")) else ".nc"
        args = [*extra, "--steps", str(steps), "--set", f"output.every={every}"]
        entry = {"args": args}
        files = {}
        for tag, tree in (("old", a.old), ("new", a.new)):
            # Same file name in both runs (the title attribute is derived from it).
            (work / tag).mkdir(exist_ok=True)
            out = str(work / tag / f"{name.replace('@', '_')}{suffix}")
            for stale in (out, out + ".xdmf", out + ".ckpt"):
                if os.path.isdir(stale):
                    shutil.rmtree(stale)
                elif os.path.exists(stale):
                    os.remove(stale)
            entry[tag] = _run(
                str(pathlib.Path(tree) / ""), str(pathlib.Path(tree) / rel), args, out
            )
            files[tag] = out
        if entry["old"]["rc"] or entry["new"]["rc"]:
            entry["diffs"] = ["a run failed"]
        else:
            entry["diffs"] = compare_files(files["old"], files["new"])
            ckpts = [files[tag] + ".ckpt" for tag in ("old", "new")]
            if all(os.path.isfile(c) for c in ckpts):  # the restart files too
                entry["diffs"] += [f"checkpoint {d}" for d in compare_files(*ckpts)]
            elif any(os.path.isfile(c) for c in ckpts):
                entry["diffs"].append("checkpoint: written by only one of the runs")
        failed |= bool(entry["diffs"])
        report[name] = entry
        print(json.dumps({name: entry}), file=sys.stderr, flush=True)
    print(json.dumps(report, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
