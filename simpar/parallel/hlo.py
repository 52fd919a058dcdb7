"""What a compiled program moves between devices, read from its HLO text.

``jit(f).lower(...).compile().as_text()`` is XLA's program after SPMD partitioning: every
communication the partitioner inserted is one instruction (``collective-permute``,
``all-gather``, ``all-to-all``, ``all-reduce``, ``reduce-scatter``, or their ``-start`` halves
when asynchronous). :func:`collectives` lists them with the shapes each device sends, so tests
can assert that the ``sharded`` engine moves only halos and benchmarks can report bytes per step.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

COLLECTIVE_OPS = (
    "collective-permute",
    "all-gather",
    "all-to-all",
    "all-reduce",
    "reduce-scatter",
)

# ``%name = <result type> <op>(<operands>), ...``; the result type is an array ``f32[4,34]{1,0}``
# or a tuple ``(f32[1,34]{1,0}, f32[1,34]{1,0})``.
_INSTR = re.compile(
    r"^\s*(?:ROOT\s+)?%?(?P<name>[\w.\-]+)\s*=\s*(?P<type>\(.*?\)|\S+)\s+"
    r"(?P<op>" + "|".join(re.escape(o) for o in COLLECTIVE_OPS) + r")(?P<start>-start)?\("
)
_ARRAY = re.compile(r"\b(?P<dtype>pred|[sufc]\d+|bf16)\[(?P<dims>[\d,]*)\]")
_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%?(?P<name>[\w.\-]+)\s.*\{\s*$")
_COMMENT = re.compile(r"/\*.*?\*/")


@dataclass(frozen=True)
class Collective:
    """One communication instruction of a compiled program (per device).

    Attributes:
      op: ``"collective-permute"``, ``"all-gather"``, ``"all-to-all"``, ``"all-reduce"`` or
        ``"reduce-scatter"`` (an async ``-start`` counts as its op).
      shapes: the arrays it moves, as ``(dtype, dims)`` (a combined op moves several).
      computation: name of the HLO computation it sits in (a loop body runs once per iteration).
    """

    op: str
    shapes: tuple[tuple[str, tuple[int, ...]], ...]
    computation: str

    @property
    def elements(self) -> int:
        """Array elements moved (all its arrays together)."""
        return sum(math.prod(dims) for _, dims in self.shapes)

    @property
    def nbytes(self) -> int:
        """Bytes moved (all its arrays together)."""
        return sum(math.prod(dims) * _itemsize(dt) for dt, dims in self.shapes)

    @property
    def largest(self) -> int:
        """Elements of the largest single array it moves."""
        return max((math.prod(dims) for _, dims in self.shapes), default=0)


def _itemsize(dtype: str) -> int:
    if dtype == "pred":
        return 1
    if dtype == "bf16":
        return 2
    return int(dtype[1:]) // 8  # s32, f64, c64 (the bits count both parts of a complex)


def collectives(hlo_text: str) -> list[Collective]:
    """Every collective instruction in the compiled HLO text of a program.

    Args:
      hlo_text: ``compiled.as_text()``.

    Returns:
      One :class:`Collective` per instruction, in text order. For an async pair only the
      ``-start`` half is counted; a ``-start`` result tuple holds the operand and the result
      buffer (and maybe scratch), so its shapes are taken from the operands instead.
    """
    out = []
    comp = ""
    for line in hlo_text.splitlines():
        m = _COMPUTATION.match(line)
        # a header has no ``=`` outside its ``/*index=5*/`` comments (long tuple parameters)
        if m and "=" not in _COMMENT.sub("", line.split("{")[0]):
            comp = m.group("name")
            continue
        m = _INSTR.match(line)
        if not m:
            continue
        if m.group("start"):
            # operands follow the op name: ``op-start(f32[..] %a, f32[..] %b), ...``
            rest = line[m.end() :]
            depth, stop = 1, len(rest)
            for i, ch in enumerate(rest):
                depth += (ch == "(") - (ch == ")")
                if depth == 0:
                    stop = i
                    break
            text = rest[:stop]
        else:
            text = m.group("type")
        shapes = tuple(
            (a.group("dtype"), tuple(int(x) for x in a.group("dims").split(",") if x))
            for a in _ARRAY.finditer(text)
        )
        out.append(Collective(m.group("op"), shapes, comp))
    return out


def bytes_moved(hlo_text: str) -> int:
    """Bytes one device sends through every collective of the program text, summed once each.

    A loop body is counted once: compile a chunk of one exchange to get bytes per exchange.
    """
    return sum(c.nbytes for c in collectives(hlo_text))


def count(hlo_text: str) -> dict[str, int]:
    """``{op: number of instructions}`` over :data:`COLLECTIVE_OPS` (zeros included)."""
    found = collectives(hlo_text)
    return {op: sum(c.op == op for c in found) for op in COLLECTIVE_OPS}


__all__ = ["COLLECTIVE_OPS", "Collective", "bytes_moved", "collectives", "count"]
