"""What took the CPU away during a run: collections timed per generation, the cgroup's throttling and
the hypervisor's steal taken as differences over the block."""

import gc

from trtfuse import run_stalls


def test_collections_are_counted_per_generation_and_only_inside_the_block():
    gc.collect()
    callbacks = list(gc.callbacks)
    with run_stalls.watch() as stalls:
        for _ in range(3):
            gc.collect(0)
        gc.collect(2)
    gc.collect(1)  # after the block: not counted
    counts = {g: stalls["gc"][g]["collections"] for g in ("gen0", "gen1", "gen2")}
    assert counts["gen0"] >= 3 and counts["gen2"] >= 1 and counts["gen1"] == 0
    assert stalls["gc"]["gen2"]["total_ms"] >= stalls["gc"]["gen2"]["max_ms"] > 0
    assert gc.callbacks == callbacks  # the timer is gone


def test_cgroup_throttling_is_the_difference_over_the_block(tmp_path, monkeypatch):
    (tmp_path / "cpu.max").write_text("200000 100000\n")
    stat = tmp_path / "cpu.stat"
    stat.write_text("usage_usec 10\nnr_periods 5\nnr_throttled 3\nthrottled_usec 7000\n")
    monkeypatch.setattr(run_stalls, "CGROUP", tmp_path)
    with run_stalls.watch() as stalls:
        stat.write_text("usage_usec 99\nnr_periods 9\nnr_throttled 7\nthrottled_usec 52000\n")
    assert stalls["cgroup"] == {"cpu_quota": 2.0, "throttled_periods": 4, "throttled_ms": 45.0}

    (tmp_path / "cpu.max").write_text("max 100000\n")
    with run_stalls.watch() as stalls:
        pass
    assert stalls["cgroup"]["cpu_quota"] == "max" and stalls["cgroup"]["throttled_periods"] == 0


def test_no_cgroup_files_no_cgroup_entry(tmp_path, monkeypatch):
    monkeypatch.setattr(run_stalls, "CGROUP", tmp_path / "absent")
    with run_stalls.watch() as stalls:
        pass
    assert "cgroup" not in stalls and set(stalls["gc"]) == {"gen0", "gen1", "gen2"}
