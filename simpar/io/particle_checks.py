"""Checks of an untrusted particle checkpoint (LJ, N-body) against the config, before the run
reads any of its data (``--resume``).

The names, shapes and dtypes every engine writes (``lj_expected``, ``nbody_expected``) are
checked from the file's metadata alone (``simpar.io.untrusted.check_group``); then the values of
the now known-small arrays (finite, masses > 0, step in int32 range, the neighbour layout the
config implies). Every refusal is a ``ConfigError`` (exit 2) naming the file and the dataset.
A new dataset in an LJ or N-body checkpoint must be added to ``lj_expected``/``nbody_expected``.
"""

from __future__ import annotations

import numpy as np

from simpar.errors import ConfigError

_NONE = -1  # integer "None" for spec.cells (as ``simpar.particles.checkpoint`` writes it)

_I32_MAX = 2**31 - 1


def lj_expected(n: int, dtype) -> tuple[dict[str, tuple], tuple[str, ...]]:
    """The names, shapes and dtypes of an LJ checkpoint of ``n`` atoms in ``dtype``.

    Args:
      n: atoms of the run (from the config or its ``system.file``).
      dtype: the run's float dtype (``system.dtype``).

    Returns:
      (name -> (shape, dtype), optional names): what ``lj_to_checkpoint`` writes on every
      engine (``layout`` is a short byte string, ``"S"``; ``layout_nbr_idx`` int32[capacity,
      M] is absent after a decomposed run, its shape depends on the writing layout).
    """
    f, f64, i64, i32 = np.dtype(dtype), np.dtype("float64"), np.dtype("int64"), np.dtype("int32")
    b = np.dtype(bool)
    exp = {"position": ((n, 3), f), "velocity": ((n, 3), f), "force": ((n, 3), f),
           "mass": ((n,), f), "valid": ((n,), b), "key": ((2,), np.dtype("uint32")),
           "step": ((), i64), "e_pair": ((), f), "virial": ((), f),
           "nbr_ref_position": ((n, 3), f), "nbr_needed": ((2,), i32), "nbr_n_builds": ((), i32),
           "regrows": ((), i64), "start_step": ((), i64), "layout": ((), "S"),
           "layout_nbr_idx": ((None, None), i32),
           "spec_max_neighbors": ((), i64), "spec_column_capacity": ((), i64),
           "spec_cells": ((3,), i64), "spec_reach": ((), i64), "spec_radius": ((), f64),
           "spec_skin": ((), f64), "spec_periodic": ((), b), "spec_origin": ((3,), f64),
           "spec_width": ((3,), f64), "spec_block": ((), i64)}  # fmt: skip
    return exp, ("layout_nbr_idx",)


def nbody_expected(n: int, dtype) -> tuple[dict[str, tuple], tuple[str, ...]]:
    """The names, shapes and dtypes of an N-body checkpoint of ``n`` bodies in ``dtype``
    (``nbody_state_to_checkpoint`` plus the driver's ``energy_initial`` float64[]); no
    optional names."""
    f = np.dtype(dtype)
    exp = {"pos": ((n, 3), f), "vel": ((n, 3), f), "acc": ((n, 3), f), "mass": ((n,), f),
           "step": ((), np.dtype("int64")), "energy_initial": ((), np.dtype("float64"))}  # fmt: skip
    return exp, ()


def _bad(path, ds, why: str) -> ConfigError:
    return ConfigError("--resume", f"{path}: dataset {ds.name} {why}; the checkpoint is damaged")


def _finite(path, datasets: dict, names) -> None:
    for name in names:
        ds = datasets[name]
        bad = int(np.count_nonzero(~np.isfinite(ds[()])))
        if bad:
            raise _bad(path, ds, f"holds {bad} non-finite values (NaN or inf)")


def _step_values(path, f, ds: dict) -> None:
    """The step dataset is the file's ``step`` attribute, in int32 range."""
    step = int(ds["step"][()])
    if step != int(f.attrs["step"]) or not 0 <= step <= _I32_MAX:
        raise _bad(path, ds["step"], f"is {step}; expected the file's step {f.attrs['step']}")


def _lj_values(path, f, ds: dict, n: int, radius: float, skin: float, box, periodic) -> None:
    """Value checks of an LJ checkpoint whose names, shapes and dtypes passed (reads the
    arrays: they are known to be small); ``box`` float[3] and ``periodic`` (or None: not
    checked) are the config's."""
    from simpar.memory import GIB, available_bytes

    _step_values(path, f, ds)
    _finite(path, ds, ("position", "velocity", "force", "mass", "nbr_ref_position", "e_pair",
                       "virial"))  # fmt: skip
    if not np.all(ds["mass"][()] > 0):
        raise _bad(path, ds["mass"], "holds masses <= 0")
    if int(np.count_nonzero(ds["valid"][()])) != n:
        raise _bad(path, ds["valid"], f"does not mark all {n} atoms valid")
    start = int(ds["start_step"][()])
    if not 0 <= start <= int(ds["step"][()]):
        raise _bad(path, ds["start_step"], f"is {start}; expected 0 .. step")
    ints = {k: int(ds[k][()]) for k in ("spec_max_neighbors", "spec_column_capacity",
                                        "spec_reach", "spec_block", "regrows", "nbr_n_builds")}  # fmt: skip
    low = {"spec_max_neighbors": 1, "spec_column_capacity": 0, "spec_reach": 1,
           "spec_block": 1, "regrows": 0, "nbr_n_builds": 0}  # fmt: skip
    for k, v in ints.items():
        if not low[k] <= v <= _I32_MAX or (k == "spec_reach" and v > 2):
            raise _bad(
                path, ds[k], f"is {v}; expected {low[k]} .. {2 if k == 'spec_reach' else _I32_MAX}"
            )
    needed = ds["nbr_needed"][()]
    if np.any(needed < 0):
        raise _bad(path, ds["nbr_needed"], f"is {needed.tolist()}; expected counts >= 0")
    cells = ds["spec_cells"][()]
    if not (
        np.all(cells == _NONE) or (np.all(cells >= 1) and np.prod(cells.astype(float)) <= _I32_MAX)
    ):
        raise _bad(path, ds["spec_cells"], f"is {cells.tolist()}; expected cells >= 1 or -1")
    if periodic is not None and bool(ds["spec_periodic"][()]) != bool(periodic):
        raise _bad(path, ds["spec_periodic"], f"is not {bool(periodic)} as the config's boundary")
    if periodic and box is not None and cells[0] != _NONE:  # neighbors._layout's grid
        want = np.maximum(np.floor(np.asarray(box, float) * ints["spec_reach"] / radius), 1)
        if not np.array_equal(cells, want.astype(cells.dtype)):
            raise _bad(path, ds["spec_cells"], f"is {cells.tolist()}; the box gives "
                       f"{want.astype(int).tolist()}")  # fmt: skip
    for k, want in (("spec_radius", radius), ("spec_skin", skin)):
        got = float(ds[k][()])
        if not abs(got - want) <= 1e-12 * abs(want):
            raise _bad(path, ds[k], f"is {got!r}; the config gives {want!r}")
    # what the rebuilt lists allocate (int32): the rows, and the candidates of the cell search
    m = min(ints["spec_max_neighbors"], n)
    cand = ints["spec_column_capacity"] * (2 * ints["spec_reach"] + 1) ** 2
    need = 4 * n * (m + cand) + 8 * int(np.prod(np.maximum(cells, 1).astype(float)))
    avail = available_bytes()
    if avail is not None and need > avail:
        raise _bad(
            path, ds["spec_column_capacity"],
            f"is {ints['spec_column_capacity']}: the neighbour search would need "
            f"{need / GIB:.3g} GiB, {avail / GIB:.3g} GiB are available",
        )  # fmt: skip


def check_for_resume(output, config_text: str, model: str, expected: dict, optional=(),
                     values=None) -> None:  # fmt: skip
    """Refuse a damaged or crafted particle checkpoint before the run reads it (``--resume``).

    First the checkpoint's attributes, model and config (``simpar.io.checkpoint``, reading
    no state), then every ``/state`` member against ``expected`` from its metadata alone
    (``simpar.io.untrusted.check_group``: names, shapes, dtypes, storage, size), then,
    with ``values``, the values of the now known-small arrays.

    Args:
      output: the run's output file (its checkpoint is ``<output>.ckpt``).
      config_text, model: the resuming run's resolved config and model name.
      expected, optional: ``lj_expected`` / ``nbody_expected`` of the run.
      values: ``(path, file, datasets) -> None`` raising ``ConfigError``, or None.

    Raises:
      ConfigError (``--resume``): naming the file and the dataset or attribute at fault.
    """
    import h5py

    from simpar.io import checkpoint as ckio
    from simpar.io import untrusted

    ckio.load_for_resume(output, config_text, model, expected={})
    path = ckio.checkpoint_path(output)
    try:
        with untrusted.no_plugins(), h5py.File(path, "r") as f:
            g = untrusted.child(f, "state", path, "--resume", dataset=False)
            ds = untrusted.check_group(g, path, "--resume", expected, optional)
            if values is not None:
                values(path, f, ds)
    except ConfigError:
        raise
    except (OSError, KeyError, ValueError, TypeError, RuntimeError) as err:
        raise ConfigError("--resume", f"checkpoint {path} is unreadable ({err})") from None


def check_lj_resume(output, config_text: str, n: int, dtype, cutoff: float, skin: float,
                    box=None, periodic=None) -> None:  # fmt: skip
    """``check_for_resume`` of an LJ run of ``n`` atoms in ``dtype`` (list radius
    ``cutoff + skin``, as ``neighbors.allocate`` computes it; with the config's ``box``
    float[3] (sigma) and ``periodic`` boundary, also the stored cell grid)."""
    exp, opt = lj_expected(n, dtype)
    radius = float(cutoff) + float(skin)
    if box is not None:  # as the run's space holds it (``neighbors._layout`` reads that)
        box = np.asarray(np.asarray(box, np.dtype(dtype)), np.float64)

    def values(path, f, ds):
        _lj_values(path, f, ds, n, radius, float(skin), box, periodic)

    check_for_resume(output, config_text, "lj", exp, opt, values)


def check_nbody_resume(output, config_text: str, n: int, dtype) -> None:
    """``check_for_resume`` of an N-body run of ``n`` bodies in ``dtype``."""
    exp, opt = nbody_expected(n, dtype)

    def values(path, f, ds):
        _step_values(path, f, ds)
        _finite(path, ds, ("pos", "vel", "acc", "mass", "energy_initial"))

    check_for_resume(output, config_text, "nbody", exp, opt, values)


def check_pm_resume(output, config_text: str, n: int, dtype) -> None:
    """``check_for_resume`` of a particle-mesh N-body run of ``n`` particles in ``dtype``:
    the N-body datasets plus ``energy_scale`` float64[] and the PM buffers' ``pm_layout``
    (short bytes), ``pm_capacity`` and ``pm_migrate`` (int64[], 0: sized by the engine)."""
    exp, opt = nbody_expected(n, dtype)
    i64 = np.dtype("int64")
    exp = {**exp, "energy_scale": ((), np.dtype("float64")), "pm_layout": ((), "S"),
           "pm_capacity": ((), i64), "pm_migrate": ((), i64)}  # fmt: skip

    def values(path, f, ds):
        _step_values(path, f, ds)
        _finite(path, ds, ("pos", "vel", "acc", "mass", "energy_initial", "energy_scale"))
        for k in ("pm_capacity", "pm_migrate"):
            v = int(ds[k][()])
            if not 0 <= v <= _I32_MAX:
                raise _bad(path, ds[k], f"is {v}; expected 0 .. {_I32_MAX}")

    check_for_resume(output, config_text, "nbody", exp, opt, values)
