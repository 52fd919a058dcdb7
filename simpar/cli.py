"""The ``simpar`` command line (``simpar --help``, ``simpar run --help``; README "Command line").

    simpar run CONFIG.toml [--engine E] [--devices N] [--mesh AxB[xC]] [--steps N]
                           [--out PATH] [--set key.sub=value ...] [--unset key.sub ...]
                           [--overwrite] [--quiet]
                           [--coordinator HOST:PORT --num-processes N --process-id I]
                           [--distributed]
                           [--show-layout] [--no-compile-cache]
    simpar info [--devices N] [--mesh AxB[xC] [--engine E] [--grid NxM[xK]]]
    simpar plot OUT.h5
    simpar --version

Multi-process runs (``simpar.parallel.distributed``): one ``simpar run`` per process with the
same arguments, plus where to meet (``--coordinator``, ``--num-processes``, ``--process-id``),
or ``--distributed`` to let JAX read them from a SLURM / Open MPI cluster. ``--devices`` is then
the number of CPU devices per process and the mesh spans the devices of every process.

Exit codes: 0 success; 2 invalid input (message names the key and what is allowed, no
traceback, no output left behind); 1 failed run (step, reason, last good output; also a
failed write such as a full disk, naming the path and the OS error); 130 stopped by Ctrl-C
(SIGINT) and 143 stopped by SIGTERM (``timeout``, ``kill``, SLURM): a running simulation
stops at the next safe point with ``run_status = "failed: interrupted"`` / ``"failed:
terminated"`` and a usable checkpoint (``simpar.signals``).
JAX is configured (number of CPU devices) before it starts, so ``--devices`` works on CPU;
``--devices`` and the count a ``--mesh`` implies are capped at ``MAX_DEVICES`` (exit 2).
``simpar run`` keeps JAX's compiled programs in a persistent cache (``compile_cache_dir``:
``$SIMPAR_COMPILE_CACHE_DIR``, else ``$XDG_CACHE_HOME/simpar/jax``, else
``~/.cache/simpar/jax``), so a second run of the same config (or a regrow to a layout seen
before) skips XLA compilation; ``--no-compile-cache`` or ``SIMPAR_NO_COMPILE_CACHE=1`` turns it
off.
stdout of ``simpar run`` carries only the one JSON summary line: whatever the run prints
(``--show-layout``, progress, thermo rows, ``wrote PATH``) goes to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import sys

EXIT_OK, EXIT_FAILED, EXIT_INVALID = 0, 1, 2
MAX_DEVICES = 4096  # per process; more virtual CPU devices take minutes and then crash XLA


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # exit code 2 with a one-line message, as for config errors
        self.print_usage(sys.stderr)
        print(f"simpar: error: {message}", file=sys.stderr)
        sys.exit(EXIT_INVALID)


RUN_EPILOG = (
    "exit codes:\n"
    "  0  success; stdout holds one JSON summary (the same keys for every model)\n"
    "  1  failed run (non-finite values, instability): names the step and the setting to\n"
    "     change; every frame before it is kept, run_status = 'failed: ...'\n"
    "  2  invalid input: names the key and what is allowed; no traceback, no output file\n"
    "  130 interrupted (Ctrl-C, SIGINT): stops at the next safe point, run_status =\n"
    "      'failed: interrupted', the checkpoint is usable (--resume); a second Ctrl-C\n"
    "      stops at once\n"
    "  143 terminated (SIGTERM: timeout, kill, SLURM at the time limit): as for 130, with\n"
    "      run_status = 'failed: terminated'\n"
    "\nstdout carries only the JSON summary line; progress, --show-layout and messages go\n"
    "to stderr.\n"
)


def _models_text() -> str:
    """The models ``[model] name`` accepts, for ``simpar run --help``: simpar's and the
    installed plugins' (``simpar.models``; no model module is imported)."""
    from simpar.models import available

    return (
        "models ([model] name in the config; plugins: entry-point group simpar.models):\n"
        + "".join(f"  {k:<12} {v}\n" for k, v in available().items())
        + "\n"
    )


def _parser() -> argparse.ArgumentParser:
    from simpar import __version__

    p = _Parser(prog="simpar", description="Particle and grid simulations on JAX, across devices.")
    p.add_argument("--version", action="version", version=f"simpar {__version__}")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    r = sub.add_parser(
        "run",
        help="run an experiment from a TOML config",
        description="Run an experiment from a TOML config and write its output file.",
        epilog=_models_text() + RUN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    r.add_argument("config", help="experiment TOML file, e.g. experiments/heat2d.toml")
    r.add_argument("--engine", help="single, pmap, shard_map or sharded (default: parallel.engine)")
    r.add_argument(
        "--devices", type=int, help="number of devices; on CPU creates N virtual devices"
    )
    r.add_argument(
        "--mesh",
        help="device grid, e.g. 8, 2x4, 2x2x2 (default: all devices along x; engine single "
        "runs on one device whatever the mesh)",
    )
    r.add_argument("--steps", type=int, help="number of time steps (default: time.steps)")
    r.add_argument("--out", help="output path (default: output.path)")
    r.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config value, e.g. --set physics.diffusivity=0.5 (repeatable)",
    )
    r.add_argument(
        "--unset",
        action="append",
        default=[],
        metavar="KEY",
        help="remove a key or table of the config so its default applies, e.g. --unset "
        "initial.wavenumber or --unset forcing (repeatable; applied before --set)",
    )
    r.add_argument("--resume", action="store_true", help="continue from the last checkpoint")
    r.add_argument("--overwrite", action="store_true", help="replace an existing output file")
    r.add_argument("--quiet", action="store_true", help="no progress output")
    r.add_argument(
        "--no-compile-cache",
        action="store_true",
        help="do not keep compiled programs in the user cache directory (also: "
        "SIMPAR_NO_COMPILE_CACHE=1)",
    )
    r.add_argument(
        "--show-layout",
        action="store_true",
        help="print which device holds which block of the state before the run (to stderr)",
    )
    d = r.add_argument_group(
        "multi-process runs", "one simpar run per process (simpar.parallel.distributed)"
    )
    d.add_argument("--coordinator", metavar="HOST:PORT", help="process 0's address")
    d.add_argument("--num-processes", type=int, metavar="N", help="number of processes")
    d.add_argument("--process-id", type=int, metavar="I", help="this process, 0 .. N-1")
    d.add_argument(
        "--distributed",
        action="store_true",
        help="join a multi-process run set up by the cluster (SLURM, Open MPI)",
    )
    i = sub.add_parser("info", help="JAX version, backend, devices, processes")
    i.add_argument("--devices", type=int, help="number of virtual CPU devices")
    i.add_argument("--mesh", help="also print which device holds which block on this mesh")
    i.add_argument("--engine", default="shard_map", help="engine for --mesh (default shard_map)")
    i.add_argument("--grid", help="grid shape for --mesh, e.g. 256x256 (default 256 per axis)")
    pl = sub.add_parser("plot", help="PNGs of the last frame / time series next to the file")
    pl.add_argument("path", help="an output file of simpar run")
    k = sub.add_parser("keys", help="a model's TOML keys, defaults and allowed values (markdown)")
    k.add_argument("model", help="a built-in [model] name, or all (docs/models.md)")
    return p


def _configure_jax(devices: int | None) -> None:
    """Must run before JAX initialises its backends (``run`` and ``info`` share it).

    Turns 64-bit JAX on for this process: float64 configs need it, float32 runs stay
    float32 (every array has an explicit dtype); see ``simpar.precision``.
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    import jax

    jax.config.update("jax_enable_x64", True)
    if devices is not None:
        try:
            jax.config.update("jax_num_cpu_devices", int(devices))
        except RuntimeError:
            pass  # JAX already started (library use, tests): the device count is checked later


def compile_cache_dir(disabled: bool = False, environ=None) -> str | None:
    """The persistent compilation cache directory of ``simpar run``, or None when off.

    Args:
      disabled: ``--no-compile-cache`` given.
      environ: the environment (default ``os.environ``): ``SIMPAR_NO_COMPILE_CACHE`` set to
        anything but ``""``/``0`` turns the cache off; ``SIMPAR_COMPILE_CACHE_DIR`` names the
        directory, else ``$XDG_CACHE_HOME/simpar/jax``, else ``~/.cache/simpar/jax``.

    Returns:
      An absolute path (not created here), or None.
    """
    env = os.environ if environ is None else environ
    if disabled or env.get("SIMPAR_NO_COMPILE_CACHE", "") not in ("", "0"):
        return None
    if env.get("SIMPAR_COMPILE_CACHE_DIR"):
        return os.path.abspath(os.path.expanduser(env["SIMPAR_COMPILE_CACHE_DIR"]))
    home = env.get("HOME") or os.path.expanduser("~")
    base = env.get("XDG_CACHE_HOME") or os.path.join(home, ".cache")
    return os.path.abspath(os.path.join(base, "simpar", "jax"))


def _enable_compile_cache(disabled: bool) -> str | None:
    """Point JAX's persistent compilation cache at ``compile_cache_dir`` (before the first
    compilation). Programs compiling in 0.1 s or more are kept (JAX's default, 1 s, would
    skip most of a run's chunk programs). An unusable directory only costs the cache: JAX
    warns and compiles as before. Returns the directory, or None when off."""
    path = compile_cache_dir(disabled)
    if path is None:
        return None
    import jax

    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.1)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return path


def _cmd_info(args) -> int:
    from simpar.parallel.topology import parse_mesh

    mesh = parse_mesh(args.mesh) if args.mesh else None
    devices = args.devices
    if devices is None and mesh is not None:
        devices = math.prod(mesh)
    if devices is not None:
        from simpar.memory import check_device_count

        check_device_count(devices, "--devices" if args.devices is not None else "--mesh",
                           MAX_DEVICES)  # fmt: skip
    _configure_jax(devices)
    import jax

    import simpar

    info = {
        "simpar": simpar.__version__,
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "devices": [str(d) for d in jax.devices()],
        "device_count": jax.device_count(),
        "local_device_count": jax.local_device_count(),
        "process_index": jax.process_index(),
        "process_count": jax.process_count(),
        "x64": bool(jax.config.jax_enable_x64),  # as a run uses it (_configure_jax)
    }
    print(json.dumps(info, indent=2))
    if mesh is not None:
        print(_layout(args.engine, mesh, args.grid))
    return EXIT_OK


class _Wrap:
    """A periodic axis (what ``simpar.grid.boundary.Periodic`` is to the engines)."""

    periodic = True


def _layout(engine: str, mesh: tuple[int, ...], grid: str | None) -> str:
    """``simpar info --mesh``: the block layout of one periodic field on ``grid`` (any model
    with the same grid and mesh has the same layout). No model module is imported: the
    field's model is the bare contract (``simpar.grid.model.GridModel``), never stepped."""
    from simpar.errors import ConfigError
    from simpar.grid.model import GridModel
    from simpar.parallel.engines import make_engine
    from simpar.parallel.layout import describe
    from simpar.parallel.topology import parse_mesh

    shape = parse_mesh(grid) if grid else (256,) * max(2, len(mesh))
    if len(shape) < 2:
        raise ConfigError("--grid", f"give 2 or 3 cell counts joined by 'x', got {grid!r}")
    wrap = ((_Wrap(), _Wrap()),) * len(shape)
    model = GridModel("layout", len(shape), 1, {"u": wrap}, update=lambda state, params: state)
    return describe(make_engine(engine, model, shape, None if engine == "single" else mesh))


def _cmd_run(args) -> int:
    from simpar import signals
    from simpar.errors import ConfigError
    from simpar.memory import fix_mmap_threshold

    fix_mmap_threshold()  # freed big blocks go back to the system at once (peak memory)

    multi = args.distributed or any(
        v is not None for v in (args.coordinator, args.num_processes, args.process_id)
    )
    if args.distributed and args.coordinator is not None:
        raise ConfigError(
            "--distributed", "give either --distributed (cluster) or --coordinator, not both"
        )
    devices, mesh, data, text, early = None, None, None, None, None
    try:
        devices, mesh, data, text = _run_inputs(args, multi)
        signals.check()  # a Ctrl-C / SIGTERM during start-up stops here, before JAX starts
    except (ConfigError, signals.Interrupted) as err:
        if not multi:
            raise
        # one process of several: join the others first, so that they hear of it and end
        # (else they wait for this one in jax.distributed.initialize for minutes), with the
        # devices it was given (with JAX's default of 1 the others saw a wrong device count
        # and could report a --mesh error instead of this one)
        early = err
        devices = _given_devices(args)
    _configure_jax(devices)
    _enable_compile_cache(args.no_compile_cache)
    if multi:
        from simpar.parallel import distributed

        distributed.initialize(args.coordinator, args.num_processes, args.process_id)
        # from here a failure on this process ends every process, with one line naming it
        # (before the driver too: an option valid on one process only, a file missing on one)
        with distributed.guard():
            if early is not None:
                raise early
            return _run(args, devices, mesh, data, text)
    return _run(args, devices, mesh, data, text)


def _given_devices(args):
    """``--devices`` when it is valid, else None (JAX's default)."""
    from simpar.errors import ConfigError
    from simpar.memory import check_device_count

    try:
        if args.devices is not None:
            check_device_count(args.devices, "--devices", MAX_DEVICES)
    except ConfigError:
        return None
    return args.devices


def _run_inputs(args, multi: bool):
    """The checks of ``simpar run`` made before JAX starts; returns ``(devices, mesh, data,
    text)``: the CPU devices to create (None: JAX's default), the ``--mesh``, the config."""
    from simpar import config as cfgmod
    from simpar.memory import check_device_count
    from simpar.parallel.topology import parse_mesh

    if args.devices is not None:
        check_device_count(args.devices, "--devices", MAX_DEVICES)
    mesh = parse_mesh(args.mesh) if args.mesh else None
    devices = args.devices  # per process in a multi-process run
    if devices is None and mesh is not None and not multi:
        devices = math.prod(mesh)  # on CPU: as many virtual devices as the mesh needs
        check_device_count(devices, "--mesh", MAX_DEVICES)  # before XLA creates them
    data, text = cfgmod.load(args.config, args.set, args.unset)
    return devices, mesh, data, text


def _run(args, devices, mesh, data, text) -> int:
    """``simpar run`` once JAX has started (and joined the other processes)."""
    import jax

    from simpar import signals
    from simpar.errors import ConfigError

    signals.check()

    if devices is not None and devices > len(jax.local_devices()):
        raise ConfigError(
            "--devices",
            f"{devices} devices requested but only {len(jax.local_devices())} "
            f"{jax.default_backend()} devices exist",
        )
    from simpar.run import run_config

    # stdout carries only the JSON summary: whatever the run prints (--show-layout, a
    # library's notice) goes to stderr
    with contextlib.redirect_stdout(sys.stderr):
        summary = run_config(
            data,
            text,
            engine=args.engine,
            mesh=mesh,
            steps=args.steps,
            out=args.out,
            overwrite=args.overwrite,
            progress=not args.quiet,
            resume=args.resume,
            show_layout=args.show_layout,
            devices=args.devices,  # the default mesh spans them (simpar.drive.loop.device_mesh)
        )
    if jax.process_index() == 0:
        print(json.dumps(summary, default=str))
    return EXIT_OK


def _cmd_plot(args) -> int:
    from simpar.io.plot import plot_file

    for path in plot_file(args.path):
        print(path)
    return EXIT_OK


def _cmd_keys(args) -> int:
    _configure_jax(None)  # float64 probes need 64-bit JAX, as in a run
    from simpar.drive import keys
    from simpar.errors import ConfigError

    if args.model not in (*keys.MODELS, "all"):
        raise ConfigError(
            "MODEL", f"choose one of {', '.join(keys.MODELS)} or all, got {args.model!r}"
        )
    print(keys.document() if args.model == "all" else keys.markdown(args.model), end="")
    return EXIT_OK


def _unraisable(hook_args) -> None:
    """h5py reports HDF5 errors from object destructors as 'Exception ignored' tracebacks;
    the error that stopped the run is reported by the driver, so print one line at most."""
    if not getattr(_unraisable, "seen", False):
        _unraisable.seen = True
        print(f"simpar: warning: {hook_args.exc_value}".splitlines()[0], file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit code (see the module docstring)."""
    from simpar import signals

    owner = not signals.installed()  # run_main installs them first and keeps them to the end
    signals.install()  # SIGINT/SIGTERM wait for the next safe point (simpar.signals)
    try:
        args = _parser().parse_args(argv)
        from simpar.errors import ConfigError, SimulationError

        sys.unraisablehook = _unraisable
        try:
            commands = {"run": _cmd_run, "info": _cmd_info, "plot": _cmd_plot, "keys": _cmd_keys}
            return commands[args.command](args)
        except ConfigError as err:
            print(f"simpar: invalid input: {err}", file=sys.stderr)
            return EXIT_INVALID
        except SimulationError as err:
            print(f"simpar: {err}", file=sys.stderr)
            return EXIT_FAILED
    except signals.Interrupted as err:
        print(f"simpar: {err.reason}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("simpar: interrupted", file=sys.stderr)
        return 130
    finally:
        if owner:
            signals.uninstall()


def run_main() -> None:
    """``python -m simpar``: exit with ``main()``'s code.

    After a signal the process leaves with ``os._exit`` once its files are closed: JAX's
    compiler threads may still be running, and tearing the interpreter down under them
    crashed (SIGSEGV) when Ctrl-C came during start-up or the first compilation.

    A Ctrl-C or SIGTERM that arrives after the run finished (its files closed, its summary
    printed) is ignored: the deferred handlers stay in place until ``main`` returns, and then
    SIGINT/SIGTERM are ignored for the interpreter's teardown. Python resets its own handlers
    to the default action early in finalization, and a signal in the next ~50 ms killed the
    process (exit -2, nothing printed) although the run had completed.
    """
    from simpar import signals

    signals.install()
    code = main()
    if code >= 128:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    sys.exit(code)


if __name__ == "__main__":
    run_main()
