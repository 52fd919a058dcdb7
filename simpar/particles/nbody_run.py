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
    [output]    every (>= 1), path ["data/runs/nbody.h5md"] (must end in .h5md)
    [parallel]  engine ["single"], devices [1 for single, else all devices]

Units are N-body units (G = M = 1, E = -1/4 for the Plummer sphere). H5MD's units module
cannot express them, so the file carries no ``unit`` attributes (see ``_NBodyH5MD``).
"""

from __future__ import annotations

import math
import time as _time
from pathlib import Path

import h5py
import jax
import numpy as np

import simpar
from simpar.config import Section
from simpar.errors import ConfigError, SimulationError
from simpar.io.meta import run_metadata
from simpar.parallel.ring import ENGINES, check_layout, make_engine
from simpar.particles.nbody import Observables, make_params, plummer_sphere
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


class _NBodyH5MD:
    """Minimal H5MD 1.1 writer for a non-periodic N-body run (plain h5py).

    Layout (reference/HDF5_FORMATS.md section 1)::

        /h5md (version [1, 1]), /h5md/author, /h5md/creator
        /particles/trajectory/box         dimension=3, boundary=["none"]*3 (no edges:
                                          allowed by H5MD for non-periodic boxes)
        /particles/trajectory/position    value f[T,N,3], step i8[T], time f8[T]
        /particles/trajectory/velocity    value f[T,N,3], step/time hard links
        /particles/trajectory/mass        f[N] (time-independent)
        /observables/<name>               value f8[T] or f8[T,3], step/time hard links
        /parameters                       G, softening, dt, seed, n as attributes
        root attributes                   run metadata (vlen strings), run_status

    Crash safety: one handle for the whole run; per frame the values are written first,
    then ``step`` and ``time`` last, then the file is flushed.

    Units: none. H5MD's unit strings (and MDAnalysis, which only knows MD units) cannot
    express N-body units, so readers open the file with
    ``MDAnalysis.Universe(path, n_atoms=N, convert_units=False)``.
    """

    def __init__(self, path: Path, n: int, dtype: str, meta: dict, parameters: dict):
        self.f = h5py.File(path, "w")  # default libver: readable by older HDF5
        f = self.f
        for key, value in meta.items():
            f.attrs[key] = value
        f.attrs["run_status"] = "running"
        f.create_group("h5md").attrs["version"] = np.array([1, 1], np.int32)
        f.create_group("h5md/author").attrs["name"] = str(meta.get("author", "unknown"))
        creator = f.create_group("h5md/creator")
        creator.attrs["name"] = "simpar"
        creator.attrs["version"] = simpar.__version__
        traj = f.create_group("particles/trajectory")
        box = traj.create_group("box")
        box.attrs["dimension"] = np.int32(3)
        box.attrs["boundary"] = ["none"] * 3
        self.pos = self._element(traj, "position", (n, 3), dtype)
        self.step = self.pos.create_dataset(
            "step", (0,), maxshape=(None,), chunks=(1024,), dtype="i8"
        )
        self.time = self.pos.create_dataset(
            "time", (0,), maxshape=(None,), chunks=(1024,), dtype="f8"
        )
        self.vel = self._element(traj, "velocity", (n, 3), dtype)
        self._link(self.vel)
        self.mass = traj.create_dataset("mass", (n,), dtype=dtype)
        obs = f.create_group("observables")
        self.obs = {}
        for name in _OBSERVABLES:
            shape = (3,) if name in ("momentum", "angular_momentum") else ()
            self.obs[name] = self._element(obs, name, shape, "f8")
            self._link(self.obs[name])
        params = f.create_group("parameters")
        for key, value in parameters.items():
            params.attrs[key] = value
        self.frames = 0
        f.flush()

    @staticmethod
    def _element(parent, name, shape, dtype):
        group = parent.create_group(name)
        group.create_dataset(
            "value", (0,) + shape, maxshape=(None,) + shape, chunks=(1,) + shape, dtype=dtype
        )
        return group

    def _link(self, group):
        group["step"] = self.step  # hard links, as H5MD asks
        group["time"] = self.time

    def write(self, step: int, time: float, pos, vel, obs: dict) -> None:
        k = self.frames
        for group, value in [(self.pos, pos), (self.vel, vel)] + [
            (self.obs[name], obs[name]) for name in _OBSERVABLES
        ]:
            ds = group["value"]
            ds.resize(k + 1, axis=0)
            ds[k] = value
        self.step.resize(k + 1, axis=0)
        self.step[k] = step
        self.time.resize(k + 1, axis=0)
        self.time[k] = time  # written last: the frame's commit marker
        self.frames = k + 1
        self.f.flush()

    def close(self, status: str) -> None:
        if self.f:
            self.f.attrs["run_status"] = status
            self.f.close()
            self.f = None


def _devices_for(engine: str, mesh, cfg_devices) -> int:
    if mesh is not None:
        mesh = tuple(mesh)
        if len(mesh) != 1:
            raise ConfigError(
                "--mesh",
                f"the N-body ring is 1-D: give one number of devices, got {'x'.join(map(str, mesh))}",
            )
        return int(mesh[0])
    if engine == "single":
        return 1
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
) -> dict:
    """Run an N-body config and write its H5MD output.

    Args:
      data: the parsed config table (see the module docstring for the keys).
      config_text: the resolved config as TOML text (stored in the output).
      engine: engine to use; an empty string means ``parallel.engine`` from the config.
      mesh: device ring as a 1-tuple ``(n,)``; None means ``parallel.devices``.
      steps: number of steps; None means ``time.steps``.
      out: output path; None means ``output.path``.
      progress: show a progress bar / log lines.

    Returns:
      Summary: path, engine, devices, n, steps, frames, initial and final total energy,
      max relative energy error over the frames, max |total momentum|, wall time and
      pair interactions per second.

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
    tsec = cfg.section("time", required=True)
    dt = tsec.get("dt", kind=float, min=0.0, exclusive_min=True)
    cfg_steps = tsec.get("steps", kind=int, min=0)
    phys = cfg.section("physics")
    eps = phys.get("softening", 0.0, kind=float, min=0.0)
    G = phys.get("G", 1.0, kind=float, min=0.0, exclusive_min=True)
    osec = cfg.section("output")
    every = osec.get("every", kind=int, min=1)
    cfg_path = osec.get("path", "data/runs/nbody.h5md", kind=str)
    psec = cfg.section("parallel")
    cfg_engine = psec.get("engine", "single", kind=str, choices=ENGINES)
    cfg_devices = psec.get("devices", None, kind=int, min=1)
    cfg.check_unused()

    if engine and engine not in ENGINES:
        raise ConfigError("--engine", f"{engine!r} is not one of {', '.join(ENGINES)}")
    engine = engine or cfg_engine
    n_devices = _devices_for(engine, mesh, cfg_devices)
    check_layout(n, engine, n_devices)
    if steps is not None and (not isinstance(steps, int) or steps < 0):
        raise ConfigError("--steps", f"must be an integer >= 0, got {steps!r}")
    n_steps = cfg_steps if steps is None else steps
    path = Path(out if out is not None else cfg_path)
    path_key = "--out" if out is not None else "output.path"
    if path.suffix != ".h5md":
        raise ConfigError(
            path_key, f"must end in .h5md (MDAnalysis recognises H5MD by it), got {str(path)!r}"
        )
    if path.is_dir():
        raise ConfigError(path_key, f"{str(path)!r} is a directory")
    if dtype == "float64" and not jax.config.jax_enable_x64:
        # The driver is a top-level entry point: float64 runs need 64-bit JAX.
        jax.config.update("jax_enable_x64", True)

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
    parameters = {
        "n": np.int64(n),
        "G": np.float64(G),
        "softening": np.float64(eps),
        "dt": np.float64(dt),
        "seed": np.int64(seed),
        "units": "N-body (Henon) units: G = M = 1, E = -1/4",
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = _NBodyH5MD(path, n, dtype, meta, parameters)
    writer.mass[...] = mass
    status = "failed"
    t0 = _time.monotonic()
    try:
        dstate = eng.init(pos, vel, mass, params)
        obs = _observable_values(eng.observables(dstate, params))
        _check_finite(obs, 0, None, 0)
        e0 = float(obs["total_energy"])
        max_de = 0.0
        max_p = float(np.abs(obs["momentum"]).max())
        host = eng.fetch(dstate)
        writer.write(0, 0.0, host.pos, host.vel, obs)
        step = 0
        with Progress(n_steps, enabled=progress, desc="nbody") as bar:
            while step < n_steps:
                chunk = min(every - step % every, n_steps - step)
                dstate, dobs = eng.run(dstate, params, chunk)
                obs = _observable_values(dobs)
                step += chunk
                _check_finite(obs, step, str(path), step - chunk)
                max_de = max(max_de, abs(float(obs["total_energy"]) / e0 - 1.0))
                max_p = max(max_p, float(np.abs(obs["momentum"]).max()))
                if step % every == 0 or step == n_steps:
                    host = eng.fetch(dstate)
                    writer.write(step, step * dt, host.pos, host.vel, obs)
                bar.update(chunk, dE=f"{max_de:.1e}")
        status = "completed"
    finally:
        writer.close(status)
    wall = _time.monotonic() - t0
    return {
        "path": str(path),
        "model": name,
        "engine": engine,
        "devices": n_devices,
        "n": n,
        "dtype": dtype,
        "steps": n_steps,
        "frames": writer.frames,
        "energy_initial": e0,
        "energy_final": float(obs["total_energy"]),
        "energy_max_rel_error": max_de,
        "momentum_max_abs": max_p,
        "wall_s": wall,
        "pair_interactions_per_s": float(n) * n * n_steps / wall if wall > 0 else math.nan,
    }


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
