"""SIGINT and SIGTERM during a build: `interruptible()` turns the first into `BuildInterrupted`
(the scheduler cancels what runs, the build reports why it ended). Must never swallow a signal the
caller ignores, nor raise twice."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class BuildInterrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM stopped the build; the CLI exits with 128 + the signal number."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.signal = signal.Signals(signum).name
        self.exit_code = 128 + signum
        super().__init__(self.signal)


@contextmanager
def interruptible() -> Iterator[None]:
    """While a build runs (in the main thread), SIGINT and SIGTERM raise `BuildInterrupted`:
    the scheduler cancels what runs (killing each action's process tree), keeps what finished
    and the build reports why it ended. Only the first signal raises; the rest are ignored
    while that cleanup (bounded by the executors' cancel) runs. A signal the caller ignores
    (SIG_IGN) stays ignored."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    fired: list[int] = []

    def on_signal(signum: int, frame: object) -> None:
        if fired:
            return
        fired.append(signum)
        raise BuildInterrupted(signum)

    previous: dict[int, Any] = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(sig) is signal.SIG_IGN:
            continue
        previous[sig] = signal.signal(sig, on_signal)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
