"""Driver for gravitational N-body configs (``[model] name = "nbody"``).

Reads and validates a config (every key before the output file is created), builds a
Plummer sphere, runs it with kick-drift-kick leapfrog on one of the four engines of
``simpar.parallel.ring`` in chunks of ``output.every`` steps (one dispatch per chunk,
state kept on the devices), checks for NaN/inf between chunks, and writes an H5MD 1.1
file with positions, velocities and the observables at every frame.

Config keys (defaults in brackets)::

    [model]     name = "nbody"
    [particles] n (>= 2), seed [0], dtype ["float64"] ("float32" | "float64")
    [time]      dt (> 0), steps (>= 0)
    [physics]   softening [0.0] (>= 0), G [1.0] (> 0)
    [output]    every (>= 1), path ["data/runs/nbody.h5md"] (must end in .h5md),
                checkpoint [true] (write <path>.ckpt with each frame, for --resume)
    [parallel]  engine ["single"], devices [1 for single, else all devices]
                (or mesh = [n], as in other simpar configs)

Output: written with ``simpar.io.h5md.H5MDWriter`` (the particle writer shared with the
LJ runs), with open boundaries (``boundary = "none"``, zero box edges), velocities, the
masses, and observables at every frame: ``kinetic_energy``, ``potential_energy``,
``total_energy``, ``virial_ratio`` ``[T]`` and ``momentum``, ``angular_momentum``
``[T, 3]`` (whole-system totals). Run metadata and physics parameters are attributes of
``/parameters`` (with ``run_status``: running / complete / failed: <reason>).

Units are N-body units (G = M = 1, E = -1/4 for the Plummer sphere). Following
``simpar.io.h5md``'s convention, position/velocity/time ``unit`` attributes name
MDAnalysis's base units ("A", "ps"), so ``MDAnalysis.Universe(path)`` opens the file and
returns the stored numbers unconverted; ``/h5md/modules/units`` ``system = "nbody"``,
``reduced_unit`` attributes (``L``, ``L T-1``, ``T``) and the observables' ``unit`` say
what they really are.

Restart: with each frame the whole state (positions, velocities, accelerations, masses,
step; ``simpar.particles.checkpoint``) is written atomically to ``<path>.ckpt``;
``resume=True`` (``simpar run --resume``) continues from it, appending to the same file, bit
for bit equal to an uninterrupted run on the same engine and device count (to round-off on
another: the state is stored in global particle order).
"""

from __future__ import annotations

import math
import time as _time
from pathlib import Path

import jax
import numpy as np

from simpar import precision, signals
from simpar.config import Section
from simpar.errors import ConfigError, SimulationError
from simpar.io import checkpoint
from simpar.io.files import (
    check_output_path,
    set_status_or_fail,
    status_on_exit,
    write_error,
)
from simpar.io.h5md import H5MDWriter
from simpar.io.meta import run_metadata, run_summary
from simpar.memory import check_fits
from simpar.parallel import distributed
from simpar.parallel.ring import ENGINES, check_layout
from simpar.particles import checkpoint as particle_checkpoint
from simpar.particles.nbody import Observables, make_engine, make_params, plummer_sphere
from simpar.progress import Progress

__all__ = ["run_config"]

_OBSERVABLES = (
    "kinetic_energy",
    "potential_energy",
    "total_energy",
    "momentum",
    "angular_momentum",
    "virial_ratio",
)


def _observable_values(obs: Observables) -> dict[str, np.ndarray]:
    kin, pot = float(obs.kinetic), float(obs.potential)
    return {
        "kinetic_energy": np.float64(kin),
        "potential_energy": np.float64(pot),
        "total_energy": np.float64(kin + pot),
        "momentum": np.asarray(obs.momentum, np.float64),
        "angular_momentum": np.asarray(obs.angular_momentum, np.float64),
        "virial_ratio": np.float64(kin / abs(pot) if pot else np.nan),
    }


# N-body units (symbols of ``simpar.io.h5md.UNIT_SYSTEMS["nbody"]``): ``reduced_unit`` of
# every element; observables also carry them as their ``unit`` (MDAnalysis does not convert
# observables). Energies and momenta are whole-system totals.
_NBODY_UNITS = {
    "position": "L",
    "velocity": "L T-1",
    "edges": "L",
    "kinetic_energy": "M L+2 T-2",
    "potential_energy": "M L+2 T-2",
    "total_energy": "M L+2 T-2",
    "virial_ratio": "1",
    "momentum": "M L T-1",
    "angular_momentum": "M L+2 T-1",
}
_VECTORS = ("momentum", "angular_momentum")


def _open_output(
    path: Path, n: int, dtype: str, mass, attrs: dict, overwrite: bool = False, key="--out"
) -> H5MDWriter:
    """An H5MD writer (``simpar.io.h5md``) set up for an open-boundary N-body run.

    Layout differences from an LJ run: ``boundary = "none"`` on every axis and zero box
    edges (MDAnalysis then reports no box, so no periodic images are used); vector
    observables ``momentum`` and ``angular_momentum`` ``[T, 3]``; ``unit_system =
    "nbody"`` and N-body ``reduced_unit`` labels; energies are totals, not per atom.
    """

    def extra(writer: H5MDWriter) -> None:
        obs = writer.file["observables"]
        for name in _VECTORS:
            grp = obs.create_group(name)
            writer.elements[name] = grp.create_dataset(
                "value", (0, 3), maxshape=(None, 3), chunks=(256, 3), dtype="f8"
            )
            grp["step"], grp["time"] = writer.step, writer.time  # hard links
        for name, ds in writer.elements.items():
            ds.attrs["reduced_unit"] = _NBODY_UNITS[name]
            if name in _OBSERVABLES:
                ds.attrs["unit"] = _NBODY_UNITS[name]
        writer.time.attrs["reduced_unit"] = "T"  # crossing time 2 sqrt(2) T

    return H5MDWriter(
        path,
        n,
        boundary=("none",) * 3,
        dtype=dtype,
        velocity=True,
        observables=[o for o in _OBSERVABLES if o not in _VECTORS],
        mass=mass,
        attrs=attrs,
        overwrite=overwrite,
        extra=extra,
        key=key,
        unit_system="nbody",
    )


def _devices_for(engine: str, from_cli: bool, mesh, cfg_devices, cfg_mesh) -> int:
    """Ring size from ``--mesh``, else ``parallel.devices`` / ``parallel.mesh``."""
    if mesh is not None:
        mesh = tuple(mesh)
        if engine == "single":
            return 1  # one device whatever the mesh, as for every model
        if len(mesh) != 1:
            shape = "x".join(map(str, mesh))
            raise ConfigError(
                "--mesh", f"the N-body ring is 1-D: give one device count, got {shape}"
            )
        return int(mesh[0])
    if cfg_mesh is not None:
        if cfg_devices is not None and cfg_devices != cfg_mesh[0]:
            raise ConfigError(
                "parallel.mesh",
                f"{cfg_mesh} disagrees with parallel.devices = {cfg_devices}; set one",
            )
        cfg_devices = cfg_mesh[0]
    if engine == "single":
        if not from_cli and cfg_devices not in (None, 1):
            raise ConfigError(
                "parallel.devices", f"engine 'single' runs on 1 device, got {cfg_devices}"
            )
        return 1  # --engine single overrides a device count meant for another engine
    return cfg_devices if cfg_devices is not None else len(jax.devices())


def run_config(
    data: dict,
    config_text: str,
    *,
    engine: str,
    mesh: tuple[int, ...] | None,
    steps: int | None,
    out: str | None,
    progress: bool = True,
    overwrite: bool = False,
    resume: bool = False,
) -> dict:
    """Run an N-body config and write its H5MD output.

    Args:
      data: the parsed config table (see the module docstring for the keys).
      config_text: the resolved config as TOML text (stored in the output).
      engine: engine to use; "" or None means ``parallel.engine`` from the config.
      mesh: device ring as a 1-tuple ``(n,)``; None means ``parallel.devices``
        (``--engine single`` ignores the config's device count).
      steps: number of steps; None means ``time.steps``.
      out: output path; None means ``output.path``.
      progress: show a progress bar / log lines.
      overwrite: replace an existing output file.
      resume: continue from ``<out>.ckpt``, appending to the output (only ``time.steps``
        may differ from the original config).

    Returns:
      The run summary (``simpar.io.meta.run_summary``, the same keys for every model):
      ``initial`` / ``final`` observables (energies, virial ratio, momenta), ``rate`` in
      pair interactions/s, ``mesh = [devices]``, and ``details`` with ``n``, the max
      relative energy error over the frames and the max |total momentum|.

    Raises:
      ConfigError: invalid config or options (raised before any file is created).
      SimulationError: NaN/inf detected; the output keeps every frame written before.
    """
    cfg = Section(data)
    name = cfg.section("model", required=True).get("name", kind=str, choices=("nbody",))
    part = cfg.section("particles", required=True)
    n = part.get("n", kind=int, min=2)
    seed = part.get("seed", 0, kind=int, min=0)
    dtype = part.get("dtype", "float64", kind=str, choices=("float32", "float64"))
    precision.require(dtype, part.key("dtype"))
    tsec = cfg.section("time", required=True)
    dt = tsec.get("dt", kind=float, min=0.0, exclusive_min=True)
    cfg_steps = tsec.get("steps", kind=int, min=0)
    phys = cfg.section("physics")
    eps = phys.get("softening", 0.0, kind=float, min=0.0)
    G = phys.get("G", 1.0, kind=float, min=0.0, exclusive_min=True)
    osec = cfg.section("output")
    every = osec.get("every", kind=int, min=1)
    cfg_path = osec.get("path", "data/runs/nbody.h5md", kind=str)
    save_checkpoints = osec.get("checkpoint", True, kind=bool)
    psec = cfg.section("parallel")
    cfg_engine = psec.get("engine", "single", kind=str, choices=ENGINES)
    cfg_devices = psec.get("devices", None, kind=int, min=1)
    cfg_mesh = psec.get("mesh", None, kind=int, length=1, min=1)  # as in grid/LJ configs
    cfg.check_unused()

    if engine and engine not in ENGINES:
        raise ConfigError("--engine", f"{engine!r} is not one of {', '.join(ENGINES)}")
    from_cli = bool(engine)
    engine = engine or cfg_engine
    n_devices = _devices_for(engine, from_cli, mesh, cfg_devices, cfg_mesh)
    check_layout(n, engine, n_devices)  # also: no 'single' across processes, no idle process
    main = distributed.is_main()  # process 0 writes the file and checkpoints, shows progress
    progress = progress and main
    if steps is not None and (not isinstance(steps, int) or steps < 0):
        raise ConfigError("--steps", f"must be an integer >= 0, got {steps!r}")
    n_steps = cfg_steps if steps is None else steps
    path = Path(out if out is not None else cfg_path)
    path_key = "--out" if out is not None else "output.path"
    if path.suffix != ".h5md":
        raise ConfigError(
            path_key, f"must end in .h5md (MDAnalysis recognises H5MD by it), got {str(path)!r}"
        )
    path = check_output_path(path, path_key)
    ck = None
    if resume:
        ck, ck_step = checkpoint.load_for_resume(path, config_text, name)
        if ck_step >= n_steps:
            raise ConfigError(
                "--steps", f"the checkpoint is at step {ck_step}; ask for more steps to resume"
            )
    elif path.exists() and not overwrite:
        raise ConfigError(
            "--out",
            f"output file {path} exists; pass --overwrite to replace it or choose another --out",
        )

    itemsize = np.dtype(dtype).itemsize
    check_fits(  # pair arrays of one target block against its sources dominate
        n * -(-n // n_devices) * 4 * itemsize + n * 64 * itemsize + (256 << 20),
        part.key("n"),
        f"{n} bodies, all pairs over {n_devices} device(s)",
        "reduce particles.n or use more devices",
    )

    # ---- everything validated: build the system and create the output
    pos, vel, mass = plummer_sphere(n, seed, dtype=np.dtype(dtype))
    params = make_params(dt, G, eps, dtype=np.dtype(dtype))
    eng = make_engine(engine, n_devices)
    meta = run_metadata(
        config_text,
        engine=engine,
        mesh=(n_devices,),
        dtype=dtype,
        seed=seed,
        model=name,
    )
    attrs = meta | {
        "units": "N-body (Henon) units: G = M = 1, E = -1/4 (Plummer), r_V = 1",
        "n": np.int64(n),
        "G": np.float64(G),
        "softening": np.float64(eps),
        "dt": np.float64(dt),
    }
    signals.check()  # stopped during set-up or compilation: no output is created
    if ck is not None:
        ck_state, ck_step = particle_checkpoint.nbody_state_from_checkpoint(ck)
        if ck_state.pos.shape != pos.shape:
            raise ConfigError("--resume", "the checkpoint holds another number of particles")
    distributed.barrier("simpar: input validated")  # every process checked before 0 writes
    if not main:
        writer = distributed.NoWriter()
    elif ck is not None:
        writer = H5MDWriter.open_existing(path, step=ck_step)
    else:
        writer = _open_output(path, n, dtype, mass, attrs, overwrite=overwrite, key=path_key)
    no_box = np.zeros(3)
    t0 = _time.monotonic()
    last_good = f"{path} (no frame written)"

    def frame(step, dstate, obs, e0):
        nonlocal last_good
        host = eng.fetch(dstate)  # a collective across processes: every process fetches
        try:
            writer.append(step, step * dt, host.pos, box=no_box, velocity=host.vel, observables=obs)
        except (OSError, RuntimeError) as err:  # disk full, I/O error (h5py: RuntimeError)
            raise write_error(err, path, step, last_good) from None
        last_good = f"{path} (frames up to step {step})"
        if save_checkpoints and main:  # after the frame: a kill in between drops that frame
            state = particle_checkpoint.nbody_state_to_checkpoint(host, step)
            state["energy_initial"] = np.float64(e0)
            checkpoint.save(checkpoint.checkpoint_path(path), state, step, config_text, name)

    with status_on_exit(writer):
        with signals.deferred() as stop:
            if ck is None:
                dstate = eng.init(pos, vel, mass, params)
                step = 0
            else:
                dstate, step = eng.place(ck_state), ck_step
                last_good = f"{path} (frames up to step {step})"
            obs = _observable_values(eng.observables(dstate, params))
            _check_finite(obs, step, None, step)
            obs0 = obs
            e0 = float(ck["energy_initial"]) if ck is not None else float(obs["total_energy"])
            max_de = abs(float(obs["total_energy"]) / e0 - 1.0)
            max_p = float(np.abs(obs["momentum"]).max())
            if ck is None:
                frame(0, dstate, obs, e0)
            first = step
            with Progress(n_steps, enabled=progress, desc="nbody") as bar:
                bar.update(first)
                while step < n_steps:
                    stop.check()  # SIGINT/SIGTERM: stop here, after the last frame
                    chunk = min(every - step % every, n_steps - step)
                    dstate, dobs = eng.run(dstate, params, chunk)
                    obs = _observable_values(dobs)
                    step += chunk
                    _check_finite(obs, step, str(path), step - chunk)
                    max_de = max(max_de, abs(float(obs["total_energy"]) / e0 - 1.0))
                    max_p = max(max_p, float(np.abs(obs["momentum"]).max()))
                    if step % every == 0 or step == n_steps:
                        frame(step, dstate, obs, e0)
                    bar.update(chunk, dE=f"{max_de:.1e}")
            set_status_or_fail(writer, "complete", path, step, last_good)
    wall = _time.monotonic() - t0
    return run_summary(
        model=name,
        path=path,
        engine=engine,
        mesh=(n_devices,),
        dtype=dtype,
        steps=n_steps,
        frames=writer.frames,
        resumed_from=first if ck is not None else None,
        wall_s=wall,
        rate=float(n) * n * (n_steps - first) / wall if wall > 0 else math.nan,
        rate_unit="pair_interactions/s",
        initial=obs0,
        final=obs,
        details={
            "n": n,
            "energy_initial": e0,
            "energy_max_rel_error": max_de,
            "momentum_max_abs": max_p,
        },
    )


def _check_finite(obs: dict, step: int, checkpoint: str | None, last_good: int) -> None:
    values = np.concatenate([np.atleast_1d(v) for v in obs.values()])
    if not np.all(np.isfinite(values)):
        where = f"between steps {last_good} and {step}" if step > last_good else "at step 0"
        raise SimulationError(
            step,
            f"non-finite energy or momentum {where} (NaN/inf in positions or velocities)",
            hint="reduce time.dt or increase physics.softening",
            checkpoint=checkpoint,
        )
