"""Progress output for long runs: a tqdm bar on a terminal, plain log lines otherwise.

On a non-terminal (CI logs, ``nohup``), tqdm would write carriage-return updates onto one
endless line; instead a line built with ``tqdm.format_meter`` is logged every ``every`` seconds
(a carriage-return bar in a log file is one unreadable line per run).
"""

from __future__ import annotations

import logging
import sys
import time

from tqdm import tqdm

log = logging.getLogger("simpar")


class Progress:
    """Counts steps of a run.

    Args:
      total: number of steps expected.
      every: seconds between plain log lines when not on a terminal.
      file: stream to draw on (default stderr).
      enabled: False silences it completely (library use, tests).
    """

    def __init__(
        self, total: int, every: float = 10.0, file=None, enabled: bool = True, desc: str = "simpar"
    ):
        self.file = file if file is not None else sys.stderr
        self.total, self.every, self.n, self.desc = int(total), every, 0, desc
        self.t0 = self.last = time.monotonic()
        self.enabled = enabled
        isatty = getattr(self.file, "isatty", lambda: False)()
        self.bar = (
            tqdm(total=self.total, unit="step", file=self.file, mininterval=0.5, desc=desc)
            if enabled and isatty
            else None
        )

    def update(self, k: int = 1, **postfix) -> None:
        """Count ``k`` more steps; ``postfix`` values (e.g. ``T=1.44``) are shown with them."""
        self.n += int(k)
        if not self.enabled:
            return
        if self.bar is not None:
            if postfix:
                self.bar.set_postfix(postfix, refresh=False)
            self.bar.update(k)
            return
        now = time.monotonic()
        if now - self.last >= self.every or self.n >= self.total:
            self.last = now
            line = tqdm.format_meter(
                self.n,
                self.total,
                now - self.t0,
                unit="step",
                ascii=True,
                ncols=0,
                prefix=self.desc,
            )
            if postfix:
                line += " " + " ".join(f"{k}={v}" for k, v in postfix.items())
            print(line, file=self.file, flush=True)

    def write(self, line: str) -> None:
        """Print a line (e.g. a thermo row) to the progress stream without breaking the bar."""
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(line, file=self.file)
        else:
            print(line, file=self.file, flush=True)

    def close(self) -> None:
        """Close the bar (if any)."""
        if self.bar is not None:
            self.bar.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
