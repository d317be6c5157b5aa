"""Waiting for the host lock, told: who holds it, for how long, as one progress line and
`host_lock_wait` / `host_lock_acquired` events. Must never decide what runs or take the lock."""

from __future__ import annotations

import time

from rsi.events import EventLog
from rsi.host import Holder, HostLock, describe_holders, short_label
from rsi.rule import ActionSpec


def _wait_text(seconds: float) -> str:
    seconds = int(seconds)
    return f"waited {seconds}s" if seconds < 60 else f"waited {seconds // 60}m{seconds % 60:02d}s"


class LockWaiter:
    """Tells people and the event stream who holds the host lock an action waits for: a
    `host_lock_wait` event whenever the holders change, one short progress line (redrawn in
    place on a terminal; elsewhere a line when the wait starts, when the holder changes at most
    every `CHANGE_S`, and every `HEARTBEAT_S`), and `host_lock_acquired` once it is taken."""

    CHANGE_S = 5.0
    HEARTBEAT_S = 30.0

    def __init__(self, events: EventLog, lock: HostLock, spec: ActionSpec, exclusive, parent):
        self.events, self.lock, self.spec = events, lock, spec
        self.exclusive, self.parent = exclusive, parent
        self.started: float | None = None
        self._seen: tuple | None = None
        self._printed: float | None = None

    def __call__(self, holders: list[Holder], waited_s: float) -> None:
        now = time.monotonic()
        if self.started is None:
            self.started = now - waited_s
        seen = tuple((h.pid, h.label, h.exclusive, h.since) for h in holders)
        changed = seen != self._seen
        self._seen = seen
        mode = "exclusive" if self.exclusive else "shared"
        if changed:
            self.events.emit(
                "host_lock_wait",
                self.parent,
                action=self.spec.id,
                label=self.spec.label,
                lock=str(self.lock.path),
                mode=mode,
                holders=[h.to_json() for h in holders],
                timeout_s=self.lock.timeout_s,
            )
        first = self._printed is None
        since = None if first else now - self._printed
        new = first or (changed and since >= self.CHANGE_S) or since >= self.HEARTBEAT_S
        where = f" ({self.lock.path})" if first else ""
        if new:
            self._printed = now
        self.events.notice(
            f"{short_label(self.spec.label)} waits for the host lock{where} ({mode}, "
            f"{_wait_text(waited_s)}): held by {describe_holders(holders)}",
            new=new,
        )

    def acquired(self) -> None:
        if self.started is None:
            return
        self.events.emit(
            "host_lock_acquired",
            self.parent,
            action=self.spec.id,
            label=self.spec.label,
            waited_s=round(time.monotonic() - self.started, 3),
        )
