"""The LJ/Morse config reader (``[model] name = "lj"``); the run goes through ``simpar.drive``.

Config layout (every key optional unless marked; defaults in brackets)::

    name = "lj_bench"            # run name, default output data/runs/<name>.h5md ["lj"]
    [model]
    name = "lj"                  # required
    [system]
    init = "lattice"             # "lattice" | "h5md"
    lattice = "fcc"              # "fcc" | "sc"              (init = "lattice")
    density = 0.8442             # number density, sigma^-3   (init = "lattice")
    cells = [20, 20, 20]         # unit cells per axis         (init = "lattice")
    temperature = 1.44           # initial T, 3N-3 dof         (init = "lattice") [0]
    seed = 87287                 # velocity seed               (init = "lattice") [0]
    file = "run.h5md"            # state to continue           (init = "h5md")
    frame = -1                   # frame of that file          (init = "h5md")
    mass = 1.0                   # [1.0]
    boundary = "periodic"        # "periodic" | "none"  ["periodic"; h5md: the file's]
    dtype = "float64"            # "float32" | "float64"
    [potential]
    kind = "lj"                  # "lj" | "morse"
    epsilon = 1.0                # LJ epsilon / Morse D0
    sigma = 1.0                  # LJ sigma / Morse r0
    alpha = 5.0                  # Morse only
    cutoff = 2.5
    shift = false                # shift the energy to zero at the cutoff
    [neighbors]
    skin = 0.3                   # Verlet skin: the list holds pairs within cutoff + skin
    every = 1                    # consider a rebuild only every N steps (int >= 1) [1]
    check = true                 # rebuild only when an atom moved > skin / 2 [true]
                                 # (LAMMPS neigh_modify every N check yes|no; the default,
                                 # every 1 check true, is exact: no pair is ever missed;
                                 # in.lj ships every 20 check false)
    max_neighbors = 0            # 0: measured; a too small value is regrown
    capacity_factor = 1.2        # head-room of measured / regrown capacities
    [integrator]
    ensemble = "nve"             # "nve" | "langevin"
    temperature = 1.0            # langevin target T
    gamma = 1.0                  # langevin friction (1/tau)
    seed = 0                     # langevin noise seed (h5md init: the file's key)
    [time]
    dt = 0.005                   # required
    steps = 100                  # required (or --steps)
    [output]
    every = 20                   # steps per frame [a tenth of time.steps, at least 1]
    path = "data/runs/lj.h5md"
    velocity = true
    force = false
    checkpoint = true            # write <path>.ckpt with each frame (for --resume)
    [units]                      # optional: what the reduced units are physically
    style = "lj"                 # "lj": reduced, the file carries no unit labels ["lj"];
                                 # "real" (kcal/mol) | "metal" (eV): the H5MD file stores
                                 # Angstrom, ps, K, ... (simpar.io.meta.PhysicalUnits);
                                 # then all three are required:
    sigma = 3.405                # Angstrom (argon)
    epsilon = 0.2381             # kcal/mol ("real") or eV ("metal") (argon: 119.8 K kB)
    mass = 39.948                # g/mol
    [parallel]
    engine = "single"            # "single" | "pmap" | "shard_map" | "sharded"
    mesh = [8]                   # sharded: devices on the 1-D particle mesh [all];
                                 # pmap / shard_map: the device grid cutting the box
                                 # into sub-boxes, e.g. [2, 4] or [2, 2, 2] [all along x]

Everything is validated before the output file is created. ``time.steps``, ``output.every``,
``output.path``, ``output.checkpoint``, ``parallel.engine`` and ``parallel.mesh`` are read by
the driver (``simpar.drive.loop.read_options``), the rest by :func:`read_config`; the chunk
loop is ``simpar.drive.loop`` and the LJ adapter ``simpar.drive.lj``.

Restart: with each frame the complete state (``simpar.particles.checkpoint``) is written
atomically to ``<path>.ckpt``; ``simpar.run_config(..., resume=True)`` (``simpar run --resume``)
continues from it, appending to the same H5MD file, bit for bit equal to an uninterrupted
run on the same engine and mesh (to round-off on another one). ``system.init = "h5md"``
instead starts a new run from a saved frame: see ``simpar.io.h5md`` for its tolerance.
"""

from __future__ import annotations

import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from simpar import precision
from simpar.config import Section
from simpar.errors import ConfigError
from simpar.io import h5md, meta
from simpar.memory import check_fits
from simpar.parallel import mapping
from simpar.particles import lattice, md, potentials

DOMAIN_ENGINES = mapping.PER_BLOCK  # spatial decomposition (simpar.particles.decomposed_sim)


def read_config(root: Section) -> dict:
    """Read and validate the LJ keys of a config (the driver reads the shared ones).

    Args:
      root: the whole config.

    Returns:
      A plain dict of settings (``name``, ``init``, ``dtype``, potential, neighbour and
      integrator settings, ``restart`` for ``system.init = "h5md"``).

    Raises:
      ConfigError: a bad value, naming the key.
    """
    cfg: dict = {"name": root.get("name", "lj", kind=str)}
    model = root.section("model", required=True)
    cfg["model"] = model.get("name", kind=str, choices=("lj",))

    sysc = root.section("system")
    init = cfg["init"] = sysc.get("init", "lattice", kind=str, choices=("lattice", "h5md"))
    cfg["dtype"] = sysc.get("dtype", "float64", kind=str, choices=("float32", "float64"))
    precision.require(cfg["dtype"], sysc.key("dtype"))
    cfg["mass"] = sysc.get("mass", 1.0, min=0.0, exclusive_min=True)
    if init == "lattice":
        cfg["lattice"] = sysc.get("lattice", "fcc", kind=str, choices=("fcc", "sc"))
        cfg["density"] = sysc.get("density", min=0.0, exclusive_min=True)
        cfg["cells"] = sysc.get("cells", kind=int, length=3, min=1)
        cfg["temperature"] = sysc.get("temperature", 0.0, min=0.0)
        cfg["seed"] = sysc.get("seed", 0, kind=int, min=0, max=2**63 - 1)
        cfg["boundary"] = sysc.get("boundary", "periodic", kind=str, choices=("periodic", "none"))
    else:
        path = sysc.get("file", kind=str)
        cfg["frame"] = sysc.get("frame", -1, kind=int)
        if not Path(path).is_file():
            raise ConfigError("system.file", f"H5MD file {path!r} not found")
        try:
            cfg["restart"] = h5md.read_frame(path, cfg["frame"])
        except ConfigError:
            raise  # already names system.file and the dataset
        except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError) as err:
            msg = f"cannot read a state from {path!r}: {err}"
            raise ConfigError("system.file", msg) from None
        fr = cfg["restart"]
        _check_restart(path, fr)
        bnd = fr["boundary"]
        default_b = "none" if all(b == "none" for b in bnd) else "periodic"
        cfg["boundary"] = sysc.get("boundary", default_b, kind=str, choices=("periodic", "none"))
        if fr["box"] is None and cfg["boundary"] == "periodic":
            raise ConfigError("system.file", f"{path!r} has no box/edges for a periodic run")
        cfg["file"] = path

    pot = root.section("potential")
    kind = cfg["kind"] = pot.get("kind", "lj", kind=str, choices=potentials.KINDS)
    cfg["epsilon"] = pot.get("epsilon", 1.0, min=0.0, exclusive_min=True)
    cfg["sigma"] = pot.get("sigma", 1.0, min=0.0, exclusive_min=True)
    cfg["alpha"] = pot.get("alpha", 5.0, min=0.0, exclusive_min=True) if kind == "morse" else 0.0
    cfg["cutoff"] = pot.get("cutoff", 2.5, min=0.0, exclusive_min=True)
    cfg["shift"] = pot.get("shift", False, kind=bool)

    nb = root.section("neighbors")
    cfg["skin"] = nb.get("skin", 0.3, min=0.0, exclusive_min=True)
    cfg["max_neighbors"] = nb.get("max_neighbors", 0, kind=int, min=0) or None
    cfg["capacity_factor"] = nb.get("capacity_factor", 1.2, min=1.0)
    cfg["every"] = nb.get("every", 1, kind=object, check=_every_problem)
    cfg["check"] = nb.get("check", True, kind=object, check=_check_problem)
    if init == "h5md" and cfg["boundary"] == "periodic":
        # the file's box against this run's cell grid (cutoff + skin): huge edges refused
        fr = cfg["restart"]
        h5md.check_box(path, fr["box"], ["periodic"] * 3, cfg["cutoff"] + cfg["skin"])

    integ = root.section("integrator")
    ens = cfg["ensemble"] = integ.get("ensemble", "nve", kind=str, choices=md.ENSEMBLES)
    if ens == "langevin":
        cfg["kt"] = integ.get("temperature", min=0.0)
        cfg["gamma"] = integ.get("gamma", 1.0, min=0.0)
        cfg["noise_seed"] = integ.get("seed", 0, kind=int, min=0, max=2**63 - 1)
    else:
        cfg["kt"], cfg["gamma"], cfg["noise_seed"] = 0.0, 0.0, 0

    cfg["dt"] = root.section("time").get("dt", min=0.0, exclusive_min=True)
    _check_thermal_speed(cfg)
    cfg["units"] = _read_units(root.section("units"))
    if init == "h5md" and cfg["restart"].get("unit_system") in meta.STYLES:
        raise ConfigError(
            "system.file",
            f"{cfg['file']!r} is in {cfg['restart']['unit_system']!r} units (Angstrom, ps), "
            "not reduced ones; start from a file written without [units]",
        )
    o = root.section("output")
    cfg["write_velocity"] = o.get("velocity", True, kind=bool)
    cfg["write_force"] = o.get("force", False, kind=bool)
    return cfg


def _read_units(un: Section):
    """``[units]``: None for reduced units (``style = "lj"``), else the
    :class:`simpar.io.meta.PhysicalUnits` the H5MD file is written in."""
    style = un.get("style", "lj", kind=str, choices=("lj", *meta.STYLES))
    if style == "lj":
        return None
    energy = meta.ENERGY[style][0].replace(" mol-1", "/mol")
    values, missing = {}, []
    for key in ("sigma", "epsilon", "mass"):  # read all three (simpar keys lists them)
        try:
            values[key] = un.get(key, min=0.0, exclusive_min=True)
        except ConfigError:
            if key in un:
                raise
            missing.append(key)
    if missing:
        raise ConfigError(
            un.key(missing[0]),
            f"missing; units.style = {style!r} needs sigma (Angstrom), epsilon ({energy}) and "
            "mass (g/mol), e.g. argon: sigma = 3.405, epsilon = 0.2381 kcal/mol, mass = 39.948",
        )
    return meta.PhysicalUnits(style, values["sigma"], values["epsilon"], values["mass"])


def _every_problem(value) -> str | None:
    """Why ``neighbors.every`` is not allowed (None when it is)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return (
            f"must be an integer >= 1 (a rebuild is considered only after steps that are "
            f"multiples of it; LAMMPS neigh_modify every N; 1 = every step), got {value!r}"
        )
    return None


def _check_problem(value) -> str | None:
    """Why ``neighbors.check`` is not allowed (None when it is)."""
    if not isinstance(value, bool):
        return (
            "must be true or false (true: rebuild only when an atom moved more than skin / 2; "
            f"false: at every considered step; LAMMPS neigh_modify check yes|no), got {value!r}"
        )
    return None


MAX_THERMAL_STEP = 0.25  # sigma per step a typical atom may move; velocity Verlet fails beyond


def _check_thermal_speed(cfg: dict) -> None:
    """Refuse a temperature at which a typical atom moves more than ``MAX_THERMAL_STEP``
    sigma per step (the run would blow up a few steps in, blamed on ``time.dt``).

    The initial (``system.temperature``) and the Langevin target (``integrator.temperature``)
    temperatures are checked; the thermal speed is ``sqrt(3 T / m)`` (reduced units). The
    temperature is blamed when even the usual ``time.dt = 0.005`` would be too long, else
    ``time.dt``.
    """
    dt, mass = cfg["dt"], cfg["mass"]
    temps = {"system.temperature": cfg.get("temperature", 0.0)}
    if cfg["ensemble"] == "langevin":
        temps["integrator.temperature"] = cfg["kt"]
    for key, temp in temps.items():
        speed = math.sqrt(3.0 * temp / mass) if temp < 1e300 else math.inf
        if speed * dt > MAX_THERMAL_STEP:
            blame = key if speed * 0.005 > MAX_THERMAL_STEP else "time.dt"
            raise ConfigError(
                blame,
                f"{key} = {temp:g} gives atoms a thermal speed sqrt(3 T / m) = {speed:.3g} "
                f"sigma/tau: {speed * dt:.3g} sigma per step with time.dt = {dt:g}, above "
                f"the {MAX_THERMAL_STEP} that velocity Verlet survives; lower {key} (reduced "
                "units, epsilon / k_B) or time.dt",
            )


def _check_restart(path: str, fr: dict) -> None:
    """Refuse an H5MD state that cannot start a run, naming the dataset at fault."""
    traj = "/particles/trajectory"
    pos = np.asarray(fr["position"])
    if pos.ndim != 2 or pos.shape[1] != 3 or pos.shape[0] < 2:
        raise ConfigError(
            "system.file",
            f"{path!r}: {traj}/position/value has frames of shape {pos.shape}; "
            "expected (N, 3) with N >= 2",
        )
    if pos.dtype.kind != "f" or not np.all(np.isfinite(pos)):
        raise ConfigError(
            "system.file", f"{path!r}: {traj}/position/value holds non-finite or non-float values"
        )
    vel = fr["velocity"]
    if vel is None:
        raise ConfigError(
            "system.file", f"{path!r} has no velocities to continue from ({traj}/velocity)"
        )
    vel = np.asarray(vel)
    if vel.shape != pos.shape or vel.dtype.kind != "f" or not np.all(np.isfinite(vel)):
        raise ConfigError(
            "system.file",
            f"{path!r}: {traj}/velocity/value must be finite floats of shape {pos.shape} "
            f"like the positions, got {vel.dtype} {vel.shape}",
        )
    box = fr["box"]
    if box is not None:
        box = np.asarray(box)
        edges = np.diag(box) if box.ndim == 2 else box
        if edges.shape != (3,) or not np.all(np.isfinite(edges)) or np.any(edges < 0):
            raise ConfigError(
                "system.file",
                f"{path!r}: {traj}/box/edges must be 3 finite edge lengths >= 0, got "
                f"{np.asarray(box).tolist()}",
            )
        if all(b == "periodic" for b in fr["boundary"]) and np.any(edges <= 0):
            raise ConfigError(
                "system.file",
                f"{path!r}: {traj}/box/edges has a zero edge {edges.tolist()} for a periodic box",
            )
        fr["box"] = edges
    mass = fr.get("mass")
    if mass is not None:
        mass = np.asarray(mass)
        if mass.shape != (pos.shape[0],) or not np.all(np.isfinite(mass)) or np.any(mass <= 0):
            raise ConfigError(
                "system.file",
                f"{path!r}: {traj}/mass must hold {pos.shape[0]} finite masses > 0",
            )
    key = fr.get("rng_key")
    if key is not None and np.asarray(key).shape != (2,):
        raise ConfigError(
            "system.file", f"{path!r}: /parameters/rng_key/value frames must have shape (2,)"
        )


def initial_state(cfg):
    """Positions, velocities, box, step, key from the config (host arrays)."""
    dtype = jnp.dtype(cfg["dtype"])
    if cfg["init"] == "lattice":
        r, box = lattice.cubic_lattice(cfg["lattice"], cfg["density"], cfg["cells"], dtype)
        n = r.shape[0]
        if n < 2:
            raise ConfigError("system.cells", "the lattice must hold at least 2 atoms")
        v = lattice.maxwell_boltzmann(
            jax.random.PRNGKey(cfg["seed"]), n, cfg["temperature"], cfg["mass"], dtype=dtype
        )
        return np.asarray(r), np.asarray(v), np.asarray(box), 0, None
    fr = cfg["restart"]
    r = np.asarray(fr["position"], dtype)
    box = fr["box"]
    if box is None:
        span = r.max(0) - r.min(0)
        box = np.maximum(span, 1.0)
    key = fr["rng_key"]
    return r, np.asarray(fr["velocity"], dtype), np.asarray(box, dtype), fr["step"], key


def check_memory(cfg) -> None:
    """Refuse a run that cannot fit, before the lattice or neighbour lists are allocated.

    The error names the key that makes the run too big: the atom count (``system.cells`` /
    ``system.file``) when the per-atom arrays dominate or the neighbour settings are
    ordinary, else the neighbour setting furthest from its default (``neighbors.skin``,
    ``neighbors.capacity_factor``, ``potential.cutoff`` or ``neighbors.max_neighbors``).
    """
    if cfg["init"] == "lattice":
        n = (4 if cfg["lattice"] == "fcc" else 1) * math.prod(cfg["cells"])
        density = cfg["density"]
    else:
        n = cfg["restart"]["position"].shape[0]
        density = 1.0  # dense liquid; the file's box may be open
    reach = cfg["cutoff"] + cfg["skin"]
    neighbours = cfg["max_neighbors"] or max(
        16.0, density * 4.19 * reach**3 * cfg["capacity_factor"] * 1.5
    )  # a float: a density of 1e300 gives a 300-digit count
    item = np.dtype(cfg["dtype"]).itemsize
    # per atom ~ 16 vectors (state, forces, reference positions, host copies); per
    # neighbour slot its int32 index and a share of the tiled force kernel's pair terms:
    # fitted to measured peaks through ``simpar run`` (experiments/check_memory_estimates.py,
    # jaxlib 0.10 CPU, 4,000 .. 131,072 atoms: about 1.3 kB per atom at the usual density)
    per_atom, per_slot = n * (16 * 3 * item), n * neighbours * 7
    key = "system.cells" if cfg["init"] == "lattice" else "system.file"
    hint = "use fewer atoms (system.cells) or more processes (--num-processes)"
    if per_slot > per_atom:
        key, hint = _neighbour_blame(cfg, key, hint)
    check_fits(
        per_atom + per_slot + (100 << 20),  # + XLA's client and the compiled programs
        key,
        f"{n} atoms with about {neighbours:.3g} neighbour slots each",
        hint,
    )


def _neighbour_blame(cfg, key: str, hint: str) -> tuple[str, str]:
    """The neighbour setting to blame for too many neighbour slots (or ``key`` unchanged
    when each is within 10x of its default's contribution)."""
    if cfg["max_neighbors"]:
        return "neighbors.max_neighbors", "lower neighbors.max_neighbors (0: measured)"
    cut, skin = cfg["cutoff"], cfg["skin"]
    factors = {  # slots scale with capacity_factor, (cutoff + skin)^3 and the density
        "neighbors.capacity_factor": cfg["capacity_factor"] / 1.2,
        "neighbors.skin": ((cut + skin) / (cut + 0.3)) ** 3,
        "potential.cutoff": ((cut + skin) / (2.5 + skin)) ** 3,
    }
    if cfg["init"] == "lattice":
        factors["system.density"] = cfg["density"] / 0.8442
    worst = max(factors, key=factors.get)
    if factors[worst] < 10:
        return key, hint
    usual = {"neighbors.capacity_factor": 1.2, "neighbors.skin": 0.3, "potential.cutoff": 2.5,
             "system.density": 0.8442}  # fmt: skip
    value = {"neighbors.capacity_factor": cfg["capacity_factor"], "neighbors.skin": skin,
             "system.density": cfg.get("density")}  # fmt: skip
    value = value.get(worst, cut)
    return worst, (
        f"{worst} = {value:.4g} needs {factors[worst]:.3g} times the neighbour slots of the "
        f"usual {usual[worst]:g}; use a smaller value"
        + (" (reduced units: near 1)" if worst == "system.density" else "")
    )


def pair_energy_blame(cfg) -> tuple[str, str]:
    """The key (and message) to blame for a non-finite initial energy of a lattice start.

    A lattice has no overlapping atoms; the energy overflows either because the atoms sit
    far inside the repulsive core (``system.density``) or because ``potential.epsilon`` is
    too large for the dtype.
    """
    a = (4.0 / cfg["density"]) ** (1 / 3) if cfg["lattice"] == "fcc" else cfg["density"] ** (-1 / 3)
    r_nn = a / math.sqrt(2.0) if cfg["lattice"] == "fcc" else a
    big = float(np.finfo(cfg["dtype"]).max)
    with np.errstate(over="ignore"):
        core = 4.0 * np.float64(cfg["sigma"] / r_nn) ** 12  # LJ pair energy / epsilon
    if cfg["kind"] == "lj" and not core * 100 < big:
        return "system.density", (
            f"{cfg['density']:g} puts neighbours {r_nn:.3g} sigma apart: the pair energy "
            f"overflows {cfg['dtype']}; use a density near 1 (reduced units)"
        )
    return "potential.epsilon", (
        f"{cfg['epsilon']:g} makes the initial energy overflow {cfg['dtype']}; give epsilon "
        "in the run's energy unit (reduced units: 1)"
    )


def _check_cells(cfg, box) -> None:
    """Refuse a periodic box whose neighbour cell grid (``neighbors._layout``: box * 2 /
    (cutoff + skin) cells per axis) overflows int32 indices or the memory: a dilute lattice
    (``system.density`` far below 1) or a huge ``system.file`` box."""
    from simpar.memory import check_fits

    if cfg["boundary"] != "periodic":
        return
    cells = np.maximum(np.floor(np.asarray(box, np.float64) * 2 / (cfg["cutoff"] + cfg["skin"])), 1)
    total = float(np.prod(cells))
    key = "system.density" if cfg["init"] == "lattice" else "system.file"
    what = f"a density of {cfg['density']:.3g}" if cfg["init"] == "lattice" else "its box"
    hint = ("use a density near 1 (reduced units)" if cfg["init"] == "lattice"
            else "use a denser system or an open boundary")  # fmt: skip
    if total > 2**31 - 1:
        raise ConfigError(key, f"{what} gives a box of {np.asarray(box).max():.3g} sigma and a "
                          f"neighbour cell grid of {total:.3g} cells (more than 2^31); {hint}")  # fmt: skip
    check_fits(int(total) * 16, key, f"a neighbour cell grid of {total:.3g} cells", hint)


def check_geometry(cfg, box) -> None:
    """Refuse a periodic box whose edges ``box`` ``(3,)`` are shorter than twice the
    interaction reach (cutoff + skin), which the minimum image needs, or whose neighbour
    cell grid cannot be indexed or held (:func:`_check_cells`)."""
    _check_cells(cfg, box)
    if cfg["boundary"] == "periodic":
        need = 2.0 * (cfg["cutoff"] + cfg["skin"])
        if np.min(box) < need:
            key = "system.cells" if cfg["init"] == "lattice" else "system.file"
            if cfg["skin"] > cfg["cutoff"] and np.min(box) >= 2.0 * (cfg["cutoff"] + 0.3):
                key = "neighbors.skin"  # the usual skin of 0.3 would fit this box
            raise ConfigError(
                key,
                f"box edges {np.round(box, 4).tolist()} must be >= 2 * (potential.cutoff "
                f"+ neighbors.skin) = {need:g} for the minimum image; "
                + {"neighbors.skin": "use a skin near 0.3", "system.cells": "use more cells"}.get(
                    key, "use a larger box or a shorter potential.cutoff"
                ),
            )


def blown_up(g: dict, th: dict, dt: float) -> str | None:
    """Why the run cannot go on (non-finite values, atoms jumping > 0.5 sigma per step).

    ``g``: global host arrays ``position`` and ``velocity`` of the atoms."""
    if not all(math.isfinite(x) for x in th.values()):
        return "non-finite energy or pressure (the run blew up)"
    if not np.all(np.isfinite(g["position"])):
        return "non-finite positions (the run blew up)"
    vmax = float(np.sqrt(np.max(np.sum(g["velocity"] ** 2, axis=-1))))
    if vmax * dt > 0.5:
        return (
            f"unstable integration: the fastest atom moves {vmax * dt:.3g} sigma per "
            f"step (T = {th['temperature']:.3g})"
        )
    return None
