"""``simpar.memory.release_free_memory`` and ``current_rss_mib``: the C heap's freed pages go
back to the system on Linux/glibc; elsewhere a no-op that says so."""

from __future__ import annotations

import sys

import pytest

from simpar import memory


def test_release_free_memory_returns_bool_and_keeps_live_data():
    keep = [bytes([i % 251]) * 4096 for i in range(2000)]  # live data must survive a trim
    junk = [bytearray(4096) for _ in range(20000)]  # ~80 MB of small blocks, then freed
    del junk
    got = memory.release_free_memory()
    assert isinstance(got, bool)
    if sys.platform.startswith("linux") and memory._malloc_trim() is not None:
        assert got, "glibc kept 80 MB of freed small blocks"
    assert all(b == bytes([i % 251]) * 4096 for i, b in enumerate(keep))


def test_release_free_memory_is_a_no_op_without_glibc(monkeypatch):
    monkeypatch.setattr(memory, "_LIBC", [None])  # as on macOS or a libc without malloc_trim
    assert memory.release_free_memory() is False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_current_rss_is_positive_and_below_the_peak():
    now = memory.current_rss_mib()
    assert 0 < now <= memory.peak_memory_mib() + 1.0
