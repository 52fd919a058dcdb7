"""``simpar keys MODEL``: a model's TOML keys, defaults and allowed values, as markdown.

There is no separate schema: the model adapters read their keys through
``simpar.config.Section.get``, whose arguments (default, kind, choices, bounds, list length)
are the schema. This module traces them: it runs the adapter's ``plan`` (which validates a
config and allocates nothing on the devices) on small probe configs with ``Section.get``
recorded, then on variants that set each recorded choice (``initial.kind = "random"``,
``physics.force = "pm"``, a boolean flipped) to reach the keys read only under it, and prints
what was read. A key read only under such a setting is listed with it ("only with").

Limits, stated in the output: a default computed from other keys (``output.every``: a tenth of
the steps) is shown as "depends on other keys"; an extra check a reader does beyond kind,
choices and bounds shows as "checked by the model"; keys read without ``Section.get`` (the
``[ensemble]`` sweep, whose keys are other keys) are not listed.

``docs/models.md`` is this output for every model (``tests/test_docs.py`` checks that it is
current).
"""

from __future__ import annotations

import copy
import tempfile
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simpar import config as cfgmod

_3D = "a 3-D `grid.shape`"
_PROBES: dict[str, tuple[tuple[str | None, str], ...]] = {
    "heat": (
        (None, "grid.shape = [8, 8]\ntime.dt = 1e-5\ntime.steps = 10"),
        (_3D, "grid.shape = [8, 8, 8]\ntime.dt = 1e-5\ntime.steps = 10"),
    ),
    "wave": (
        (None, "grid.shape = [8, 8]\ntime.dt = 1e-3\ntime.steps = 10"),
        (_3D, "grid.shape = [8, 8, 8]\ntime.dt = 1e-3\ntime.steps = 10"),
    ),
    "advection": (
        (None, "grid.shape = [8, 8]\ntime.dt = 1e-3\ntime.steps = 10"),
        (_3D, "grid.shape = [8, 8, 8]\ntime.dt = 1e-3\ntime.steps = 10"),
    ),
    "gray_scott": (
        (None, 'grid.shape = [8, 8]\nphysics.preset = "spots"\ntime.steps = 10'),
        (_3D, 'grid.shape = [8, 8, 8]\nphysics.preset = "spots"\ntime.steps = 10'),
    ),
    "lbm": (
        (None, "grid.shape = [8, 8]\nphysics.viscosity = 0.1\ntime.steps = 10"),
        (
            "`physics.reynolds` set",
            'grid.shape = [8, 8]\nboundary.x = "wall"\n'
            'boundary.y = { lower = "wall", upper = "lid" }\nphysics.reynolds = 10.0\n'
            "time.steps = 10",
        ),
        ("`physics.tau` set", "grid.shape = [8, 8]\nphysics.tau = 0.8\ntime.steps = 10"),
        (_3D, "grid.shape = [8, 8, 8]\nphysics.viscosity = 0.1\ntime.steps = 10"),
    ),
    "lj": (
        (
            None,
            "system.density = 0.8442\nsystem.cells = [4, 4, 4]\ntime.dt = 0.005\ntime.steps = 10",
        ),
    ),
    "nbody": (
        (None, "particles.n = 8\ntime.dt = 0.01\ntime.steps = 10"),
        (
            '`physics.force = "pm"`',
            'physics.force = "pm"\nphysics.pm_mesh = [4, 4, 4]\n'
            'particles.lattice = [4, 4, 4]\ninitial.kind = "plane_wave"\ntime.dt = 0.01\n'
            "time.steps = 10",
        ),
    ),
    "spectral_ns": (
        (None, "grid.shape = [8, 8]\nphysics.viscosity = 0.01\ntime.dt = 0.01\ntime.steps = 10"),
        (_3D, "grid.shape = [8, 8, 8]\nphysics.viscosity = 0.01\ntime.dt = 0.01\ntime.steps = 10"),
    ),
}
"""Per model: (the setting a probe stands for, as markdown, or None for the plain model; its
TOML, without ``[model] name``)."""
for _model in ("heat", "wave", "advection", "gray_scott", "lbm"):
    _PROBES[_model] += (
        ("an `[ensemble]` table", _PROBES[_model][0][1] + "\nensemble.members = 2"),
    )

_GRID_BOUNDARY = (
    '`"periodic"`, `"neumann"`, `"dirichlet"` (value 0), `{kind = "dirichlet", value = V}`, '
    "or `{lower = ..., upper = ...}` of these"
)
_ALLOWED = {
    "boundary": _GRID_BOUNDARY,
    "lbm:boundary": '`"periodic"`, `"wall"`, `"lid"` (moving along +x; on y or z), or '
    "`{lower = ..., upper = ...}` of these",
    "neighbors.every": "an integer >= 1",
    "neighbors.check": "true or false",
    "ensemble.seeds": "a list of `ensemble.members` integers >= 0",
    "nbody:physics.boundary": '`"periodic"` (Poisson by FFT needs a periodic box)',
}
"""What a key allows where its reader checks more than ``Section.get`` states (a value read
as ``kind=object``, a list as long as another key): by ``model:key``, key, or table."""

_NOTES = {
    "lbm:physics.reynolds": "exactly one of `physics.reynolds` (needs a lid), `physics.viscosity`"
    ", `physics.tau`",
    "lbm:physics.viscosity": "exactly one of `physics.reynolds`, `physics.viscosity`, "
    "`physics.tau`",
    "lbm:physics.tau": "exactly one of `physics.reynolds`, `physics.viscosity`, `physics.tau`",
    "gray_scott:physics.F": "required without `physics.preset`",
    "gray_scott:physics.k": "required without `physics.preset`",
}
"""Rules between keys that no single ``Section.get`` call states."""

MODELS = tuple(_PROBES)
_MAX_PLANS = 400  # variants tried per model at most


@dataclass
class Key:
    """What the readers asked of one key (the union over every probe that read it)."""

    name: str
    defaults: list = field(default_factory=list)
    kind: type = float
    choices: tuple | None = None
    bounds: str = ""
    length: Any = None
    checked: bool = False
    conditions: set = field(default_factory=set)
    always: bool = False


class _Recorder:
    """Replaces ``Section.get`` while probing; records each call's schema."""

    def __init__(self):
        self.calls: list[tuple[str, dict]] = []

    def __enter__(self):
        self.original = cfgmod.Section.get
        recorder = self

        def get(section, name, default=cfgmod.REQUIRED, **kw):
            recorder.calls.append((section.key(name), dict(kw, default=default)))
            return recorder.original(section, name, default, **kw)

        cfgmod.Section.get = get
        return self

    def __exit__(self, *exc):
        cfgmod.Section.get = self.original


def _set(data: dict, dotted: str, value: Any) -> dict:
    data = copy.deepcopy(data)
    node = data
    *path, last = dotted.split(".")
    for part in path:
        node = node.setdefault(part, {})
    node[last] = value
    return data


def _scaled(data: Any) -> Any:
    """The probe with its integers doubled: defaults that change with them are computed."""
    if isinstance(data, dict):
        return {k: _scaled(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_scaled(v) for v in data]
    if isinstance(data, int) and not isinstance(data, bool):
        return 2 * data
    return data


def _plan(adapter, data: dict, out: str) -> list[tuple[str, dict]]:
    """The keys one ``plan`` reads from ``data`` (up to the first error, if any)."""
    from simpar.drive.loop import Options

    with _Recorder() as rec:
        try:
            adapter.plan(cfgmod.Section(data), Options(out=out, progress=False), "")
        except Exception:  # noqa: BLE001 - a variant the model refuses (a ConfigError, or an
            pass  # error of a combination no config reaches): the keys read before it count
    return rec.calls


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return repr(value)


def _adapter(model: str):
    """The object whose ``plan(cfg, opts, config_text)`` reads the ``model``'s config."""
    from simpar.drive import builtin

    return builtin(model)


def trace(model: str) -> dict[str, Key]:
    """Every key the ``model``'s reader asks for, by dotted name (see the module docstring)."""
    adapter = _adapter(model)
    keys: dict[str, Key] = {}
    suffix = ".h5md" if model in ("lj", "nbody") else ".nc"
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp, "probe" + suffix))
        queue: list[tuple[dict, tuple[str, ...]]] = []
        for label, text in _PROBES[model]:
            base = tomllib.loads(f'model.name = "{model}"\n' + text)
            queue.append((base, (label,) if label else ()))
            for name, kw in _plan(adapter, _scaled(base), out):  # computed defaults
                keys.setdefault(name, Key(name)).defaults.append(("scaled", kw["default"]))
        tried = {_toml(sorted(_flat(d).items())) for d, _ in queue}
        plans = 0
        while queue and plans < _MAX_PLANS:
            data, condition = queue.pop(0)
            plans += 1
            for name, kw in _plan(adapter, data, out):
                key = keys.setdefault(name, Key(name))
                _record(key, kw, condition)
                for value in _variants(name, kw) if not name.endswith(".dtype") else ():
                    variant = _set(data, name, value)
                    flat = _toml(sorted(_flat(variant).items()))
                    if flat not in tried and name != "model.name":
                        tried.add(flat)
                        step = f"`{name} = {_toml(value)}`"
                        if len(condition) < 2:  # settings two deep reach every key seen so far
                            queue.append((variant, condition + (step,)))
    return keys


def _flat(data: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in data.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out


def _variants(name: str, kw: dict) -> list:
    if kw.get("length") is not None:
        return []
    if kw.get("choices") is not None:
        return list(kw["choices"])
    if kw.get("kind") is bool:
        return [True, False]
    return []


def _record(key: Key, kw: dict, condition: tuple[str, ...]) -> None:
    key.defaults.append(("plain", kw["default"]))
    key.kind = kw.get("kind", float)
    if kw.get("choices") is not None:
        old = key.choices or ()
        key.choices = old + tuple(c for c in kw["choices"] if c not in old)
    low, high = kw.get("min"), kw.get("max")
    parts = []
    if low is not None:
        parts.append(f"{'>' if kw.get('exclusive_min') else '>='} {low}")
    if high is not None:
        parts.append(f"<= {high}")
    key.bounds = key.bounds or ", ".join(parts)
    length = kw.get("length")
    if length is not None:
        lengths = (length,) if isinstance(length, int) else tuple(length)
        key.length = tuple(sorted(set(key.length or ()) | set(lengths)))
    key.checked = key.checked or kw.get("check") is not None
    if condition:
        key.conditions.add(frozenset(condition))
    else:
        key.always = True


_KINDS = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


def _default(key: Key) -> str:
    plain = {_toml(v) if v is not cfgmod.REQUIRED else "REQUIRED" for k, v in key.defaults
             if k == "plain"}  # fmt: skip
    scaled = {_toml(v) if v is not cfgmod.REQUIRED else "REQUIRED" for k, v in key.defaults
              if k == "scaled"}  # fmt: skip
    if len(plain) > 1:  # read twice, once as required (after a reader saw it set): the default
        plain.discard("REQUIRED")
        scaled.discard("REQUIRED")
    if len(plain) > 1 or (scaled and plain and scaled != plain):
        return "depends on other keys"
    value = next(iter(plain))
    if value == "REQUIRED":
        return "required"
    if value == "None":
        return "unset"
    return f"`{value}`"


def _allowed(model: str, key: Key) -> str:
    table = key.name.split(".")[0]
    by_hand = (_ALLOWED.get(f"{model}:{key.name}") or _ALLOWED.get(key.name)
               or _ALLOWED.get(f"{model}:{table}") or _ALLOWED.get(table))  # fmt: skip
    if key.name == "model.name":
        return f'`"{model}"`'
    if key.name == "parallel.engine":
        from simpar.parallel.mapping import ENGINES

        return ", ".join(f'`"{e}"`' for e in ENGINES)
    if by_hand:
        return by_hand
    if key.choices is not None:
        what = ", ".join(f"`{_toml(c)}`" for c in key.choices)
    else:
        what = _KINDS.get(key.kind, "any value")
        if key.bounds:
            what += " " + key.bounds
    if key.length is not None:
        what = f"a list of {' or '.join(map(str, key.length))}, each {what}"
    if key.checked:
        what += "; checked by the model"
    return what


def markdown(model: str) -> str:
    """The ``model``'s keys as a markdown section (``## model`` and one table).

    Raises:
      KeyError: an unknown model (the command line offers only ``MODELS``).
    """
    keys = trace(model)
    rows = []
    for name in sorted(keys, key=lambda n: (n.split(".")[0] != "model", n)):
        key = keys[name]
        when = []
        if f"{model}:{name}" in _NOTES:  # a rule between keys says more than the probes
            when.append(_NOTES[f"{model}:{name}"])
        elif not key.always and key.conditions:
            least = {c for c in key.conditions if not any(o < c for o in key.conditions)}
            when.append("only with " + "; or ".join(sorted(" and ".join(sorted(c)) for c in least)))
        rows.append(f"| `{name}` | {_default(key)} | {_allowed(model, key)} | {'; '.join(when)} |")
    head = [f"## {model}", "", "| key | default | allowed | read |", "|---|---|---|---|"]
    return "\n".join(head + rows) + "\n"


def document() -> str:
    """``docs/models.md``: every model's section."""
    intro = (
        "# Model keys\n\n"
        "Generated by `simpar keys MODEL` for every model (`simpar/drive/keys.py`); do not edit:\n"
        "`tests/test_docs.py` fails when this file and the command disagree. Regenerate with\n\n"
        "```bash\n"
        ".venv/bin/simpar keys all > docs/models.md   # one model: simpar keys heat\n"
        "```\n\n"
        "The keys are traced from the readers (`Section.get`) on small probe configs and on\n"
        "variants that set each choice, so a key read only under a setting says so in the\n"
        '"read" column. "depends on other keys": the default is computed (e.g. `output.every`,\n'
        'a tenth of the steps); "unset": absent means the model decides; "checked by the\n'
        'model": a further check (a stability limit, a consistent shape) applies. The\n'
        "`[ensemble]` section's `sweep` takes other keys as its keys and is not listed.\n"
    )
    return intro + "".join("\n" + markdown(m) for m in MODELS)


__all__ = ["MODELS", "document", "markdown", "trace"]
