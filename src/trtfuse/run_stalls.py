"""What took the CPU away from the harness during a timed LoadGen run (``report.json`` →
``harness.stalls``): Python's garbage collector, the container's CPU quota, and the hypervisor.

A Server run whose p99 is past MLPerf's bound while the GPU is far from busy has lost time on the
host. Three usual suspects, each measured over the run:
- ``gc``: every collection stops all Python threads (LoadGen's issue thread, the SUT's workers) while
  it walks its generation; a full one walks everything the process holds (measured on this project's
  CPU machine at up to 26 ms). Per generation: collections, the longest pause, their sum.
- ``cgroup``: a CPU quota (``cpu.max``) throttles the whole container for the rest of each period
  once it is spent: ``cpu.stat``'s throttled periods and time, where the cgroup v2 files are readable.
- ``steal_ms``: time the hypervisor ran something else on this machine's virtual CPUs (``/proc/stat``),
  summed over all CPUs.
"""

from __future__ import annotations

import gc
import os
import time
from contextlib import contextmanager
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")


def _cgroup() -> dict:
    try:
        stat = dict(line.split() for line in (CGROUP / "cpu.stat").read_text().splitlines() if line.strip())
        quota = (CGROUP / "cpu.max").read_text().split()
    except (OSError, ValueError):
        return {}
    return {"quota": "max" if quota[0] == "max" else round(int(quota[0]) / int(quota[1]), 2),
            "nr_throttled": int(stat.get("nr_throttled", 0)), "throttled_usec": int(stat.get("throttled_usec", 0))}


def _steal_ticks() -> int | None:
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()
        return int(fields[8])  # cpu user nice system idle iowait irq softirq steal
    except (OSError, IndexError, ValueError):
        return None


@contextmanager
def watch():
    """During the block, time every garbage collection and take the cgroup's and the hypervisor's
    counters before and after. Yields a dict, filled in when the block ends."""
    stats: dict = {}
    pauses: list[tuple[int, float]] = []
    started = [0.0]

    def timer(phase: str, info: dict) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            pauses.append((info["generation"], time.perf_counter() - started[0]))

    cgroup0, steal0 = _cgroup(), _steal_ticks()
    gc.callbacks.append(timer)
    try:
        yield stats
    finally:
        gc.callbacks.remove(timer)
        cgroup1, steal1 = _cgroup(), _steal_ticks()
        stats["gc"] = {}
        for gen in range(3):
            times = [t for g, t in pauses if g == gen]
            stats["gc"][f"gen{gen}"] = {"collections": len(times), "max_ms": round(max(times, default=0) * 1e3, 2),
                                        "total_ms": round(sum(times) * 1e3, 2)}
        if cgroup0 and cgroup1:
            stats["cgroup"] = {"cpu_quota": cgroup1["quota"],
                               "throttled_periods": cgroup1["nr_throttled"] - cgroup0["nr_throttled"],
                               "throttled_ms": round((cgroup1["throttled_usec"] - cgroup0["throttled_usec"]) / 1e3, 1)}
        if steal0 is not None and steal1 is not None:
            stats["steal_ms"] = round((steal1 - steal0) * 1e3 / os.sysconf("SC_CLK_TCK"), 1)
