"""LJ / Morse molecular dynamics in the driver (``[model] name = "lj"``).

The LJ keys are read by ``simpar.drive.lj_config.read_config`` (its module docstring lists
them); the shared options (engine, mesh, steps, ``output.every`` with its default of a tenth
of the steps, path, checkpoint) by ``simpar.drive.loop.read_options``. Engines: ``single``
and ``sharded`` (a 1-D particle mesh) run ``simpar.particles.md``; ``pmap`` and
``shard_map`` cut a periodic box into sub-boxes (``simpar.particles.decomposed_sim``). The output is
H5MD 1.1 (positions, velocities, optionally forces, the box, thermo observables and the
Langevin RNG key at every frame; units: reduced LJ units sigma, epsilon, m).

:func:`_simulation` builds the simulation; single, sharded and decomposed simulations
answer one interface (``advance``, ``thermo``, ``snapshot``, ``step``, ``regrows``,
``builds``, ``hops``), which is all the rest of this adapter uses.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from simpar.config import Section
from simpar.drive import lj_config
from simpar.drive.loop import ModelAdapter, Options, Plan, Run, device_mesh, rate, read_options
from simpar.errors import ConfigError, SimulationError
from simpar.io.meta import run_metadata
from simpar.memory import drop_compiled_if_cached
from simpar.parallel import distributed
from simpar.parallel.mapping import kind
from simpar.particles import observables, potentials, space

DOMAIN_ENGINES = lj_config.DOMAIN_ENGINES


def _simulation(plan: LJPlan, ck: dict | None):
    """Build the simulation: ``md.Simulation`` (``single``, ``sharded``) or the decomposed
    ``DomainSimulation`` (``pmap``, ``shard_map``), new or from checkpoint arrays ``ck``.

    Both answer one interface, which is all the driver uses: ``advance(k)``,
    ``thermo() -> dict``, ``snapshot() -> dict`` (global host arrays in atom-id order,
    ``position``/``velocity``/``force`` ``(n, 3)``, ``key``, ``step``; a collective across
    processes), ``step``, ``regrows``, ``builds``, ``hops`` (None unless decomposed), and
    ``simpar.particles.checkpoint.lj_to_checkpoint`` for the checkpoint arrays.
    """
    from simpar.parallel.particles import shard_particles
    from simpar.particles import checkpoint as pck
    from simpar.particles import decomposed_sim, md

    cfg, n, cap, engine = plan.cfg, plan.n, plan.cap, plan.engine
    common = dict(dt=cfg["dt"], ensemble=cfg["ensemble"], kt=cfg["kt"], gamma=cfg["gamma"])
    build = dict(skin=cfg["skin"], step=plan.step0, max_neighbors=cfg["max_neighbors"],
                 capacity_factor=cfg["capacity_factor"], mass=cfg["mass"], key=plan.key,
                 every=cfg["every"], check=cfg["check"])  # fmt: skip
    placement = None
    if kind(engine).partitioned:
        placement = lambda tree: shard_particles(tree, plan.mesh[0], cap)  # noqa: E731
    if plan.decomposed:
        restore = None if ck is None else pck.lj_global_arrays(ck)
        return decomposed_sim.make_domain_simulation(
            engine, plan.mesh, plan.space, plan.pot, plan.r, plan.v, restore=restore,
            **common, **build,
        )  # fmt: skip
    if ck is not None:
        return pck.lj_sim_from_checkpoint(
            ck, plan.space, plan.pot, capacity=cap, layout=plan.layout,
            capacity_factor=cfg["capacity_factor"], placement=placement, **common,
        )  # fmt: skip
    return md.make_simulation(
        plan.space, plan.pot, plan.r, plan.v, valid=np.arange(cap) < n,
        placement=placement, **common, **build,
    )  # fmt: skip


def _not_appendable(path, err) -> ConfigError:
    return ConfigError(
        "--resume",
        f"cannot open {str(path)!r} for appending ({str(err).splitlines()[0]}); is another "
        "process (a viewer, an h5py session, another run) holding it open? Close it and retry",
    )


def _check_appendable(path) -> None:
    """Refuse ``--resume`` at once when the output cannot be opened for appending (HDF5's
    file lock held by a reader, read-only file); a missing file is left to the driver."""
    import h5py

    from simpar.io.untrusted import open_readonly

    if not path.exists():
        return
    open_readonly(path, "--resume").close()  # a truncated or non-HDF5 file says so
    try:
        h5py.File(path, "a").close()
    except OSError as err:
        raise _not_appendable(path, err) from None


class LJPlan(Plan):
    """A validated LJ run: settings, the initial host arrays, engine and mesh.

    Attributes:
      common: the shared options; cfg: the LJ settings (``read_config``).
      model, engine, mesh, dtype: for the metadata and the summary.
      n: atoms; cap: buffer capacity (n rounded up to the devices of a sharded run).
      r, v: initial positions and velocities ``(cap, 3)`` (host, ``dtype``); box ``(3,)``.
      first_step: the run's first step (``step0``; an H5MD start may be later than 0).
    """

    model = "lj"

    def __init__(self, root: Section, opts: Options, config_text: str):
        cfg = self.cfg = lj_config.read_config(root)
        c = self.common = read_options(
            root, opts, default_path=f"data/runs/{cfg['name']}.h5md",
            output="h5md",
        )  # fmt: skip
        self.config_text, self.engine, self.dtype = config_text, c.engine, cfg["dtype"]
        self.save_checkpoints = c.checkpoint
        self.decomposed = c.engine in DOMAIN_ENGINES
        if distributed.process_count() > 1 and kind(c.engine).one_device:
            raise ConfigError(
                "--engine",
                "engine 'single' runs in one process; across processes MD runs on 'pmap', "
                "'shard_map' or 'sharded'",
            )
        if kind(c.engine).partitioned and c.mesh is not None and len(c.mesh) != 1:
            raise ConfigError(c.mesh_key, f"LJ uses a 1-D particle mesh, got {c.mesh}")
        self.mesh = device_mesh(c)
        if c.resume and distributed.is_main():
            _check_appendable(c.path)  # before the build: a held file fails in seconds
        lj_config.check_memory(cfg)
        r, v, box, self.step0, key = lj_config.initial_state(cfg)
        lj_config.check_geometry(cfg, box)
        if self.decomposed:
            if cfg["boundary"] != "periodic":
                raise ConfigError(
                    "system.boundary",
                    f"engine {c.engine!r} cuts a periodic box into sub-boxes; free space "
                    "runs on 'single' or 'sharded'",
                )
            from simpar.parallel.capacity import check_mesh

            check_mesh(self.mesh, box, cfg["cutoff"] + cfg["skin"], cfg["skin"])
        self.first_step = self.step0
        dtype = jnp.dtype(cfg["dtype"])
        self.n = n = r.shape[0]
        if c.resume:  # names, shapes, dtypes, values against the config, before any read
            from simpar.io.particle_checks import check_lj_resume

            check_lj_resume(c.path, config_text, n, cfg["dtype"], cfg["cutoff"], cfg["skin"],
                            np.asarray(box), cfg["boundary"] == "periodic")  # fmt: skip
        ndev = 1 if self.decomposed else self.mesh[0]
        self.cap = cap = -(-n // ndev) * ndev
        from simpar.particles.checkpoint import layout_name

        self.layout = layout_name(c.engine, self.mesh, cap)
        pad = lambda x: np.concatenate([x, np.zeros((cap - n,) + x.shape[1:], x.dtype)])  # noqa: E731
        self.r, self.v, self.box = pad(r), pad(v), box
        self.space = (space.periodic if cfg["boundary"] == "periodic" else space.free)(box, dtype)
        if cfg["kind"] == "lj":
            self.pot = potentials.lennard_jones(
                cfg["epsilon"], cfg["sigma"], cfg["cutoff"], cfg["shift"], dtype
            )
        else:
            self.pot = potentials.morse(
                cfg["epsilon"], cfg["alpha"], cfg["sigma"], cfg["cutoff"], cfg["shift"], dtype
            )
        self.key = key if key is not None else jax.random.PRNGKey(cfg["noise_seed"])

    def check_resume(self, ck: dict, ck_step: int) -> int:
        """The run's first step from the checkpoint; refuses another number of atoms."""
        self.step0 = self.first_step = int(ck.get("start_step", self.step0))
        if ck.get("position", self.r[: self.n]).shape != (self.n, 3):
            raise ConfigError("--resume", "the checkpoint holds another number of atoms")
        return self.first_step

    def build(self, ck) -> LJRun:
        """Build the simulation (neighbour lists, first compilation)."""
        return LJRun(self, ck)


class LJRun(Run):
    """An LJ run (see ``simpar.drive.loop.Run`` for the methods)."""

    def __init__(self, plan: LJPlan, ck):
        self.plan, self.cfg = plan, plan.cfg
        self.sim = _simulation(plan, ck)
        # the neighbour policy (neighbors.every / check; a resumed single run gets it here)
        self.sim.every, self.sim.check = self.cfg["every"], self.cfg["check"]
        if not plan.decomposed:  # the driver keeps no list: chunks may consume them (memory)
            self.sim.consume_list = True
        # the set-up's programs (lattice, keys, first list and forces) do not run again: their
        # executables go (in.lj: 10 MiB less peak) when JAX's cache would reload them
        drop_compiled_if_cached()
        if not plan.decomposed and self.sim.placement is None:  # the time steps' compilation
            self.sim.compile_chunks()  # (the peak) before the first frame's arrays, writer
        self.desc = self.cfg["name"]
        self._snap = None

    def observe(self) -> dict:
        self._snap = None
        return self.sim.thermo()

    def initial_problem(self, th) -> None:
        """Refuse a non-finite initial state, naming the key that made it (exit 2)."""
        if all(math.isfinite(x) for x in th.values()):
            return
        cfg, dtype = self.cfg, self.cfg["dtype"]
        lattice = cfg["init"] == "lattice"
        if not (math.isfinite(th["kinetic_energy"]) and math.isfinite(th["temperature"])):
            if lattice:
                raise ConfigError(
                    "system.temperature",
                    f"{cfg['temperature']:g} gives a kinetic energy that overflows {dtype}; "
                    "give a temperature in reduced units (epsilon / k_B), e.g. 0.5 .. 5",
                )
            raise ConfigError(
                "system.file", f"{cfg['file']!r}: the velocities give a non-finite kinetic energy"
            )
        if lattice:
            key, why = lj_config.pair_energy_blame(cfg)
            raise ConfigError(key, why)
        raise ConfigError(
            "system.file",
            f"{cfg['file']!r}: the initial potential energy or pressure is not finite in "
            f"{dtype} (overlapping atoms? potential.epsilon = {cfg['epsilon']:g})",
        )

    def advance(self, k: int, last_good: str) -> None:
        self._snap = None  # stale after the chunk: its host arrays need not live through it
        try:
            self.sim.advance(k)
        except SimulationError as err:  # decoded error bits that a regrow could not repair
            raise SimulationError(err.step, err.reason, err.hint, last_good) from None

    def snapshot(self) -> dict:
        if self._snap is None:
            self._snap = self.sim.snapshot()
        return self._snap

    def problem(self, th, step):
        why = lj_config.blown_up(self.snapshot(), th, self.cfg["dt"])
        return (why, "reduce time.dt (or check the potential and initial state)") if why else None

    def postfix(self, th) -> dict:
        return {"T": f"{th['temperature']:.4g}", "E": f"{th['total_energy']:.6g}"}

    def at_frame(self, step, th, first) -> str:
        return observables.format_thermo(step, th, header=first)

    def checkpoint_state(self, g, step) -> dict:
        from simpar.particles.checkpoint import lj_to_checkpoint

        return lj_to_checkpoint(self.sim, self.plan.layout, self.plan.step0, snapshot=g)

    def open_writer(self, path, *, resume_step, overwrite, key):
        from simpar.io import h5md

        p, cfg = self.plan, self.cfg
        seed = cfg.get("seed") if cfg["init"] == "lattice" else None
        attrs = run_metadata(
            p.config_text, engine=p.engine, mesh=p.mesh, dtype=cfg["dtype"],
            seed=seed if cfg["ensemble"] == "nve" else cfg["noise_seed"], model="lj",
        )  # fmt: skip
        attrs.update(dt=cfg["dt"], ensemble=cfg["ensemble"], potential=cfg["kind"],
                     cutoff=cfg["cutoff"], skin=cfg["skin"], n_atoms=np.int64(p.n),
                     velocity_seed=np.int64(-1 if seed is None else seed),
                     noise_seed=np.int64(cfg["noise_seed"]),
                     neighbors_every=np.int64(cfg["every"]),
                     neighbors_check=np.bool_(cfg["check"]))  # fmt: skip
        new = lambda path, **kw: h5md.H5MDWriter(  # noqa: E731
            path, p.n, boundary=[cfg["boundary"]] * 3, dtype=cfg["dtype"],
            velocity=cfg["write_velocity"], force=cfg["write_force"],
            observables=observables.NAMES, rng_key=True, mass=np.full(p.n, cfg["mass"]),
            attrs=attrs, units=cfg["units"], **kw,
        )  # fmt: skip
        if resume_step is not None:  # the old file must have the layout of a new one
            try:
                return h5md.H5MDWriter.open_existing(path, step=resume_step, like=new)
            except OSError as err:
                raise _not_appendable(path, err) from None
        return new(path, overwrite=overwrite, key=key)

    def write_frame(self, writer, step, g, th) -> None:
        cfg = self.cfg
        writer.append(
            step, float(step) * cfg["dt"], g["position"], box=np.asarray(self.plan.box),
            velocity=g["velocity"] if cfg["write_velocity"] else None,
            force=g["force"] if cfg["write_force"] else None, observables=th, rng_key=g["key"],
        )  # fmt: skip

    def summary(self, th0, th, steps_run, wall) -> dict:
        n = self.plan.n
        sim = self.sim
        hops = None if sim.hops is None else list(sim.hops)
        return dict(
            **rate(n, steps_run, wall, "atom_steps/s"),
            initial=th0,
            final=th,
            details={
                "n_atoms": n,
                "energy_drift": th["total_energy"] - th0["total_energy"],
                "regrows": sim.regrows,
                "neighbor_builds": sim.builds,
                "ghost_hops": hops,
            },
        )


def plan(cfg: Section, opts: Options, config_text: str) -> LJPlan:
    """Read and validate an LJ config (``ConfigError`` names the key); nothing on the
    devices."""
    return LJPlan(cfg, opts, config_text)


model = ModelAdapter("lj", plan, "Lennard-Jones / Morse molecular dynamics (H5MD output)")
"""The LJ / Morse model (``simpar.models``)."""
