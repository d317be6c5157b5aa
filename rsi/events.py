"""The build event stream: versioned JSON lines that CI and agents read, plus a live progress
line for people at a terminal. Schema: docs/events.md. Writing an event never fails a build.
Cache hits are summarised (`actions_cached`: a count and a digest of the set) unless listing
them is asked for: the log grows with what ran, failed or missed, never with what did not."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

from rsi.digest import hit_term, hits_digest
from rsi.errors import DeclarationError

EVENTS_SCHEMA = "rsi.events/1"
# NB: opt-in (or `rsi build --events-hits`): one `action_finished` line per cache hit as well
LIST_HITS_ENV = "RSI_EVENTS_HITS"


class EventLog:
    def __init__(
        self,
        path: Path | None = None,
        *,
        also: IO[str] | None = None,
        progress: bool | None = None,
        list_hits: bool | None = None,
    ) -> None:
        self.path = path
        if list_hits is None:
            list_hits = os.environ.get(LIST_HITS_ENV) == "1"
        self.list_hits = list_hits
        # NB: the local hits not summarised yet: how many, and the sum of their terms
        self._hit_count = 0
        self._hit_sum = 0
        self._files: list[IO[str]] = []
        if path is not None:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                self._files.append(open(path, "a", encoding="utf-8"))
            except OSError as exc:
                # NB: the first file a build writes in its store: a store that cannot be
                # written is refused here, before anything else is, and never a traceback
                raise DeclarationError(
                    f"the store cannot be written: {exc.filename}: {exc.strerror or exc}",
                    field="store",
                    hint="make the store writable (a read-write mount, `chattr -i`, its mode), "
                    "or use another folder; nothing was written",
                ) from None
        if also is not None:
            self._files.append(also)
        self._lock = threading.Lock()
        self._next_id = 1
        self.progress = sys.stderr.isatty() if progress is None else progress
        self._last_draw = 0.0
        self.counts = {"total": 0, "done": 0, "hit": 0, "executed": 0, "failed": 0, "running": 0}
        self._drawn = False

    def emit(self, kind: str, parent: int | None = None, **fields: Any) -> int:
        with self._lock:
            event_id = self._next_id
            self._next_id += 1
            doc = {
                "schema": EVENTS_SCHEMA,
                "id": event_id,
                "parent": parent,
                "kind": kind,
                "time": round(time.time(), 6),
                **fields,
            }
            line = json.dumps(doc, sort_keys=True, default=str) + "\n"
            for f in self._files:
                try:
                    f.write(line)
                    f.flush()
                except (OSError, ValueError):
                    pass
        return event_id

    def hit(self, parent: int | None, action: str, label: str, mnemonic: str, key: str) -> None:
        """One local cache hit: counted in this build's `actions_cached` summary, and written
        as its own `action_finished` line only when hits are listed."""
        if self.list_hits:
            self.emit(
                "action_finished",
                parent,
                action=action,
                label=label,
                mnemonic=mnemonic,
                key=key,
                cache="hit",
                status="ok",
            )
        term = hit_term(action, key)
        with self._lock:
            self._hit_count += 1
            self._hit_sum += term

    def emit_hits(self, parent: int | None, rows, template=None, summary=None) -> None:
        """Local cache hits, one per (action, label, mnemonic, key) row: counted towards
        `summarise_hits`; with hits listed, also one `action_finished` line each, written at
        once (the same lines as `emit`, at a fraction of its cost per event). `summary`, when
        given, is (count, sum of `hit_term`s) of the rows, known to the caller: the rows are
        then not read unless listed. `template` is a `HitTemplate` of the same rows, reused
        when it fits."""
        if not self.list_hits:
            if summary is None:
                summary = (0, 0)
                for r in rows:
                    summary = (summary[0] + 1, summary[1] + hit_term(r[0], r[3]))
            with self._lock:
                self._hit_count += summary[0]
                self._hit_sum += summary[1]
            return
        rows = list(rows)
        if summary is None:
            summary = (len(rows), sum(hit_term(r[0], r[3]) for r in rows))
        with self._lock:
            self._hit_count += summary[0]
            self._hit_sum += summary[1]
            now = round(time.time(), 6)
            if template is not None and template.fits(parent, self._next_id):
                text, self._next_id = template.render(now)
            else:
                first = self._next_id
                text, self._next_id = hit_lines(rows, parent, first, TIME_MARK, EVENTS_SCHEMA)
                if template is not None:
                    template.keep(parent, first, text, self._next_id)
                text = text.replace(_TIME_TEXT, json.dumps(now))
            if not text:
                return
            for f in self._files:
                try:
                    f.write(text)
                    f.flush()
                except (OSError, ValueError):
                    pass

    def summarise_hits(self, parent: int | None) -> None:
        """Write one `actions_cached` event for the local hits since the last one (none when
        there were none): `count`, `digest` (`rsi.digest.hits_digest`) and `listed`."""
        with self._lock:
            count, total = self._hit_count, self._hit_sum
            self._hit_count = self._hit_sum = 0
        if count:
            self.emit(
                "actions_cached",
                parent,
                count=count,
                digest=hits_digest(total),
                listed=self.list_hits,
            )

    def draw(self, current: str = "", force: bool = False) -> None:
        if not self.progress:
            return
        now = time.monotonic()
        if not force and now - self._last_draw < 0.1:
            return
        self._last_draw = now
        c = self.counts
        line = (
            f"[{c['done']}/{c['total']}] {c['running']} running, {c['hit']} cached, "
            f"{c['executed']} executed, {c['failed']} failed  {current}"
        )
        self._write_progress(line)

    def _write_progress(self, line: str) -> None:
        try:
            tty = sys.stderr.isatty()
            width = os.get_terminal_size(sys.stderr.fileno()).columns if tty else 120
            sys.stderr.write("\r" + line[: width - 1].ljust(width - 1))
            sys.stderr.flush()
        except (OSError, ValueError):
            return
        self._drawn = True

    def notice(self, message: str, *, new: bool = True) -> None:
        """Something the build waits on, for people: at a terminal it is the progress line
        (redrawn on every call); otherwise a line on stderr each time it is `new`."""
        if self.progress:
            self._last_draw = time.monotonic()
            self._write_progress(message)
        elif new:
            try:
                sys.stderr.write(f"rsi: {message}\n")
                sys.stderr.flush()
            except (OSError, ValueError):
                pass

    def close(self) -> None:
        if self._drawn:
            sys.stderr.write("\n")
            sys.stderr.flush()
        for f in self._files:
            if f is not sys.stdout and f is not sys.stderr:
                try:
                    f.close()
                except OSError:
                    pass


# NB: where a hit line's time goes in a template; no JSON value can hold it (a control char)
TIME_MARK = object()
_TIME_TEXT = "\x00time\x00"


class HitTemplate:
    """The hit lines of one set of rows, rendered once with the time left out: a build that
    reports the same hits again (the build server's no-op) writes them at the cost of one
    string replace. The owner drops it when any row changes."""

    def __init__(self) -> None:
        self._at: tuple | None = None
        self._text = ""
        self._next = 0

    def fits(self, parent: int | None, first_id: int) -> bool:
        return self._at == (parent, first_id)

    def keep(self, parent: int | None, first_id: int, text: str, next_id: int) -> None:
        self._at, self._text, self._next = (parent, first_id), text, next_id

    def render(self, now: float) -> tuple[str, int]:
        return self._text.replace(_TIME_TEXT, json.dumps(now)), self._next


def hit_lines(rows, parent: int | None, first_id: int, now: Any, schema: str) -> tuple[str, int]:
    """`action_finished` cache hits as the lines `EventLog.emit` would write (sorted keys,
    json.dumps' separators), without a json.dumps per event. `now` may be `TIME_MARK`: the
    time is then left as a mark for `HitTemplate`."""
    enc = json.encoder.encode_basestring_ascii  # type: ignore[attr-defined]
    when = _TIME_TEXT if now is TIME_MARK else json.dumps(now)
    tail = (
        f', "parent": {json.dumps(parent)}, "schema": {enc(schema)}, "status": "ok", '
        f'"time": {when}}}\n'
    )
    out = []
    i = first_id
    for action, label, mnemonic, key in rows:
        out.append(
            f'{{"action": {enc(action)}, "cache": "hit", "id": {i}, "key": {enc(key)}, '
            f'"kind": "action_finished", "label": {enc(label)}, "mnemonic": {enc(mnemonic)}' + tail
        )
        i += 1
    return "".join(out), i
