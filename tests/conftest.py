"""Test set-up: 8 simulated CPU devices (asserted, never skipped) and float64 available.

Every multi-device path runs in CI this way; a test that needs N devices never skips.

Fused multiply-add is switched off on x86 (``--xla_cpu_max_isa=AVX``): XLA contracts
``a * b + c`` into an FMA only where both land in the same compiled kernel, and kernels are cut
differently per engine, mesh and halo width, so with FMA the engines differ from ``single`` by one
rounding in a few cells. Without it every engine is bitwise equal to ``single`` (the tests assert
that); tests that also run with FMA on compare to 1e-14.

Tiers: ``pytest -m "not slow"`` is the fast tier (every model on every engine at small size);
``slow`` marks multi-process runs and long validation runs (pyproject.toml). Command-line tests
call ``simpar.cli.main([...])`` in this process where a subprocess adds nothing; every test
must leave the SIGINT/SIGTERM handlers as it found them (checked after each test), and no
test may write into the repository: a module that leaves an untracked, non-ignored file there
fails (``git status --porcelain`` before and after each module; tests write into ``tmp_path``).
"""

import gc
import json
import os
import platform
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# command-line runs of the tests (in-process and subprocesses) keep no compiled programs in the
# user's cache directory (simpar.cli.compile_cache_dir); the cache's own test sets it per run
os.environ.setdefault("SIMPAR_NO_COMPILE_CACHE", "1")
if platform.machine().lower() in ("x86_64", "amd64") and "xla_cpu_max_isa" not in os.environ.get(
    "XLA_FLAGS", ""
):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_max_isa=AVX").strip()

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)
jax.config.update("jax_enable_x64", True)

# One persistent compilation cache per test session (issue 29 item 7): the same XLA program
# compiled again (in the next module, after JAX's in-memory caches were emptied below, or in
# the other xdist worker) is loaded from it instead. The first process creates a temporary
# directory and names it in the environment; xdist's workers inherit it and the creator removes
# it at the end. ``SIMPAR_TEST_COMPILE_CACHE`` may name a directory to keep (a warm rerun), or
# be ``0`` to turn the cache off. Tests that count compilations turn it off for themselves
# (the ``no_compile_cache`` fixture); ``simpar run`` subprocesses keep theirs off
# (``SIMPAR_NO_COMPILE_CACHE`` above).
_CACHE_ENV = "SIMPAR_TEST_COMPILE_CACHE"
_CACHE_CREATED = _CACHE_ENV not in os.environ
if _CACHE_CREATED:
    os.environ[_CACHE_ENV] = tempfile.mkdtemp(prefix="simpar-test-jax-cache-")
if os.environ[_CACHE_ENV] not in ("", "0"):
    jax.config.update("jax_compilation_cache_dir", os.environ[_CACHE_ENV])
    jax.config.update(
        "jax_persistent_cache_min_compile_time_secs",
        float(os.environ.get("SIMPAR_TEST_CACHE_MIN_S", "0.05")),
    )
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    try:  # reads and writes under a file lock: a worker never reads another's half-written entry
        import filelock  # noqa: F401

        jax.config.update("jax_compilation_cache_max_size", 4 << 30)
    except ImportError:
        pass  # a torn read only warns and compiles again

# With the cache on, simpar drops a run's set-up programs once they have run (``simpar run``
# saves memory; a later call reloads them from the cache) and an LJ run empties all of JAX's
# caches: every in-process run, and every module fixture after it, traced, lowered and loaded
# its programs again. The tests keep them (JAX's caches are emptied after each module below);
# tests/test_memory_release.py checks the drop itself (issue 29 item 7).
import simpar.memory  # noqa: E402

simpar.memory.KEEP_COMPILED = True

N_DEVICES = 8
ROOT = Path(__file__).resolve().parents[1]


def pytest_configure(config):
    n = len(jax.devices())
    assert n == N_DEVICES, f"tests need {N_DEVICES} CPU devices, JAX sees {n}: {jax.devices()}"


@pytest.fixture(autouse=True)
def _signal_handlers_restored():
    """In-process ``simpar.cli.main`` runs restore the handlers they installed (checked)."""
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    yield
    after = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    assert after == before, f"signal handlers left changed: {before} -> {after}"


def _untracked() -> set[str] | None:
    """Untracked, non-ignored files of the repository (None outside a git checkout)."""
    try:
        r = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=all"], cwd=ROOT,
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    if r.returncode != 0:
        return None  # not a git checkout (an unpacked sdist): nothing to compare
    return {line[3:] for line in r.stdout.splitlines() if line.startswith("?? ")}


@pytest.fixture(autouse=True, scope="module")
def _repository_untouched(request):
    """A test module leaves no new file in the repository (issue 28: a log named after a
    command-line argument once landed in the working directory and was committed)."""
    before = _untracked()
    yield
    after = _untracked()
    if before is not None and after is not None and after - before:
        new = ", ".join(sorted(after - before)[:10])
        pytest.fail(
            f"{request.module.__name__} left untracked files in the repository: {new} "
            "(write into tmp_path)",
            pytrace=False,
        )


def _memory_maps() -> int:
    """Memory mappings of this process (``/proc/self/maps`` lines; 0 where unavailable)."""
    try:
        with open("/proc/self/maps") as f:
            return sum(1 for _ in f)
    except OSError:
        return 0


_PEAK_MAPS = [0, ""]


@pytest.fixture(autouse=True, scope="module")
def _compiled_programs_released(request):
    """JAX's caches are emptied after each test module. Each compiled XLA:CPU program holds
    6-20 memory mappings (its code and constants) for as long as a cache keeps it, a process
    may hold ``vm.max_map_count`` (65,530 by default) and LLVM segfaults inside XLA's compiler
    when an ``mmap`` is refused: the whole suite in one process (as CI runs it) compiles
    thousands of programs and crashed that way twice, in whichever test came next. The peak
    count after a module is printed at the end of the run."""
    yield
    n = _memory_maps()
    if n > _PEAK_MAPS[0]:
        _PEAK_MAPS[:] = [n, request.module.__name__]
    jax.clear_caches()
    gc.collect()


@pytest.fixture
def no_compile_cache():
    """JAX's persistent compilation cache off for one test: a test that counts backend
    compilations sees a program compiled twice as two compilations, not one and a cache hit."""
    from jax._src import compilation_cache

    was = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", False)
    compilation_cache.reset_cache()
    yield
    jax.config.update("jax_enable_compilation_cache", was)
    compilation_cache.reset_cache()


def pytest_unconfigure(config):
    if _CACHE_CREATED and not hasattr(config, "workerinput"):
        shutil.rmtree(os.environ.pop(_CACHE_ENV), ignore_errors=True)


# Opt-in compile accounting (issue 29 item 7): ``SIMPAR_COUNT_COMPILES=1 pytest ...`` counts the
# XLA backend compilations (jax.monitoring's backend-compile duration event, jax 0.10 and 0.12),
# their seconds and the CPU seconds of this process per test (set-up and tear-down included), and
# prints the 30 heaviest tests, the CPU seconds per file and the totals at the end; under xdist
# each worker sends its counts to the controller (``workeroutput``). Compiles in a module-scoped
# fixture count against the first test that uses it; subprocesses are not seen.
_COMPILE_EVENT = "backend_compile"
_HIT_EVENT = "cache_retrieval_time"  # a program loaded from the persistent cache
_COMPILES: dict[str, list] = {}  # nodeid -> [compiles, their s, CPU s, cache loads, their s]
_CURRENT = ["(collection)"]
_COUNTING = os.environ.get("SIMPAR_COUNT_COMPILES", "") not in ("", "0")
if _COUNTING:

    def _on_duration(event, duration, **_):
        if _COMPILE_EVENT in event or _HIT_EVENT in event:
            entry = _COMPILES.setdefault(_CURRENT[0], [0, 0.0, 0.0, 0, 0.0])
            at = 0 if _COMPILE_EVENT in event else 3
            entry[at] += 1
            entry[at + 1] += duration

    jax.monitoring.register_event_duration_secs_listener(_on_duration)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _CURRENT[0] = item.nodeid
    cpu = time.process_time()
    try:
        return (yield)
    finally:
        if _COUNTING:
            _COMPILES.setdefault(item.nodeid, [0, 0.0, 0.0, 0, 0.0])[2] += time.process_time() - cpu
        _CURRENT[0] = "(between tests)"


def pytest_sessionfinish(session):
    if _COUNTING and hasattr(session.config, "workeroutput"):  # an xdist worker
        session.config.workeroutput["simpar_compiles"] = json.dumps(_COMPILES)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """xdist's controller: the worker's compile counts join this process's."""
    sent = getattr(node, "workeroutput", {}).get("simpar_compiles", "{}")
    for nodeid, row in json.loads(sent).items():
        entry = _COMPILES.setdefault(nodeid, [0, 0.0, 0.0, 0, 0.0])
        for i, v in enumerate(row):
            entry[i] += v


def _row(r) -> str:
    return f"{r[0]:5d} compiles {r[1]:7.2f} s {r[3]:5d} loaded {r[4]:6.2f} s  cpu {r[2]:7.2f} s"


def pytest_terminal_summary(terminalreporter):
    if _COMPILES:
        rows = sorted(_COMPILES.items(), key=lambda kv: -kv[1][1])
        write = terminalreporter.write_line
        terminalreporter.write_sep("=", "XLA compiles per test (SIMPAR_COUNT_COMPILES)")
        for nodeid, r in rows[:30]:
            write(f"{_row(r)}  {nodeid}")
        files: dict[str, list] = {}
        for nodeid, r in rows:
            f = files.setdefault(nodeid.split("::")[0], [0, 0.0, 0.0, 0, 0.0])
            f[:] = [a + b for a, b in zip(f, r, strict=True)]
        terminalreporter.write_sep("-", "per file (loaded: from the persistent cache)")
        for name, r in sorted(files.items(), key=lambda kv: -kv[1][2]):
            write(f"{_row(r)}  {name}")
        total = [sum(col) for col in zip(*_COMPILES.values(), strict=True)]
        write(f"{_row(total)}  total of {len(rows)} tests (CPU: the test processes only)")
    if _PEAK_MAPS[0]:
        terminalreporter.write_line(
            f"memory maps: peak {_PEAK_MAPS[0]} after {_PEAK_MAPS[1]} (before clearing JAX's "
            "caches; the kernel allows vm.max_map_count, 65,530 by default)"
        )
