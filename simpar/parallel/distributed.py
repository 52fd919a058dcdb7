"""Multi-process start-up and host transfers: one run over the devices of several processes.

A multi-host run is one ``simpar run`` per process, all with the same config and options plus
where to meet (``jax.distributed``)::

    # two processes on this machine, 4 CPU devices each, one 2x4 mesh over all 8
    simpar run experiments/heat2d.toml --engine shard_map --mesh 2x4 --devices 4 \\
        --coordinator 127.0.0.1:12345 --num-processes 2 --process-id 0 &
    simpar run experiments/heat2d.toml --engine shard_map --mesh 2x4 --devices 4 \\
        --coordinator 127.0.0.1:12345 --num-processes 2 --process-id 1
    # under SLURM or Open MPI, one task per host: the cluster tells JAX all three
    srun simpar run experiments/heat2d.toml --engine sharded --distributed

``--devices`` is then the number of CPU devices *per process*; a mesh spans every process's
devices (``jax.devices()`` lists them by process). Grid models run this way on ``pmap``,
``shard_map`` and ``sharded``, Lennard-Jones MD and the N-body ring on ``pmap``,
``shard_map`` and ``sharded`` (the ring spans the processes' devices: ``--devices 4`` on two
processes is a ring of 8).
Every process builds the initial state on the host, places only its own blocks, runs the same
compiled chunks and takes part in the collectives; process 0 alone writes the output file,
the checkpoints and the progress. For a frame the state is gathered to every host
(``multihost_utils.process_allgather``), so the driver first checks its size against
``output.gather_limit_gib``.

On CPU the cross-process collectives go through gloo (set here before JAX starts), or, opt-in,
through MPI: ``SIMPAR_CPU_COLLECTIVES=mpi`` in processes started by ``mpirun``, one CPU device
each (``simpar.parallel.cpu_collectives``, which checks the setting and its needs).

Failures end every process (``simpar.parallel.watchdog``): when one process fails (a write
error, an invalid input, a simulation error, a second signal) it publishes its reason and
the others exit 1 (2 for an invalid input) with one line naming it; when one dies (SIGKILL, a
crash), the others notice its heartbeat stop within ``watchdog.PEER_TIMEOUT_S`` (10 s) and
do the same. Process 0, if alive, sets ``run_status = "failed: <reason>"``; the checkpoint of
the last frame stays resumable. The command line wraps everything after joining in
:func:`guard` (an option or a config file bad on one process only fails there, after it
joined the others), and so does the driver.

SIGINT/SIGTERM on any process is not a failure: before each chunk every process learns of
it (:func:`agree`, with the chunk's length) and all stop at that chunk boundary, exit 130/143
and ``run_status = "failed: interrupted"`` / ``"failed: terminated"`` (``simpar.drive.chunks``).
"""

from __future__ import annotations

import atexit
import contextlib

from simpar.errors import ConfigError, SimulationError
from simpar.parallel import cpu_collectives

# the host <-> device transfers live with the block mapping; re-exported for existing callers
from simpar.parallel.blocks import gather_blocks, put_blocks, put_global, to_host
from simpar.parallel.coordinator import ServiceProcess

HEARTBEAT_S = 25  # jax.distributed's heartbeat timeout (s): a dead peer aborts the others then

__all__ = [
    "NoWriter",
    "agree",
    "barrier",
    "check_gather_size",
    "gather_blocks",
    "guard",
    "watch",
    "initialize",
    "is_main",
    "process_count",
    "put_blocks",
    "put_global",
    "to_host",
]


class NoWriter:
    """The output writer of the processes other than 0 (grid or H5MD): writes nothing.

    Accepts any constructor arguments and has the calls the drivers make (``append``,
    ``set_status``, ``close``, ``frames``, use as a context manager).
    """

    frames = 0

    def __init__(self, *args, **kwargs):
        pass

    def append(self, *args, **kwargs):
        """Write nothing (process 0 writes the frame)."""

    def set_status(self, status):
        """Do nothing (process 0 sets ``run_status``)."""

    def close(self):
        """Do nothing."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def initialize(
    coordinator: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
) -> None:
    """Join a multi-process run (``jax.distributed.initialize``); call before JAX computes.

    Args:
      coordinator: ``host:port`` of process 0's coordinator service; ``None`` lets JAX detect
        the cluster (SLURM, Open MPI, Kubernetes, TPU pods), which then also gives the other two.
      num_processes: total number of processes (>= 1).
      process_id: this process, ``0 <= process_id < num_processes``.

    Raises:
      ConfigError: inconsistent options, or no cluster detected / coordinator unreachable.
    """
    explicit = (coordinator, num_processes, process_id)
    if any(v is not None for v in explicit) and any(v is None for v in explicit):
        raise ConfigError(
            "--coordinator",
            "give --coordinator HOST:PORT, --num-processes N and --process-id I together "
            "(or --distributed alone to let JAX detect a SLURM / Open MPI cluster)",
        )
    if coordinator is not None:
        if num_processes < 1:
            raise ConfigError("--num-processes", f"must be >= 1, got {num_processes}")
        if not 0 <= process_id < num_processes:
            raise ConfigError(
                "--process-id",
                f"must be in [0, {num_processes - 1}] for --num-processes {num_processes}, "
                f"got {process_id}",
            )
        host, _, port = coordinator.rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError(
                "--coordinator", f"must be HOST:PORT, e.g. 127.0.0.1:12345; got {coordinator!r}"
            )
    collectives = cpu_collectives.choose(num_processes)
    import jax

    jax.config.update("jax_cpu_collectives_implementation", collectives)
    # JAX's preemption service catches SIGTERM in C++ (simpar.signals never sees it) and
    # waits for a sync point simpar does not have: with it, SIGTERM to a 2-process run hung
    # both processes in their next collective until SIGKILL
    jax.config.update("jax_enable_preemption_service", False)
    try:
        with _service_in_helper():
            jax.distributed.initialize(
                coordinator_address=coordinator,
                num_processes=num_processes,
                process_id=process_id,
                # the client's; simpar's service helper does not judge heartbeats (a process
                # continued after SIGSTOP was aborted by that verdict: watchdog); JAX's own
                # service, where it runs, aborts the others with a C++ trace after this
                heartbeat_timeout_seconds=HEARTBEAT_S,
            )
    except (ValueError, RuntimeError) as err:
        if coordinator is None:
            raise ConfigError(
                "--distributed",
                f"no cluster detected by jax.distributed ({err}); outside SLURM / Open MPI give "
                "--coordinator HOST:PORT --num-processes N --process-id I",
            ) from err
        raise ConfigError("--coordinator", f"jax.distributed.initialize failed: {err}") from err
    from jax._src import distributed as jax_distributed

    from simpar.parallel import watchdog

    state = jax_distributed.global_state
    watchdog.start(state.client, jax.process_index(), jax.process_count(), coordinator)
    if collectives == "mpi":
        cpu_collectives.keep_cpu_client()
        cpu_collectives.open_world_communicator()
    if isinstance(state.service, ServiceProcess) or collectives == "mpi":
        # after the run: end the helper in order; with MPI every process leaves JAX's
        # shutdown barrier before JAX's MPI_Finalize (registered when the backend started,
        # so it runs after this), else process 0 waits in the barrier while the others wait
        # in MPI_Finalize for it
        atexit.register(_shutdown_after_run)


@contextlib.contextmanager
def _service_in_helper():
    """Within the block, JAX starts process 0's coordination service in a helper process
    (``simpar.parallel.coordinator``) so that it outlives process 0; JAX's own way if its
    internals differ from 0.10-0.11's."""
    from jax._src import distributed as jax_distributed

    real = getattr(jax_distributed, "_jax", None)
    if real is None or not hasattr(real, "get_distributed_runtime_service"):
        yield
        return

    class _Lib:
        get_distributed_runtime_service = ServiceProcess

        def __getattr__(self, name):
            return getattr(real, name)

    jax_distributed._jax = _Lib()
    try:
        yield
    finally:
        jax_distributed._jax = real


def _shutdown_after_run() -> None:
    """``atexit`` of process 0 (of every process with MPI): after a run that ended well,
    leave the shutdown barrier with the others, then end the service's helper
    (``jax.distributed.shutdown``)."""
    from simpar.parallel import watchdog

    if watchdog.finished():
        import jax

        with contextlib.suppress(Exception):
            jax.distributed.shutdown()


@contextlib.contextmanager
def guard():
    """Around a run: every process ends when one fails (no-op in a one-process run).

    Within the block, an exception on this process is published to the peers with its
    one-line reason before it propagates (they exit 1 naming this process), and this process
    then exits with its code at once after the command line's message (``ConfigError`` 2,
    ``simpar.signals.Interrupted`` 128 + signal, else 1) instead of waiting for the peers in
    JAX's shutdown. A normal end tells the peers this process is done.

    Yields:
      :func:`watch`, for the part of the run where a writer is open.
    """
    from simpar import signals
    from simpar.parallel import watchdog

    if not watchdog.active():
        yield watch
        return
    watchdog.begin()
    try:
        yield watch
    except ConfigError as err:
        watchdog.publish_failure(f"invalid input: {err}", 2)
        raise
    except signals.Interrupted as err:
        if err.together:  # every process stops here (simpar.drive.chunks): none has failed
            watchdog.leave(err.exit_code)
        else:
            watchdog.publish_failure(err.reason, err.exit_code)
        raise
    except SimulationError as err:
        watchdog.publish_failure(f"{err.reason} (step {err.step})", 1)
        raise
    except Exception as err:
        if not _collective_failed(err):  # a bug: its traceback, and the peers stop
            watchdog.publish_failure(f"{type(err).__name__}: {err}", 1)
            raise
        failure = _lost_peer(err, 0, None)  # before the writer opened
        watchdog.publish_failure(failure.reason, 1)
        raise failure from None
    except BaseException as err:
        watchdog.publish_failure(f"{type(err).__name__}: {err}", 1)
        raise
    watchdog.finish()


def _collective_failed(err: BaseException) -> bool:
    """Whether ``err`` is a runtime error of XLA (gloo: "Connection closed by peer", ...)."""
    return type(err).__name__ in ("JaxRuntimeError", "XlaRuntimeError")


def _lost_peer(err: BaseException, step: int, last_good: str | None) -> SimulationError:
    """A failed collective (gloo ``JaxRuntimeError``: a peer went away): give the watchdog
    time to name the peer (it then ends this process); else a ``SimulationError``."""
    from simpar.parallel import watchdog

    watchdog.verdict_wait()
    why = str(err).strip().splitlines()[0][:300] if str(err).strip() else ""
    return SimulationError(
        step,
        f"a collective across processes failed and no peer was named ({type(err).__name__}: {why})",
        checkpoint=last_good,
    )


@contextlib.contextmanager
def watch(set_status, where):
    """While a writer is open: a peer's failure sets ``run_status`` through ``set_status``
    (called by the watchdog thread with ``"failed: <reason>"``), and a failed collective
    waits for the watchdog's verdict before it becomes a ``SimulationError``.

    Args:
      set_status: ``writer.set_status``.
      where: ``() -> (step, last_good)``, the current step and the last good output.
    """
    from simpar.parallel import watchdog

    if not watchdog.active():
        yield
        return
    with watchdog.on_stop(set_status):
        try:
            yield
        except Exception as err:
            if not _collective_failed(err):
                raise
            raise _lost_peer(err, *where()) from None


def process_count() -> int:
    """Number of processes in this run (1 unless ``initialize`` joined a multi-process run)."""
    import jax

    return jax.process_count()


def is_main() -> bool:
    """True on the process that writes files and reports progress (process 0)."""
    import jax

    return jax.process_index() == 0


def barrier(name: str) -> None:
    """Wait until every process gets here (no-op in a one-process run)."""
    if process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def agree(steps: int, signum: int | None) -> tuple[int, int | None]:
    """Process 0's ``steps`` and any process's signal: one tiny collective (every process).

    The chunk loop calls it before each chunk (``simpar.drive.chunks.next_chunk``), so every
    process runs chunks of the same length and all stop at the same chunk boundary. Cost: one
    ``process_allgather`` of two int32 per process, about 2 ms on two local processes over
    gloo (0.17 s the first time); no collective in a one-process run.

    Args:
      steps: this process's proposal (only process 0's is used), >= 0.
      signum: the signal this process received and has not acted on (``signals.pending()``),
        or None.

    Returns:
      ``(steps of process 0, the largest signal number any process received or None)``
      (SIGTERM, 15, wins over SIGINT, 2).
    """
    if process_count() == 1:
        return int(steps), signum
    import numpy as np
    from jax.experimental import multihost_utils

    mine = np.array([int(steps), int(signum or 0)], dtype=np.int32)
    every = np.asarray(multihost_utils.process_allgather(mine))  # (processes, 2)
    sig = int(every[:, 1].max())
    return int(every[0, 0]), (sig or None)


def check_gather_size(nbytes: int, limit_gib: float, key: str) -> None:
    """Refuse a multi-process run whose frames would gather more than ``limit_gib`` per host."""
    if process_count() > 1 and nbytes > limit_gib * 2**30:
        raise ConfigError(
            key,
            f"each output frame gathers the whole state ({nbytes / 2**30:.2f} GiB) on every "
            f"process, above the limit of {limit_gib} GiB; raise {key} if the hosts have the "
            "memory, or write fewer/smaller fields",
        )
