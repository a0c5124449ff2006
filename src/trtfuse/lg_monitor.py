"""A thread beside LoadGen's StartTest: progress on stderr, a timeline of completed samples (the run's
"completed samples over time" picture), and a watchdog for hung backends.

The timeline is sampled every ``interval_s``, plus one point at the moment of the last completion
(taken from the ledger when StartTest returns): LoadGen's Offline samples/s is all samples over the
span from its issue to that moment, so the picture can place LoadGen's timed span exactly.

LoadGen waits forever for a sample that is never completed. When samples are outstanding and none
has completed for ``stall_s`` seconds, the watchdog completes them with empty responses so that
StartTest returns, and records why; the run then fails with that message instead of hanging.
"""

from __future__ import annotations

import bisect
import os
import sys
import threading
import time


class RunMonitor:
    def __init__(self, sut, stall_s: float, expected_s: float | None = None,
                 progress: bool = True, interval_s: float = 0.5):
        self.sut = sut
        self.stall_s = stall_s
        self.expected_s = expected_s
        self.progress = progress
        self.interval_s = interval_s
        self.stalled: str | None = None
        # (seconds since start, samples completed): every interval, and at the last completion
        self.timeline: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="trtfuse-monitor", daemon=True)
        self._tty = sys.stderr.isatty()

    def __enter__(self):
        self._start = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=5)
        self._add_last_completion()
        if self.progress and self._printed and self._tty:
            print(file=sys.stderr)

    _printed = False

    def _loop(self) -> None:
        last_print = 0.0
        while not self._stop.wait(self.interval_s):
            ledger = self.sut.ledger
            completed = ledger.completed  # before the clock: every sample counted had completed by `now`
            now = time.monotonic()
            self.timeline.append((round(now - self._start, 3), completed))
            if ledger.outstanding > 0 and now - ledger.last_progress > self.stall_s:
                self._unstick(ledger.outstanding)
            # On a terminal: a line redrawn in place; in logs (CI): one line every 10 s.
            if self.progress and (self._tty or now - last_print >= 10):
                elapsed = now - self._start
                eta = f" of ~{self.expected_s:.0f} s" if self.expected_s else ""
                line = (f"  {elapsed:6.1f} s{eta}  {completed:,} samples done"
                        f"  ({completed / max(elapsed, 1e-9):,.0f}/s)")
                print(("\r" + line) if self._tty else line, end="" if self._tty else "\n",
                      file=sys.stderr, flush=True)
                self._printed = True
                last_print = now

    def _add_last_completion(self) -> None:
        """The point of the last completion, in time order: when the run ends, the ledger's last
        progress is its last completion (nothing is issued after it)."""
        ledger = self.sut.ledger
        if ledger.completed == 0 or ledger.outstanding != 0:
            return
        point = (round(ledger.last_progress - self._start, 3), ledger.completed)
        if point[0] >= 0 and point not in self.timeline:
            bisect.insort(self.timeline, point)

    _found_nothing = 0

    def _unstick(self, outstanding: int) -> None:
        if self.stalled is None:
            self.stalled = (f"no sample completed for {self.stall_s:g} s with {outstanding} outstanding"
                            " (the backend hung)")
            self.sut.errors.append(TimeoutError(self.stalled))  # new queries are answered at once
        freed = self.sut.abandon()
        # Nothing to free twice in a row (a batch may be in transit between threads once):
        self._found_nothing = self._found_nothing + 1 if freed == 0 else 0
        if self._found_nothing >= 2:
            # Samples LoadGen still waits for are nowhere in the SUT: StartTest can never return.
            print(f"\nerror: {self.stalled}, and {outstanding} samples were lost by the harness; "
                  "exiting because LoadGen would wait forever", file=sys.stderr, flush=True)
            os._exit(3)
