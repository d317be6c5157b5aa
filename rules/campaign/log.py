"""What a campaign keeps on disk: its append-only log (the only source of truth), the attempts file
and the store's evidence index (derived, disposable state), and the gc roots they name. It must
never rewrite or drop an appended entry."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import socket
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from rsi.errors import DeclarationError, RsiError
from rsi.fsutil import read_json_object
from rsi.label import Label

LOG_SCHEMA = "rsi.campaign.log/1"


def campaign_dir(store_root: str | os.PathLike, label: Label | str) -> Path:
    return Path(store_root) / "campaigns" / hashlib.sha256(str(label).encode()).hexdigest()


_DIGEST_TEXT = re.compile(r"^([0-9a-f]{64})/\d+$")


def gc_roots(store) -> Iterator[str]:
    """The `rsi.gc_roots` entry point of the campaign family: every blob named by a campaign
    log under `<store>/campaigns/` (candidate snapshots, frozen project trees). They are gc
    roots because a logged candidate may not have been built yet, so no cached result names
    its files. Yields `hash/size` digest texts; a torn last line of a crashed writer is
    skipped, an unreadable log too (gc keeps what the others name)."""
    found: set[str] = set()

    def walk(value: Any) -> None:
        if isinstance(value, str):
            m = _DIGEST_TEXT.match(value)
            if m:
                found.add(value)
        elif isinstance(value, dict):
            for v in value.values():
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)

    for log in sorted((Path(store.root) / "campaigns").glob("*/*.jsonl")):
        try:
            lines = log.read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            try:
                walk(json.loads(line))
            except ValueError:
                continue  # NB: a torn last line of a crashed writer
    yield from sorted(found)


class CampaignLog:
    """Append-only JSON lines. An entry counts once its line and newline are on disk (fsync'd
    before anything is acknowledged); a reader ignores a torn last line, and the next writer
    cuts it off before appending, so a `kill -9` leaves the entry absent or whole."""

    def __init__(self, store_root: str | os.PathLike, label: Label | str) -> None:
        self.label = str(label)
        self.store_root = Path(store_root)
        self.dir = campaign_dir(store_root, label)
        self.path = self.dir / "log.jsonl"

    def read(self) -> list[dict]:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise RsiError(f"cannot read the campaign log {self.path}: {exc}") from exc
        entries = []
        for number, raw in enumerate(data.split(b"\n")[:-1], 1):
            if not raw.strip():
                continue
            try:
                entry = json.loads(raw)
                if not isinstance(entry, dict) or entry.get("schema") != LOG_SCHEMA:
                    raise ValueError(f"not an {LOG_SCHEMA} entry")
            except ValueError as exc:
                raise DeclarationError(
                    f"line {number} of the campaign log of {self.label} is corrupt ({exc})",
                    file=str(self.path),
                    hint="the log is append-only and written whole-line; restore it from a "
                    "backup, or move it away to start the campaign afresh",
                ) from None
            entries.append(entry)
        return entries

    @contextmanager
    def locked(self) -> Iterator["CampaignLog"]:
        """One writer at a time: budget checks and the append happen under this lock."""
        from rsi.store_folder import claim_store

        claim_store(self.store_root)  # NB: the log may be the first thing written in the store
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            meta = self.dir / "campaign.json"
            if not meta.exists():
                meta.write_text(json.dumps({"label": self.label}) + "\n")
            fd = os.open(self.dir / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise RsiError(f"cannot open the campaign folder {self.dir}: {exc}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield self
        finally:
            os.close(fd)

    def append(self, entry: dict) -> dict:
        """Append one entry (the caller holds `locked()`); returns it once it is durable."""
        entry = {"schema": LOG_SCHEMA, **entry}
        line = (
            json.dumps(entry, sort_keys=True, separators=(",", ":"), allow_nan=False) + "\n"
        ).encode()
        created = not self.path.exists()
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                data = os.pread(fd, size, 0)
                os.ftruncate(fd, data.rfind(b"\n") + 1)  # NB: a torn entry was never acknowledged
            view = memoryview(line)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            os.fsync(fd)
        finally:
            os.close(fd)
        if created:
            dfd = os.open(self.dir, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        return entry


ATTEMPTS_SCHEMA = "rsi.campaign.attempts/1"


class Attempts:
    """The last build attempt of each round (and of the final) by `rsi round` / `rsi campaign
    final`: `building` (with its pid), `done` or `failed` (with the failed actions' messages).

    Derived, disposable state next to the log (`attempts.json`): it only lets `rsi campaign
    status` tell a round whose last build faulted (retryable) or was killed from one never
    built. The log stays the only source of truth, and a missing or unreadable file is simply
    no history. Written whole (temp file + rename) under its own lock; a failure to write it
    never fails a command."""

    def __init__(self, log: CampaignLog, *, clock=time.time) -> None:
        self.clock = clock
        self.path = log.dir / "attempts.json"
        self.lock_path = log.dir / "attempts.lock"

    def read(self) -> dict[str, dict]:
        try:
            doc = json.loads(self.path.read_bytes())
        except (OSError, ValueError):
            return {}
        if not isinstance(doc, dict) or doc.get("schema") != ATTEMPTS_SCHEMA:
            return {}
        last = doc.get("last")
        return (
            {k: v for k, v in last.items() if isinstance(v, dict)} if isinstance(last, dict) else {}
        )

    def record(self, key: str, outcome: str, **detail: Any) -> None:
        """Set the last attempt of `key` (`round-N` or `final`)."""
        from rsi.fsutil import atomic_write_bytes

        entry = {
            "outcome": outcome,
            "time": self.clock(),
            "pid": os.getpid(),
            "host": socket.gethostname(),
            **detail,
        }
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                last = self.read()
                last[key] = entry
                atomic_write_bytes(
                    self.path,
                    (
                        json.dumps(
                            {"schema": ATTEMPTS_SCHEMA, "last": last}, sort_keys=True, default=str
                        )
                        + "\n"
                    ).encode(),
                )
            finally:
                os.close(fd)
        except OSError:
            pass  # NB: disposable state; the log and the cache are what count


def attempt_state(attempt: dict | None) -> str:
    """What the last attempt says of a round that has no verdict in the cache."""
    if not attempt:
        return "not_built"
    outcome = attempt.get("outcome")
    if outcome == "building":
        if attempt.get("host") != socket.gethostname():
            return "building"
        try:
            os.kill(int(attempt.get("pid")), 0)
        except ProcessLookupError:
            return "interrupted"
        except (PermissionError, TypeError, ValueError, OverflowError):
            return "building"
        return "building"
    if outcome in ("failed", "not_built"):
        return "failed_retryable"
    reasons = (attempt.get("verdict_doc") or {}).get("reasons") or []
    if outcome == "done" and "host_busy" in reasons:
        # NB: judged, but the measurement said nothing (the host was busy): never cached, so
        # asking again measures anew; its verdict is shown, never counted
        return "host_busy"
    return "not_built"  # NB: built once, but its result is no longer in the cache


EVIDENCE_INDEX = "evidence-index.json"


def read_index(path: Path) -> dict:
    """The evidence index at `path`; {} when absent or unreadable (it is rebuilt as rounds land)."""
    return read_json_object(path)


def update_index(path: Path, entries: dict) -> None:
    """Add `entries` (output digest -> where it was produced) to the store's evidence index:
    derived, disposable state (a failure to write it never fails a round)."""
    from rsi.fsutil import atomic_write_bytes

    try:
        fd = os.open(path.with_name(EVIDENCE_INDEX + ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            index = read_index(path)
            for digest, where in entries.items():
                index.setdefault(digest, where)  # NB: the first producer is the source
            atomic_write_bytes(path, (json.dumps(index, sort_keys=True) + "\n").encode())
        finally:
            os.close(fd)
    except OSError:
        pass


@contextmanager
def campaign_flock(path: Path, waiting: str):
    """An exclusive flock on `path` (a file in the campaign's folder); a wait says why on
    stderr and stays interruptible (Ctrl-C)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"rsi: waiting: {waiting}", file=sys.stderr, flush=True)
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
