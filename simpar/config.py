"""TOML experiment files -> validated values.

A config is a TOML table. ``load(path, overrides, unset)`` reads it, removes the ``--unset
key.sub`` keys (the model's default applies), applies ``--set key.sub=value``
overrides (values parsed as TOML, so ``--set grid.shape=[64,64]`` works), and returns a
``Section`` over the whole table. Models and the driver read their keys through ``Section.get``,
which validates type, range and choices and raises ``ConfigError`` naming the dotted key and
what is allowed. ``Section.check_unused()`` reports keys nobody read (typos), with a suggestion.
"""

from __future__ import annotations

import contextlib
import difflib
import math
import re
import tomllib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from simpar.errors import ConfigError

REQUIRED = object()

_TYPE_NAMES = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}


def _type_ok(value: Any, kind: type) -> bool:
    if kind is object:
        return True
    if kind is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


class Section:
    """A view of one TOML table that validates what it hands out.

    Args:
      data: the table (a dict, as parsed by ``tomllib``).
      prefix: dotted name of this table inside the whole config ("" for the root).
    """

    def __init__(self, data: dict, prefix: str = ""):
        if not isinstance(data, dict):
            raise ConfigError(prefix or "<root>", "must be a table")
        self.data = data
        self.prefix = prefix
        self._used: set[str] = set()
        self._children: dict[str, Section] = {}

    def key(self, name: str) -> str:
        """The dotted config key of ``name`` in this section, e.g. ``"grid.shape"``."""
        return f"{self.prefix}.{name}" if self.prefix else name

    def __contains__(self, name: str) -> bool:
        return name in self.data

    def section(self, name: str, required: bool = False) -> Section:
        """The sub-table ``name`` (an empty one when absent and not required)."""
        self._used.add(name)
        if name not in self._children:
            if name not in self.data:
                if required:
                    raise ConfigError(self.key(name), "missing table")
                self.data[name] = {}
            if not isinstance(self.data[name], dict):
                raise ConfigError(self.key(name), "must be a table, e.g. [" + self.key(name) + "]")
            self._children[name] = Section(self.data[name], self.key(name))
        return self._children[name]

    @contextlib.contextmanager
    def hidden(self, name: str):
        """Within the block, the sub-table ``name`` reads as absent (empty); restored after.

        For a reader that handles a table itself before handing the rest of the config on
        (``initial.kind = "file"``: the model builds its default initial state, which the
        file then replaces). What is read of the empty table meanwhile is forgotten.
        """
        had, value = name in self.data, self.data.get(name)
        child = self._children.pop(name, None)
        self.data[name] = {}
        try:
            yield
        finally:
            self._children.pop(name, None)
            if had:
                self.data[name] = value
            else:
                self.data.pop(name, None)
            if child is not None:
                self._children[name] = child

    def get(
        self,
        name: str,
        default: Any = REQUIRED,
        *,
        kind: type = float,
        choices: Sequence[Any] | None = None,
        min: float | None = None,
        max: float | None = None,
        exclusive_min: bool = False,
        length: int | Sequence[int] | None = None,
        check: Callable[[Any], str | None] | None = None,
    ) -> Any:
        """Read and validate one value.

        Args:
          name: key inside this table.
          default: value when absent; ``REQUIRED`` makes absence an error.
          kind: ``bool``, ``int``, ``float`` or ``str``; with ``length`` the element type of a list.
          choices: allowed values.
          min, max: inclusive bounds (``exclusive_min`` makes the lower bound strict).
          length: the value is a list of this length (or one of these lengths).
          check: extra validator returning an error text or None.

        Returns:
          The value (a list when ``length`` is given; ints promoted to float for ``kind=float``).

        Raises:
          ConfigError: naming ``prefix.name`` and what is allowed.
        """
        self._used.add(name)
        key = self.key(name)
        if name not in self.data:
            if default is REQUIRED:
                raise ConfigError(
                    key, "missing; it must be set in the config or with --set " + key + "=..."
                )
            return default
        value = self.data[name]
        what = _TYPE_NAMES.get(kind, kind.__name__)
        if length is not None:
            lengths = (length,) if isinstance(length, int) else tuple(length)
            if not isinstance(value, list) or len(value) not in lengths:
                allowed = " or ".join(str(n) for n in lengths)
                raise ConfigError(
                    key, f"must be a list of {allowed} values ({what} each), got {value!r}"
                )
            items = value
        else:
            items = [value]
        out = []
        for item in items:
            if not _type_ok(item, kind):
                raise ConfigError(key, f"must be {what}, got {item!r}")
            if kind is float:
                item = float(item)
                if not math.isfinite(item):
                    raise ConfigError(key, f"must be a finite number, got {item!r}")
            if choices is not None and item not in choices:
                raise ConfigError(
                    key, f"{item!r} is not allowed; choose one of {', '.join(map(repr, choices))}"
                )
            if min is not None and (item <= min if exclusive_min else item < min):
                raise ConfigError(
                    key, f"must be {'>' if exclusive_min else '>='} {min}, got {item!r}"
                )
            if max is not None and item > max:
                raise ConfigError(key, f"must be <= {max}, got {item!r}")
            out.append(item)
        result = out if length is not None else out[0]
        if check is not None:
            problem = check(result)
            if problem:
                raise ConfigError(key, problem)
        return result

    def check_unused(self) -> None:
        """Raise ``ConfigError`` for keys that were never read (misspellings, unsupported keys)."""
        for name in self.data:
            if name not in self._used:
                close = difflib.get_close_matches(name, sorted(self._used), n=1)
                hint = f"; did you mean {self.key(close[0])!r}?" if close else ""
                known = ", ".join(sorted(self._used)) or "none"
                raise ConfigError(self.key(name), f"unknown key{hint} (known keys here: {known})")
        for child in self._children.values():
            child.check_unused()


def parse_override(text: str) -> tuple[list[str], Any]:
    """Split ``key.sub=value`` into (["key", "sub"], value); the value is parsed as TOML."""
    if "=" not in text:
        raise ConfigError("--set", f"expected key.sub=value, got {text!r}")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise ConfigError("--set", f"expected key.sub=value, got {text!r}")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw  # a bare word such as --set model.name=heat is taken as a string
    return key.split("."), value


def apply_overrides(data: dict, overrides: Sequence[str]) -> dict:
    """Apply ``--set`` overrides in place and return ``data``."""
    for text in overrides:
        path, value = parse_override(text)
        node = data
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError("--set", f"{'.'.join(path)}: {part!r} is a value, not a table")
            node = child
        node[path[-1]] = value
    return data


def apply_unsets(data: dict, keys: Sequence[str]) -> dict:
    """Remove ``--unset`` keys (``initial.wavenumber``, or a whole table such as ``forcing``)
    in place and return ``data``; the model then uses its default.

    Raises:
      ConfigError: (``--unset``) a key that is not in the config, naming the keys that are.
    """
    for key in keys:
        path = key.strip().split(".")
        if not key.strip() or any(not part for part in path):
            raise ConfigError("--unset", f"expected a dotted key such as initial.seed, got {key!r}")
        node = data
        for i, part in enumerate(path):
            if not isinstance(node, dict) or part not in node:
                where = ".".join(path[:i]) or "the top level"
                held = ", ".join(sorted(node)) if isinstance(node, dict) else "a value, not a table"
                raise ConfigError("--unset", f"{key}: not in the config ({where} holds: {held})")
            if i == len(path) - 1:
                del node[part]
            else:
                node = node[part]
    return data


def load(
    path: str | Path, overrides: Sequence[str] = (), unset: Sequence[str] = ()
) -> tuple[dict, str]:
    """Read a TOML config, remove the ``unset`` keys, then apply the ``--set`` overrides.

    Returns:
      (data, text): the table and the resolved config as TOML text (stored in outputs).

    Raises:
      ConfigError: the file is missing or is not valid TOML.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(str(path), "config file not found")
    try:
        data = tomllib.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as err:
        raise ConfigError(
            str(path), f"not UTF-8 text (byte {err.start}: {err.reason}); save it as UTF-8"
        ) from None
    except OSError as err:
        raise ConfigError(str(path), f"cannot read the config: {err.strerror}") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(str(path), f"not valid TOML: {err}") from None
    apply_unsets(data, unset)
    apply_overrides(data, overrides)
    _check_finite(data)
    return data, dumps(data)


def _check_finite(data: Any, prefix: str = "") -> None:
    """Refuse NaN/inf anywhere in the config (also in keys read with ``kind=object``)."""
    if isinstance(data, dict):
        pairs = [(f"{prefix}.{k}" if prefix else str(k), v) for k, v in data.items()]
    else:
        pairs = [(prefix, v) for v in data]
    for key, v in pairs:
        if isinstance(v, float) and not math.isfinite(v):
            raise ConfigError(key, f"must be a finite number, got {v!r}")
        if isinstance(v, dict | list):
            _check_finite(v, key)


def _key(key: str) -> str:
    """A TOML key: bare when it can be, else quoted (``"physics.diffusivity"`` stays one key)."""
    if re.fullmatch(r"[A-Za-z0-9_-]+", key):
        return key
    return _toml_value(str(key))


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_key(k)} = {_toml_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"cannot write {type(value).__name__} to TOML")


def dumps(data: dict, prefix: str = "") -> str:
    """Write a (nested) table as TOML text; round-trips through ``tomllib``."""
    scalars = [f"{_key(k)} = {_toml_value(v)}" for k, v in data.items() if not isinstance(v, dict)]
    parts = []
    if prefix and (scalars or not any(isinstance(v, dict) for v in data.values())):
        parts.append(f"[{prefix}]")
    parts.extend(scalars)
    text = "\n".join(parts)
    for key, value in data.items():
        if isinstance(value, dict):
            sub = dumps(value, f"{prefix}.{_key(key)}" if prefix else _key(key))
            text = f"{text}\n\n{sub}" if text else sub
    return text
