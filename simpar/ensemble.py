"""The ``[ensemble]`` section: several members of one grid experiment run at once.

::

    [ensemble]
    members = 4
    sweep = { "physics.diffusivity" = [0.5, 1.0, 1.5, 2.0] }   # one value per member
    seeds = [1, 2, 3, 4]            # shorthand for sweep "initial.seed"

Each member is the config with its own values of the swept keys (any number of keys, each a
list of ``members`` values). Members must share the model's program: a swept key may change
parameter values (``[physics]`` numbers) and the initial state (``[initial]``), not the
stencil, the grid, the boundary conditions or the time step; that is checked by comparing the
traced step of every member with member 0's. The engines hold the members on device groups
(``simpar.parallel.ensemble``); the output is one file with an ``ensemble`` dimension.
"""

from __future__ import annotations

import copy
import functools
import json
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from simpar.config import Section
from simpar.errors import ConfigError
from simpar.grid.model import GridSetup
from simpar.parallel.comm import LocalComm
from simpar.parallel.engines import advance_block


@dataclass(eq=False)
class Ensemble:
    """The members of an ensemble run.

    Attributes:
      members: number of members.
      setups: one ``GridSetup`` per member.
      sweep: swept key -> one value per member (``initial.seed`` for ``seeds``).
      state: field -> host array ``(members, *lead, n_0, ..., n_{d-1})``.
      params: parameter -> array ``(members, ...)``.
    """

    members: int
    setups: list[GridSetup]
    sweep: dict[str, list]
    state: dict
    params: dict

    def attrs(self) -> dict:
        """Global attributes for the output file."""
        return {"ensemble_members": self.members, "ensemble_sweep": json.dumps(self.sweep)}

    def coordinates(self, taken=(), units=None) -> dict[str, dict]:
        """The swept numbers as coordinates of the ``ensemble`` dimension of the output.

        Each swept key whose values are numbers becomes one variable named after its last
        part (``physics.diffusivity`` -> ``diffusivity``, ``initial.seed`` -> ``seed``; the
        whole key with ``_`` for ``.`` where that name is taken), so
        ``xarray.open_dataset(path).sel(diffusivity=1.5)`` picks a member. Swept lists or
        strings stay in the ``ensemble_sweep`` attribute only.

        Args:
          taken: names already used in the file (fields, diagnostics, axes).
          units: swept key -> CF units (the model's ``param_units``); a key not in it gets
            no ``units`` (a seed, a dimensionless number).

        Returns:
          name -> ``{"data": (members,) float64 or int64, "long_name": str[, "units": str]}``
          (``simpar.io.netcdf.GridWriter``'s ``ensemble_coords``).
        """
        out: dict[str, dict] = {}
        used = {"time", "step", "ensemble", *taken}
        for key, values in self.sweep.items():
            if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
                continue
            name = key.rsplit(".", 1)[-1]
            if name in used or name in out:
                name = key.replace(".", "_")
            if name in used or name in out:
                continue
            floats = any(isinstance(v, float) for v in values)
            data = np.asarray(values, np.float64 if floats else np.int64)
            out[name] = {"data": data, "long_name": f"swept {key} of each member"}
            if (units or {}).get(key) is not None:
                out[name]["units"] = units[key]
        return out


def _set(data: dict, dotted: str, value) -> None:
    node = data
    parts = dotted.split(".")
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"ensemble.sweep.{dotted}", f"{part!r} is a value, not a table")
        node = child
    node[parts[-1]] = value


def _was_read(sec: Section, dotted: str) -> bool:
    *tables, leaf = dotted.split(".")
    for t in tables:
        sec = sec._children.get(t)
        if sec is None:
            return False
    return leaf in sec._used


def _program(setup: GridSetup) -> str:
    """The traced one-step program of a member (parameters are arguments, not constants)."""
    m = setup.model
    step = functools.partial(advance_block, n=1, model=m, comm=LocalComm(m.ndim), w=m.radius)
    return str(jax.make_jaxpr(step)(setup.state, setup.params))


def from_config(cfg: Section, data: dict, grid_setup) -> Ensemble | None:
    """Read ``[ensemble]`` and build every member's set-up (``None`` without the section).

    Args:
      cfg: the whole config (its ``ensemble`` keys are marked as read).
      data: the whole config table (copied per member; not modified).
      grid_setup: ``Section -> GridSetup`` (``simpar.run.grid_setup``).

    Raises:
      ConfigError: bad ``[ensemble]`` values, a member config that is invalid, or a swept key
        that changes the model rather than its parameters or initial state.
    """
    if "ensemble" not in data:
        return None
    ens = cfg.section("ensemble")
    members = ens.get("members", kind=int, min=1)
    sweep: dict[str, list] = {}
    sw = ens.section("sweep")
    for key in list(sw.data):
        values = sw.data[key]
        if not isinstance(values, list) or len(values) != members:
            raise ConfigError(
                sw.key(key), f"must be a list of {members} values (one per member), got {values!r}"
            )
        sw._used.add(key)
        sweep[key] = values
    seeds = ens.get("seeds", None, kind=int, length=members, min=0, max=2**63 - 1)
    if seeds is not None:
        if "initial.seed" in sweep:
            raise ConfigError("ensemble.seeds", "give seeds or sweep 'initial.seed', not both")
        sweep["initial.seed"] = seeds
    setups = []
    for m in range(members):
        d = copy.deepcopy(data)
        d.pop("ensemble")
        for key, values in sweep.items():
            _set(d, key, values[m])
        sec = Section(d)
        try:
            setups.append(grid_setup(sec))
        except ConfigError as err:
            raise ConfigError(
                f"ensemble (member {m})", f"{err}; swept: {', '.join(sweep) or 'nothing'}"
            ) from err
        for key in sweep:
            if not _was_read(sec, key):
                raise ConfigError(
                    f"ensemble.sweep.{key}",
                    "is not a key the model reads (sweep [physics] values or [initial] keys, "
                    "e.g. 'physics.diffusivity', 'initial.seed')",
                )
    first = setups[0]
    ref = _program(first)
    for m, s in enumerate(setups[1:], 1):
        if s.dt != first.dt or s.domain != first.domain or _program(s) != ref:
            raise ConfigError(
                "ensemble.sweep",
                f"member {m} differs from member 0 in its model (stencil, grid, boundaries or "
                f"time step), not only in parameter values or the initial state; swept: "
                f"{', '.join(sweep)}. Members must share the model: run them separately",
            )
    state = {f: np.stack([np.asarray(s.state[f]) for s in setups]) for f in first.state}
    params = jax.tree.map(lambda *p: jnp.stack(p), *[s.params for s in setups])
    return Ensemble(members, setups, sweep, state, params)
