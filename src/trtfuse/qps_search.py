"""The highest Server target QPS that LoadGen calls VALID: step up after a pass, down after a failure,
then bisect between the highest pass and the lowest failure (how submitters find their Server target).
Each try is one LoadGen run, so the number of tries is the caller's budget."""

from __future__ import annotations

from typing import Callable


def search_server_qps(try_target: Callable[[float], bool], start: float, tries: int,
                      up: float = 1.05, down: float = 0.9) -> tuple[float | None, list[tuple[float, bool]]]:
    """``try_target(qps)`` runs LoadGen at ``qps`` and says whether it passed (VALID within the bound).
    Returns (the highest target that passed, or None; every (target, passed) in order)."""
    if start <= 0 or tries < 1 or not (up > 1 > down > 0):
        raise ValueError("need start > 0, tries >= 1 and up > 1 > down > 0")
    passed, failed, qps, tried = None, None, start, []
    for _ in range(tries):
        ok = bool(try_target(qps))
        tried.append((qps, ok))
        if ok:
            passed = qps
            qps = (qps + failed) / 2 if failed else qps * up
        else:
            failed = qps
            qps = (passed + qps) / 2 if passed else qps * down
    return passed, tried
