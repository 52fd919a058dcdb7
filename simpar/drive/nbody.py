"""Gravitational N-body in the driver (``[model] name = "nbody"``).

Builds a Plummer sphere and runs it with kick-drift-kick leapfrog on one of the four engines
of ``simpar.parallel.ring`` (one dispatch per chunk, state kept on the devices); NaN/inf are
checked between chunks; the output is H5MD 1.1 (``simpar.drive.nbody_output.open_output``:
positions, velocities, masses and the observables at every frame, N-body units).

Config keys (defaults in brackets; ``time.steps``, ``output.*`` and ``parallel.engine`` /
``parallel.mesh`` are read by ``simpar.drive.loop.read_options``)::

    [model]     name = "nbody"
    [particles] n (>= 2), seed [0], dtype ["float64"] ("float32" | "float64")
    [time]      dt (> 0), steps (>= 0)
    [physics]   force ["direct"] (all pairs on the ring; "pm": particle-mesh gravity in a
                periodic box, keys in ``simpar.drive.nbody_pm``), softening [0.0] (>= 0),
                G [1.0] (> 0)
    [output]    every [a tenth of the steps, at least 1], path ["data/runs/nbody.h5md"]
                (must end in .h5md), checkpoint [true] (<path>.ckpt with each frame)
    [parallel]  engine ["single"], devices [1 for single, else all devices]
                (or mesh = [n], as in other simpar configs; the ring is 1-D)

Restart: the checkpoint holds positions, velocities, accelerations, masses, the step and the
initial energy; ``--resume`` continues bit for bit on the same engine and device count.
"""

from __future__ import annotations

import math

import numpy as np

from simpar import precision
from simpar.config import Section
from simpar.drive import nbody_output as io
from simpar.drive.loop import ModelAdapter, Options, Plan, device_mesh, rate, read_options
from simpar.drive.nbody_output import BodiesRun
from simpar.errors import ConfigError, SimulationError
from simpar.memory import check_fits
from simpar.parallel.mapping import kind

#: what an N-body run adds besides its arrays: XLA's client, the compiled programs (bytes)
_OVERHEAD = 100 << 20


def memory_estimate(n: int, devices: int, dtype: str, engine: str) -> int:
    """Bytes an N-body run of ``n`` bodies adds to the process's resident memory at its peak.

    Fitted to measured peaks through ``simpar run`` (experiments/check_memory_estimates.py,
    jaxlib 0.10 CPU, N = 1024 .. 16384): about 64 values per body (state, host copies,
    output frame) and, per device (on CPU every device shares the host's memory), the pair
    arrays of the targets it holds at once against all ``n`` sources, about 5 values per
    pair: 64 targets at a time where the kernel is tiled
    (``simpar.particles.nbody.default_target_block``), else the device's whole block.
    """
    from simpar.particles.nbody import default_target_block

    item = np.dtype(dtype).itemsize
    block = -(-n // devices)
    tile = default_target_block(engine)
    rows = min(tile, block) if tile else block
    return int(_OVERHEAD + n * 64 * item + devices * rows * n * 5 * item)


class NBodyPlan(Plan):
    """A validated N-body run (nothing allocated).

    Attributes:
      common: the shared options; n: bodies; seed; dt, G, eps: time step, gravitational
        constant and softening (N-body units); model, engine, mesh ``(devices,)``, dtype.
    """

    model = "nbody"
    first_step = 0

    def __init__(self, cfg: Section, opts: Options, config_text: str):
        cfg.section("model", required=True).get("name", kind=str, choices=("nbody",))
        part = cfg.section("particles", required=True)
        self.n = n = part.get("n", kind=int, min=2)
        self.seed = part.get("seed", 0, kind=int, min=0, max=2**63 - 1)
        self.dtype = part.get("dtype", "float64", kind=str, choices=("float32", "float64"))
        precision.require(self.dtype, part.key("dtype"))
        self.dt = cfg.section("time", required=True).get("dt", kind=float, min=0.0,
                                                         exclusive_min=True)  # fmt: skip
        phys = cfg.section("physics")
        self.eps = phys.get("softening", 0.0, kind=float, min=0.0)
        self.G = phys.get("G", 1.0, kind=float, min=0.0, exclusive_min=True)
        cfg_devices = cfg.section("parallel").get("devices", None, kind=int, min=1)
        c = self.common = read_options(
            cfg, opts, default_path="data/runs/nbody.h5md", output="h5md"
        )
        self.engine, self.config_text = c.engine, config_text
        self.save_checkpoints = c.checkpoint
        self.mesh, ring_key = self._ring(c, cfg_devices)
        from simpar.parallel.ring import check_layout

        if n % self.mesh[0]:  # blame what set the ring size (N when every device is used)
            m, lo = self.mesh[0], n - n % self.mesh[0]
            default = ring_key == "parallel.mesh" and c.mesh is None
            fits = f"N = {lo} or {lo + m}" if lo else f"N = {m}"
            raise ConfigError(
                part.key("n") if default else ring_key,
                f"N = {n} particles cannot be split evenly over {m} devices (N must be a "
                f"multiple of the device count; {fits} would do, or another device count)",
            )
        check_layout(n, c.engine, self.mesh[0])  # no 'single' across processes, no idle one
        if c.resume:  # names, shapes, dtypes, values against the config, before any read
            from simpar.io.particle_checks import check_nbody_resume

            check_nbody_resume(c.path, config_text, n, self.dtype)
        check_fits(
            memory_estimate(n, self.mesh[0], self.dtype, self.engine),
            part.key("n"),
            f"{n} bodies, all pairs over {self.mesh[0]} device(s)",
            "reduce particles.n or use more devices",
        )

    @staticmethod
    def _ring(c, cfg_devices) -> tuple[tuple[int], str]:
        """The ring size ``(n,)`` (``--mesh``, else ``parallel.mesh`` / ``parallel.devices``)
        and the key it came from."""
        mesh, key = c.mesh, c.mesh_key
        if key == "parallel.mesh":  # not from the command line
            if mesh is not None and cfg_devices is not None and cfg_devices != mesh[0]:
                raise ConfigError(
                    "parallel.mesh",
                    f"{list(mesh)} disagrees with parallel.devices = {cfg_devices}; set one",
                )
            if mesh is None and cfg_devices is not None:
                mesh, key = (cfg_devices,), "parallel.devices"
            devices = mesh[0] if mesh is not None else None
            if kind(c.engine).one_device and not c.engine_from_cli and devices not in (None, 1):
                raise ConfigError(
                    "parallel.devices", f"engine 'single' runs on 1 device, got {devices}"
                )
        if not kind(c.engine).one_device and mesh is not None and len(mesh) != 1:
            shape = "x".join(map(str, mesh))
            raise ConfigError(key, f"the N-body ring is 1-D: give one device count, got {shape}")
        return device_mesh(c, mesh=mesh, key=key), key

    def check_resume(self, ck: dict, ck_step: int) -> int:
        """The run starts at step 0 (``build`` checks the number of bodies)."""
        return 0

    def build(self, ck) -> NBodyRun:
        """Place the bodies on the ring's devices and compute their first accelerations."""
        return NBodyRun(self, ck)


class NBodyRun(BodiesRun):
    """An N-body run on a ring engine (see ``simpar.drive.loop.Run`` for the methods)."""

    desc = "nbody"

    def __init__(self, plan: NBodyPlan, ck):
        from simpar.particles import checkpoint as pck
        from simpar.particles.nbody import make_engine, make_params, plummer_sphere

        self.plan = p = plan
        dtype = np.dtype(p.dtype)
        self.pos, vel, self.mass = plummer_sphere(p.n, p.seed, dtype=dtype)
        self.params = make_params(p.dt, p.G, p.eps, dtype=dtype)
        self.eng = make_engine(p.engine, p.mesh[0])
        if ck is None:
            self.state, self.step = self.eng.init(self.pos, vel, self.mass, self.params), 0
            self.e0 = None
        else:
            ck_state, self.step = pck.nbody_state_from_checkpoint(ck)
            if ck_state.pos.shape != self.pos.shape:
                raise ConfigError("--resume", "the checkpoint holds another number of particles")
            self.state, self.e0 = self.eng.place(ck_state), float(ck["energy_initial"])
        self.prev = self.step
        self.max_de = self.max_p = -math.inf  # over the frames of this invocation
        self._obs = io.observable_values(self.eng.observables(self.state, self.params))

    def _track(self, obs) -> None:
        """The max relative energy error and |total momentum| over the frames."""
        self.max_de = max(self.max_de, abs(float(obs["total_energy"]) / self.e0 - 1.0))
        self.max_p = max(self.max_p, float(np.abs(obs["momentum"]).max()))

    _HINT = "reduce time.dt or increase physics.softening"

    def initial_problem(self, obs) -> None:
        why = self._nonfinite(obs)
        if why:
            raise SimulationError(self.step, why, self._HINT)
        if self.e0 is None:
            self.e0 = float(obs["total_energy"])
        self._track(obs)  # the first frame, or the state a resumed run starts from

    def advance(self, k: int, last_good: str) -> None:
        self.prev = self.step
        self.state, dobs = self.eng.run(self.state, self.params, k)
        self._obs = io.observable_values(dobs)
        self.step += k

    def postfix(self, obs) -> dict:
        return {"dE": f"{self.max_de:.1e}"}

    def snapshot(self):
        return self.eng.fetch(self.state)  # a collective across processes

    def checkpoint_state(self, host, step) -> dict:
        from simpar.particles import checkpoint as pck

        state = pck.nbody_state_to_checkpoint(host, step)
        state["energy_initial"] = np.float64(self.e0)
        return state

    def file_attrs(self) -> dict:
        p = self.plan
        return {
            "units": "N-body (Henon) units: G = M = 1, E = -1/4 (Plummer), r_V = 1",
            "n": np.int64(p.n),
            "G": np.float64(p.G),
            "softening": np.float64(p.eps),
            "dt": np.float64(p.dt),
        }

    def write_frame(self, writer, step, host, obs) -> None:
        writer.append(step, step * self.plan.dt, host.pos, box=np.zeros(3), velocity=host.vel,
                      observables=obs)  # fmt: skip

    def summary(self, obs0, obs, steps_run, wall) -> dict:
        n = self.plan.n
        return dict(
            **rate(float(n) * n, steps_run, wall, "pair_interactions/s"),
            initial=obs0,
            final=obs,
            details={
                "n": n,
                "energy_initial": self.e0,
                "energy_max_rel_error": self.max_de,
                "momentum_max_abs": self.max_p,
            },
        )


FORCES = ("direct", "pm")
"""``physics.force``: the all-pairs ring (this module) or particle-mesh gravity in a periodic
box (``simpar.drive.nbody_pm``)."""
_PM_ONLY = ("pm_mesh", "box", "boundary")


def plan(cfg: Section, opts: Options, config_text: str) -> Plan:
    """Read and validate an N-body config (``ConfigError`` names the key); nothing
    allocated. ``physics.force = "pm"`` hands the config to ``simpar.drive.nbody_pm``."""
    phys = cfg.section("physics")
    if phys.get("force", "direct", kind=str, choices=FORCES) == "pm":
        from simpar.drive import nbody_pm

        return nbody_pm.plan(cfg, opts, config_text)
    for name in _PM_ONLY:
        if name in phys:
            raise ConfigError(
                phys.key(name),
                "is a key of the particle-mesh force only (physics.force = 'pm'); the "
                "all-pairs force (physics.force = 'direct') has open boundaries",
            )
    return NBodyPlan(cfg, opts, config_text)


model = ModelAdapter("nbody", plan, "gravitational N-body: direct sum or particle-mesh")
"""The N-body model (``simpar.models``): ``physics.force`` picks the ring or the PM plan."""
