"""The one MD time step, the chunk loop and the host's regrow/redo loop, shared by every engine.

Contract:
  * ``md_step`` advances one block by one step: the integrator's stages before the force
    (``integrate.verlet_drift``, or ``integrate.baoab_drift`` with noise drawn for every atom
    of the system and picked by id: the stages of ``integrate.nve`` / ``integrate.langevin``), the rebuild decision (the exact policy: some atom moved more than
    ``skin / 2`` since the last build, reduced over all devices), a rebuild or a refresh of
    the neighbours, the forces, the last half kick. How the neighbours are found is a
    ``Provider``: a local Verlet list (``single``, ``sharded``: ``md.local_provider``) or
    ghosts + migration over a ``Comm`` (decomposed engines:
    ``decomposed.domain_provider``). The state is any NamedTuple with ``position``,
    ``velocity``, ``force``, ``mass``, ``key`` and ``step``; the neighbour state any with an
    int32 ``error`` bitmask (``error_codes``) and ``idx``.
  * ``run_steps`` runs up to ``n`` steps in one ``lax.while_loop`` and stops at the first
    non-zero error.
  * ``Regrowing`` is the host loop around a chunk: when the chunk reports only repairable
    overflows it regrows the layout and redoes the chunk from its saved start (no interaction
    is ever dropped), otherwise it raises the decoded error.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from simpar.particles import error_codes, integrate
from simpar.particles.forces import pair_forces
from simpar.particles.space import displacement, wrap


class Provider(NamedTuple):
    """Where a block's neighbours come from (all functions jittable, ``init`` a traced
    bool or Python False: the first iteration of a decomposed chunk, see ``md_step``).

    Attributes:
      skin: Verlet skin (sigma).
      n_draw: Langevin rows drawn per step (atoms of the system; slots on one device).
      valid: ``state -> bool[C]`` occupied slots.
      ids: ``state -> int32[C]`` global atom ids (-1 empty), or None when slot k is atom k.
      reference: ``(state, nbrs) -> float[C, 3]`` positions at the last build (sigma).
      reduce_max: ``x -> x`` maximum over all devices (identity on one device).
      rebuild: ``(state, nbrs, init) -> (state, nbrs)`` a new list (decomposed: after
        migration, which may reorder the slots); errors and needs accumulate.
      refresh: ``(state, nbrs, init) -> (state, nbrs)`` between builds (ghost positions).
      others: ``(state, nbrs) -> float[K, 3]`` positions that ``nbrs.idx`` indexes, or None
        for the state's own positions.
      rows: ``state -> int32[]`` the leading slots that hold every valid atom (the force
        passes stop there; ``forces.pair_forces``), or None: all.
      block: rows per pass of the force kernel (``forces.pair_forces``; static): -1 the
        backend's default, None one pass (``sharded``: a row-blocked ``lax.map`` would make
        XLA gather the neighbour lists and all-reduce the force blocks across devices).
      every, check: the neighbour policy (static), LAMMPS's ``neigh_modify every N check
        yes|no``: a rebuild is considered only after steps whose number is a multiple of
        ``every``; with ``check`` it happens only when an atom moved more than skin/2 since
        the last build (the default, ``every`` 1 and ``check``, is the exact policy: no pair
        is ever missed); without it, always. With ``every`` > 1 an atom may cross more than
        skin/2 between two checks and pairs entering the cutoff may be missed (LAMMPS's
        "dangerous builds"): in.lj ships ``every 20 check no``.
    """

    skin: float
    n_draw: int
    valid: Callable
    ids: Callable
    reference: Callable
    reduce_max: Callable
    rebuild: Callable
    refresh: Callable
    others: Callable
    rows: Callable | None = None
    block: int | None = -1
    every: int = 1
    check: bool = True


def _drift(ensemble: str, space, params, prov: Provider, state, nbrs, init):
    """The stages of a step before the forces: (moved state, new key, rebuild decision).

    ``moved`` is ``state`` with the drifted positions and half-kicked velocities (its key
    still the old one); on ``init`` (a traced bool) nothing moves and a rebuild is forced.
    """
    valid = prov.valid(state)
    shift = functools.partial(wrap, space)
    key = state.key
    if ensemble == "nve":
        r, v = integrate.verlet_drift(state.position, state.velocity, state.force,
                                      state.mass, params.dt, shift)  # fmt: skip
    else:
        key, sub = jax.random.split(key)
        xi = integrate.noise(sub, prov.n_draw, prov.ids(state), state.velocity.dtype)
        r, v = integrate.baoab_drift(
            state.position, state.velocity, state.force, state.mass, params.dt,
            params.gamma, params.kt, xi, shift,
        )  # fmt: skip
        v = jnp.where(valid[:, None], v, 0.0)
        r = jnp.where(valid[:, None], r, state.position)
    if init is not None:
        key = jnp.where(init, state.key, key)
        r = jnp.where(init, state.position, r)
        v = jnp.where(init, state.velocity, v)
    dr = displacement(space, r, prov.reference(state, nbrs))
    # x, y, z added in this order: a reduction (jnp.sum) may be associated differently in
    # each engine's program, and one ulp at the threshold flips the rebuild decision
    d2 = dr[:, 0] * dr[:, 0] + dr[:, 1] * dr[:, 1] + dr[:, 2] * dr[:, 2]
    d2 = jnp.where(valid, d2, 0.0)
    if prov.check:
        rebuild = prov.reduce_max(jnp.max(d2)) > jnp.asarray((0.5 * prov.skin) ** 2, r.dtype)
    else:
        rebuild = jnp.asarray(True)
    if prov.every > 1:
        rebuild = rebuild & ((state.step + 1) % prov.every == 0)
    if init is not None:
        rebuild = rebuild | init
    return state._replace(position=r, velocity=v), key, rebuild


def _finish(ensemble: str, space, pot, params, prov: Provider, s, nbrs, key, init):
    """The stages after the neighbours are current: forces, last half kick, step count."""
    valid = prov.valid(s)
    f = pair_forces(pot, space, s.position, nbrs.idx, energy=False, others=prov.others(s, nbrs),
                    block=prov.block, rows=None if prov.rows is None else prov.rows(s))  # fmt: skip
    f = jnp.where(valid[:, None], f, 0.0)
    v = integrate.kick(s.velocity, f, s.mass, params.dt)
    if init is not None:
        v = jnp.where(init, s.velocity, v)
    if ensemble != "nve":
        v = jnp.where(valid[:, None], v, 0.0)
    step = s.step + (1 if init is None else jnp.where(init, 0, 1).astype(s.step.dtype))
    return s._replace(velocity=v, force=f, key=key, step=step)


def md_step(ensemble: str, space, pot, params, prov: Provider, state, nbrs, init=None):
    """One time step of one block (jittable; ``ensemble`` static).

    Args:
      ensemble: ``"nve"`` or ``"langevin"``.
      space, pot: the space and the pair potential; params: ``md.MDParams``.
      prov: the neighbour provider.
      state, nbrs: the block's state (position, velocity, force float[C, 3], mass float[C],
        key uint32[2], step int32[]) and its neighbour state.
      init: None, or a traced bool: when True no time passes; the neighbours are rebuilt
        from the state as laid out on the host and the forces computed (the first
        iteration of a decomposed chunk).

    Returns:
      (state, nbrs) one step later (``state.force`` the new forces).
    """
    moved, key, rebuild = _drift(ensemble, space, params, prov, state, nbrs, init)
    flag = False if init is None else init
    s, nbrs = jax.lax.cond(rebuild, prov.rebuild, prov.refresh, moved, nbrs, flag)
    return _finish(ensemble, space, pot, params, prov, s, nbrs, key, init), nbrs


def run_until_rebuild(ensemble: str, space, pot, params, prov: Provider, state, nbrs, n_steps,
                      resume):  # fmt: skip
    """Up to ``n_steps`` steps of ``md_step`` with the current neighbours, stopping inside the
    first step that needs a rebuild, before its forces (jittable; the host rebuilds the list
    in a separate program and calls again with ``resume``: ``md.Simulation``).

    The steps are ``md_step``'s, bit for bit: a rebuild between two programs instead of a
    ``lax.cond`` branch inside one. Splitting lets the list build, which dominates the
    compiler's memory, be compiled apart from (and leaner than) the time steps.

    Args:
      ensemble, space, pot, params, prov: as ``md_step`` (``prov.rebuild`` is not used).
      state, nbrs: the start; with ``resume`` the state is a step stopped for its rebuild
        (drifted, its new key) and ``nbrs`` the list built for it.
      n_steps: int scalar, steps to run (traced).
      resume: bool scalar (traced): finish the stopped step first (it counts as one).

    Returns:
      (state, nbrs, done, pending): ``done`` int32 steps completed; ``pending`` bool: the
      loop stopped in step ``done + 1`` for a rebuild, ``state`` holding that step's drifted
      positions (and its key). Stops early, not pending, when ``nbrs.error`` is set.
    """

    # the loop is rotated so that the forces run unconditionally (no ``lax.cond`` around the
    # force kernel, no per-step selects for the resumed step): the carry holds the next step
    # drifted (its positions, velocities, key and rebuild decision); a body finishes that
    # step (forces, kick) and drifts the one after it unless it was the last; the first step
    # is drifted before the loop, or on ``resume`` by the call that stopped it
    def drift(s, nb):
        moved, key, rebuild = _drift(ensemble, space, params, prov, s, nb, None)
        return moved.position, moved.velocity, key, rebuild

    def keep(s, _nb):
        return s.position, s.velocity, s.key, jnp.asarray(False)

    def cond(carry):
        i, _, _, rebuild, nb = carry
        return (i < n_steps) & ~rebuild & (nb.error == 0)

    def body(carry):
        i, s, (r, v, key), _, nb = carry
        m, nb = prov.refresh(s._replace(position=r, velocity=v), nb, False)
        s = _finish(ensemble, space, pot, params, prov, m, nb, key, None)
        i = i + 1
        r, v, key, rebuild = jax.lax.cond(i < n_steps, drift, keep, s, nb)
        return i, s._replace(position=None, velocity=None), (r, v, key), rebuild, nb

    # the carry's state holds neither positions nor velocities (r, v: no copies per step)
    r, v, key, rebuild = jax.lax.cond(resume | (n_steps <= 0), keep, drift, state, nbrs)
    s = state._replace(position=None, velocity=None)
    carry = (jnp.int32(0), s, (r, v, key), rebuild, nbrs)
    done, state, (r, v, key), rebuild, nbrs = jax.lax.while_loop(cond, body, carry)
    pending = rebuild & (nbrs.error == 0)
    # pending: the drifted step (its old force and step count, its new key); else the last
    # finished step (r, v, key are its own)
    return state._replace(position=r, velocity=v, key=key), nbrs, done, pending


def run_steps(step_fn: Callable, state, nbrs, n_steps, init=None):
    """Up to ``n_steps`` calls of ``step_fn(state, nbrs[, first]) -> (state, nbrs)`` in one
    ``lax.while_loop``, stopping after the first step that sets ``nbrs.error``.

    Args:
      step_fn: one step (``md_step`` with everything but the state bound).
      state, nbrs: the start.
      n_steps: int scalar (traced: one compilation serves every chunk length).
      init: None, or a (traced) bool: an extra first iteration ``step_fn(..., True)`` in
        which no time passes (the decomposed engines lay out their lists there).

    Returns:
      (state, nbrs) after the steps done.
    """
    if init is None:

        def cond(carry):
            i, _, nb = carry
            return (i < n_steps) & (nb.error == 0)

        def body(carry):
            i, s, nb = carry
            s, nb = step_fn(s, nb)
            return i + 1, s, nb

        _, state, nbrs = jax.lax.while_loop(cond, body, (jnp.int32(0), state, nbrs))
        return state, nbrs

    def cond_init(carry):
        i, _, nb, first = carry
        return ((i < n_steps) | first) & (nb.error == 0)

    def body_init(carry):
        i, s, nb, first = carry
        s, nb = step_fn(s, nb, first)
        return i + jnp.where(first, 0, 1), s, nb, jnp.zeros((), bool)

    carry = (jnp.int32(0), state, nbrs, jnp.asarray(init, bool))
    _, state, nbrs, _ = jax.lax.while_loop(cond_init, body_init, carry)
    return state, nbrs


class Regrowing:
    """The overflow -> regrow -> redo-the-chunk host loop (a mixin of both simulations).

    A subclass provides ``_chunk(n) -> (state, nbrs)`` (run from the committed start, commit
    nothing), ``_error(nbrs) -> int`` and ``_needed(nbrs) -> list`` (host), ``_regrow(nbrs)``
    (grow the layout from the needs and lay the committed start out in it), ``_commit(state,
    nbrs)``, ``_step_of(state) -> int``, and the attributes ``regrows`` and ``max_regrows``;
    ``messages`` (``error_codes.decode``) may name its own settings.
    """

    messages: dict | None = None

    def _advance(self, n_steps: int) -> None:
        """Run ``n_steps`` steps; regrow and redo on overflow.

        Raises:
          SimulationError: an error that regrowing cannot repair (lost atoms), or capacities
            still overflowing after ``max_regrows`` regrows (``error_codes.decode``).
        """
        for attempt in range(self.max_regrows + 1):
            state, nbrs = self._chunk(n_steps)
            err = self._error(nbrs)
            if err == 0:
                self._commit(state, nbrs)
                return
            if err & ~error_codes.REPAIRABLE or attempt == self.max_regrows:
                break
            self._regrow(nbrs)
            self.regrows += 1
        detail = f"needed {np.asarray(self._needed(nbrs)).tolist()}"
        if not err & ~error_codes.REPAIRABLE:
            detail = f"still overflowing after {self.max_regrows} regrows; {detail}"
        raise error_codes.decode(err, self._step_of(state), detail, self.messages)
