"""Memory: the cgroup allowance without reclaimable page cache, every model's estimate
against the measured peak (experiments/check_memory_estimates.py), refusals before
allocating."""

from __future__ import annotations

from simpar import memory

GIB = memory.GIB


def test_cgroup_v2_allowance_leaves_out_inactive_page_cache(tmp_path):
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "memory.max").write_text(f"{2 * GIB}\n")
    (v2 / "memory.current").write_text(f"{GIB + GIB // 2}\n")  # 1 GiB of it written output
    (v2 / "memory.stat").write_text(
        f"anon {GIB // 2}\nfile {GIB}\nactive_file 0\ninactive_file {GIB}\n"
    )
    assert memory.cgroup_available(v2)[0] == GIB + GIB // 2
    (v2 / "memory.stat").write_text("anon 1\nactive_file 0\n")  # no counter: usage as is
    assert memory.cgroup_available(v2)[0] == GIB // 2
    (v2 / "memory.stat").write_text(f"inactive_file {4 * GIB}\n")  # never beyond the usage
    assert memory.cgroup_available(v2)[0] == 2 * GIB
    (v2 / "memory.stat").write_text("inactive_file lots\n")  # unreadable: ignored
    assert memory.cgroup_available(v2)[0] == GIB // 2


def test_cgroup_v1_allowance_leaves_out_total_inactive_file(tmp_path):
    v1 = tmp_path / "v1" / "memory"
    v1.mkdir(parents=True)
    (v1 / "memory.limit_in_bytes").write_text(f"{2 * GIB}\n")
    (v1 / "memory.usage_in_bytes").write_text(f"{GIB + GIB // 2}\n")
    # v1 lists the cgroup's own inactive_file and the hierarchy's total_inactive_file
    (v1 / "memory.stat").write_text(
        f"cache {GIB}\ninactive_file {GIB // 4}\ntotal_inactive_file {GIB}\n"
    )
    assert memory.cgroup_available(tmp_path / "v1")[0] == GIB + GIB // 2
    (v1 / "memory.stat").unlink()
    assert memory.cgroup_available(tmp_path / "v1")[0] == GIB // 2
