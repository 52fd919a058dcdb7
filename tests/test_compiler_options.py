"""Tuning options reach XLA only when this jaxlib accepts them (jaxlib 0.12 removed
``xla_cpu_use_fusion_emitters``, and passing it crashed every LJ run there)."""

import jax
import jax.numpy as jnp
import numpy as np

from simpar import memory


def test_unknown_option_is_dropped_quietly():
    opts = {"xla_cpu_no_such_option_for_simpar": True}
    assert memory.accepted_compiler_options(opts) == {}


def test_lean_options_are_accepted_by_this_jaxlib_and_reported():
    used = memory.lean_compiler_options()
    assert set(used) <= set(memory.LEAN_CPU_OPTIONS)
    for k, v in used.items():  # every option passed compiles on this jaxlib
        jax.jit(lambda x: x * 2, compiler_options={k: v}).lower(1.0).compile()
    report = memory.compiler_options_report()
    assert report["lean_jit"] == used
    assert set(report["dropped"]) | set(used) == set(memory.LEAN_CPU_OPTIONS)


def test_lean_jit_runs_on_this_jaxlib():
    f = memory.lean_jit(lambda x: jnp.sin(x) + 1)
    x = jnp.linspace(0, 1, 7)
    np.testing.assert_array_equal(np.asarray(f(x)), np.asarray(jax.jit(lambda x: jnp.sin(x) + 1)(x)))
