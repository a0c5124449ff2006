"""``trtfuse`` with every backend slowed to a known pace: ``python slow_trtfuse.py SECONDS ARGS...``
runs ``trtfuse ARGS`` with each ``classify_rows`` call taking SECONDS more. The interrupt tests use
it so that a run is still going when they send their signal, on a machine of any speed, without a
big model or dataset. ``SECONDS:deaf``: the SUT also ignores the first signal (its ``interrupt`` does
nothing), as a backend stuck in a call would, to test what a second signal does."""

import sys
import time

from trtfuse import backends, cli


def main() -> int:
    delay, _, deaf = sys.argv[1].partition(":")
    delay = float(delay)
    if deaf:
        from trtfuse import lg_sut

        lg_sut.BatchSUT.interrupt = lambda self: 0
    make = backends.create_backend

    def slowed(name, **options):
        backend = make(name, **options)
        classify = backend.classify_rows

        def classify_rows(*args, **kwargs):
            time.sleep(delay)
            return classify(*args, **kwargs)

        backend.classify_rows = classify_rows
        return backend

    backends.create_backend = slowed
    return cli.main(sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
