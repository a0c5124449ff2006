"""bench native's half-load row: only a run at about half of the lease's highest Server target counts."""

from trtfuse.bench.native import half_load


def _row(sut, qps, p99):
    return {"sut": sut, "target_qps": qps, "p99_ms": p99}


def test_the_half_load_is_a_run_at_about_half_the_highest_target():
    rows = [_row("native", 75000.0, 9.6), _row("native", 37500.0, 3.1), _row("python", 20000.0, 2.0)]
    assert half_load(rows) == {"sut": "native", "target_qps": 37500.0, "p99_ms": 3.1}


def test_a_lease_of_one_load_has_no_half_load():
    # a 600 s run alone: its own target is not half of itself
    assert half_load([_row("native", 75000.0, 9.7), _row("python", 30000.0, 2.0)]) is None
    assert half_load([_row("native", 75000.0, 9.7), _row("native", 60000.0, 8.0)]) is None
    assert half_load([]) is None
