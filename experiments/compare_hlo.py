"""Dump the optimized HLO of the ``single`` engine's chunk program for each grid model.

What it shows (issue 16, item 6): that a restructuring left ``single``'s compiled programs
unchanged. Run it once with each checkout on ``PYTHONPATH`` and compare the digests (or diff
the dumped texts). The text is ``jax.jit(...).lower(...).compile().as_text()`` of the chunk
the driver runs (``advance`` of ``n`` steps, state donated), canonicalised: metadata, the
module name and instruction names (renumbered in order of appearance) are stripped.

Runtime: about 30 s per checkout on one CPU core.

Run::

    OLD=$(mktemp -d) && git archive 78984a9 | tar -x -C "$OLD"    # the old tree, a plain copy
    PYTHONPATH="$OLD" python experiments/compare_hlo.py --dump hlo_old > old.json
    PYTHONPATH=.      python experiments/compare_hlo.py --dump hlo_new > new.json
    diff old.json new.json; diff -r hlo_old hlo_new
"""

from __future__ import annotations

import argparse
import hashlib
import json
import pathlib
import re
import tomllib

import jax

jax.config.update("jax_enable_x64", True)  # as ``simpar run`` does

from simpar.config import Section  # noqa: E402
from simpar.parallel.engines import make_engine  # noqa: E402

try:  # after the restructure
    from simpar.drive.grid import grid_setup
except ImportError:  # before it (78984a9)
    from simpar.run import grid_setup

CONFIGS = ("heat2d", "wave2d", "advection2d", "gray_scott", "cavity_re100", "lbm3d")
_HERE = pathlib.Path(__file__).resolve().parent


def canonical(text: str) -> str:
    """HLO text without metadata, the source-location tables, the module name or instruction
    names (renumbered)."""
    head, _, body = text.partition("\n\n")  # HloModule line, then the tables
    body = body[min(body.find(k) % (len(body) + 1) for k in ("\n%", "\nENTRY")) :]
    text = head + "\n" + body
    text = re.sub(r",?\s*metadata=\{[^}]*\}", "", text)
    text = re.sub(r"^HloModule \S+", "HloModule M", text, flags=re.MULTILINE)
    names: dict[str, str] = {}

    def rename(m: re.Match) -> str:
        return names.setdefault(m.group(0), f"%v{len(names)}")

    return re.sub(r"%[\w.\-]+", rename, text)


def chunk_hlo(config: str, n: int) -> str:
    """Optimized HLO text of the ``single`` chunk of ``n`` steps for one experiment."""
    data = tomllib.loads((_HERE / f"{config}.toml").read_text())
    setup = grid_setup(Section(data))
    halo = data.get("parallel", {}).get("halo")
    eng = make_engine("single", setup.model, setup.domain.shape, None, halo)
    state = eng.place(setup.state)
    fn = eng._compile_advance(n, donate=True)  # what the driver runs
    return fn.lower(state, setup.params).compile().as_text()


def main() -> None:
    """Print ``{config: {"sha256": ..., "lines": ...}}`` and optionally dump the texts."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=10, help="steps per chunk")
    p.add_argument("--dump", help="folder for the canonical texts")
    a = p.parse_args()
    out = {}
    for config in CONFIGS:
        text = canonical(chunk_hlo(config, a.steps))
        out[config] = {
            "sha256": hashlib.sha256(text.encode()).hexdigest()[:16],
            "lines": text.count("\n"),
        }
        if a.dump:
            pathlib.Path(a.dump).mkdir(parents=True, exist_ok=True)
            (pathlib.Path(a.dump) / f"{config}.hlo").write_text(text)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
