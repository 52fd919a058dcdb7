"""Memory: what this machine has, what a run needs (checked before allocating), what it used.

Drivers estimate the bytes a run will hold (state, halos, buffers, neighbour lists, output
frames on the host) and call :func:`check_fits` before allocating anything, so a run that
cannot fit is refused with exit code 2 and the figures, instead of a ``MemoryError``
traceback or the kernel's OOM killer. :func:`peak_memory_mib` goes into every run summary.
"""

from __future__ import annotations

import os
import resource
import sys

from simpar.errors import ConfigError

GIB = 2**30


def available_bytes() -> int | None:
    """Memory available to a new allocation (``MemAvailable``), None if unknown."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def peak_memory_mib() -> float:
    """Peak resident memory of this process so far (``ru_maxrss``), in MiB."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(rss / (2**20 if sys.platform == "darwin" else 2**10), 1)


def check_fits(needed: int, key: str, what: str, hint: str) -> None:
    """Refuse a run whose estimated memory exceeds what the machine has available.

    Args:
      needed: estimated bytes (on CPU, devices share the host's memory).
      key: config key or option named in the error, e.g. ``"grid.shape"``.
      what: what was estimated, e.g. ``"4 fields of 4096 x 4096 float32 + halos"``.
      hint: what to change.

    Raises:
      ConfigError: ``needed`` exceeds the available memory (exit code 2).
    """
    avail = available_bytes()
    if avail is None or needed <= avail:
        return
    raise ConfigError(
        key,
        f"the run needs about {needed / GIB:.3g} GiB ({what}); this machine has "
        f"{avail / GIB:.3g} GiB available; {hint}",
    )
