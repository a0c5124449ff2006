"""Ctrl-C and SIGTERM: the first ends the command promptly and cleanly, a second exits at once.

Python runs signal handlers in the main thread, between bytecodes, and its default for SIGINT raises
KeyboardInterrupt wherever the main thread happens to be. Raised while LoadGen's StartTest is running,
that unwinds into LoadGen's C++ frames (``terminate called ...``, exit 134, a half-written run folder);
and while the main thread sits inside StartTest it is not raised at all until the test ends (an
Offline run ignored Ctrl-C for its whole duration).

So, while a command runs (``handled``):
- outside a ``deferred`` section the first signal raises KeyboardInterrupt at once, as Python would;
- inside one (LoadGen's test, which runs on a worker thread while the main thread waits in
  ``wait_for``; a report being written) it is only noted: the section's ``on_interrupt`` callbacks
  run (the SUT answers everything outstanding and every later query at once, so StartTest returns),
  and the section's owner decides what to keep once it is safe to;
- a second signal runs the ``on_exit`` cleanups (a run folder that is not complete is removed, child
  servers are stopped) and exits with 130 at once, without unwinding anything.

The CLI turns KeyboardInterrupt into "interrupted" and exit code 130 (128 + SIGINT).
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import threading
from contextlib import contextmanager
from pathlib import Path

EXIT_CODE = 130
SIGNALS = (signal.SIGINT, signal.SIGTERM)


class _State:
    def __init__(self):
        self.installed = False
        self.requested = False
        self.deferring = 0
        self.on_interrupt: list = []
        self.notices: list[str] = []  # what the innermost deferring section tells the user it does
        self.on_exit: list = []
        self.folders: list = []  # RunFolders not yet complete


_state = _State()


def requested() -> bool:
    """Whether a signal asked the command to stop."""
    return _state.requested


def _say(text: str) -> None:
    try:
        print(f"\n{text}", file=sys.stderr, flush=True)
    except Exception:  # noqa: BLE001 - a closed stderr must not keep the process alive
        pass


def _run_all(callbacks) -> None:
    for fn in list(callbacks):
        try:
            fn()
        except Exception:  # noqa: BLE001 - one failed cleanup must not stop the others
            pass


def exit_now(why: str = "interrupted again: quitting at once") -> None:
    """The second signal: clean up what must not be left half-made, and exit 130 without unwinding
    (LoadGen's threads may still be running: no destructor of theirs may run)."""
    _run_all(reversed(_state.on_exit))
    remove_unfinished()
    _say(why)
    try:
        sys.stdout.flush()
    except Exception:  # noqa: BLE001
        pass
    os._exit(EXIT_CODE)


def _handler(signum, frame) -> None:
    if _state.requested:
        exit_now()
    _state.requested = True
    if _state.deferring:
        notice = _state.notices[-1] if _state.notices else "stopping"
        _say(f"interrupted: {notice} (Ctrl-C again to quit at once)")
        _run_all(_state.on_interrupt)
        return
    raise KeyboardInterrupt


@contextmanager
def handled():
    """Install the handlers for the command's duration (main thread only: elsewhere Python allows
    no handler), and restore the previous ones after."""
    if _state.installed or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in SIGNALS}
    _state.__init__()
    _state.installed = True
    try:
        for sig in SIGNALS:
            signal.signal(sig, _handler)
        yield
    finally:
        if _state.requested:
            remove_unfinished()
        for sig, old in previous.items():
            signal.signal(sig, old)
        _state.__init__()


@contextmanager
def deferred(on_interrupt=None, stopping: str = "the run"):
    """A section a signal must not unwind: the signal is only noted (``requested()``) and
    ``on_interrupt`` called, in the main thread (the user is told it is ``stopping`` that). A signal
    that came before the section is acted on at its start."""
    _state.notices.append(f"stopping {stopping}")
    if on_interrupt is not None:
        _state.on_interrupt.append(on_interrupt)
        if _state.requested:
            on_interrupt()
    _state.deferring += 1
    try:
        yield
    finally:
        _state.deferring -= 1
        _state.notices.pop()
        if on_interrupt is not None:
            _state.on_interrupt.remove(on_interrupt)


@contextmanager
def on_exit(cleanup):
    """``cleanup`` runs if a second signal exits the process during the block."""
    _state.on_exit.append(cleanup)
    try:
        yield
    finally:
        _state.on_exit.remove(cleanup)


def raise_if_requested() -> None:
    if _state.requested:
        raise KeyboardInterrupt


def wait_for(thread: threading.Thread, grace_s: float) -> None:
    """Wait in the main thread (where signals are handled) for ``thread`` to end. Once a signal
    came, it has ``grace_s`` more seconds; then the process exits as on a second signal (LoadGen's
    Server test keeps issuing queries on its schedule however fast they are answered)."""
    waited_since_signal = 0.0
    step = 0.05
    while thread.is_alive():
        thread.join(step)
        if _state.requested and thread.is_alive():
            waited_since_signal += step
            if waited_since_signal >= grace_s:
                exit_now("interrupted: LoadGen's test cannot be stopped early in this scenario; "
                         "quitting (an unfinished run folder is removed)")


def call(fn, on_interrupt, grace_s: float):
    """``fn()`` on a worker thread while the main thread waits, in a ``deferred`` section whose
    ``on_interrupt`` makes ``fn`` return soon (LoadGen's StartTest: the SUT answers everything);
    ``fn``'s exception is raised here. KeyboardInterrupt after it returned, if a signal came."""
    failed: list[BaseException] = []

    def target():
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - raised in the caller's thread
            failed.append(e)

    with deferred(on_interrupt):
        worker = threading.Thread(target=target, name="trtfuse-loadgen", daemon=True)
        worker.start()
        wait_for(worker, grace_s)
    if failed:
        raise failed[0]


class RunFolder:
    """A folder a command is writing, complete in the end or not left at all. Until ``complete()``,
    an interrupt that ends the command (KeyboardInterrupt leaving ``handled``, or a second signal)
    removes it. After ``measured()`` (LoadGen's test ended by itself: what is left is writing the
    report) a signal no longer unwinds the command: the folder is completed, ``complete`` marks it
    interrupted, and the command then exits 130. ``created``: whether this command made the folder
    (one that was there, empty, is emptied instead)."""

    def __init__(self, path: Path, created: bool = True):
        self.path = Path(path)
        self.created = created
        self._measured = False
        _state.folders.append(self)

    def measured(self) -> None:
        if not self._measured:
            self._measured = True
            _state.deferring += 1
            _state.notices.append("finishing the run folder first (LoadGen's test had ended)")

    def complete(self, mark=None) -> None:
        """The folder is whole: kept from now on. ``mark(why)`` rewrites its report when a signal
        came while it was being completed; then KeyboardInterrupt."""
        if self in _state.folders:
            _state.folders.remove(self)
        if self._measured:  # (a folder of an earlier command's state, reset since, changes nothing)
            self._measured = False
            _state.deferring = max(0, _state.deferring - 1)
            if _state.notices:
                _state.notices.pop()
        if _state.requested:
            if mark is not None:
                mark("a signal came after LoadGen's test had ended: the measurement is whole")
            raise KeyboardInterrupt

    def remove(self) -> None:
        if self in _state.folders:
            _state.folders.remove(self)
        if not self.path.exists():
            return
        if self.created:
            shutil.rmtree(self.path, ignore_errors=True)
        else:
            for child in self.path.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child, ignore_errors=True)
                else:
                    child.unlink(missing_ok=True)


def remove_unfinished() -> None:
    """Remove every folder the command has not completed, the newest (innermost) first."""
    for folder in reversed(list(_state.folders)):
        folder.remove()
