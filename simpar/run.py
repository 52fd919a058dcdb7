"""The driver: config -> validated set-up -> engine -> chunks of steps -> output file.

``run_config`` is what ``simpar run`` calls. For grid models it:

1. reads and validates the whole config (model, grid, time, output, parallel) and builds the
   engine (which checks the mesh against the grid) *before* any file is created, so invalid
   input leaves nothing behind;
2. jit-compiles a chunk of ``output.every`` steps and loops over chunks on the host;
3. after each chunk checks for non-finite values (a ``SimulationError`` names the step and the
   setting to change), appends a frame (fields, diagnostics, profiles) to the netCDF-style HDF5
   file and flushes it, and reports progress.

Particle models (``lj``, ``nbody``) have drivers of their own in ``simpar.particles``.
"""

from __future__ import annotations

import importlib
import math
import time

import numpy as np

from simpar import config as cfgmod
from simpar import ensemble, signals
from simpar.config import Section
from simpar.errors import ConfigError, SimulationError
from simpar.grid.model import GridSetup
from simpar.io.files import check_output_path, final_status, write_error
from simpar.parallel import distributed
from simpar.parallel.engines import ENGINES, make_engine
from simpar.parallel.ensemble import make_ensemble_engine
from simpar.parallel.topology import AXIS_NAMES
from simpar.progress import Progress

GRID_MODELS = ("heat", "wave", "advection", "gray_scott", "lbm")
PARTICLE_MODELS = {"lj": "simpar.particles.run", "nbody": "simpar.particles.nbody_run"}


def grid_setup(cfg: Section) -> GridSetup:
    """Build a grid model's set-up from its config (module ``simpar.grid.<name>``)."""
    name = cfg.section("model", required=True).get("name", kind=str)
    module = importlib.import_module(f"simpar.grid.{name}")
    return module.from_config(cfg)


def model_name(data: dict) -> str:
    """``[model] name`` of a config, checked against the known models (``ConfigError``)."""
    name = (
        Section(data)
        .section("model", required=True)
        .get("name", kind=str, choices=GRID_MODELS + tuple(PARTICLE_MODELS))
    )
    return name


def run_config(
    data: dict,
    config_text: str,
    *,
    engine: str | None = None,
    mesh: tuple[int, ...] | None = None,
    steps: int | None = None,
    out: str | None = None,
    overwrite: bool = False,
    progress: bool = True,
    resume: bool = False,
    show_layout: bool = False,
) -> dict:
    """Run the experiment described by a parsed config.

    Args:
      data: the TOML table (``--set`` overrides applied).
      config_text: the resolved config as TOML text, stored in the output.
      engine, mesh, steps, out: command-line overrides of ``parallel.engine``,
        ``parallel.mesh``, ``time.steps`` and ``output.path``.
      overwrite: replace an existing output file.
      progress: show progress.
      resume: continue from the checkpoint next to the output (``<out>.ckpt``); the final
        state equals that of an uninterrupted run.
      show_layout: print which device holds which block before the run (grid models).

    Returns:
      The run summary, with the same keys for every model (``simpar.io.meta.SUMMARY_KEYS``:
      path, model, engine, mesh, dtype, steps, frames, run_status, wall time, rate, initial
      and final observables, model-specific ``details``).

    Raises:
      ConfigError: invalid input (nothing written).
      SimulationError: the run failed (the output holds every frame before the failure).
    """
    name = model_name(data)
    options = dict(
        engine=engine, mesh=mesh, steps=steps, out=out, progress=progress, overwrite=overwrite
    )
    if name in PARTICLE_MODELS:
        if distributed.process_count() > 1 and name not in ("lj", "nbody"):
            raise ConfigError(
                "--num-processes",
                f"multi-process runs support the grid models, lj and nbody; {name!r} runs in "
                "one process (use --devices and a mesh on one host)",
            )
        if show_layout:
            raise ConfigError("--show-layout", f"grid models only; not {name!r}")
        module = importlib.import_module(PARTICLE_MODELS[name])
        return module.run_config(data, config_text, resume=resume, **options)
    return run_grid(data, config_text, resume=resume, show_layout=show_layout, **options)


def _parallel_settings(cfg: Section, engine, mesh):
    par = cfg.section("parallel")
    cfg_engine = par.get("engine", "single", kind=str, choices=ENGINES)
    engine = engine or cfg_engine
    cfg_mesh = par.get("mesh", None, kind=int, length=(1, 2, 3), min=1)
    mesh = tuple(mesh) if mesh is not None else (tuple(cfg_mesh) if cfg_mesh else None)
    halo = par.get("halo", None, kind=int, min=1, max=16)
    return engine, mesh, halo


# state arrays per cell of each grid model (LBM: populations + the uint8 wall flag)
_STATE_FIELDS = {"heat": 1, "wave": 2, "advection": (3, 4), "gray_scott": 2, "lbm": (9.25, 19.25)}


def _check_grid_memory(cfg: Section, data: dict) -> None:
    """Refuse a grid run that cannot fit in memory, before anything is allocated.

    The estimate counts the state on the devices twice (input and output of a chunk), plus
    halos, the host copy gathered for each output frame and the frame's transposed copy:
    about ``4.2 x`` the state (on CPU every device shares the host's memory).
    """
    try:
        g = data["grid"]
        shape = [int(n) for n in g["shape"]]
        itemsize = 8 if g.get("dtype", "float32") == "float64" else 4
        fields = _STATE_FIELDS[data["model"]["name"]]
    except (KeyError, TypeError, ValueError):
        return  # malformed: the model's validation names the key
    if not 2 <= len(shape) <= 3 or min(shape) < 1:
        return
    if isinstance(fields, tuple):
        fields = fields[len(shape) - 2]
    state = math.prod(shape) * itemsize * fields
    from simpar.memory import check_fits

    check_fits(
        int(4.2 * state) + (256 << 20),
        cfg.section("grid").key("shape"),
        f"{fields:g} fields of {' x '.join(map(str, shape))} x {itemsize} bytes: state "
        f"{state / 2**30:.3g} GiB, twice on the devices, plus halos and output frames",
        "reduce grid.shape or run across more processes (--num-processes)",
    )


def run_grid(
    data,
    config_text,
    *,
    engine=None,
    mesh=None,
    steps=None,
    out=None,
    overwrite=False,
    progress=True,
    resume=False,
    show_layout=False,
) -> dict:
    """``run_config`` for the grid models (same arguments and summary; see there)."""
    from simpar.io import checkpoint
    from simpar.io.meta import run_metadata, run_summary
    from simpar.io.netcdf import GridWriter

    cfg = Section(data)
    _check_grid_memory(cfg, data)  # before the set-up allocates the initial state
    setup = grid_setup(cfg)
    model, domain = setup.model, setup.domain
    ens = ensemble.from_config(cfg, data, grid_setup)  # None without [ensemble]
    t = cfg.section("time")
    cfg_steps = t.get("steps", None if steps is not None else cfgmod.REQUIRED, kind=int, min=0)
    n_steps = steps if steps is not None else cfg_steps
    if n_steps < 0:
        raise ConfigError("--steps", f"must be >= 0, got {n_steps}")
    o = cfg.section("output")
    every = o.get("every", max(n_steps // 10, 1), kind=int, min=1)
    cfg_path = o.get("path", f"data/runs/{model.name}.nc", kind=str)
    path_key = "--out" if out is not None else "output.path"
    path = check_output_path(out if out is not None else cfg_path, path_key)
    save_checkpoints = o.get("checkpoint", True, kind=bool)
    gather_limit = o.get("gather_limit_gib", 16.0, min=0.0, exclusive_min=True)
    engine, mesh, halo = _parallel_settings(cfg, engine, mesh)
    if engine != "single" and mesh is None:
        import jax

        mesh = (len(jax.devices()) // (ens.members if ens else 1),)
    cfg.check_unused()
    if ens is None:
        eng = make_engine(engine, model, domain.shape, mesh if engine != "single" else None, halo)
    else:  # members on device groups; the mesh is one member's
        if resume:
            raise ConfigError("--resume", "ensemble runs cannot be resumed yet; run again")
        eng = make_ensemble_engine(
            engine, model, domain.shape, ens.members, mesh if engine != "single" else None, halo
        )
        setup.state, setup.params, save_checkpoints = ens.state, ens.params, False
    distributed.check_gather_size(
        sum(np.asarray(u).nbytes for u in setup.state.values()),
        gather_limit,
        o.key("gather_limit_gib"),
    )
    start = 0
    if resume:
        ck_state, start = checkpoint.load_for_resume(path, config_text, model.name)
        if start >= n_steps:
            raise ConfigError(
                "--steps", f"the checkpoint is at step {start}; ask for more steps to resume"
            )
        setup.state = {k: ck_state[k] for k in setup.state}
    elif path.exists() and not overwrite:
        raise ConfigError(
            "--out",
            f"output file {path} exists; pass --overwrite to replace it or choose another --out",
        )
    if path.suffix in (".xdmf", ".toml"):
        raise ConfigError(
            "--out",
            f"{path} looks like a sidecar/config; give an HDF5 path such as run.nc or run.h5",
        )

    # ---- everything validated: from here on we write -------------------------------------
    # (in a multi-process run every process has validated before process 0 creates a file,
    # and only process 0 writes)
    main = distributed.is_main()
    signals.check()  # stopped during set-up: no output is created
    if show_layout and main:
        from simpar.parallel.layout import describe

        print(describe(eng), flush=True)
    distributed.barrier("simpar: input validated")
    d = domain.ndim
    names = AXIS_NAMES[:d]
    out_fields = setup.output or {f: (lambda s, f=f: s[f]) for f in model.fields}
    state = eng.place(setup.state)
    params = setup.params
    obs = eng.observe(state, params)
    if np.sum(obs["nonfinite"]) > 0:
        raise ConfigError(
            "initial",
            f"the initial state has {int(np.sum(obs['nonfinite']))} non-finite values; "
            "check the [initial] settings",
        )
    variables = {}
    step_coord = {"coordinates": "step"}  # CF: xarray shows step as a coordinate of time
    member = ("ensemble",) if ens else ()  # the member dimension follows time
    for f in out_fields:
        variables[f] = {
            "dims": ("time", *member) + tuple(reversed(names)),
            "dtype": domain.dtype,
            "units": model.units.get(f, "1"),
            "long_name": model.long_names.get(f, f),
            "attrs": step_coord,
        }
    for k, v in obs.items():
        if k == "nonfinite":
            continue
        units, long_name = model.diagnostic_attrs(k)
        if np.ndim(v) == 1 + len(member):
            variables[k] = {
                "dims": ("time", *member, names[-1]),
                "dtype": "float64",
                "units": units,
                "long_name": f"{model.long_names.get(k[:-8], k[:-8])} averaged over "
                f"{', '.join(names[:-1])}",
                "attrs": step_coord,
            }
        else:
            variables[k] = {
                "dims": ("time", *member),
                "dtype": "float64",
                "units": units,
                "long_name": long_name,
                "attrs": step_coord,
            }
    attrs = run_metadata(
        config_text,
        engine=engine,
        mesh=eng.grid.shape,
        dtype=domain.dtype,
        seed=None if ens else setup.seed,
        model=model.name,
    )
    if ens:
        attrs.update(ens.attrs())
    attrs.update(
        {
            "halo_width": np.int32(eng.halo),
            "dt": float(setup.dt),
            "grid_shape": np.asarray(domain.shape, np.int32),
            "grid_length": np.asarray(domain.length, np.float64),
        }
    )
    coords = {n: c for n, c in zip(reversed(names), reversed(domain.coords()), strict=True)}
    signals.check()  # the first compilation (observe) is over: still no output
    if not main:
        writer = distributed.NoWriter()
    elif resume:
        writer = GridWriter.open_existing(path, step=start, xdmf_min_interval=2.0)
    else:
        # the XDMF sidecar is rewritten whole: at most every 2 s, and always at close
        writer = GridWriter(
            path,
            coords=coords,
            variables=variables,
            attrs=attrs,
            overwrite=overwrite,
            xdmf_min_interval=2.0,
            time_units=model.time_units,
            length_units=model.length_units,
            key=path_key,
            ensemble=ens.members if ens else None,
        )

    frames = 0
    obs0 = obs
    last_good = [f"{path} (no frame written)"]

    def frame(step, host_state, obs):
        nonlocal frames
        frames += 1
        if not main:
            return
        if ens:
            split = [{k: v[m] for k, v in host_state.items()} for m in range(ens.members)]
            values = {
                f: np.stack([np.transpose(fn(s)) for s in split]) for f, fn in out_fields.items()
            }
        else:
            values = {f: np.transpose(fn(host_state)) for f, fn in out_fields.items()}
        values.update({k: v for k, v in obs.items() if k != "nonfinite"})
        try:
            writer.append(step * setup.dt, step, values)
            if save_checkpoints:
                ckpt = checkpoint.checkpoint_path(path)
                checkpoint.save(ckpt, host_state, step, config_text, model.name)
        except (OSError, RuntimeError) as err:  # disk full, I/O error (h5py: RuntimeError)
            raise write_error(err, path, step, last_good[0]) from None
        last_good[0] = f"{path} (frames up to step {step})"

    t0 = time.perf_counter()
    done = start
    cells = math.prod(domain.shape) * (ens.members if ens else 1)
    try:
        with signals.deferred() as stop:
            writer.set_status("running")
            if not resume:
                frame(0, eng.gather(state), obs)
            with Progress(n_steps, enabled=progress and main, desc=f"{model.name}/{engine}") as bar:
                bar.update(start)
                while done < n_steps:
                    stop.check()  # SIGINT/SIGTERM: stop here, after the last frame
                    chunk = min(every, n_steps - done)
                    state = eng.advance(state, params, chunk, donate=True)
                    obs = eng.observe(state, params)
                    done += chunk
                    if np.sum(obs["nonfinite"]) > 0:
                        raise SimulationError(
                            done,
                            f"{int(np.sum(obs['nonfinite']))} non-finite values in the fields after "
                            f"step {done}",
                            hint="The scheme is unstable or a parameter is out of range: "
                            "reduce time.dt or check [physics]",
                            checkpoint=f"{path} (frames up to step {done - chunk})",
                        )
                    frame(done, eng.gather(state), obs)
                    bar.update(chunk)
            if main:
                try:
                    writer.flush()  # writes the sidecar: a full disk fails the run here
                    writer.set_status("complete")
                except (OSError, RuntimeError) as err:
                    raise write_error(err, path, done, last_good[0]) from None
    except SimulationError as err:
        final_status(writer, f"failed: {err}")
        raise
    except signals.Interrupted as err:
        final_status(writer, f"failed: {err.reason}")
        raise
    except BaseException as err:
        final_status(writer, f"failed: {type(err).__name__}: {err}")
        raise
    finally:
        final_status(writer, None)
    wall = time.perf_counter() - t0
    scalars = lambda o: {k: v for k, v in o.items() if np.ndim(v) == len(member)}  # noqa: E731
    return run_summary(
        model=model.name,
        path=path,
        engine=engine,
        mesh=eng.grid.shape,
        dtype=domain.dtype,
        steps=n_steps,
        frames=frames,
        resumed_from=start if resume else None,
        wall_s=wall,
        rate=cells * (n_steps - start) / wall / 1e6 if wall > 0 else float("nan"),
        rate_unit="Mcell_updates/s",
        initial=scalars(obs0),
        final=scalars(obs),
        details={
            "cells": cells,
            "dt": float(setup.dt),
            "ensemble_members": ens.members if ens else None,
        },
    )


def run_file(path: str, overrides=(), **kwargs) -> dict:
    """Load a TOML config, apply ``--set`` overrides and run it (see ``run_config``)."""
    data, text = cfgmod.load(path, overrides)
    return run_config(data, text, **kwargs)
