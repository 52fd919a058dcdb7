"""The CPU collectives of a multi-process run: gloo (default) or, opt-in, MPI.

``SIMPAR_CPU_COLLECTIVES`` selects them (unset: ``gloo``; ``mpi``; anything else is a
``ConfigError``); ``simpar.parallel.distributed.initialize`` applies the choice before JAX
joins. gloo hands each message to a TCP I/O thread, which on a process pinned to one core
must be scheduled beside the compute thread; MPI over shared memory polls from the calling
thread (``experiments/bench_collectives.py`` measures both).

The MPI path: processes started by ``mpirun -np N`` (``--bind-to core`` to pin them), one CPU
device each, joining with ``--distributed`` (JAX reads rank and size from Open MPI) or with
``--coordinator`` and ``--process-id`` set to each rank (``OMPI_COMM_WORLD_RANK``). JAX reaches
MPI through MPItrampoline, which loads the library named by ``MPITRAMPOLINE_LIB``: an
MPIwrapper built against the system MPI (docs/multiprocess.md). MPItrampoline loads it
as soon as JAX is imported, whatever the collectives: a library that does not load ends any
JAX process there with MPItrampoline's own message (exit 1). The MPI path cannot run in CI
(no MPIwrapper there); ``experiments/bench_collectives.py`` and ``experiments/bench_md.py
--collectives mpi`` check it by hand.
"""

from __future__ import annotations

import ctypes
import os

from simpar.errors import ConfigError, SimulationError

COLLECTIVES_ENV = "SIMPAR_CPU_COLLECTIVES"  # gloo (default) or mpi
CPU_COLLECTIVES = ("gloo", "mpi")


def choose(num_processes: int | None = None) -> str:
    """The CPU collectives of a multi-process run: ``SIMPAR_CPU_COLLECTIVES``, checked.

    Unset means ``gloo``. ``mpi`` needs ``MPITRAMPOLINE_LIB`` naming a loadable MPIwrapper
    library, processes started by ``mpirun`` (``OMPI_COMM_WORLD_SIZE`` or ``PMI_SIZE`` set,
    equal to ``num_processes`` when that is given) and one CPU device per process
    (``jax_num_cpu_devices``, set before this call): without them MPItrampoline would abort
    the process, MPI would start each process alone, or XLA would refuse the collectives of a
    second device's thread.

    Args:
      num_processes: the run's number of processes, if known.

    Returns:
      ``"gloo"`` or ``"mpi"``.

    Raises:
      ConfigError: another value, or ``mpi`` without what it needs.
    """
    value = os.environ.get(COLLECTIVES_ENV, "gloo")
    if value not in CPU_COLLECTIVES:
        raise ConfigError(
            COLLECTIVES_ENV,
            f"must be one of {', '.join(CPU_COLLECTIVES)} (unset: gloo), got {value!r}",
        )
    if value == "gloo":
        return value
    lib = os.environ.get("MPITRAMPOLINE_LIB")
    if not lib:
        raise ConfigError(
            "MPITRAMPOLINE_LIB",
            f"{COLLECTIVES_ENV}=mpi needs MPITRAMPOLINE_LIB set to an MPIwrapper library "
            "built against this machine's MPI (libmpiwrapper.so; docs/multiprocess.md)",
        )
    # MPItrampoline (in jaxlib) loads the library when JAX is imported and ends the process
    # there (exit 1, "MPItrampoline: Could not dlopen library") if it cannot: this check
    # speaks only where the variable was set after JAX started (library use, tests)
    try:
        wrapper = ctypes.CDLL(lib)
    except OSError as err:
        raise ConfigError(
            "MPITRAMPOLINE_LIB", f"{lib!r} could not be loaded for {COLLECTIVES_ENV}=mpi: {err}"
        ) from err
    if not hasattr(wrapper, "mpiwrapper_version_major"):
        raise ConfigError(
            "MPITRAMPOLINE_LIB", f"{lib!r} is not an MPIwrapper library (libmpiwrapper.so)"
        )
    size = os.environ.get("OMPI_COMM_WORLD_SIZE") or os.environ.get("PMI_SIZE")
    if size is None:
        raise ConfigError(
            COLLECTIVES_ENV,
            "mpi needs the processes started by mpirun (e.g. mpirun -np 2 --bind-to core ...); "
            "no OMPI_COMM_WORLD_SIZE / PMI_SIZE in the environment",
        )
    if num_processes is not None and int(size) != num_processes:
        raise ConfigError(
            "--num-processes",
            f"{COLLECTIVES_ENV}=mpi: mpirun started {size} processes, --num-processes is "
            f"{num_processes}",
        )
    import jax

    devices = jax.config.jax_num_cpu_devices
    if devices not in (-1, 1):
        raise ConfigError(
            "--devices",
            f"{COLLECTIVES_ENV}=mpi runs one CPU device per process (XLA's MPI collectives "
            f"refuse more: one thread per process may call MPI), got {devices}; use --devices 1 "
            "and one process per core, or gloo",
        )
    return value


def open_world_communicator() -> None:
    """Open the MPI communicator over every device now, on this (MPI's main) thread.

    XLA creates the communicator of a group of devices at the first collective over that
    group and refuses to do so from any thread but the one that initialized MPI ("MPI:
    Communicator requested from a thread that is not the one MPI was initialized from");
    a compiled chunk's collectives may run on a pool thread of XLA:CPU. One small ``psum``
    over all devices, run here, opens the group every mesh spanning all the processes'
    devices uses. A collective over a smaller group (a mesh axis within a process's
    devices) would still need its own first call from this thread.
    """
    import jax
    import numpy as np
    from jax.sharding import PartitionSpec as P

    from simpar.parallel import blocks

    mesh = blocks.make_mesh((len(jax.devices()),), ("all",), jax.devices())
    ones = jax.make_array_from_callback(
        (len(jax.devices()),), blocks.sharding(mesh, "all"), lambda idx: np.ones(1, np.int32)
    )
    psum = blocks.shard_map(lambda x: jax.lax.psum(x, "all"), mesh, P("all"), P())
    count = jax.jit(psum)(ones)
    if int(np.asarray(count.addressable_data(0))[0]) != len(jax.devices()):
        raise SimulationError(0, "the first MPI all-reduce over every device gave a wrong sum")


def keep_cpu_client() -> None:
    """Keep JAX's CPU client (which holds the MPI communicators) alive to the process's end.

    JAX calls ``MPI_Finalize`` in an ``atexit`` handler; the client, destroyed later in the
    interpreter's teardown, then frees its communicators and Open MPI aborts the process
    ("MPI_Comm_free() ... called after MPI_FINALIZE", exit 1). One reference that is never
    dropped leaves the client to the operating system.
    """
    from jax.extend.backend import get_backend

    ctypes.pythonapi.Py_IncRef(ctypes.py_object(get_backend("cpu")))
