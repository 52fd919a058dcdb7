"""The bad-input fuzz on the spectral and particle-mesh models (issue 31, item 5).

Every leaf of ``taylor_green.toml``, ``kolmogorov.toml``, a 3-D spectral config (``taylor_green``
at 16^3 with the ABC flow) and ``pm_plane_wave.toml`` / ``pm_cosmic_web.toml`` (made small) is
mutated with out-of-range, huge, wrong-type and wrong-length values. Every mutation that is
not a valid config (``VALID``) must exit 2 with ONE line naming the key (or, where two keys
disagree, a key of the same table), no traceback and no output. The full set runs in the slow
tier; a fixed sample of it in the fast tier. The random fuzz of every experiment (NaN, inf,
types, unknown keys, paths) is ``tests/test_faults.py``.

Left out on purpose: ``RUNTIME``, values that are valid input but blow the run up (exit 1,
"run failed at step N" naming ``time.dt``); ``SIZES``, grids whose memory the spectral model
does not estimate yet (issue 31, item 2).
"""

import json
import math
import os
import random
import tomllib
from pathlib import Path

import pytest

from simpar import config as cfgmod
from simpar.cli import main

ROOT = Path(__file__).resolve().parents[1] / "experiments"
TWO_PI = 2 * math.pi
BASES = {  # name -> (experiment, overrides that make it small)
    "taylor_green": ("taylor_green.toml", {"grid.shape": [16, 16]}),
    "kolmogorov": ("kolmogorov.toml", {"grid.shape": [32, 32]}),
    "spectral_3d": ("taylor_green.toml", {"grid.shape": [16, 16, 16],
                                          "grid.length": [TWO_PI] * 3, "initial.kind": "abc"}),
    "pm_plane_wave": ("pm_plane_wave.toml", {"particles.lattice": [16, 4, 4],
                                             "physics.pm_mesh": [16, 4, 4]}),
    "pm_cosmic_web": ("pm_cosmic_web.toml", {"particles.lattice": [8, 8, 8],
                                             "physics.pm_mesh": [8, 8, 8]}),
}  # fmt: skip
BIG = 2**63
VALID = {  # key -> mutated values that make a valid config (the run goes ahead)
    "physics.viscosity": (0, 1e300, BIG),
    "physics.drag": (0, 1e300, BIG),
    "initial.amplitude": (-1, 0),  # spectral: any sign (PM refuses them: not run here)
    "forcing.amplitude": (-1, 0),
    "grid.length": (2**40,),
    "physics.box": (2**40,),
    "initial.seed": (0,),
    "particles.seed": (0,),
    "initial.spectral_index": (-1, 0),
    "initial.sigma": (BIG,),
    "physics.G": (BIG,),
    "time.dt": (BIG,),  # PM: a static lattice stays finite
    "output.fields": ("vorticity",),
}
RUNTIME = {"forcing.amplitude": (1e300, -1e300, BIG), "physics.G": (1e300,), "time.dt": (1e300,)}
SIZES = {"grid.shape": (2**40,)}
SKIP_KEYS = {"time.steps", "output.every", "output.path"}  # --steps 2 overrides; any is fine


def _set(data: dict, key: str, value) -> None:
    node = data
    *head, last = key.split(".")
    for part in head:
        node = node.setdefault(part, {})
    node[last] = value


def _base(name: str) -> dict:
    toml, small = BASES[name]
    data = tomllib.loads((ROOT / toml).read_text())
    for key, value in small.items():
        _set(data, key, value)
    return data


def _leaves(data, prefix=()):
    for k, v in data.items():
        if isinstance(v, dict):
            yield from _leaves(v, (*prefix, k))
        else:
            yield ".".join((*prefix, k)), v


def _values(v):
    """The mutations of a leaf ``v``."""
    if isinstance(v, bool):
        return ["yes", 2]
    if isinstance(v, int | float):
        return [-1, 0, 1e300, -1e300, BIG] + ([0.5] if isinstance(v, int) else [])
    if isinstance(v, str):
        return ["bogus", ""]
    if isinstance(v, list):
        return [[], v[:1], v + v[:1], [-1] * len(v), [0] * len(v), [1e300] * len(v),
                ["a"] * len(v), [2**40] * len(v)]  # fmt: skip
    return []


def _skipped(key: str, value) -> bool:
    first = value[0] if isinstance(value, list) and value else value
    for table in (VALID, RUNTIME, SIZES):
        if any(first == v and type(first) is type(v) for v in table.get(key, ())):
            return True
    return key in SKIP_KEYS


def _cases() -> list[tuple[str, str, object]]:
    out = []
    for name in BASES:
        for key, v in _leaves(_base(name)):
            out += [(name, key, m) for m in _values(v) if not _skipped(key, m)]
    return out


CASES = _cases()
FAST = set(random.Random(31).sample(range(len(CASES)), 24))


@pytest.mark.parametrize(
    "case", [pytest.param(i, marks=() if i in FAST else pytest.mark.slow,
                          id=f"{CASES[i][0]}-{CASES[i][1]}={str(CASES[i][2])[:24]}")
             for i in range(len(CASES))],
)  # fmt: skip
def test_bad_values_of_the_new_models_exit_2_naming_the_key(tmp_path, capsys, case):
    name, key, value = CASES[case]
    data = json.loads(json.dumps(_base(name)))
    _set(data, key, value)
    ext = ".h5md" if data["model"]["name"] == "nbody" else ".nc"
    data.setdefault("output", {})["path"] = str(tmp_path / f"out{ext}")
    cfg = tmp_path / "fuzz.toml"
    cfg.write_text(cfgmod.dumps(data))
    code = main(["run", str(cfg), "--steps", "2", "--quiet"])
    _, err = capsys.readouterr()
    line = err.strip()
    assert code == 2 and "Traceback" not in err and "\n" not in line, (name, key, value, err)
    table = key.rsplit(".", 1)[0]
    named = line.startswith(f"simpar: invalid input: {key}") or (
        line.startswith(f"simpar: invalid input: {table}.") and isinstance(value, list)
    )
    assert named, (name, key, value, line)
    assert sorted(os.listdir(tmp_path)) == ["fuzz.toml"], os.listdir(tmp_path)


def test_the_fuzz_covers_every_new_model_and_key():
    assert len(CASES) > 200
    for name in BASES:
        keys = {k for n, k, _ in CASES if n == name}
        assert len(keys) >= 10, (name, keys)
    fast = {CASES[i][0] for i in FAST}
    assert fast == set(BASES), fast
