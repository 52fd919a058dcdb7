"""How long the next chunk of steps is, and whether the run stops before it (every process).

The chunk loop (``simpar.drive.loop``) runs steps in chunks that end at the next output frame
or after about :data:`CHUNK_SECONDS` of measured step time (:class:`ChunkClock`), so that
SIGINT/SIGTERM, which are only looked at between chunks, are honoured within seconds.

In a multi-process run every process must run the same chunks (each chunk's collectives meet
those of the other processes) and stop at the same chunk boundary. So before each chunk the
processes agree (:func:`next_chunk`, one tiny collective,
``simpar.parallel.distributed.agree``): the chunk length is process 0's clock's, and a
signal on ANY process (SLURM signals every task; ``kill`` may reach one) stops EVERY process
there, each with :class:`simpar.signals.Interrupted` marked ``together``: no process reports
the others as failed, process 0 sets ``run_status = "failed: terminated"`` (or
``interrupted``) and each exits 143 (130). The exchange costs about 2 ms per chunk on two
local processes over gloo (0.17 s the first time, which compiles it), against chunks of
about 2 s. In a one-process run it is no collective at all.

Results do not depend on where chunks end: frames are at the run's first step and at
multiples of ``output.every`` after it (the loop never lets a chunk cross a frame), and every
step runs the same arithmetic whatever the chunk it is in.
"""

from __future__ import annotations

import math

from simpar import signals
from simpar.parallel import distributed

CHUNK_SECONDS = 2.0  # wall time of a chunk at most (about; ChunkClock)
PROBE_STEPS = 1  # steps of the first chunk, before any step time is measured

__all__ = ["CHUNK_SECONDS", "PROBE_STEPS", "ChunkClock", "next_chunk"]


def _pow2_floor(x: float) -> int:
    """The largest power of two <= ``x`` (1 when ``x < 2``)."""
    return 1 << max(math.floor(math.log2(x)), 0) if x >= 2 else 1


class ChunkClock:
    """Chunk sizes bounded in wall time from the first chunk, so signals are honoured within
    seconds.

    The first chunk is ``probe`` steps (1: a single step, which also compiles the chunk
    program). A chunk of a length run before measures the step time exactly; the next chunks
    then end at the next frame step or after about ``target`` seconds of measured step time,
    whichever comes first, with lengths that stop short of a frame rounded down to a power of
    two (so few chunk programs are compiled where the length is static). A chunk whose
    length is new is not taken as a measure (it may include its compilation); before any
    measure it only lowers the limit (its time per step is an upper bound), so the next chunk
    repeats a compiled length and measures. A chunk therefore takes at most ``target``
    seconds of steps plus one compilation, also when a step takes seconds; a run whose frames
    are close or whose steps are fast keeps one chunk per frame after the first two. In a
    multi-process run only process 0's clock decides (:func:`next_chunk`).

    Args:
      target: wall seconds a chunk should take at most (s); a chunk of a new length also
        compiles, so it may take longer.
      probe: steps of the first chunk (before a step time has been measured), >= 1.
    """

    def __init__(self, target: float = CHUNK_SECONDS, probe: int = PROBE_STEPS):
        self.target, self.limit = target, max(int(probe), 1)
        self.compiled: set[int] = set()
        self.step_s: float | None = None  # seconds per step (s), measured

    def size(self, to_frame: int) -> int:
        """Steps of the next chunk, given the steps left to the next frame."""
        return min(to_frame, self.limit)

    def record(self, k: int, seconds: float) -> None:
        """Take the wall time (s) of a chunk of ``k`` steps into account."""
        first_use = k not in self.compiled
        self.compiled.add(k)
        per_step = max(seconds, 1e-9) / k
        if first_use:  # may include its compilation: an upper bound of the step time
            if self.step_s is None:
                self.limit = min(self.limit, k, _pow2_floor(self.target / per_step))
            return
        self.step_s = per_step
        self.limit = _pow2_floor(self.target / per_step)


def next_chunk(clock: ChunkClock | None, to_frame: int) -> int:
    """The steps of the next chunk, agreed by every process; or stop every process here.

    Args:
      clock: this process's chunk clock (process 0's decides); None: a zero-step exchange
        (e.g. the last barrier before the output is opened).
      to_frame: steps left to the next frame (the same on every process), >= 1.

    Returns:
      The chunk length (process 0's ``clock.size(to_frame)``; 0 when ``clock`` is None).

    Raises:
      simpar.signals.Interrupted: a signal arrived on this or any other process
        (``together`` is True in a multi-process run: every process raises it here).
    """
    proposed = 0 if clock is None else clock.size(to_frame)
    steps, signum = distributed.agree(proposed, signals.pending())
    if signum:
        raise signals.Interrupted(signum, together=distributed.process_count() > 1)
    if not 0 <= steps <= to_frame:  # process 0's clock runs the same loop: never seen
        raise RuntimeError(f"chunk of {steps} steps agreed with {to_frame} left to the frame")
    return steps
