"""Where a Server query's latency goes in the Python SUT (``server.query_timeline``).

Per sample, four host timestamps (``time.perf_counter``, one clock for all threads):
  seen       LoadGen's issue callback ran with it (the SUT has it)
  taken      a worker took it into a batch
  inferred   the backend returned the batch's answers (copies, the engine run, the sync's wake-up)
  completed  ``QuerySamplesComplete`` returned for it
LoadGen times a query from its scheduled issue, which Python never sees: the time before ``seen`` (LoadGen's
issue thread waiting for the GIL, its own bookkeeping) is LoadGen's percentile minus the same percentile
of seen-to-completed, an estimate from the two distributions, not per sample.

The attribution at a percentile P takes the samples whose seen-to-completed time is at or above P and
averages each segment over them: what the slow queries spent their time on.
"""

from __future__ import annotations

import time

import numpy as np

SEGMENTS = ("queued", "inference", "completion")  # seen->taken, taken->inferred, inferred->completed
PERCENTILES = (50.0, 90.0, 99.0)

now = time.perf_counter


class QueryTimeline:
    """The timestamps of every batch a Server run completed (appended from the worker threads)."""

    def __init__(self):
        self._batches: list[tuple[list[float], float, float, float]] = []

    def add(self, seen: list[float], taken: float, inferred: float, completed: float) -> None:
        self._batches.append((seen, taken, inferred, completed))  # list.append: atomic under the GIL

    def __len__(self) -> int:
        return sum(len(b[0]) for b in self._batches)

    def segments_ms(self) -> dict[str, np.ndarray]:
        """Per sample: each segment and the total (seen to completed), in ms."""
        if not self._batches:
            return {name: np.zeros(0) for name in (*SEGMENTS, "total")}
        seen = np.concatenate([np.asarray(b[0], dtype=np.float64) for b in self._batches])
        counts = [len(b[0]) for b in self._batches]
        taken, inferred, completed = (np.repeat([b[k] for b in self._batches], counts) for k in (1, 2, 3))
        return {"queued": (taken - seen) * 1e3, "inference": (inferred - taken) * 1e3,
                "completion": (completed - inferred) * 1e3, "total": (completed - seen) * 1e3}

    def summary(self, loadgen_latency_ns: dict | None = None) -> dict | None:
        """Percentiles of each segment, the attribution of the slow samples at each of PERCENTILES, and,
        given LoadGen's latency percentiles ({"99.00": ns, ...}), the time before the SUT saw a query."""
        seg = self.segments_ms()
        total = seg["total"]
        if total.size == 0:
            return None
        out: dict = {"samples": int(total.size), "batches": len(self._batches),
                     "percentiles_ms": {name: {_key(p): round(float(np.percentile(v, p)), 3) for p in PERCENTILES}
                                        for name, v in seg.items()},
                     "attribution_ms": {}}
        for p in PERCENTILES:
            slow = total >= np.percentile(total, p)
            out["attribution_ms"][_key(p)] = {name: round(float(seg[name][slow].mean()), 3)
                                              for name in (*SEGMENTS, "total")}
        if loadgen_latency_ns:
            before = {}
            for p in PERCENTILES:
                lg_ns = loadgen_latency_ns.get(f"{p:.2f}")
                if lg_ns is not None:
                    before[_key(p)] = round(lg_ns / 1e6 - out["percentiles_ms"]["total"][_key(p)], 3)
            out["before_seen_ms"] = before
        return out


def describe(summary: dict | None, p: str = "p99") -> str | None:
    """One line for a person: what the slowest 1 % of samples spent their time on."""
    if not summary or p not in summary.get("attribution_ms", {}):
        return None
    a = summary["attribution_ms"][p]
    line = (f"samples at or above the SUT's {p} ({a['total']:.2f} ms mean): queued {a['queued']:.2f} ms, "
            f"inference {a['inference']:.2f} ms, completion {a['completion']:.2f} ms")
    before = (summary.get("before_seen_ms") or {}).get(p)
    if before is not None:
        line += f"; LoadGen's {p} is {before:+.2f} ms beyond the SUT's (before the SUT saw the query)"
    return line


def _key(p: float) -> str:
    return f"p{p:g}"
