"""Grid models (heat, wave, advection, gray_scott, lbm) and grid ensembles in the driver.

:func:`plan` reads the model's config (``simpar.grid.<name>.from_config``), the
``[ensemble]`` section (``simpar.ensemble``), ``parallel.halo`` and
``output.gather_limit_gib``; the shared options (engine, mesh, steps, ``output.every`` with
its default of a tenth of the steps, path, checkpoint) come from
``simpar.drive.loop.read_options``. :class:`GridRun` places the state with a grid engine
(``simpar.parallel.engines`` / ``simpar.parallel.ensemble``) and writes a netCDF-style HDF5
file (``simpar.io.netcdf.GridWriter``): fields ``(time, [ensemble,] z?, y, x)`` in the
model's units, diagnostics ``(time, [ensemble])`` (float64), profiles ``(time, [ensemble,]
y)`` and an XDMF sidecar. Ensembles cannot be resumed (``--resume`` is refused).
"""

from __future__ import annotations

import importlib
import math

import numpy as np

from simpar import ensemble
from simpar.config import Section
from simpar.drive import BUILTIN as _NAMES
from simpar.drive.loop import Options, Plan, Run, device_mesh, rate, read_options
from simpar.errors import ConfigError
from simpar.grid.model import GridSetup
from simpar.parallel import distributed
from simpar.parallel.mapping import kind
from simpar.parallel.topology import AXIS_NAMES

# state arrays per cell of each grid model (LBM: populations + the uint8 wall flag)
_STATE_FIELDS = {"heat": 1, "wave": 2, "advection": (3, 4), "gray_scott": 2, "lbm": (9.25, 19.25)}


class GridFamily:
    """A grid model as the driver runs it: the one model protocol (``simpar.models``) over a
    set-up function ``from_config(cfg) -> GridSetup``.

    Built by ``simpar.models.grid_model`` (plugins) and below for heat, wave, advection,
    gray_scott and lbm. Every grid model gets, from here, every engine, netCDF frames, XDMF,
    checkpoints, ``--resume``, ensembles and ``initial.kind = "file"``.

    Attributes:
      name: the ``[model] name``; description: a line for ``--help``.
      shows_layout: ``--show-layout`` is supported.
    """

    shows_layout = True

    def __init__(self, name: str, from_config, description: str = "a grid model"):
        self.name, self.description = name, description
        self._from_config = from_config

    def __repr__(self) -> str:
        return f"GridFamily({self.name!r})"

    def setup(self, cfg: Section) -> GridSetup:
        """The model's set-up from its config, the initial state from a file when
        ``initial.kind = "file"`` (checked against the set-up's own initial state)."""
        fn = self._from_config
        if isinstance(fn, str):  # simpar's own models: "module:function", imported here
            module, _, attr = fn.partition(":")
            fn = getattr(importlib.import_module(module), attr)
        ini = cfg.data.get("initial")
        if not (isinstance(ini, dict) and ini.get("kind") == "file"):
            setup = fn(cfg)
            self._check_setup(setup)
            return setup
        from simpar.io import initial_file

        path, frame = initial_file.from_config(cfg.section("initial"))
        with cfg.hidden("initial"):  # the model's default start: its shapes and dtypes
            setup = fn(cfg)
        self._check_setup(setup)
        expected = {k: (np.shape(v), np.asarray(v).dtype) for k, v in setup.state.items()}
        setup.state = initial_file.read_fields(path, frame, expected)
        setup.seed = None
        return setup

    def _check_setup(self, setup) -> None:
        """A model's reader broke the contract: one line naming the model (exit 2)."""
        if not isinstance(setup, GridSetup):
            raise ConfigError(
                "model.name", f"{self.name!r}: from_config returned {type(setup).__name__}, "
                "not a simpar.grid.model.GridSetup",
            )  # fmt: skip
        if setup.model.name != self.name:
            raise ConfigError(
                "model.name",
                f"{self.name!r}: its GridModel is named {setup.model.name!r}; use one name",
            )

    def plan(self, cfg: Section, opts: Options, config_text: str) -> GridPlan:
        """Read and validate a grid config (``ConfigError`` names the key); nothing
        allocated on the devices."""
        if "model" in cfg:
            cfg.section("model").get("name", kind=str, choices=(self.name,))
        return GridPlan(cfg, opts, config_text, self)


heat = GridFamily("heat", "simpar.grid.heat:from_config", _NAMES["heat"][1])
wave = GridFamily("wave", "simpar.grid.wave:from_config", _NAMES["wave"][1])
advection = GridFamily("advection", "simpar.grid.advection:from_config", _NAMES["advection"][1])
gray_scott = GridFamily("gray_scott", "simpar.grid.gray_scott:from_config", _NAMES["gray_scott"][1])
lbm = GridFamily("lbm", "simpar.grid.lbm_config:from_config", _NAMES["lbm"][1])
BUILTIN = {m.name: m for m in (heat, wave, advection, gray_scott, lbm)}
"""simpar's grid models (``simpar.models`` lists them with the others)."""


def grid_setup(cfg: Section, family: GridFamily | None = None) -> GridSetup:
    """Build a grid model's set-up from its config (``family``: default the built-in named
    by ``[model] name``; ``simpar.run.grid_setup`` finds plugins too)."""
    if family is None:
        name = cfg.section("model", required=True).get("name", kind=str, choices=tuple(BUILTIN))
        family = BUILTIN[name]
    return family.setup(cfg)


#: resident bytes a grid run adds per byte of state (all members), measured through
#: ``simpar run`` (experiments/check_memory_estimates.py, jaxlib 0.10 CPU, heat 1024^2 ..
#: 8192^2): the state twice on the devices (a chunk's input and output), the fused stencil's
#: temporaries and halos, the host frame gathered for output and its transposed copy
_STATE_FACTOR = 6.1
#: what a grid run adds besides its fields: XLA's client, the compiled programs (bytes)
_OVERHEAD = 70 << 20


def memory_estimate(shape, itemsize: int, fields: float, members: int = 1) -> int:
    """Bytes a grid run adds to the process's resident memory at its peak.

    Args:
      shape: the grid (cells per axis); itemsize: bytes per value (4 or 8).
      fields: state arrays per cell (e.g. 1 for heat, 19.25 for D3Q19 with its flags).
      members: ensemble members (each holds a whole state).

    Returns:
      ``_OVERHEAD + _STATE_FACTOR * state`` (bytes), the state being ``members * cells *
      fields * itemsize``; on CPU every device shares the host's memory, so the mesh does not
      change it.
    """
    state = math.prod(shape) * itemsize * fields * members
    return int(_OVERHEAD + _STATE_FACTOR * state)


def _check_memory(cfg: Section, data: dict) -> None:
    """Refuse a grid run that cannot fit in memory, before anything is allocated
    (:func:`memory_estimate`). The key named is ``grid.shape``, or ``ensemble.members`` when
    one member would fit."""
    try:
        g = data["grid"]
        shape = [int(n) for n in g["shape"]]
        itemsize = 8 if g.get("dtype", "float32") == "float64" else 4
        fields = _STATE_FIELDS[data["model"]["name"]]
        members = data.get("ensemble", {}).get("members", 1)
        members = members if isinstance(members, int) and 1 <= members <= 2**31 else 1
    except (KeyError, TypeError, ValueError, AttributeError):
        return  # malformed: the model's validation names the key
    if not 2 <= len(shape) <= 3 or min(shape) < 1:
        return
    if isinstance(fields, tuple):
        fields = fields[len(shape) - 2]
    from simpar.memory import available, check_fits

    needed = memory_estimate(shape, itemsize, fields, members)
    key, hint = cfg.section("grid").key("shape"), "reduce grid.shape"
    got = available()
    if members > 1 and got is not None and memory_estimate(shape, itemsize, fields) <= got[0]:
        key, hint = "ensemble.members", "use fewer ensemble.members"
    state = math.prod(shape) * itemsize * fields * members
    times = f"{members} x " if members > 1 else ""
    check_fits(
        needed,
        key,
        f"{times}{fields:g} fields of {' x '.join(map(str, shape))} x {itemsize} bytes: state "
        f"{state / 2**30:.3g} GiB, twice on the devices, plus halos and output frames",
        f"{hint} or run across more processes (--num-processes)",
    )


#: resident bytes a ``spectral_ns`` run (``simpar.drive.spectral``) adds per grid cell, as (fixed, per byte of ``dtype``) (fitted to
#: measured peaks through ``simpar run``, experiments/check_memory_estimates.py, jaxlib 0.10
#: CPU): 2-D the host's initial field and CFL check (NumPy float64 FFTs), the Fourier state,
#: the RK4 stages and the physical-space products of the nonlinear term, the output frame;
#: 3-D the same with three velocity components
_SPECTRAL_BYTES_PER_CELL = {2: (18.0, 21.0), 3: (136.0, 26.0)}
#: what a ``spectral_ns`` run adds besides the fields: XLA's client, the compiled programs (bytes)
_SPECTRAL_OVERHEAD = 100 << 20


def spectral_memory_estimate(shape, dtype) -> int:
    """Bytes a ``spectral_ns`` run adds to the process's resident memory at its peak.

    Args:
      shape: the grid ``(N_x, N_y[, N_z])`` (cells); dtype: ``"float32"`` or ``"float64"``.

    Returns:
      The estimate (bytes): ``_SPECTRAL_OVERHEAD + (a + b * itemsize) * cells`` with
      ``(a, b) = _SPECTRAL_BYTES_PER_CELL[d]``; on CPU the devices share the host's memory, so
      the mesh does not change it.
    """
    fixed, per_item = _SPECTRAL_BYTES_PER_CELL[len(shape)]
    item = np.dtype(dtype).itemsize
    return int(_SPECTRAL_OVERHEAD + (fixed + per_item * item) * math.prod(shape))


def check_spectral_memory(shape, dtype, key: str) -> None:
    """Refuse a grid that cannot fit (``simpar.memory.check_fits``), before the initial field
    or anything on the devices is allocated (``key``: ``grid.shape``)."""
    from simpar.memory import check_fits

    check_fits(
        spectral_memory_estimate(shape, dtype),
        key,
        f"a {' x '.join(map(str, shape))} {dtype} spectral grid: initial field, Fourier state, "
        "RK4 stages and output frames",
        "reduce grid.shape (or use float32) or run across more processes (--num-processes)",
    )


class GridPlan(Plan):
    """A validated grid run (host set-up built; nothing on the devices).

    Attributes:
      common: the shared options; setup: the model's ``GridSetup`` (members stacked on a
        leading axis for an ensemble); ens: the ``Ensemble`` or None.
      model, engine, mesh, dtype: for the metadata and the summary.
      first_step: 0 (grid runs start at step 0).
    """

    first_step = 0

    def __init__(self, cfg: Section, opts: Options, config_text: str, family: GridFamily):
        data = cfg.data
        _check_memory(cfg, data)  # before the set-up allocates the initial state
        self.family = family
        self.setup = setup = family.setup(cfg)
        # None without [ensemble]
        self.ens = ens = ensemble.from_config(cfg, data, family.setup)
        self.common = c = read_options(
            cfg, opts, default_path=f"data/runs/{setup.model.name}.nc", output="netcdf"
        )
        o = cfg.section("output")
        gather_limit = o.get("gather_limit_gib", 16.0, min=0.0, exclusive_min=True)
        self.halo = cfg.section("parallel").get("halo", None, kind=int, min=1, max=16)
        self.model, self.engine, self.dtype = setup.model.name, c.engine, setup.domain.dtype
        self.members = ens.members if ens else 1
        self.mesh = device_mesh(c, members=self.members)
        self.config_text = config_text
        if ens is not None:
            setup.state, setup.params = ens.state, ens.params
        self.save_checkpoints = c.checkpoint and ens is None
        if ens is not None and c.resume:
            raise ConfigError("--resume", "ensemble runs cannot be resumed yet; run again")
        if c.resume:
            self._check_checkpoint(c.path, config_text)
        self.eng = self._engine()  # checks the mesh against the grid (no state placed yet)
        self.mesh = tuple(self.eng.grid.shape)
        distributed.check_gather_size(
            sum(np.asarray(u).nbytes for u in setup.state.values()),
            gather_limit,
            o.key("gather_limit_gib"),
        )

    def _check_checkpoint(self, path, config_text: str) -> None:
        """Refuse a damaged or crafted checkpoint before the run is built (``--resume``).

        The shapes and dtypes of the state arrays follow from the config
        (``checkpoint.expected_of`` of the initial state), so every dataset is checked
        against them before any data is read, only those arrays are read, and non-finite
        values are blamed on ``--resume`` and the dataset (not on ``[initial]``).

        Attributes set:
          resume_expected: name -> (shape, dtype) of the state arrays.
        """
        from simpar.io import checkpoint

        self.resume_expected = checkpoint.expected_of(self.setup.state)
        checkpoint.load_for_resume(
            path, config_text, self.setup.model.name, expected=self.resume_expected
        )

    def _engine(self):
        from simpar.parallel.engines import make_engine
        from simpar.parallel.ensemble import make_ensemble_engine

        s, mesh = self.setup, (None if kind(self.engine).one_device else self.mesh)
        if self.ens is None:
            return make_engine(self.engine, s.model, s.domain.shape, mesh, self.halo)
        return make_ensemble_engine(
            self.engine, s.model, s.domain.shape, self.ens.members, mesh, self.halo
        )

    def check_resume(self, ck: dict, ck_step: int) -> int:
        """Take the checkpoint's fields as the initial state; the run starts at step 0."""
        self.setup.state = {k: ck[k] for k in self.setup.state}
        return 0

    def build(self, ck) -> GridRun:
        """Place the state on the devices."""
        return GridRun(self)


class GridRun(Run):
    """A grid run on its engine (see ``simpar.drive.loop.Run`` for the methods)."""

    def __init__(self, plan: GridPlan):
        self.plan, self.eng, self.setup = plan, plan.eng, plan.setup
        self.state = self.eng.place(self.setup.state)
        self.desc = f"{plan.model}/{plan.engine}"
        model = self.setup.model
        self.out_fields = self.setup.output or {f: (lambda s, f=f: s[f]) for f in model.fields}
        self.member = ("ensemble",) if plan.ens else ()

    def layout(self) -> str:
        """Which device holds which block (``--show-layout``)."""
        from simpar.parallel.layout import describe

        return describe(self.eng)

    def observe(self) -> dict:
        return self.eng.observe(self.state, self.setup.params)

    def initial_problem(self, obs) -> None:
        self.obs0 = obs  # its keys name the diagnostics' variables in a new file
        if np.sum(obs["nonfinite"]) > 0:
            raise ConfigError(
                "initial",
                f"the initial state has {int(np.sum(obs['nonfinite']))} non-finite values; "
                "check the [initial] settings",
            )

    def advance(self, n: int, last_good: str) -> None:
        self.state = self.eng.advance(self.state, self.setup.params, n, donate=True)

    def problem(self, obs, step):
        bad = int(np.sum(obs["nonfinite"]))
        if bad == 0:
            return None
        return (
            f"{bad} non-finite values in the fields after step {step}",
            "The scheme is unstable or a parameter is out of range: reduce time.dt or "
            "check [physics]",
        )

    def snapshot(self):
        return self.eng.gather(self.state)

    def checkpoint_state(self, snap, step) -> dict:
        return snap

    def open_writer(self, path, *, resume_step, overwrite, key):
        from simpar.io.meta import run_metadata
        from simpar.io.netcdf import GridWriter

        p, setup, model = self.plan, self.setup, self.setup.model
        domain, ens = setup.domain, p.ens
        names = AXIS_NAMES[: domain.ndim]
        obs = self.obs0
        step_coord = {"coordinates": "step"}  # CF: xarray shows step as a coordinate of time
        variables = {}
        for f in self.out_fields:
            variables[f] = {
                "dims": ("time", *self.member) + tuple(reversed(names)),
                "dtype": domain.dtype,
                "units": model.units.get(f, "1"),
                "long_name": model.long_names.get(f, f),
                "attrs": step_coord,
            }
        for k, v in obs.items():
            if k == "nonfinite":
                continue
            units, long_name = model.diagnostic_attrs(k)
            if np.ndim(v) == 1 + len(self.member):
                long_name = (
                    f"{model.long_names.get(k[:-8], k[:-8])} averaged over {', '.join(names[:-1])}"
                )
                dims = ("time", *self.member, names[-1])
            else:
                dims = ("time", *self.member)
            variables[k] = {
                "dims": dims, "dtype": "float64", "units": units, "long_name": long_name,
                "attrs": step_coord,
            }  # fmt: skip
        attrs = run_metadata(
            p.config_text, engine=p.engine, mesh=self.eng.grid.shape, dtype=domain.dtype,
            seed=None if ens else setup.seed, model=model.name,
        )  # fmt: skip
        if ens:
            attrs.update(ens.attrs())
        attrs.update(
            {
                "halo_width": np.int32(self.eng.halo),
                "dt": float(setup.dt),
                "grid_shape": np.asarray(domain.shape, np.int32),
                "grid_length": np.asarray(domain.length, np.float64),
            }
        )
        coords = {n: c for n, c in zip(reversed(names), reversed(domain.coords()), strict=True)}
        # the XDMF sidecar is rewritten whole: at most every 2 s, and always at close
        new = lambda p, **kw: GridWriter(  # noqa: E731
            p, coords=coords, variables=variables, attrs=attrs, xdmf_min_interval=2.0,
            time_units=model.time_units, length_units=model.length_units,
            ensemble=ens.members if ens else None,
            ensemble_coords=ens.coordinates(
                [*coords, *variables], getattr(model, "param_units", None)
            ) if ens else None, **kw,
        )  # fmt: skip
        if resume_step is not None:  # the old file must have the layout of a new one
            return GridWriter.open_existing(path, step=resume_step, xdmf_min_interval=2.0,
                                            like=new)  # fmt: skip
        return new(path, overwrite=overwrite, key=key)

    def write_frame(self, writer, step, snap, obs) -> None:
        fns, ens = self.out_fields, self.plan.ens
        if ens:
            split = [{k: v[m] for k, v in snap.items()} for m in range(ens.members)]
            values = {f: np.stack([np.transpose(fn(s)) for s in split]) for f, fn in fns.items()}
        else:
            values = {f: np.transpose(fn(snap)) for f, fn in fns.items()}
        values.update({k: v for k, v in obs.items() if k != "nonfinite"})
        writer.append(step, step * self.setup.dt, values)

    def summary(self, obs0, obs, steps_run, wall) -> dict:
        p, n = self.plan, len(self.member)
        cells = math.prod(self.setup.domain.shape) * p.members
        scalars = lambda o: {k: v for k, v in o.items() if np.ndim(v) == n}  # noqa: E731
        return dict(
            **rate(cells / 1e6, steps_run, wall, "Mcell_updates/s"),
            initial=scalars(obs0),
            final=scalars(obs),
            details={
                "cells": cells,
                "dt": float(self.setup.dt),
                "ensemble_members": p.ens.members if p.ens else None,
            },
        )


__all__ = ["BUILTIN", "GridFamily", "GridPlan", "GridRun", "grid_setup"]
