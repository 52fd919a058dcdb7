"""Memory: what this process may allocate, what a run needs (checked before allocating), what
it used.

Drivers estimate the bytes a run will hold (state, halos, buffers, neighbour lists, output
frames on the host) and call :func:`check_fits` before allocating anything, so a run that
cannot fit is refused with exit code 2 and the figures, instead of a ``MemoryError`` or
``RESOURCE_EXHAUSTED`` traceback or the kernel's OOM killer.

What "available" means: the smallest of three real limits (:func:`memory_limits`):

- ``MemAvailable`` of ``/proc/meminfo`` (free RAM plus what the kernel can reclaim);
- the cgroup limit of this process (a container, a SLURM job): cgroup v2 ``memory.max`` minus
  ``memory.current``, or cgroup v1 ``memory.limit_in_bytes`` minus ``memory.usage_in_bytes``,
  each plus the reclaimable page cache that usage counts (``inactive_file`` of
  ``memory.stat``, v1 ``total_inactive_file``), as container runtimes count it;
- the address-space limit ``RLIMIT_AS`` (``ulimit -v``) minus this process's current virtual
  size (``VmSize``).

:func:`check_device_count` caps the number of devices a run asks for (directly or through the
mesh it names); :func:`peak_memory_mib` goes into every run summary; :func:`release_free_memory`
hands the heap's freed pages back to the system after a set-up stage (XLA's compiler and eager
set-up work free most of what they allocate, but glibc keeps it), so the next stage's peak
starts from what is really live; :func:`lean_jit` compiles rarely run programs (set-up, list
builds, energies) with XLA:CPU's loop emitters, a fifth of the compiler's memory for the same
bits.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import resource
import sys
from pathlib import Path

from simpar.errors import ConfigError

GIB = 2**30
#: cgroup v1 reports "no limit" as a number near 2^63 (rounded down to a page)
_UNLIMITED = 2**60
#: where cgroup file systems are mounted (tests point it at a fake tree)
CGROUP_ROOT = "/sys/fs/cgroup"
KEEP_COMPILED = False  # True: drop_compiled_if_cached keeps them (tests share them; conftest)


def _read_int(path: Path) -> int | None:
    """An integer file of a cgroup (``"max"`` and absurd values mean no limit)."""
    try:
        text = path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    if not text or text == "max":
        return None
    try:
        value = int(text)
    except ValueError:
        return None
    return value if 0 <= value < _UNLIMITED else None


def _stat_value(path: Path, name: str) -> int:
    """One counter of a cgroup's ``memory.stat`` (``name value`` lines), in bytes; 0 when the
    file or the counter is missing or unreadable."""
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError):
        return 0
    for line in lines:
        parts = line.split()
        if len(parts) == 2 and parts[0] == name:
            try:
                return max(int(parts[1]), 0)
            except ValueError:
                return 0
    return 0


def _cgroup_used(usage: int | None, stat: Path, cache_key: str) -> int:
    """Bytes a cgroup really holds: its usage less the inactive page cache (written or read
    files the kernel reclaims before it would OOM-kill anything)."""
    usage = usage or 0
    return max(usage - min(_stat_value(stat, cache_key), usage), 0)


def _cgroup_dirs(root: Path, controller: str | None) -> list[Path]:
    """Candidate directories of this process's cgroup: the mount point itself (a container
    sees its own cgroup there) and the path named in ``/proc/self/cgroup``."""
    base = root / controller if controller else root
    dirs = [base]
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        ctrls = parts[1].split(",")
        if (controller is None and parts[0] == "0" and parts[1] == "") or (
            controller is not None and controller in ctrls
        ):
            rel = parts[2].strip().lstrip("/")
            if rel:
                dirs.append(base / rel)
    return dirs


def cgroup_available(root: str | os.PathLike | None = None) -> tuple[int, str] | None:
    """Bytes this process's cgroup still allows, and which file said so.

    Args:
      root: the cgroup mount point (default ``CGROUP_ROOT``, ``/sys/fs/cgroup``).

    Returns:
      (limit minus usage in bytes, a description such as ``"cgroup v2 memory.max"``), the
      tightest over the cgroup directories found, or None when no limit is set or readable.
      The usage leaves out the inactive page cache (``memory.stat``: v2 ``inactive_file``,
      v1 ``total_inactive_file``): output written by earlier runs is reclaimable.
    """
    root = Path(CGROUP_ROOT if root is None else root)
    best = None
    for d in _cgroup_dirs(root, None):  # v2: one unified hierarchy
        limit = _read_int(d / "memory.max")
        if limit is not None:
            used = _cgroup_used(_read_int(d / "memory.current"), d / "memory.stat", "inactive_file")
            left = limit - used
            if best is None or left < best[0]:
                best = (left, f"cgroup v2 memory.max {limit / GIB:.3g} GiB of {d}")
    for d in _cgroup_dirs(root, "memory"):  # v1: the memory controller's hierarchy
        limit = _read_int(d / "memory.limit_in_bytes")
        if limit is not None:
            used = _cgroup_used(_read_int(d / "memory.usage_in_bytes"), d / "memory.stat",
                                "total_inactive_file")  # fmt: skip
            left = limit - used
            if best is None or left < best[0]:
                best = (left, f"cgroup v1 memory.limit_in_bytes {limit / GIB:.3g} GiB of {d}")
    return None if best is None else (max(best[0], 0), best[1])


def _meminfo_available() -> int | None:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:  # not Linux
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _status_kib(name: str) -> int | None:
    """A ``kB`` field of ``/proc/self/status`` (``VmSize``, ``VmRSS``, ``VmHWM``), None if
    unknown (non-Linux)."""
    try:
        with open("/proc/self/status") as fh:
            return int(next(x for x in fh if x.startswith(name + ":")).split()[1])
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def _vm_size() -> int:
    """This process's virtual size in bytes (``VmSize``), 0 if unknown."""
    return (_status_kib("VmSize") or 0) * 1024


def memory_limits() -> dict[str, int]:
    """Every memory limit that applies to this process, in bytes still available.

    Returns:
      description -> bytes, for those that are known: ``"free RAM (MemAvailable)"``, the
      cgroup limit (``cgroup_available``) and ``"RLIMIT_AS (ulimit -v) ..."`` (the soft
      limit minus the current virtual size).
    """
    out = {}
    free = _meminfo_available()
    if free is not None:
        out["free RAM (MemAvailable)"] = free
    cg = cgroup_available()
    if cg is not None:
        out[cg[1]] = cg[0]
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY and soft >= 0:
        out[f"RLIMIT_AS (ulimit -v) {soft / GIB:.3g} GiB"] = max(soft - _vm_size(), 0)
    return out


def available() -> tuple[int, str] | None:
    """The memory a new allocation may take: (bytes, which limit applied), the smallest of
    :func:`memory_limits`, or None when none is known."""
    limits = memory_limits()
    if not limits:
        return None
    name = min(limits, key=limits.__getitem__)
    return limits[name], name


def available_bytes() -> int | None:
    """Bytes a new allocation may take (``available``'s), None if unknown."""
    got = available()
    return None if got is None else got[0]


def peak_memory_mib() -> float:
    """Peak resident memory of this process, in MiB: Linux's ``VmHWM`` (``ru_maxrss`` elsewhere:
    on Linux it survives ``execve``, so a child of a large process reports the parent's size)."""
    hwm = _status_kib("VmHWM")
    if hwm is not None:
        return round(hwm / 2**10, 1)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(rss / (2**20 if sys.platform == "darwin" else 2**10), 1)


_LIBC: list = []  # the loaded C library with ``malloc_trim`` and ``mallopt``, or None


def _malloc_trim():
    """glibc's ``malloc_trim`` (None off Linux/glibc, e.g. macOS or musl without it)."""
    if not _LIBC:
        lib = None
        if sys.platform.startswith("linux"):
            try:
                lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
                lib.malloc_trim.argtypes = [ctypes.c_size_t]
                lib.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
            except (OSError, AttributeError):
                lib = None
        _LIBC.append(lib)
    return None if _LIBC[0] is None else _LIBC[0].malloc_trim


#: glibc's ``M_MMAP_THRESHOLD`` (malloc.h) and the value :func:`fix_mmap_threshold` sets
_M_MMAP_THRESHOLD, MMAP_THRESHOLD = -3, 1 << 20


def fix_mmap_threshold() -> bool:
    """Fix glibc's mmap threshold at ``MMAP_THRESHOLD``: larger blocks are mappings of their
    own, unmapped when freed (glibc's threshold rises to the largest block freed, up to 32
    MiB, after which XLA's big buffers stay resident). Called early by ``simpar run``;
    True when set (False off glibc)."""
    return _malloc_trim() is not None and bool(_LIBC[0].mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))


def release_free_memory() -> bool:
    """Give the C heap's free pages back to the operating system (``malloc_trim(0)``).

    A set-up stage (compiling a program, an eager pass over all particles) frees most of
    what it allocated, but glibc keeps freed pages mapped, so every later stage's peak
    resident memory would start from the earlier stage's high-water mark (on in.lj, 70-130
    MB after each stage). Calling this between stages makes the peak the largest single
    stage instead of their sum. Costs a few milliseconds; live data is untouched.

    Returns:
      True when memory was released (Linux with glibc and something to give back); False
      elsewhere (a no-op on other platforms and C libraries).
    """
    trim = _malloc_trim()
    if trim is None:
        return False
    return bool(trim(0))


#: XLA:CPU options of the programs simpar compiles "lean" (``lean_jit``): the loop emitters
#: instead of the MLIR fusion emitters. On in.lj (float64, jaxlib 0.10): the same bits, a fifth
#: of the compiler's memory (a list build +86 -> +15 MiB; in.lj's time steps +50 -> +6 MiB),
#: but the force kernel ~30% slower (5 steps: 63 -> 83 ms CPU), so the time steps keep the
#: fusion emitters and only set-up, list builds and energies are lean. A jaxlib that does not
#: know an option (0.12 removed this one) compiles without it (:func:`accepted_compiler_options`).
LEAN_CPU_OPTIONS = {"xla_cpu_use_fusion_emitters": False}


@functools.cache
def _accepts(name: str, value) -> bool:
    """Whether this jaxlib's default backend compiles a tiny program with the option
    ``name=value`` (a compile of ~10 ms, once per option and process)."""
    import jax
    import jax.numpy as jnp

    try:
        jax.jit(lambda x: x + 1, compiler_options={name: value}).lower(
            jax.ShapeDtypeStruct((), jnp.float32)
        ).compile()
    except Exception:  # noqa: BLE001 - XLA raises JaxRuntimeError/ValueError/... by version
        return False
    return True


def accepted_compiler_options(options: dict) -> dict:
    """The subset of ``options`` (XLA compiler options that only tune speed or memory) that
    this jaxlib accepts; the others are dropped quietly. Which were used is reported by
    :func:`compiler_options_report` (benchmarks put it in their JSON)."""
    return {k: v for k, v in options.items() if _accepts(k, v)}


def lean_compiler_options() -> dict:
    """The accepted part of ``LEAN_CPU_OPTIONS`` when JAX's default backend is the CPU, else
    ``{}`` (accelerator compilers have their own emitters and memory)."""
    import jax

    if jax.default_backend() != "cpu":
        return {}
    return accepted_compiler_options(LEAN_CPU_OPTIONS)


def compiler_options_report() -> dict:
    """Which tuning options simpar passes to XLA on this jaxlib and backend, for benchmark
    JSON: ``{"lean_jit": {...used...}, "dropped": [names this jaxlib refused]}``."""
    used = lean_compiler_options()
    import jax

    asked = LEAN_CPU_OPTIONS if jax.default_backend() == "cpu" else {}
    return {"lean_jit": used, "dropped": sorted(set(asked) - set(used))}


class _LeanJit:
    """``lean_jit``'s function: the lean program, or under an outer trace (``jax.jit``,
    ``grad``, ``vmap``), where compiler options are refused, a plain nested ``jax.jit``."""

    def __init__(self, fun, jit_kwargs: dict):
        import jax

        self._lean = jax.jit(fun, compiler_options=lean_compiler_options(), **jit_kwargs)
        self._plain = jax.jit(fun, **jit_kwargs)
        self.lower = self._lean.lower

    def __call__(self, *args, **kwargs):
        import jax

        try:  # an outer trace, also when every argument is a constant (a closure's)
            from jax._src.core import trace_state_clean

            traced = not trace_state_clean()
        except ImportError:  # the private function moved: tracer arguments still show one
            traced = False
        traced = traced or any(isinstance(x, jax.core.Tracer)
                               for x in jax.tree.leaves((args, kwargs)))  # fmt: skip
        return (self._plain if traced else self._lean)(*args, **kwargs)

    def clear_cache(self) -> None:
        self._lean.clear_cache()
        self._plain.clear_cache()


def lean_jit(fun, **jit_kwargs):
    """``jax.jit(fun, **jit_kwargs)`` compiled with ``lean_compiler_options()``: for programs
    run once or rarely (set-up, list builds, energies), whose compilation would otherwise
    dominate a run's peak memory. Called inside another trace it is a plain nested
    ``jax.jit`` (part of the outer program). Call it when first needed (it reads the
    backend), e.g. behind ``functools.cache``."""
    return _LeanJit(fun, jit_kwargs)


def drop_compiled_if_cached(*jitted) -> bool:
    """Drop the compiled programs of set-up functions (``jax.jit`` objects; none: all, by
    ``jax.clear_caches``) when JAX's persistent cache is on and ``KEEP_COMPILED`` is False (as in
    ``simpar run``): 2-15 MiB each, reloaded from the cache in milliseconds. True if dropped."""
    import jax

    c = jax.config
    if KEEP_COMPILED or not (c.jax_enable_compilation_cache and c.jax_compilation_cache_dir):
        return False
    if not jitted:
        jax.clear_caches()
    for fn in jitted:
        fn.clear_cache()
    release_free_memory()
    return True


def current_rss_mib() -> float:
    """Resident memory of this process now (``VmRSS``), in MiB; 0.0 if unknown (non-Linux)."""
    return round((_status_kib("VmRSS") or 0) / 1024, 1)


#: when set (to anything non-empty), :func:`check_fits` prints each estimate to stderr as the
#: peak resident memory it implies (this process's resident memory now plus ``needed``);
#: ``experiments/check_memory_estimates.py`` compares it with the measured peak
REPORT_ENV = "SIMPAR_MEMORY_REPORT"


def check_fits(needed: int, key: str, what: str, hint: str) -> None:
    """Refuse a run whose estimated memory exceeds what this process may allocate.

    ``needed`` is what the run adds to this process's resident memory now (the estimates
    are calibrated so that resident-now plus ``needed`` is the run's peak, within 30%, on
    every shipped experiment: ``experiments/check_memory_estimates.py``).

    Args:
      needed: estimated bytes (on CPU, devices share the host's memory).
      key: config key or option named in the error, e.g. ``"grid.shape"``.
      what: what was estimated, e.g. ``"4 fields of 4096 x 4096 float32 + halos"``.
      hint: what to change.

    Raises:
      ConfigError: ``needed`` exceeds the available memory (exit code 2); the message gives
        both figures and which limit applied (free RAM, cgroup or RLIMIT_AS).
    """
    if os.environ.get(REPORT_ENV):
        peak = current_rss_mib() * 2**20 + needed
        print(f"simpar: memory estimate {key}: {peak / 2**20:.1f} MiB peak resident "
              f"({what})", file=sys.stderr, flush=True)  # fmt: skip
    got = available()
    if got is None or needed <= got[0]:
        return
    avail, limit = got
    raise ConfigError(
        key,
        f"the run needs about {needed / GIB:.3g} GiB ({what}); this process may allocate "
        f"{avail / GIB:.3g} GiB (limited by {limit}); {hint}",
    )


def check_device_count(devices: int, key: str, cap: int) -> None:
    """Refuse a device count outside ``1 .. cap`` before JAX creates the devices.

    The command line caps ``--devices``; the count a ``--mesh`` implies (the product of its
    sizes, e.g. 5000 for ``--mesh 5000``) must be held to the same cap, since on CPU it
    becomes the number of virtual devices XLA creates (beyond a few thousand it takes
    minutes and then aborts the process).

    Args:
      devices: the number of devices the run would create (``--devices`` or the mesh's
        product).
      key: the option named in the error (``"--devices"`` or ``"--mesh"``).
      cap: the largest count allowed (the CLI's ``MAX_DEVICES``).

    Raises:
      ConfigError: ``devices`` is not an integer in ``1 .. cap``.
    """
    if isinstance(devices, bool) or not isinstance(devices, int) or not 1 <= devices <= cap:
        what = "devices" if key == "--devices" else "devices (the product of the mesh sizes)"
        raise ConfigError(key, f"must be 1 .. {cap} {what}, got {devices!r}")
    limit = device_limit(devices)
    if limit is not None:
        most, why = limit
        what = "devices" if key == "--devices" else "devices (the product of the mesh sizes)"
        raise ConfigError(key, f"{devices} {what} cannot be created here: {why}; at most "
                          f"{most} fit, use fewer (or raise the limit)")  # fmt: skip


#: virtual size of XLA's CPU client beyond the Python process with JAX imported (measured:
#: 1.1 GiB with 8 devices on jaxlib 0.10, of which 128 MiB thread stacks), plus a margin for
#: compiling and running the first programs
_CLIENT_VM = 2 * GIB
#: XLA's CPU client starts about one thread per device plus one per device up to this many
#: (measured: 2 per device up to 256 devices, 1 per device beyond)
_SHARED_THREADS = 256
#: threads of the process besides the per-device ones (JAX's pools, Python)
_BASE_THREADS = 64


def _threads_for(devices: int) -> int:
    return devices + min(devices, _SHARED_THREADS)


def _thread_stack() -> int:
    """The stack each new thread reserves (glibc: RLIMIT_STACK, 8 MiB where unlimited)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_STACK)
    return soft if soft != resource.RLIM_INFINITY and soft > 0 else 8 << 20


def _user_threads() -> int | None:
    """Threads of this user's processes (what RLIMIT_NPROC counts), None if unknown."""
    uid, total = os.getuid(), 0
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return None
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as fh:
                fields = dict(line.split(":", 1) for line in fh if ":" in line)
            if int(fields["Uid"].split()[0]) == uid:
                total += int(fields["Threads"])
        except (OSError, KeyError, ValueError, IndexError):
            continue
    return total


def device_limit(devices: int) -> tuple[int, str] | None:
    """Whether the process limits leave room for ``devices`` virtual CPU devices.

    XLA's CPU client starts threads per device (:func:`_threads_for`), each reserving a
    stack of RLIMIT_STACK bytes of address space; past RLIMIT_AS (``ulimit -v``) or
    RLIMIT_NPROC (``ulimit -u``, threads of this user) thread creation fails inside XLA and
    the process aborts (SIGABRT from absl, no message). This estimates both before JAX
    starts.

    Returns:
      None when ``devices`` fits; else (the most devices that fit, which limit refuses).
    """
    stack = _thread_stack()
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY and soft >= 0:
        # import JAX first: the check then sees the Python process's real size
        room = soft - max(_vm_size(), 512 << 20) - _CLIENT_VM
        need = _threads_for(devices) * stack
        if need > room:
            most = max((i for i in range(devices) if _threads_for(i) * stack <= room), default=0)
            return most, (
                f"their threads reserve about {need / GIB:.3g} GiB of address space "
                f"({stack >> 20} MiB stack each, RLIMIT_STACK) and XLA about "
                f"{_CLIENT_VM / GIB:.3g} GiB, but RLIMIT_AS (ulimit -v) is {soft / GIB:.3g} GiB"
            )
    nproc, _ = resource.getrlimit(resource.RLIMIT_NPROC)
    if nproc != resource.RLIM_INFINITY and nproc >= 0 and os.geteuid() != 0:
        used = _user_threads()
        if used is not None:
            room = nproc - used - _BASE_THREADS
            if _threads_for(devices) > room:
                most = max((i for i in range(devices) if _threads_for(i) <= room), default=0)
                return most, (
                    f"they need about {_threads_for(devices)} threads and RLIMIT_NPROC "
                    f"(ulimit -u) {nproc} leaves {max(nproc - used, 0)} to this user"
                )
    return None
