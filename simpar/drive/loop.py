"""The chunk loop every model runs through: options -> plan -> writer -> chunks -> summary.

:func:`drive` is what ``simpar run`` (and ``simpar.run.run_config``) calls. It

1. resolves the options shared by every model ONCE (:func:`read_options`): engine
   (``--engine`` / ``parallel.engine``), the requested mesh (``--mesh`` / ``parallel.mesh``),
   steps (``--steps`` / ``time.steps``), the output cadence (``output.every``), the output
   path (``--out`` / ``output.path``), ``output.checkpoint``, ``--resume`` and ``--overwrite``;
2. asks the model's adapter for a *plan* (the rest of the config, validated; nothing on the
   devices; ``ConfigError`` names the key) whose mesh comes from :func:`device_mesh`, the one
   default-mesh rule;
3. checks ``--resume`` against the checkpoint (or refuses an existing output without
   ``--overwrite``), builds the adapter's *run* (state on the devices), and only then, once
   every process has validated (barrier), lets process 0 open the writer;
4. advances in chunks that end at every frame step or after about 2 s of measured step
   time (``simpar.drive.chunks``: in a multi-process run every process runs process 0's
   chunk lengths, and a signal on any process stops all of them at one boundary), checks
   the run's problems between chunks (a ``SimulationError`` with the step, the reason, the
   setting to change and the last good output), writes frames and checkpoints, honours
   SIGINT/SIGTERM at chunk boundaries, shows progress, sets ``run_status`` one way
   (``running`` -> ``complete`` | ``failed: <reason>``) and returns one summary
   (``simpar.io.meta.run_summary``).

Frame cadence (every model, also after ``--resume``): frames at the run's first step and at
that step + multiples of ``output.every``, plus the last step. ``output.every`` defaults to a
tenth of the steps (at least 1); set it explicitly to resume with more steps on the same
cadence. ``summary["frames"]`` counts the frames in the output file.

Models (``simpar.models``: ours in ``simpar.drive.grid``, ``.spectral``, ``.lj``, ``.nbody``,
and plugins) provide ``plan(cfg, opts, config_text)`` returning a :class:`Plan` subclass,
whose ``build`` returns a :class:`Run` subclass.
"""

from __future__ import annotations

import errno
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simpar import config as cfgmod
from simpar import signals
from simpar.config import Section
from simpar.drive.chunks import CHUNK_SECONDS, PROBE_STEPS, ChunkClock, next_chunk
from simpar.errors import ConfigError, SimulationError
from simpar.io import checkpoint, untrusted
from simpar.io.files import check_output_name, check_output_path, status_on_exit, write_error
from simpar.io.meta import run_summary
from simpar.parallel import distributed
from simpar.parallel.blocks import require_devices
from simpar.parallel.mapping import ENGINES, check_engine, default_mesh, kind
from simpar.progress import Progress

KILL_ENV = "SIMPAR_TEST_KILL_AFTER_FRAME"
"""Test hook: ``SIGKILL`` this process once the output holds this many frames (and the
checkpoint of the last one is written); a deterministic crash for the resume tests."""

WRITE_ERROR_ENV = "SIMPAR_TEST_WRITE_ERROR_AFTER_FRAME"
"""Test hook: writing a frame after this many frames fails as a full disk would (``OSError``
ENOSPC); a deterministic write error for the fault tests."""


@dataclass(frozen=True)
class Options:
    """What the command line (or a Python caller) asks for; None: the config decides.

    Attributes:
      engine, mesh, steps, out: ``--engine``, ``--mesh``, ``--steps``, ``--out``.
      devices: ``--devices`` (devices this process uses; None: every device JAX sees).
      overwrite, progress, resume, show_layout: the flags of ``simpar run``.
    """

    engine: str | None = None
    mesh: tuple[int, ...] | None = None
    steps: int | None = None
    out: str | None = None
    devices: int | None = None
    overwrite: bool = False
    progress: bool = True
    resume: bool = False
    show_layout: bool = False


@dataclass(frozen=True)
class Common:
    """The options every model shares, resolved once (:func:`read_options`).

    Attributes:
      engine: one of ``simpar.parallel.blocks.ENGINES``; engine_key: where it came from.
      engine_from_cli: ``--engine`` was given.
      mesh: the requested device grid (``--mesh`` over ``parallel.mesh``) or None;
        mesh_key: where it came from: ``"--mesh"``, ``"parallel.mesh"`` or ``"--devices"``
        (``--engine`` with ``--devices``: every device, the config's mesh is not used).
      n_devices: devices the default mesh spans (``--devices`` on one process, else all).
      steps: steps after the run's first step (``--steps`` over ``time.steps``).
      every: steps between frames (``output.every``, default ``max(steps // 10, 1)``).
      path, path_key: the output file and the key it came from.
      checkpoint: write ``<path>.ckpt`` with each frame (``output.checkpoint``).
      resume, overwrite, progress, show_layout: as in :class:`Options`.
    """

    engine: str
    engine_key: str
    engine_from_cli: bool
    mesh: tuple[int, ...] | None
    mesh_key: str
    n_devices: int
    steps: int
    every: int
    path: Path
    path_key: str
    checkpoint: bool
    resume: bool
    overwrite: bool
    progress: bool
    show_layout: bool


class Run:
    """A model's state on the devices, as the loop drives it (built by ``Plan.build``).

    Adapters subclass it; ``layout``, ``postfix`` and ``at_frame`` have defaults.
    """

    desc: str = "simpar"  # progress label

    def layout(self) -> str:
        """Which device holds which block (``--show-layout``; grid models)."""
        raise ConfigError("--show-layout", "grid models only")

    def postfix(self, obs: dict) -> dict:
        """Values shown next to the progress bar (e.g. ``T=1.44``)."""
        return {}

    def at_frame(self, step: int, obs: dict, first: bool) -> str | None:
        """Called at every frame (every process); returns a line to print with it or None
        (LJ: a thermo row, ``first``: with its header)."""
        return None

    def initial_problem(self, obs: dict) -> None:
        """Raise ``ConfigError``/``SimulationError`` when the initial state cannot run."""
        raise NotImplementedError

    def advance(self, n: int, last_good: str) -> None:
        """Advance ``n`` steps (``SimulationError`` naming ``last_good`` if impossible)."""
        raise NotImplementedError

    def observe(self) -> dict:
        """Diagnostics of the current state (host values; waits for the last chunk)."""
        raise NotImplementedError

    def problem(self, obs: dict, step: int) -> tuple[str, str] | None:
        """``(reason, setting to change)`` when the run cannot go on at ``step``, else None."""
        raise NotImplementedError

    def snapshot(self) -> Any:
        """The frame's host data (a collective in multi-process runs: every process calls)."""
        raise NotImplementedError

    def open_writer(self, path: Path, *, resume_step: int | None, overwrite: bool, key: str):
        """The output writer (process 0): a new file, or the old one cut at ``resume_step``."""
        raise NotImplementedError

    def write_frame(self, writer, step: int, snap, obs: dict) -> None:
        """Append one frame (process 0)."""
        raise NotImplementedError

    def checkpoint_state(self, snap, step: int) -> dict:
        """The checkpoint arrays of a frame (every process calls; process 0 saves)."""
        raise NotImplementedError

    def summary(self, obs0: dict, obs: dict, steps_run: int, wall: float) -> dict:
        """``initial``, ``final``, ``rate``, ``rate_unit`` and ``details`` of the summary."""
        raise NotImplementedError


def rate(work_per_step: float, steps_run: int, wall: float, unit: str) -> dict:
    """The summary's ``rate`` (work per second; NaN when no time passed) and ``rate_unit``.

    Args:
      work_per_step: units of work in one step (e.g. cells / 1e6, atoms, body pairs).
      steps_run: steps this run took; wall: their wall time (s); unit: e.g. "atom_steps/s".
    """
    per_s = work_per_step * steps_run / wall if wall > 0 else float("nan")
    return {"rate": per_s, "rate_unit": unit}


class Plan:
    """A validated model set-up (nothing on the devices yet); adapters subclass it.

    Attributes:
      common: the shared options (:func:`read_options`).
      model, engine, mesh, dtype: for the metadata and the summary.
      first_step: the run's first step (set by ``check_resume`` when resuming).
      save_checkpoints: write ``<path>.ckpt`` with each frame.
    """

    common: Common
    model: str
    engine: str
    mesh: tuple[int, ...]
    dtype: str
    first_step: int = 0
    save_checkpoints: bool = True

    def check_resume(self, ck: dict, ck_step: int) -> int:
        """Check a checkpoint against the plan; returns the run's first step."""
        return self.first_step

    def build(self, ck: dict | None) -> Run:
        """Allocate the state (from the checkpoint ``ck`` when resuming) and compile."""
        raise NotImplementedError


class ModelAdapter:
    """A model of the one protocol (``simpar.models.Model``) from a plan function.

    Attributes:
      name: the ``[model] name``; description: one line for ``simpar run --help``.
      shows_layout: whether ``--show-layout`` is supported (grid models).
    """

    shows_layout = False

    def __init__(self, name: str, plan, description: str = ""):
        self.name, self.description, self._plan = name, description, plan

    def __repr__(self) -> str:
        return f"ModelAdapter({self.name!r})"

    def plan(self, cfg: Section, opts: Options, config_text: str) -> Plan:
        """Read and validate the config (``ConfigError`` names the key); returns the plan."""
        return self._plan(cfg, opts, config_text)


def read_options(
    cfg: Section, opts: Options, *, default_path: str, output: str = "netcdf"
) -> Common:
    """Resolve the options every model shares (the only place they are read).

    Args:
      cfg: the whole config; ``time.steps``, ``output.every``, ``output.path``,
        ``output.checkpoint``, ``parallel.engine`` and ``parallel.mesh`` are read here.
      opts: the command-line options.
      default_path: ``output.path`` when absent.
      output: the kind of output file, ``"netcdf"`` (grid files) or ``"h5md"`` (particle
        trajectories); its naming rule is ``simpar.io.files.check_output_name``.

    The requested mesh: ``--mesh``; else, when ``--engine`` (not ``single``) is given with
    ``--devices`` or across processes, none (every device: the command line beats the
    config's mesh or device count); else ``parallel.mesh``.

    Raises:
      ConfigError: a bad value, naming the option or key.
    """
    import jax

    steps = opts.steps
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 0):
        raise ConfigError("--steps", f"must be an integer >= 0, got {steps!r}")
    t = cfg.section("time")
    cfg_steps = t.get("steps", None if steps is not None else cfgmod.REQUIRED, kind=int, min=0)
    steps = steps if steps is not None else cfg_steps
    o = cfg.section("output")
    every = o.get("every", max(steps // 10, 1), kind=int, min=1)
    path_key = "--out" if opts.out is not None else "output.path"
    cfg_path = o.get("path", default_path, kind=str)
    path = check_output_path(opts.out if opts.out is not None else cfg_path, path_key)
    check_output_name(path, path_key, output)
    save = o.get("checkpoint", True, kind=bool)
    par = cfg.section("parallel")
    cfg_engine = par.get("engine", "single", kind=str)
    if cfg_engine not in ENGINES:
        raise ConfigError(
            par.key("engine"), f"unknown engine {cfg_engine!r}; supported: {', '.join(ENGINES)}"
        )
    engine = check_engine(opts.engine, "--engine") if opts.engine else cfg_engine
    cfg_mesh = par.get("mesh", None, kind=int, length=(1, 2, 3), min=1)
    multi = distributed.process_count() > 1
    if opts.mesh is not None:
        mesh, mesh_key = tuple(int(m) for m in opts.mesh), "--mesh"
    elif (
        opts.engine is not None
        and not (opts.engine and kind(opts.engine).one_device)
        and (opts.devices is not None or multi)
    ):
        mesh, mesh_key = None, "--devices"  # the command line's devices, not the config's mesh
    else:
        mesh, mesh_key = (tuple(cfg_mesh) if cfg_mesh else None), "parallel.mesh"
    n_devices = len(jax.devices())
    if opts.devices is not None and not multi:  # --devices: the default mesh spans these
        n_devices = min(opts.devices, n_devices)
    return Common(
        engine=engine,
        engine_key="--engine" if opts.engine else "parallel.engine",
        engine_from_cli=bool(opts.engine),
        mesh=mesh,
        mesh_key=mesh_key,
        n_devices=n_devices,
        steps=steps,
        every=every,
        path=path,
        path_key=path_key,
        checkpoint=save,
        resume=opts.resume,
        overwrite=opts.overwrite,
        progress=opts.progress,
        show_layout=opts.show_layout,
    )


def device_mesh(
    common: Common, *, members: int = 1, mesh=None, key: str | None = None
) -> tuple[int, ...]:
    """The device grid of a run: the one default-mesh rule and device check.

    Args:
      common: the resolved options (engine, requested mesh, device count).
      members: ensemble members sharing the devices (the mesh is one member's).
      mesh, key: a model's own reading of the requested mesh and the key to blame
        (default: ``common.mesh`` and ``common.mesh_key``).

    Returns:
      ``(1,)`` for ``single``; else the requested mesh or every device along the first axis
      (``simpar.parallel.blocks.default_mesh``), checked against the devices.
    """
    mesh = common.mesh if mesh is None else mesh
    key = common.mesh_key if key is None else key
    out = default_mesh(common.engine, mesh, common.n_devices, members)
    if not kind(common.engine).one_device:
        require_devices(out, common.n_devices, key, members)
    return out


def drive(model, data: dict, config_text: str, opts: Options, cfg: Section | None = None) -> dict:
    """Run one experiment with ``model`` (``simpar.models.Model``); returns the summary.

    ``cfg``: the ``Section`` over ``data`` when the caller has read keys from it already.

    In a multi-process run a failure on one process ends all of them
    (``simpar.parallel.distributed.guard``).

    Raises:
      ConfigError: invalid input (no output file is created).
      SimulationError: the run failed (the output keeps every frame written before).
      simpar.signals.Interrupted: SIGINT/SIGTERM (``run_status = "failed: <reason>"``).
    """
    with distributed.guard() as watch:
        return _drive(model, data, config_text, opts, watch, cfg)


def _drive(model, data: dict, config_text: str, opts: Options, watch, cfg) -> dict:
    """:func:`drive` within its guard (``watch``: ``simpar.parallel.distributed.watch``)."""
    cfg = Section(data) if cfg is None else cfg
    plan = model.plan(cfg, opts, config_text)  # reads every key of its own
    cfg.check_unused()
    c: Common = plan.common
    ck, start = None, 0
    if c.resume:
        ck, ck_step = checkpoint.load_for_resume(c.path, config_text, plan.model)
        first = plan.check_resume(ck, ck_step)
        if ck_step >= first + c.steps:
            raise ConfigError(
                "--steps", f"the checkpoint is at step {ck_step}; ask for more steps to resume"
            )
        start = ck_step - first
        check_output(c.path, step=ck_step)  # before any compilation
    elif c.path.exists() and not c.overwrite:
        raise ConfigError(
            "--out",
            f"output file {c.path} exists; pass --overwrite to replace it or choose another --out",
        )
    signals.check()  # stopped during set-up: no output is created
    run = plan.build(ck)
    first = plan.first_step
    obs0 = obs = run.observe()
    run.initial_problem(obs0)
    main = distributed.is_main()
    if c.show_layout and main:
        print(run.layout(), flush=True)
    # a barrier (every process validated before 0 writes), after the first compilation: a
    # signal on any process stops every one here, before the output exists
    next_chunk(None, 0)

    path, done = c.path, start
    t0 = time.perf_counter()
    if not main:
        writer = distributed.NoWriter()
    else:
        writer = run.open_writer(
            path, resume_step=first + start if c.resume else None, overwrite=c.overwrite,
            key=c.path_key,
        )  # fmt: skip
    frames = int(writer.frames or 0)  # every writer (and NoWriter) counts its frames
    last_good = f"{path} (frames up to step {first + start})" if c.resume else None
    last_good = last_good or f"{path} (no frame written)"
    kill_after = int(os.environ.get(KILL_ENV, "0") or 0)
    fail_after = int(os.environ.get(WRITE_ERROR_ENV, "0") or 0)

    with status_on_exit(writer), watch(writer.set_status, lambda: (first + done, last_good)):
        with (
            signals.deferred(),
            Progress(c.steps, enabled=c.progress and main, desc=run.desc) as bar,
        ):

            def frame(step, obs):
                nonlocal frames, last_good
                frames += 1
                snap = run.snapshot()  # every process: a collective across processes
                line = run.at_frame(step, obs, frames == 1)
                if line:
                    bar.write(line)
                if main:
                    try:
                        if fail_after and frames > fail_after:
                            raise OSError(
                                errno.ENOSPC, f"No space left on device ({WRITE_ERROR_ENV})"
                            )
                        run.write_frame(writer, step, snap, obs)
                    except (OSError, RuntimeError) as err:  # disk full (h5py: RuntimeError)
                        raise write_error(err, path, step, last_good) from None
                last_good = f"{path} (frames up to step {step})"
                if plan.save_checkpoints:  # after the frame: a kill in between drops that frame
                    state = run.checkpoint_state(snap, step)
                    if main:
                        try:
                            checkpoint.save(
                                checkpoint.checkpoint_path(path), state, step, config_text,
                                plan.model,
                            )  # fmt: skip
                        except (OSError, RuntimeError) as err:
                            raise write_error(err, path, step, last_good) from None
                if kill_after and frames >= kill_after:
                    os.kill(os.getpid(), signal.SIGKILL)

            writer.set_status("running")
            if not c.resume:
                frame(first, obs0)
            bar.update(done)
            clock = ChunkClock(CHUNK_SECONDS, PROBE_STEPS)
            while done < c.steps:
                to_frame = min(c.every - done % c.every, c.steps - done)
                # every process: the same length; SIGINT/SIGTERM on any stops all here
                k = next_chunk(clock, to_frame)
                t = time.perf_counter()
                run.advance(k, last_good)
                done += k
                obs = run.observe()  # waits for the chunk: its wall time is measured
                clock.record(k, time.perf_counter() - t)
                problem = run.problem(obs, first + done)
                if problem:
                    raise SimulationError(first + done, problem[0], problem[1], last_good)
                if k == to_frame:
                    frame(first + done, obs)
                bar.update(k, **run.postfix(obs))
            if main:
                try:
                    if hasattr(writer, "flush"):
                        writer.flush()  # grid: writes the sidecar; a full disk fails here
                    writer.set_status("complete")
                except (OSError, RuntimeError) as err:
                    raise write_error(err, path, first + done, last_good) from None
    wall = time.perf_counter() - t0
    if c.progress and main:
        print(f"wrote {path} ({frames} frames) in {wall:.2f} s", file=sys.stderr)
    return run_summary(
        model=plan.model,
        path=os.fspath(path),
        engine=plan.engine,
        mesh=plan.mesh,
        dtype=plan.dtype,
        steps=c.steps,
        frames=frames,
        resumed_from=first + start if c.resume else None,
        wall_s=wall,
        **run.summary(obs0, obs, c.steps - start, wall),
    )


def check_output(path, *, step: int | None, key: str = "--resume") -> None:
    """The checks of ``nclayout.check_grid_output`` or ``h5md_read.check_h5md_output`` that need no
    template (links, storage, frames at ``step``), whichever the file is (a grid file has a
    root ``time``): made as soon as ``--resume`` is read, before the run compiles anything.

    Raises:
      ConfigError: a missing, unreadable or crafted file, naming it and the dataset.
    """
    if not os.path.isfile(path):
        raise ConfigError(key, f"output file {os.fspath(path)!r} does not exist")
    with untrusted.no_plugins(), untrusted.open_readonly(path, key) as f:
        grid = f.get("time", getlink=True) is not None
    if grid:
        from simpar.io.nclayout import check_grid_output

        check_grid_output(path, step=step, key=key)
    else:
        from simpar.io.h5md_read import check_h5md_output

        check_h5md_output(path, step=step, key=key)
