"""What a build tidies in its store: the event logs kept (newest, bounded) and the scratch
folders killed builds left. Must never touch what a live process (by the pid in its name) may
still use."""

from __future__ import annotations

import time

from rsi.fsutil import pid_alive
from rsi.store import LocalStore


# NB: a build's event log stays for `rsi why` and for people; the newest are kept, bounded
KEEP_EVENT_LOGS = 200
KEEP_EVENT_BYTES = 256 << 20


def prune_event_logs(store: LocalStore, current: str) -> None:
    from rsi.fsutil import prune

    prune(
        store.events_dir,
        keep=KEEP_EVENT_LOGS,
        keep_bytes=KEEP_EVENT_BYTES,
        match=lambda name: name.endswith(".jsonl"),
        spare=current,
    )


def clean_stale_scratch(store: LocalStore) -> None:
    """Remove scratch folders left by a killed build: those whose pid (in the name) is gone.

    A live pid's folder is never touched, however old: a long action may still be using it.
    Folders without a pid in the name are removed once older than a day. (What killed builds
    left of the sandboxes, `clean_stale_sandboxes`, waits for a build that runs something.)
    """
    now = time.time()
    for entry in store.tmp.iterdir() if store.tmp.exists() else ():
        try:
            pid = int(entry.name.split("-")[1])
        except (IndexError, ValueError):
            pid = None
        if pid is not None:
            if pid_alive(pid):
                continue
        else:
            try:
                if now - entry.stat().st_mtime < 86400:
                    continue
            except OSError:
                continue
        if entry.is_dir():
            # NB: imported only when there is something to remove: a no-op build never needs
            # the executors
            from rsi.fsutil import remove_tree

            remove_tree(entry)
        else:
            entry.unlink(missing_ok=True)
