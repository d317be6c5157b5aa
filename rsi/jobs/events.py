"""A job's event stream: `<store>/jobs/<job>/events.jsonl`, in the build event format
(`rsi.events/1`, docs/events.md). Job events (`job_started`, `job_retry`, `job_budget`,
`job_finished`, ...) frame the events of every build the job runs, which are passed through with
their ids renumbered into the job's one increasing sequence (a build's `build_started` gets the
job's current `job_started` as its parent). A resumed job appends to the same file. A line must
never be rewritten once written.

`rsi job logs --cursor N` reads the events after id N, so a reader resumes where it stopped.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from rsi.events import EVENTS_SCHEMA


def last_id(path: Path) -> int:
    """The id of the last whole event in `path` (0 when none)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - 65536))
            tail = f.read()
    except OSError:
        return 0
    for line in reversed(tail.splitlines()):
        try:
            return int(json.loads(line)["id"])
        except (ValueError, KeyError, TypeError):
            continue
    return 0


class JobEvents:
    """The writer of a job's stream (one per runner), and the file object builds write their
    events to (`events_to=`): each line is renumbered, shown to `observe`, then appended."""

    def __init__(self, path: Path, observe: Callable[[dict], None] | None = None) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._next = last_id(path) + 1
        self._f = open(path, "a", encoding="utf-8")
        self._lock = threading.Lock()
        self._map: dict[int, int] = {}
        self.parent_for_builds: int | None = None
        self.observe = observe
        self._partial = ""

    def emit(self, kind: str, parent: int | None = None, **fields: Any) -> int:
        with self._lock:
            event_id = self._next
            self._next += 1
            doc = {
                "schema": EVENTS_SCHEMA,
                "id": event_id,
                "parent": parent,
                "kind": kind,
                "time": round(time.time(), 6),
                **fields,
            }
            self._append(doc)
        return event_id

    def _append(self, doc: dict) -> None:
        try:
            self._f.write(json.dumps(doc, sort_keys=True, default=str) + "\n")
            self._f.flush()
        except (OSError, ValueError):
            pass

    # NB: the file-object side, for rsi.build.build(events_to=self)
    def write(self, text: str) -> int:
        with self._lock:
            text = self._partial + text
            lines = text.split("\n")
            self._partial = lines.pop()
            for line in lines:
                if not line.strip():
                    continue
                try:
                    doc = json.loads(line)
                except ValueError:
                    continue
                if doc.get("kind") == "build_started":
                    self._map = {}
                old = doc.get("id")
                new = self._next
                self._next += 1
                if isinstance(old, int):
                    self._map[old] = new
                doc["id"] = new
                parent = doc.get("parent")
                if parent is None:
                    doc["parent"] = self.parent_for_builds
                else:
                    doc["parent"] = self._map.get(parent, parent)
                if self.observe is not None:
                    try:
                        self.observe(doc)
                    except Exception:  # noqa: BLE001 - NB: accounting never fails a build
                        pass
                self._append(doc)
        return len(text)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        """A build closing its event log: the job's stream goes on."""

    def finish(self) -> None:
        try:
            self._f.close()
        except OSError:
            pass


def read_events(path: Path, after: int = 0, offset: int = 0) -> tuple[list[dict], int]:
    """(events with id > `after` from byte `offset` on, the offset after the last whole
    line read): a line still being written is left for the next call."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return [], offset
    end = data.rfind(b"\n") + 1
    found = []
    for line in data[:end].splitlines():
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict) and int(doc.get("id", 0)) > after:
            found.append(doc)
    return found, offset + end


def follow(path: Path, after: int, done: Callable[[], bool], poll_s: float = 0.2) -> Iterator[dict]:
    """Every event after id `after`, waiting for more until `done()` and nothing is left."""
    offset = 0
    while True:
        finished = done()
        events, offset = read_events(path, after, offset)
        for doc in events:
            after = max(after, int(doc["id"]))
            yield doc
        if finished and not events:
            return
        if not events:
            time.sleep(poll_s)
