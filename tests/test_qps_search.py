"""The Server QPS search on a system whose true limit is known."""

import pytest
from trtfuse.qps_search import search_server_qps


@pytest.mark.parametrize("start", [40_000.0, 60_000.0, 90_000.0])
def test_search_closes_in_on_the_limit_from_either_side(start):
    limit = 61_234.0
    best, tried = search_server_qps(lambda q: q <= limit, start, tries=16)
    assert best is not None and best <= limit
    assert best > 0.995 * limit  # steps of 5 % up (10 % down) to bracket it, then bisection
    assert len(tried) == 16 and all(ok == (q <= limit) for q, ok in tried)


def test_no_pass_returns_none_and_bad_arguments_are_refused():
    best, tried = search_server_qps(lambda q: False, 1000.0, tries=3)
    assert best is None and [q for q, _ in tried] == pytest.approx([1000.0, 900.0, 810.0])
    with pytest.raises(ValueError):
        search_server_qps(lambda q: True, 0.0, tries=3)
