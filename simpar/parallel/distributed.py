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
compiled chunks and takes part in the collectives; process 0 alone writes the output file, the checkpoints and the progress. For a
frame the state is gathered to every host (``multihost_utils.process_allgather``), so the
driver first checks its size against ``output.gather_limit_gib``.

On CPU the cross-process collectives go through gloo (set here before JAX starts).
"""

from __future__ import annotations

from simpar.errors import ConfigError

# the host <-> device transfers live with the block mapping; re-exported for existing callers
from simpar.parallel.blocks import gather_blocks, put_blocks, put_global, to_host

__all__ = [
    "NoWriter",
    "barrier",
    "check_gather_size",
    "gather_blocks",
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
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    try:
        jax.distributed.initialize(
            coordinator_address=coordinator, num_processes=num_processes, process_id=process_id
        )
    except (ValueError, RuntimeError) as err:
        if coordinator is None:
            raise ConfigError(
                "--distributed",
                f"no cluster detected by jax.distributed ({err}); outside SLURM / Open MPI give "
                "--coordinator HOST:PORT --num-processes N --process-id I",
            ) from err
        raise ConfigError("--coordinator", f"jax.distributed.initialize failed: {err}") from err


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


def check_gather_size(nbytes: int, limit_gib: float, key: str) -> None:
    """Refuse a multi-process run whose frames would gather more than ``limit_gib`` per host."""
    if process_count() > 1 and nbytes > limit_gib * 2**30:
        raise ConfigError(
            key,
            f"each output frame gathers the whole state ({nbytes / 2**30:.2f} GiB) on every "
            f"process, above the limit of {limit_gib} GiB; raise {key} if the hosts have the "
            "memory, or write fewer/smaller fields",
        )
