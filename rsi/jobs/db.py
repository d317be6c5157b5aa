"""The jobs database: one SQLite file in the store (`<store>/jobs/jobs.db`), in WAL mode with a
busy timeout, so any number of `rsi job` clients and runners read and write it at once. Every
write is one `BEGIN IMMEDIATE` transaction (writers queue, readers never block); the runner's
heartbeat is one small update.

States a job record holds: `queued` (submitted, its runner not started yet), `running`,
`succeeded`, `failed`, `stopped` (a budget was reached: `stop_reason` names it), `cancelled`.
`interrupted` is never written: it is what a `queued` or `running` record whose runner is gone
(killed, the machine rebooted) reads as (`rsi.jobs.service.effective_state`).
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

SCHEMA_VERSION = 1
TERMINAL = ("succeeded", "failed", "stopped", "cancelled")
LIVE = ("queued", "running")
# NB: states a second submit with the same inputs attaches to (a failed, stopped or cancelled
# job is submitted anew)
ATTACHABLE = ("queued", "running", "succeeded")

_COLUMNS = {
    "id": "TEXT PRIMARY KEY",
    "seq": "INTEGER",
    "key": "TEXT NOT NULL",
    "kind": "TEXT NOT NULL",
    "spec": "TEXT NOT NULL",
    "workspace": "TEXT NOT NULL",
    "settings": "TEXT NOT NULL",
    "state": "TEXT NOT NULL",
    "stop_reason": "TEXT",
    "detail": "TEXT",
    "profile_name": "TEXT",
    "profile_path": "TEXT",
    "profile_digest": "TEXT",
    "profile": "TEXT",
    "submitted_at": "REAL",
    "submitted_by": "TEXT",
    "first_started_at": "REAL",
    "started_at": "REAL",
    "finished_at": "REAL",
    "heartbeat_at": "REAL",
    "runner_pid": "INTEGER",
    "runner_start": "INTEGER",
    "runner_pids": "TEXT",
    "boot_id": "TEXT",
    "host": "TEXT",
    "containment": "TEXT",
    "cgroups": "TEXT",
    "action_cgroups": "TEXT",
    "starts": "INTEGER DEFAULT 0",
    "cancel_requested_at": "REAL",
    "cancelled_by": "TEXT",
    "cancelled_at": "REAL",
    "cancel_report": "TEXT",
    "usage": "TEXT",
    "result": "TEXT",
    "artifacts": "TEXT",
    "events": "TEXT",
    "exit_code": "INTEGER",
}
JSON_COLUMNS = (
    "spec",
    "settings",
    "profile",
    "runner_pids",
    "cgroups",
    "action_cgroups",
    "cancel_report",
    "usage",
    "result",
    "artifacts",
)


def jobs_dir(store_root: Path) -> Path:
    return Path(store_root) / "jobs"


class JobDB:
    """The jobs table of one store. Opened per use; cheap (no pool)."""

    def __init__(self, store_root: Path) -> None:
        self.dir = jobs_dir(store_root)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / "jobs.db"
        self.conn = sqlite3.connect(self.path, timeout=60, isolation_level=None)
        self.conn.row_factory = sqlite3.Row
        self.conn.execute("PRAGMA busy_timeout = 60000")
        self._init()

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> "JobDB":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _init(self) -> None:
        for attempt in range(100):
            try:
                mode = self.conn.execute("PRAGMA journal_mode").fetchone()[0]
                if mode != "wal":
                    self.conn.execute("PRAGMA journal_mode = WAL")
                self.conn.execute("PRAGMA synchronous = NORMAL")
                if self.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION:
                    return
                with self.tx():
                    if self.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION:
                        return
                    cols = ", ".join(f"{k} {v}" for k, v in _COLUMNS.items())
                    self.conn.execute(f"CREATE TABLE IF NOT EXISTS jobs ({cols})")
                    self.conn.execute("CREATE INDEX IF NOT EXISTS jobs_key ON jobs(key)")
                    self.conn.execute("CREATE INDEX IF NOT EXISTS jobs_seq ON jobs(seq)")
                    self.conn.execute(
                        "CREATE TABLE IF NOT EXISTS profiles (digest TEXT PRIMARY KEY, "
                        "name TEXT, path TEXT, first_seen REAL, text BLOB)"
                    )
                    self.conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
                return
            except sqlite3.OperationalError as exc:
                # NB: "database is locked" past the busy timeout while another client creates
                # it, or switches it to WAL: try again
                if "locked" not in str(exc) or attempt == 99:
                    raise
                time.sleep(0.05)

    @contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, taken at once (BEGIN IMMEDIATE): concurrent writers queue
        on the busy timeout instead of failing on a lock upgrade."""
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield self.conn
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")

    # ------------------------------------------------------------------------- records
    @staticmethod
    def _encode(fields: dict[str, Any]) -> dict[str, Any]:
        out = {}
        for k, v in fields.items():
            if k not in _COLUMNS:
                raise KeyError(f"no job field {k!r}")
            out[k] = json.dumps(v, sort_keys=True, default=str) if k in JSON_COLUMNS else v
        return out

    @staticmethod
    def decode(row: sqlite3.Row | None) -> dict | None:
        if row is None:
            return None
        doc = dict(row)
        for k in JSON_COLUMNS:
            if doc.get(k) is not None:
                doc[k] = json.loads(doc[k])
        return doc

    def insert(self, conn: sqlite3.Connection, fields: dict[str, Any]) -> None:
        enc = self._encode(fields)
        seq = conn.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM jobs").fetchone()[0]
        enc["seq"] = seq
        names = ", ".join(enc)
        marks = ", ".join("?" for _ in enc)
        conn.execute(f"INSERT INTO jobs ({names}) VALUES ({marks})", list(enc.values()))

    def update(self, job_id: str, **fields: Any) -> None:
        with self.tx() as conn:
            self.update_in(conn, job_id, **fields)

    def update_in(self, conn: sqlite3.Connection, job_id: str, **fields: Any) -> None:
        enc = self._encode(fields)
        sets = ", ".join(f"{k} = ?" for k in enc)
        conn.execute(f"UPDATE jobs SET {sets} WHERE id = ?", [*enc.values(), job_id])

    def get(self, job_id: str) -> dict | None:
        row = self.conn.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return self.decode(row)

    def find(self, prefix: str) -> list[dict]:
        """Jobs whose id starts with `prefix` (the whole id is one)."""
        exact = self.get(prefix)
        if exact is not None:
            return [exact]
        rows = self.conn.execute(
            "SELECT * FROM jobs WHERE id LIKE ? ESCAPE '\\' ORDER BY seq",
            (prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%",),
        ).fetchall()
        return [self.decode(r) for r in rows]  # type: ignore[misc]

    def by_key(self, conn: sqlite3.Connection, key: str) -> list[dict]:
        rows = conn.execute("SELECT * FROM jobs WHERE key = ? ORDER BY seq", (key,)).fetchall()
        return [self.decode(r) for r in rows]  # type: ignore[misc]

    def all(self, limit: int | None = None) -> list[dict]:
        sql = "SELECT * FROM jobs ORDER BY seq DESC"
        if limit:
            sql += f" LIMIT {int(limit)}"
        return [self.decode(r) for r in self.conn.execute(sql).fetchall()]  # type: ignore[misc]

    def remember_profile(self, conn: sqlite3.Connection, profile: Any) -> None:
        conn.execute(
            "INSERT OR IGNORE INTO profiles (digest, name, path, first_seen, text) "
            "VALUES (?, ?, ?, ?, ?)",
            (profile.digest, profile.name, profile.path, time.time(), profile.text),
        )

    def profiles(self) -> list[dict]:
        rows = self.conn.execute(
            "SELECT digest, name, path, first_seen FROM profiles ORDER BY first_seen"
        ).fetchall()
        return [dict(r) for r in rows]

    def integrity(self) -> str:
        return self.conn.execute("PRAGMA integrity_check").fetchone()[0]


def job_dir(store_root: Path, job_id: str) -> Path:
    return jobs_dir(store_root) / job_id


def who() -> str:
    """`user@host (pid N)` of the calling process, for the record."""
    import getpass
    import socket

    try:
        user = getpass.getuser()
    except Exception:  # noqa: BLE001 - NB: no passwd entry: the uid says it
        user = f"uid {os.getuid()}"
    return f"{user}@{socket.gethostname()} (pid {os.getpid()})"
