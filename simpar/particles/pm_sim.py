"""Host driver of a particle-mesh run: ``PMSimulation`` (every engine of ``PMEngine``).

The overflow path is the MD one: each chunk is ``pm.advance`` (``step.run_steps``: it stops
at the first step that sets an ``error_codes`` bit, on every device at once), and the host
loop is ``step.Regrowing``: when the chunk reports only ``OWNED`` / ``MIGRATE`` overflows
it grows ``pm.capacity`` / ``pm.migrate``, lays the chunk's start out again in the larger
buffers and redoes the chunk; ``LOST`` (a particle crossed more than one sub-box in a step)
or overflows left after ``max_regrows`` regrows raise ``error_codes.decode``'s error with
the step the overflow happened at and the setting to change.

The slots of a device hold its particles in id order whatever the capacity (``distribute``
and ``ghosts.migrate`` keep them so; empty slots add exact zeros), so a regrown run follows
one started with the larger buffers bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable

import jax.numpy as jnp
import numpy as np

from simpar.particles import error_codes, pm
from simpar.particles.domain_spec import grown
from simpar.particles.step import Regrowing

# the MD wording names neighbour settings; PM's are pm.capacity / pm.migrate
MESSAGES = {
    error_codes.OWNED: ("owned-particle capacity overflow (a device owned more particles "
                        "than pm.capacity)", "raise pm.capacity or use fewer devices"),
    error_codes.MIGRATE: ("migration capacity overflow (more particles crossed one sub-box face "
                          "in a step than pm.migrate)", "raise pm.migrate or reduce time.dt"),
    error_codes.LOST: ("lost particles: a particle moved more than one sub-box in one step",
                       "reduce time.dt or use fewer devices along the thin axis"),
}  # fmt: skip


_COMPILED: dict = {}  # layout -> (start, chunk, observe): shared by every run with that layout


def programs(eng, dtype) -> tuple:
    """``(start, chunk, observe)`` of ``pm.make_program`` / ``pm.make_observe`` for the
    engine's layout and capacities and the float ``dtype``, shared by every run with an equal
    layout (a second run, or a regrow to capacities seen before, compiles nothing; as the
    decomposed MD programs are shared). Call it after ``eng.distribute`` sized the buffers.
    """
    key = (eng.engine, tuple(eng.ops.shape), tuple(eng.plan.mesh), eng.box,
           tuple(eng.devices or ()), eng.capacities(), np.dtype(dtype).name)  # fmt: skip
    if key not in _COMPILED:
        # the programs read the capacities when traced: the key fixes them and the dtype,
        # so a program is never traced again for another layout
        _COMPILED[key] = (*pm.make_program(eng), pm.make_observe(eng))
    return _COMPILED[key]


class PMSimulation(Regrowing):
    """A PM run: placed state, step counter, and the overflow -> regrow -> redo loop.

    Args:
      eng: a ``PMEngine`` (its ``capacity`` / ``migrate_cap`` None: sized at placement).
      params: ``pm.PMParams``.
      pos, vel, mass: host arrays of the ``N`` particles in id order.
      acc: their accelerations (a checkpoint), or None: computed.
      step: the step of the state.
      capacity_factor: head-room of a regrown capacity over what was needed.
      max_regrows: regrows allowed per chunk (0: an overflow is an error).
      log: called with one line at each regrow (None: silent).

    Attributes:
      state (placed ``pm.PMState``), step, regrows (so far), eng (capacities as grown).
    """

    messages = MESSAGES

    def __init__(self, eng, params, pos, vel, mass, acc=None, *, step: int = 0,
                 capacity_factor: float = 1.25, max_regrows: int = 10,
                 log: Callable[[str], None] | None = None):  # fmt: skip
        self.eng, self.params, self.step = eng, params, int(step)
        self.capacity_factor, self.max_regrows, self.log = capacity_factor, max_regrows, log
        self.regrows, self._done = 0, 0
        if eng.decomposed and eng.capacity is not None:  # a given capacity may be too small
            most = int(eng.owned_counts(pos).max())
            if most > eng.capacity:
                self._grow(most, 0, f"at step {self.step}, {most} particles on one device")
                self.regrows += 1
        placed = eng.distribute(pos, vel, mass, *(() if acc is None else (acc,)))
        self._programs()
        self.state = pm.PMState(*placed) if acc is not None else self._start(*placed, params)

    def _programs(self) -> None:
        """Trace the mapped functions for the current capacities."""
        self._start, self._run, self._observe = programs(self.eng, self.params.dt.dtype)

    def _grow(self, owned: int, migrate: int, why: str) -> None:
        """Grow the capacities that ``owned`` / ``migrate`` exceed; log one line (the caller
        counts the regrow)."""
        eng, old = self.eng, self.eng.capacities()
        if owned > eng.capacity:
            eng.capacity = grown(eng.capacity, owned, self.capacity_factor)
        if eng.migrate_cap is not None and migrate > eng.migrate_cap:
            eng.migrate_cap = grown(eng.migrate_cap, migrate, self.capacity_factor)
        if self.log is not None:
            grew = [f"{k} {a} -> {b}" for k, a, b in zip(("pm.capacity", "pm.migrate"), old,
                    eng.capacities(), strict=True) if a != b]  # fmt: skip
            self.log(f"regrew {', '.join(grew)} ({why})")

    # the regrow loop's hooks (step.Regrowing) ---------------------------------------------
    def _chunk(self, n_steps: int):
        state, check = self._run(self.state, self.params, jnp.asarray(n_steps, jnp.int32))
        check = self.eng.per_device(check, 4)[0]  # the same on every device
        self._done = int(check[3])
        return state, check

    def _error(self, check) -> int:
        return int(check[0])

    def _needed(self, check):
        return check[1:3]

    def _regrow(self, check) -> None:
        host = self.snapshot()  # the chunk's start, laid out again in the larger buffers
        self._grow(int(check[1]), int(check[2]),
                   f"{names(int(check[0]))} at step {self.step + self._done}: needed "
                   f"{int(check[1])} owned, {int(check[2])} migrating; redoing the chunk from "
                   f"step {self.step}")  # fmt: skip
        pos, vel, mass, _, acc = host
        placed = self.eng.distribute(pos, vel, mass, acc)
        self._programs()
        self.state = pm.PMState(*placed)

    def _commit(self, state, check) -> None:
        self.state, self.step = state, self.step + int(check[3])

    def _step_of(self, state) -> int:
        return self.step + self._done

    # the driver's interface ---------------------------------------------------------------
    def advance(self, n_steps: int) -> None:
        """Run ``n_steps`` steps; on overflow regrow and redo the chunk from its start.

        Raises:
          SimulationError: lost particles, or capacities still overflowing after
            ``max_regrows`` regrows, at the step the problem happened.
        """
        self._advance(n_steps)

    def observables(self) -> np.ndarray:
        """Per-device rows ``(n_blocks, pm.N_OBS)`` of ``pm.block_observables`` (host)."""
        return self.eng.per_device(self._observe(self.state, self.params), pm.N_OBS)

    def snapshot(self):
        """``(pos, vel, mass, ids, acc)`` host arrays in id order (checks the count)."""
        s = self.state
        return self.eng.collect((s.pos, s.vel, s.mass, s.ids, s.acc), self.step)


def names(error: int) -> str:
    """The PM wording of the problems set in ``error`` (short form)."""
    return "; ".join(MESSAGES[b][0].split(" (")[0] for b in MESSAGES if error & b)
