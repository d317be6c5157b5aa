"""What makes a folder a store: its marker (`STORE.json`), claiming an empty folder, and why a
folder can be neither used nor written. Must never write into a folder that holds anything but
a store (rsi deletes files in its store) and never open blobs or entries (that is `store.py`)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from rsi.errors import EXIT_USAGE, StoreError
from rsi.fsutil import atomic_write_bytes, store_write_error

STORE_SCHEMA = "rsi.store/1"
STORE_MARKER = "STORE.json"
# NB: files an empty folder may hold in a repository (the default `cache/` ships with one);
# rsi never touches them
_PLACEHOLDERS = frozenset({".gitkeep", ".gitignore", ".keep"})


def marker_bytes(function: str | None) -> bytes:
    doc = {"schema": STORE_SCHEMA}
    if function is not None:
        doc["digest_function"] = function
    return json.dumps(doc).encode()


def claim_store(root: Path, function: str | None = None) -> None:
    """Make `root` a store before anything is written under it (StoreRefused when it may not
    be one): every writer into a store folder, not only `LocalStore`, calls this first."""
    root = Path(root)
    problem = store_folder_problem(root)
    if problem is not None:
        raise StoreRefused(
            f"{root} cannot be used as the store: {problem}",
            hint="point the store at a new or empty folder (rsi.toml `store`, or --store)",
        )
    meta = root / STORE_MARKER
    if meta.exists():
        return
    try:
        # NB: the marker first, so a folder rsi starts to fill is recognisably a store
        root.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(meta, marker_bytes(function))
    except OSError as exc:
        raise store_write_error(root, exc) from exc


class StoreRefused(StoreError):
    """The configured folder cannot be a store (not empty and not an rsi store)."""

    exit_code = EXIT_USAGE


def store_folder_problem(root: Path) -> str | None:
    """Why `root` cannot be used as a store, or None: it may be absent, empty, or a store.

    rsi writes and deletes files under its store, so a folder holding anything else (and no
    STORE.json) is refused rather than adopted.
    """
    try:
        entries = [
            e for e in os.listdir(root) if not e.startswith(".tmp-") and e not in _PLACEHOLDERS
        ]
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        return "it is a file, not a folder"
    except OSError as exc:
        return f"it cannot be read ({exc.strerror or exc})"
    if STORE_MARKER not in entries:
        if not entries:
            return None  # NB: `.tmp-*`: another rsi is creating this store right now
        shown = ", ".join(sorted(entries)[:3]) + (", ..." if len(entries) > 3 else "")
        return (
            f"it is not empty ({shown}) and is not an rsi store (no {STORE_MARKER}); rsi "
            "deletes files in its store, so it only uses an empty folder or one it created"
        )
    try:
        doc = json.loads((root / STORE_MARKER).read_bytes())
        schema = doc.get("schema") if isinstance(doc, dict) else None
    except (OSError, ValueError) as exc:
        return f"its {STORE_MARKER} is unreadable ({exc})"
    if schema == STORE_SCHEMA:
        return None
    if isinstance(schema, str) and schema.startswith("rsi.store/"):
        return f"another version of rsi wrote it (schema {schema}; this rsi reads {STORE_SCHEMA})"
    return f"its {STORE_MARKER} is not an rsi store marker (schema {schema!r})"


# NB: the folders of a store a build writes in (checked by name: a listing costs more); a rule
# family's own folders (the campaign logs) are its business: the engine names none of them
WRITTEN_FOLDERS = (
    "cas",
    "ac",
    "targets",
    "tmp",
    "roots",
    "events",
    "analysis",
    "toolchains",
    "locks",  # NB: the outputs lock of each workspace (rsi/wslock.py)
    "stage",  # NB: prepared input trees (rsi/executors/staged.py)
)


def folder_write_problem(
    root: str | os.PathLike, what: str = "it", inside: tuple[str, ...] = WRITTEN_FOLDERS
) -> str | None:
    """Why rsi could not write under `root` (a store, or `out/`), or None: the folder, the
    folders `inside` it that exist, or where it is to be made, is read-only (a read-only mount, an
    immutable folder: root bypasses modes but not these) or closed to this user. Checked
    before a build writes anything, so a refusal leaves nothing half written. (A file where
    the folder should be is left to `store_folder_problem`.)"""
    want = os.R_OK | os.W_OK | os.X_OK
    top = here = os.fspath(root)
    while not os.path.lexists(here):
        parent = os.path.dirname(here)
        if parent == here:
            return None
        here = parent
        what = f"the folder it would be made in ({here})"
    if not os.path.isdir(here):
        return None
    folders = [here]
    if here == top:
        folders += [os.path.join(here, name) for name in inside]
    for folder in folders:
        if os.access(folder, want) or (folder != here and not os.path.lexists(folder)):
            continue
        try:
            read_only = bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
        except OSError:
            read_only = False
        if read_only:
            why = "on a read-only file system"
        elif os.access(folder, os.R_OK | os.X_OK):
            why = "not writable (an immutable folder, or its mode)"
        else:
            why = "not readable by this user"
        return f"{what if folder == here else folder} is {why}"
    return None
