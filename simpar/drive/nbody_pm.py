"""Particle-mesh gravity in the driver (``[model] name = "nbody"``, ``physics.force = "pm"``).

A static periodic box of particles on a lattice (displaced by a plane wave or Gaussian random
Zel'dovich displacements, ``simpar.particles.pm_ics``) moves under PM gravity
(``simpar.particles.pm``: cloud-in-cell deposit, Poisson by the distributed FFT, 4th-order
gradient, CIC interpolation, kick-drift-kick leapfrog) on one of the four engines of
``simpar.parallel.pm_engine``. On ``pmap``/``shard_map`` the particles are owned by sub-box and
migrate between devices every step; a chunk stops at the first step whose particles overflow
``pm.capacity`` or ``pm.migrate``, both are regrown and the chunk is redone from its start
(a line on stderr says so; ``simpar.particles.pm_sim``, the MD regrow loop), and the particle
count is checked at every frame: nothing is dropped silently.

Config keys (defaults in brackets; ``time.steps``, ``output.*`` and ``parallel.engine`` /
``parallel.mesh`` are read by ``simpar.drive.loop.read_options``)::

    [model]     name = "nbody"
    [physics]   force = "pm" (default "direct": the all-pairs ring, simpar.drive.nbody),
                pm_mesh = [N0, N1, N2] (mesh nodes, each >= 4; the device mesh must divide
                it and its FFT transposes), box [[1.0, 1.0, 1.0]] (periodic edge lengths, > 0),
                boundary ["periodic"] (the only one: Poisson by FFT), G [1.0] (> 0).
                No softening key: the mesh softens the force on about two cells.
    [particles] lattice = [n0, n1, n2] (one particle per site; N = n0 n1 n2, total mass 1),
                seed [0], dtype ["float64"]
    [initial]   kind = "plane_wave" (amplitude = A0 k in (0, 1) [0.05]) or "zeldovich"
                (sigma: rms initial density contrast [0.1]; spectral_index [-2.0];
                velocity ["growing"] | "rest"), or "file": path (an H5MD file: positions,
                velocities, masses and box of frame [-1], the last; particles.lattice and
                seed are then not given, physics.box defaults to the file's box)
    [time]      dt (> 0), steps (>= 0)
    [pm]        capacity, migrate: particle slots per device and per axis and direction of
                migration (pmap/shard_map; default: from the initial distribution;
                regrown, with a line on stderr, when a step overflows them)
    [output]    every, path ["data/runs/nbody_pm.h5md"] (.h5md), checkpoint [true]
    [parallel]  engine ["single"], mesh [every device along x] (1 to 3 axes) or devices (n:
                the mesh (n,))

Output: H5MD as for ``nbody`` (``simpar.drive.nbody_output``) with a periodic box and the
observables ``kinetic_energy``, ``potential_energy``, ``total_energy``, ``momentum`` and
``density_contrast`` (largest mesh density / mean). Restart: the checkpoint holds positions,
velocities, accelerations and masses in id order, and the per-device capacities;
``--resume`` continues bit for bit on the same engine and mesh.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np

from simpar import precision
from simpar.config import Section
from simpar.drive import nbody_output as io
from simpar.drive.loop import Options, Plan, device_mesh, rate, read_options
from simpar.drive.nbody_output import BodiesRun
from simpar.errors import ConfigError, SimulationError
from simpar.memory import check_fits
from simpar.parallel.mapping import kind

KINDS = ("plane_wave", "zeldovich", "file")


class PMPlan(Plan):
    """A validated PM run (nothing allocated).

    Attributes:
      common: the shared options; shape: PM mesh nodes; box: edge lengths; lattice, n:
        particles per axis and in all; G, dt; kind and its parameters; capacity, migrate
        (None: sized by the engine); engine, mesh, dtype, seed.
    """

    model = "nbody"
    first_step = 0

    def __init__(self, cfg: Section, opts: Options, config_text: str):
        cfg.section("model", required=True).get("name", kind=str, choices=("nbody",))
        phys = cfg.section("physics", required=True)
        phys.get("force", kind=str, choices=("direct", "pm"))
        if "softening" in phys:
            raise ConfigError(
                phys.key("softening"),
                "the PM force is softened by the mesh (about two cells of physics.pm_mesh); "
                "remove physics.softening, or use physics.force = 'direct' for Plummer softening",
            )
        boundary = phys.get("boundary", "periodic", kind=str)
        if boundary != "periodic":
            raise ConfigError(
                phys.key("boundary"),
                f"the PM force solves Poisson by FFT in a periodic box; got {boundary!r}, allowed:"
                " 'periodic' (use physics.force = 'direct' for an open, non-periodic system)",
            )
        self.shape = tuple(phys.get("pm_mesh", kind=int, length=3, min=4))
        self.box = tuple(phys.get("box", [1.0] * 3, kind=float, length=3, min=0.0,
                                  exclusive_min=True))  # fmt: skip
        if not (1e-100 <= min(self.box) and max(self.box) <= 1e100):  # wavenumbers, volume
            raise ConfigError(phys.key("box"), f"edges {list(self.box)} must lie in 1e-100 .. "
                              "1e100 (N-body units: 1)")  # fmt: skip
        self.G = phys.get("G", 1.0, kind=float, min=0.0, exclusive_min=True)
        part = cfg.section("particles", required=True)
        if "n" in part:
            raise ConfigError(
                part.key("n"),
                "with physics.force = 'pm' the particles sit on a lattice: set "
                "particles.lattice = [n0, n1, n2] (N = n0 n1 n2) instead of particles.n",
            )
        self.dtype = part.get("dtype", "float64", kind=str, choices=("float32", "float64"))
        precision.require(self.dtype, part.key("dtype"))
        init = cfg.section("initial", required=True)
        self.kind = init.get("kind", kind=str, choices=KINDS)
        self.frame = None
        if self.kind == "file":  # a frame of an H5MD file (ours or another code's)
            self._read_file(init, part, phys)
        else:
            self.lattice = tuple(part.get("lattice", kind=int, length=3, min=1))
            self.n = math.prod(self.lattice)
            self.seed = part.get("seed", 0, kind=int, min=0, max=2**63 - 1)
        if self.kind == "plane_wave":
            self.amplitude = init.get("amplitude", 0.05, kind=float, min=0.0, max=0.999,
                                      exclusive_min=True)  # fmt: skip
        elif self.kind == "zeldovich":
            self.sigma = init.get("sigma", 0.1, kind=float, min=0.0, exclusive_min=True)
            self.index = init.get("spectral_index", -2.0, kind=float, min=-4.0, max=4.0)
            self.velocity = init.get("velocity", "growing", kind=str, choices=("growing", "rest"))
        self.dt = cfg.section("time", required=True).get("dt", kind=float, min=0.0,
                                                         exclusive_min=True)  # fmt: skip
        pm = cfg.section("pm")
        self.capacity = pm.get("capacity", None, kind=int, min=1)
        self.migrate = pm.get("migrate", None, kind=int, min=1)
        c = self.common = read_options(
            cfg, opts, default_path="data/runs/nbody_pm.h5md", output="h5md"
        )
        self.engine, self.config_text = c.engine, config_text
        self.save_checkpoints = c.checkpoint
        mesh, self.mesh_key = c.mesh, c.mesh_key
        devices = cfg.section("parallel").get("devices", None, kind=int, min=1)
        if devices is not None and self.mesh_key == "parallel.mesh" and mesh is None:
            mesh, self.mesh_key = (devices,), "parallel.devices"  # as the all-pairs force reads it
            if kind(c.engine).one_device and devices != 1 and not c.engine_from_cli:
                raise ConfigError(
                    "parallel.devices", f"engine 'single' runs on 1 device, got {devices}"
                )
        self.mesh = device_mesh(c, mesh=mesh, key=self.mesh_key)
        self._check_split()
        if c.resume:  # names, shapes, dtypes, values against the config, before any read
            from simpar.io.particle_checks import check_pm_resume

            check_pm_resume(c.path, config_text, self.n, self.dtype)
        itemsize = np.dtype(self.dtype).itemsize
        on_particles, on_mesh = self.n * 40 * itemsize, 12 * math.prod(self.shape) * itemsize
        # particle arrays (x ~2 buffers) and ~12 mesh-sized arrays; within 30% of the peaks
        # measured through ``simpar run`` (experiments/check_memory_estimates.py, 32^3 .. 128^3)
        check_fits(
            on_particles + on_mesh + (200 << 20),  # + XLA's client, programs, FFT plans
            part.key("lattice") if on_particles > on_mesh else phys.key("pm_mesh"),
            f"{self.n} particles on a {'x'.join(map(str, self.shape))} mesh",
            "reduce particles.lattice or physics.pm_mesh, or use more devices",
        )

    def _read_file(self, init: Section, part: Section, phys: Section) -> None:
        """``initial.path`` / ``initial.frame`` (default the last): positions, velocities
        and masses of an H5MD file, checked against the plan (untrusted input:
        ``simpar.io.h5md_read``). Sets ``frame`` (the host arrays), ``n``, ``seed`` (None)
        and, when ``physics.box`` is not given, ``box`` from the file's edges."""
        from simpar.io.h5md_read import read_frame

        path = init.get("path", kind=str)
        frame = init.get("frame", -1, kind=int)
        for name in ("lattice", "seed"):
            if name in part:
                raise ConfigError(
                    part.key(name), "the particles come from initial.path (initial.kind = 'file')"
                )
        if not Path(path).is_file():
            raise ConfigError(init.key("path"), f"H5MD file {path!r} not found")
        key = init.key("path")
        fr = read_frame(path, frame, key=key)
        pos, vel, mass = fr["position"], fr["velocity"], fr.get("mass")
        n, dtype = pos.shape[0], np.dtype(self.dtype)
        where = f"{path}: /particles/trajectory"
        if vel is None:
            raise ConfigError(key, f"{where}/velocity: missing; a PM run needs velocities")
        for name, a in (("position", pos), ("velocity", vel)):
            if a.shape != (n, 3) or a.dtype != dtype or not np.all(np.isfinite(a)):
                raise ConfigError(
                    key,
                    f"{where}/{name} is {a.dtype} {a.shape}; the run needs finite {dtype} "
                    f"({n}, 3) (particles.dtype)",
                )
        if mass is not None and (
            mass.shape != (n,) or not np.all(np.isfinite(mass)) or np.any(mass <= 0)
        ):
            raise ConfigError(key, f"{where}/mass must hold {n} finite masses > 0")
        edges = fr["box"]
        if edges is not None:
            edges = np.diag(edges) if np.ndim(edges) == 2 else np.asarray(edges)
            if "box" not in phys:
                self.box = tuple(float(e) for e in edges)
            elif not np.allclose(edges, self.box, rtol=1e-12, atol=0):
                raise ConfigError(
                    phys.key("box"),
                    f"{list(self.box)} differs from the box of {path} ({edges.tolist()}); "
                    "leave physics.box out to take the file's",
                )
        box = np.asarray(self.box, dtype)
        self.frame = (np.mod(pos, box).astype(dtype), vel, mass)  # periodic: into [0, L)
        self.n, self.seed, self.lattice = n, None, None

    def _check_split(self) -> None:
        """The device mesh must divide the PM mesh and its FFT transposes (``ConfigError``)."""
        from simpar.parallel import fft

        if kind(self.engine).one_device:
            return
        if len(self.mesh) > 3:
            raise ConfigError(self.mesh_key, f"a 3-D PM mesh takes 1 to 3 mesh axes: {self.mesh}")
        try:
            fft.make_plan(self.shape, self.mesh, True)
        except ConfigError as err:
            mesh = "x".join(map(str, self.mesh))
            raise ConfigError(
                self.mesh_key,
                f"physics.pm_mesh = {list(self.shape)} does not split over the device mesh "
                f"{mesh}: {err.message}",
            ) from None

    def check_resume(self, ck: dict, ck_step: int) -> int:
        """The run starts at step 0 (``build`` checks the number of particles)."""
        return 0

    def build(self, ck) -> PMRun:
        """Place the particles on the devices and compute their first accelerations."""
        return PMRun(self, ck)


class PMRun(BodiesRun):
    """A PM run on a ``PMEngine`` (see ``simpar.drive.loop.Run`` for the methods)."""

    desc = "nbody-pm"

    def __init__(self, plan: PMPlan, ck):
        import jax.numpy as jnp

        from simpar.parallel.pm_engine import PMEngine
        from simpar.particles import pm, pm_ics
        from simpar.particles.pm_sim import PMSimulation

        self.plan = p = plan
        dtype = np.dtype(p.dtype)
        self.layout = f"{p.engine} {'x'.join(map(str, p.mesh))}"
        capacity, migrate = p.capacity, p.migrate
        if ck is not None and bytes(ck.get("pm_layout", b"")) == self.layout.encode():
            # the same buffers as the interrupted run, regrown ones included (0: sized by
            # the engine)
            capacity = max(capacity or 0, int(ck.get("pm_capacity", 0))) or None
            migrate = max(migrate or 0, int(ck.get("pm_migrate", 0))) or None
        self.eng = eng = PMEngine(p.engine, p.shape, p.mesh, p.box, capacity, migrate,
                                  key=p.mesh_key)  # fmt: skip
        self.params = pm.PMParams(jnp.asarray(p.dt, dtype), jnp.asarray(p.G, dtype))
        self.mass = np.full(p.n, 1.0 / p.n, dtype)  # total mass 1
        self.rho0 = 1.0 / math.prod(p.box)
        if p.frame is not None and p.frame[2] is not None:  # the file's masses
            self.mass = p.frame[2].astype(dtype)
            self.rho0 = float(self.mass.astype(np.float64).sum()) / math.prod(p.box)
        if ck is None:
            omega = pm_ics.growth_rate(p.G, 1.0, p.box)
            if p.kind == "file":
                pos, vel = p.frame[0], p.frame[1]
            elif p.kind == "plane_wave":
                pos, vel, _ = pm_ics.plane_wave(p.lattice, p.box, p.amplitude)
            else:
                pos, vel = pm_ics.zeldovich(p.lattice, p.box, p.seed, p.sigma, p.index, omega,
                                            p.velocity)  # fmt: skip
            host, step, self.e0 = (pos.astype(dtype), vel.astype(dtype), self.mass, None), 0, None
        else:
            shapes = {k: np.shape(ck.get(k)) for k in ("pos", "vel", "acc", "mass")}
            if shapes != {"pos": (p.n, 3), "vel": (p.n, 3), "acc": (p.n, 3), "mass": (p.n,)}:
                raise ConfigError("--resume", "the checkpoint holds another number of particles")
            host, step = (ck["pos"], ck["vel"], ck["mass"], ck["acc"]), int(ck["step"])
            self.e0 = (float(ck["energy_initial"]), float(ck["energy_scale"]))
        # overflows regrow pm.capacity / pm.migrate and redo the chunk (one line each)
        self.sim = PMSimulation(eng, self.params, *host, step=step, log=_log)
        self.prev = self.step
        self.max_de = self.max_p = -math.inf
        self._obs = self._observe_now()

    def _observe_now(self) -> dict:
        rows = self.sim.observables()
        tot = rows[:, :5].astype(np.float64).sum(axis=0)
        return {
            "kinetic_energy": np.float64(tot[0]),
            "potential_energy": np.float64(tot[1]),
            "total_energy": np.float64(tot[0] + tot[1]),
            "momentum": tot[2:5],
            "density_contrast": np.float64(rows[:, 5].max() / self.rho0),
        }

    def _track(self, obs) -> None:
        """Max of ``|E - E0| / (K + |W|)`` (``K + |W|`` the largest so far: a collapsing
        system starts near ``E = 0``) and of ``|P|`` over the frames."""
        e0, scale = self.e0
        k, w = float(obs["kinetic_energy"]), float(obs["potential_energy"])
        self.e0 = (e0, scale := max(scale, k + abs(w)))
        self.max_de = max(self.max_de, abs(float(obs["total_energy"]) - e0) / scale)
        self.max_p = max(self.max_p, float(np.abs(obs["momentum"]).max()))

    def initial_problem(self, obs) -> None:
        why = self._nonfinite(obs)
        if why and self.e0 is None:  # a new run: the config made the initial state non-finite
            p = self.plan
            volume = math.prod(p.box)
            if not (math.isfinite(volume) and 1e-300 < volume < 1e300):
                key = "physics.box"
            elif p.G * max(p.box) ** 2 > 1e300:
                key = "physics.G"
            else:
                key = "initial.sigma" if p.kind != "plane_wave" else "initial.amplitude"
            raise ConfigError(key, f"gives a non-finite initial state ({why}); use values near "
                              "1 (N-body units: box 1, G = 1 / (4 pi))")  # fmt: skip
        if why:
            raise SimulationError(self.step, why, self._HINT)
        if self.e0 is None:
            k, w = float(obs["kinetic_energy"]), float(obs["potential_energy"])
            self.e0 = (k + w, max(k + abs(w), 1e-300))
        self._track(obs)

    @property
    def step(self) -> int:
        """The step of the state."""
        return self.sim.step

    def advance(self, k: int, last_good: str) -> None:
        self.prev = self.step
        try:
            self.sim.advance(k)  # stops at the first overflow; regrows and redoes the chunk
        except SimulationError as err:
            raise SimulationError(err.step, err.reason, err.hint, last_good) from None
        self._obs = self._observe_now()

    def postfix(self, obs) -> dict:
        return {"contrast": f"{float(obs['density_contrast']):.3g}"}

    def snapshot(self):
        """``(pos, vel, mass, ids, acc)`` host arrays in id order (checks the count)."""
        return self.sim.snapshot()

    def checkpoint_state(self, host, step) -> dict:
        from simpar.particles import checkpoint as pck
        from simpar.particles.nbody import NBodyState

        pos, vel, mass, _, acc = host
        state = pck.nbody_state_to_checkpoint(NBodyState(pos, vel, acc, mass), step)
        state["energy_initial"], state["energy_scale"] = (np.float64(e) for e in self.e0)
        state["pm_layout"] = np.bytes_(self.layout)
        state["pm_capacity"] = np.int64(self.eng.capacity or 0)
        state["pm_migrate"] = np.int64(self.eng.migrate_cap or 0)
        return state

    _OUTPUT = {"periodic": True, "names": io.PM_OBSERVABLES}

    def file_attrs(self) -> dict:
        p = self.plan
        return {
            "units": "N-body units: total mass 1, G and the box as configured",
            "force": "pm",
            "n": np.int64(p.n),
            "G": np.float64(p.G),
            "pm_mesh": np.asarray(p.shape, np.int64),
            "box": np.asarray(p.box, np.float64),
            "dt": np.float64(p.dt),
            "growth_rate": np.float64(math.sqrt(4 * math.pi * p.G * self.rho0)),
        }

    def write_frame(self, writer, step, host, obs) -> None:
        pos, vel = host[0], host[1]
        writer.append(step, step * self.plan.dt, pos, box=np.asarray(self.plan.box),
                      velocity=vel, observables=obs)  # fmt: skip

    def summary(self, obs0, obs, steps_run, wall) -> dict:
        n = self.plan.n
        return dict(
            **rate(float(n), steps_run, wall, "particle_steps/s"),
            initial=obs0,
            final=obs,
            details={
                "n": n,
                "force": "pm",
                "pm_mesh": list(self.plan.shape),
                "energy_initial": self.e0[0],
                "energy_max_rel_change": self.max_de,
                "momentum_max_abs": self.max_p,
                "density_contrast": float(obs["density_contrast"]),
                "regrows": self.sim.regrows,
                "pm_capacity": self.eng.capacity,
                "pm_migrate": self.eng.migrate_cap,
            },
        )


def _log(line: str) -> None:
    """A regrow line on stderr (the main process; also under ``--quiet``)."""
    from simpar.parallel import distributed

    if distributed.is_main():
        print(f"nbody-pm: {line}", file=sys.stderr, flush=True)


def plan(cfg: Section, opts: Options, config_text: str) -> PMPlan:
    """Read and validate a PM N-body config (``ConfigError`` names the key); nothing
    allocated."""
    return PMPlan(cfg, opts, config_text)
