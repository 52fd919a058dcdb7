"""Helpers for checking that every engine reproduces ``single`` (used by the test suite).

``ENGINE_CASES`` lists (engine, mesh, halo) combinations over the meshes the suite covers;
``run_engines`` runs a grid model on each and returns the gathered final states.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterable, Sequence

import numpy as np

from simpar.grid.model import GridModel
from simpar.parallel.engines import make_engine

ENGINE_CASES_2D = (
    ("pmap", (8,), 1),
    ("pmap", (2, 4), 2),
    ("pmap", (4, 2), 3),
    ("pmap", (1, 8), 1),
    ("shard_map", (8,), 2),
    ("shard_map", (2, 4), 1),
    ("shard_map", (4, 2), 2),
    ("shard_map", (1, 8), 3),
    ("sharded", (2, 4), 1),
    ("sharded", (4, 2), 2),
    ("sharded", (1, 8), 1),
)
ENGINE_CASES_3D = (
    ("pmap", (2, 2, 2), 1),
    ("pmap", (2, 2, 2), 2),
    ("shard_map", (2, 2, 2), 1),
    ("shard_map", (2, 2, 2), 2),
    ("sharded", (2, 2, 2), 1),
)


def run_engine(
    engine: str,
    model: GridModel,
    state: dict,
    params,
    n: int,
    mesh: Sequence[int] | None = None,
    halo: int | None = None,
):
    """Run ``n`` steps; returns (final host state, diagnostics)."""
    shape = next(iter(state.values())).shape[-model.ndim :]
    e = make_engine(engine, model, shape, mesh, halo)
    st = e.advance(e.place(state), params, n)
    return e.gather(st), e.observe(st, params)


def run_engines(
    model: GridModel, state: dict, params, n: int, cases: Iterable[tuple[str, Sequence[int], int]]
):
    """``{(engine, mesh, halo): final host state}`` plus the ``single`` reference under
    key ``("single", (1,), model.radius)``."""
    out = {
        ("single", (1,), model.radius): run_engine(
            "single", model, state, params, n, None, model.radius
        )[0]
    }
    for engine, mesh, halo in cases:
        out[(engine, tuple(mesh), halo)] = run_engine(engine, model, state, params, n, mesh, halo)[
            0
        ]
    return out


def max_abs_diff(a: dict, b: dict) -> float:
    """Largest ``|a[k] - b[k]|`` over every field ``k`` of ``a`` (compared in float64)."""
    return max(
        float(np.max(np.abs(np.asarray(a[k], np.float64) - np.asarray(b[k], np.float64))))
        for k in a
    )


# Without FMA (XLA_FLAGS=--xla_cpu_max_isa=AVX, set by tests/conftest.py on x86) every engine
# equals ``single`` bitwise, as the per-cell arithmetic is the same. With FMA, XLA:CPU contracts
# ``a * b + c`` into one rounding wherever both sit in one fusion, and programs that fuse
# differently (another engine, halo width or mesh) then differ in a few cells by an ulp per step.
FMA_OFF = (
    re.search(r"--xla_cpu_max_isa=(SSE4_2|AVX)\b", os.environ.get("XLA_FLAGS", "")) is not None
)
ENGINE_ATOL = 0.0 if FMA_OFF else 1e-14


def assert_same_field(got, ref, msg: str = "") -> None:
    """Bitwise without FMA; within ``ENGINE_ATOL`` (fields of order 1) with it."""
    if FMA_OFF:
        np.testing.assert_array_equal(got, ref, err_msg=msg)
    else:
        np.testing.assert_allclose(got, ref, rtol=0, atol=ENGINE_ATOL, err_msg=msg)


#: the test set-up's settings that a user's new shell does not have
TEST_ONLY_VARIABLES = ("XLA_FLAGS", "JAX_ENABLE_X64", "JAX_NUM_CPU_DEVICES", "PYTHONSTARTUP")


def user_shell_env(root, keep_xla_flags: bool = False, **env) -> dict:
    """The environment of a user's new shell with ``root`` on ``PYTHONPATH``: none of the test
    set-up's JAX settings (``TEST_ONLY_VARIABLES``; ``XLA_FLAGS`` kept when asked, for checks
    that compare bitwise with FMA off); ``env`` adds variables."""
    drop = [v for v in TEST_ONLY_VARIABLES if not (keep_xla_flags and v == "XLA_FLAGS")]
    e = {k: v for k, v in os.environ.items() if k not in drop}
    e.update(PYTHONPATH=str(root), **env)
    return e


def fresh_python(code: str, root, **env) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter with ``root`` on ``PYTHONPATH`` and cwd ``root``:
    JAX not yet configured, so 64-bit JAX is off (``JAX_ENABLE_X64`` removed); ``env`` adds
    variables. Returns the completed process (stdout/stderr as text, 300 s limit)."""
    e = dict(os.environ, PYTHONPATH=str(root), **env)
    e.pop("JAX_ENABLE_X64", None)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=e,
        cwd=root,
        timeout=300,
    )
