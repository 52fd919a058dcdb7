"""The one error bitmask of an MD run, and its decoder.

Under ``jit`` nothing can raise, so every MD run (``single``, ``sharded`` and the decomposed
engines) carries one int32 ``error`` leaf in its neighbour state (``NeighborList.error``,
``decomposed.DomainLists.error``): each bit is a problem seen at some time step, OR-ed in
(sticky), reduced over all devices on the decomposed engines. A chunk stops at the first
non-zero value; the host then regrows the capacities and redoes the chunk when every set
bit is ``REPAIRABLE``, and otherwise raises the ``SimulationError`` that ``decode`` words,
with the step and the setting to change. The particle-mesh run (``pm.advance``,
``pm_sim.PMSimulation``) uses the same bits (``OWNED``, ``MIGRATE``, ``LOST``), the same
chunk loop and the same host loop, with its own settings named (``decode``'s ``messages``).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from simpar.errors import SimulationError

NEIGHBORS = 1 << 0  # a neighbour row needed more than max_neighbors slots
CELLS = 1 << 1  # a column of cells held more than column_capacity atoms
OWNED = 1 << 2  # a device owns more atoms than its buffer holds
MIGRATE = 1 << 3  # more atoms leave a sub-box across one face than the migration buffer holds
GHOSTS = 1 << 4  # more ghost atoms than a ghost-stage buffer holds
LOST = 1 << 5  # the atom count changed, or an atom jumped more than one sub-box

REPAIRABLE = NEIGHBORS | CELLS | OWNED | MIGRATE | GHOSTS

# bit -> (what happened, the setting to change)
_MESSAGES = {
    NEIGHBORS: ("neighbour-list overflow (an atom has more neighbours than max_neighbors)",
                "raise neighbors.max_neighbors or neighbors.capacity_factor"),
    CELLS: ("cell-list overflow (a column of cells holds more atoms than its capacity)",
            "raise neighbors.capacity_factor"),
    OWNED: ("owned-atom capacity overflow (atoms piled into one sub-box)",
            "raise neighbors.capacity_factor or use fewer devices"),
    MIGRATE: ("migration capacity overflow (many atoms crossed one sub-box face)",
              "raise neighbors.capacity_factor or reduce time.dt"),
    GHOSTS: ("ghost capacity overflow (many atoms within cutoff + skin of a sub-box face)",
             "raise neighbors.capacity_factor"),
    LOST: ("lost atoms: an atom jumped more than one sub-box between neighbour builds, or "
           "the atom count changed", "reduce time.dt (the run is unstable)"),
}  # fmt: skip


def overflow(needed, capacities, bits):
    """int32[] (traced) OR of ``bits[k]`` over the entries with ``needed[k] > capacities[k]``.

    Args:
      needed: int32[K] what a step needed (reduced over all devices).
      capacities: K ints, the static sizes of the buffers.
      bits: K ints, the error bit of each capacity.
    """
    over = needed > jnp.asarray(capacities, jnp.int32)
    bits = jnp.asarray(bits, jnp.int32)
    return jnp.bitwise_or.reduce(jnp.where(over, bits, 0)).astype(jnp.int32)


def names(error: int) -> list[str]:
    """The problems set in ``error`` (host int), in bit order."""
    return [_MESSAGES[b][0] for b in _MESSAGES if int(error) & b]


def decode(error: int, step: int, detail: str = "", messages: dict | None = None
           ) -> SimulationError:  # fmt: skip
    """One ``SimulationError`` for the bits set in ``error``.

    Args:
      error: the int32 bitmask (host int); 0 is not an error.
      step: the time step the chunk stopped at.
      detail: appended to the reason (e.g. "after 10 regrows; needed ...").
      messages: ``bit -> (what happened, the setting to change)`` replacing the MD wording
        of those bits (a model whose settings have other names: ``pm_sim``).

    Returns:
      The error (raise it), naming every problem and the setting to change for each.
    """
    error = int(error)
    words = {**_MESSAGES, **(messages or {})}
    bits = [b for b in _MESSAGES if error & b]
    unknown = error & ~sum(_MESSAGES)
    if not bits and not unknown:
        raise ValueError("error code 0 is not an error")
    reason = "; ".join(words[b][0] for b in bits)
    if unknown:
        reason += ("; " if reason else "") + f"unknown error bits {unknown:#x}"
    if detail:
        reason += f" ({detail})"
    hints = []
    for b in bits:
        if words[b][1] not in hints:
            hints.append(words[b][1])
    return SimulationError(int(step), reason, "; ".join(hints) or "report this as a bug")


def check(error, step: int, detail: str = "") -> None:
    """Raise ``decode(error, step, detail)`` unless ``error`` (int or array) is 0."""
    error = int(np.asarray(error))
    if error:
        raise decode(error, step, detail)
