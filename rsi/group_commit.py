"""Group commit of action-cache entries: one thread writes them in batches, each after one sync of
the store, so the blobs an entry names are durable before it is. Must never report an entry written
before it and its blobs are on disk."""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future

from rsi.errors import StoreError
from rsi.store import LocalStore

_HURRY = object()  # NB: a GroupCommitter queue item: stop lingering, write the batch now


class GroupCommitter:
    """Writes action-cache entries on one thread, in batches, each batch after one `sync()` of
    the store: the blobs an entry names are durable before the entry is, at the price of one
    sync per batch instead of one fsync per file. A batch is whatever queued meanwhile, so it
    grows by itself when actions finish faster than entries are written."""

    def __init__(self, store: LocalStore) -> None:
        self.store = store
        self.used = False
        self.linger_s = 0.02
        self._hurried = False
        self._queue: "queue.Queue" = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="rsi-commit", daemon=True)
        self._thread.start()

    def submit(self, fn, *args) -> Future:
        self.used = True
        fut: Future = Future()
        self._hurried = False
        self._queue.put((fut, fn, args))
        return fut

    def hurry(self) -> None:
        """Write what is queued now, without waiting for more to join the batch (the
        scheduler has nothing left running)."""
        if not self._hurried:
            self._hurried = True
            self._queue.put(_HURRY)

    def _run(self) -> None:
        stop = False
        while not stop:
            item = self._queue.get()
            if item is None:
                break
            if item is _HURRY:
                continue
            batch = [item]
            # NB: a short linger lets a batch form (one sync for many entries instead of one
            # each). It delays only the "finished" events: dependents use results in memory.
            deadline = time.monotonic() + self.linger_s
            while True:
                try:
                    nxt = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if nxt is None:
                    stop = True
                    break
                if nxt is _HURRY:
                    break
                batch.append(nxt)
            try:
                self.store.sync()
            except OSError as exc:
                for fut, _, _ in batch:
                    fut.set_exception(StoreError(f"cannot sync the store: {exc}"))
                continue
            done: list[tuple[Future, object, BaseException | None]] = []
            for fut, fn, args in batch:
                try:
                    done.append((fut, fn(*args), None))
                except BaseException as exc:  # NB: reported per action by the scheduler
                    done.append((fut, None, exc))
            try:
                self.store.sync()  # NB: the entries themselves, before anyone is told "ok"
            except OSError as exc:
                done = [
                    (f, None, e or StoreError(f"cannot sync the store: {exc}")) for f, _, e in done
                ]
            for fut, value, exc in done:
                if exc is None:
                    fut.set_result(value)
                else:
                    fut.set_exception(exc)

    def shutdown(self) -> None:
        self._queue.put(None)
        self._thread.join()
        if self.used:  # NB: a no-op build wrote nothing that needs a sync
            try:
                self.store.sync()
            except OSError:
                pass
