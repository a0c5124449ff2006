"""SingleStream and MultiStream settings: the scenarios' names as LoadGen spells them, samples per query,
and the expected latency that sizes LoadGen's query list."""

from __future__ import annotations

import mlperf_loadgen as lg

# LoadGen's (and mlperf.conf's, user.conf's, the submission tree's) spelling of each scenario.
SCENARIO_NAME = {"offline": "Offline", "server": "Server", "singlestream": "SingleStream",
                 "multistream": "MultiStream"}
STREAM_SCENARIOS = ("singlestream", "multistream")  # one query at a time, the next once it is answered


def samples_per_query(ts: lg.TestSettings, scenario: str) -> int:
    return ts.multi_stream_samples_per_query if scenario == "multistream" else 1


def stream_expected_latency_ns(section: dict, ts: lg.TestSettings, scenario: str,
                               measured_qps: float | None) -> float:
    """SingleStream/MultiStream: the expected latency of one query, the user's, else the warm-up's
    estimate (a query's samples at the warm-up's rate), else mlperf.conf's. LoadGen generates
    min_duration / expected latency queries and a run that uses them up before its min duration is
    INVALID: the estimate is divided by 4 (more queries; LoadGen stops once both minimums are met). A
    few warm-up batches time a query's latency loosely (on 2 CPU cores one query ran 10x faster than
    the warm-up said, and 1.5x padding ran out of queries)."""
    if section["expected_latency_ms"]:
        return section["expected_latency_ms"] * 1e6
    if measured_qps:
        return max(samples_per_query(ts, scenario) / measured_qps / 4 * 1e9, 1000.0)
    return (ts.multi_stream_expected_latency_ns if scenario == "multistream"
            else ts.single_stream_expected_latency_ns)


def set_expected_latency(ts: lg.TestSettings, scenario: str, ns: float) -> None:
    if scenario == "multistream":
        ts.multi_stream_expected_latency_ns = int(ns)
    else:
        ts.single_stream_expected_latency_ns = int(ns)
