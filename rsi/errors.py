"""The one exception root of rsi and its families. It must never import another rsi module.

Every error a person can see carries what they need to act on it: the file, the target and the
field at fault, and what to do next. Exit codes live here so the CLI and docs agree.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_BUILD_FAILED = 1
EXIT_USAGE = 2


class RsiError(Exception):
    """Root of every error rsi raises on purpose."""

    exit_code = EXIT_BUILD_FAILED

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\n  hint: {self.hint}"


class UsageError(RsiError):
    """The command line was wrong."""

    exit_code = EXIT_USAGE


class DeclarationError(RsiError):
    """A declaration file is wrong; names the file, the target and the field."""

    exit_code = EXIT_USAGE

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        target: str | None = None,
        field: str | None = None,
        hint: str | None = None,
    ) -> None:
        where = ":".join(p for p in (file,) if p)
        parts = []
        if where:
            parts.append(where)
        if target:
            parts.append(f"target '{target}'")
        if field:
            parts.append(f"field '{field}'")
        prefix = ", ".join(parts)
        super().__init__(f"{prefix}: {message}" if prefix else message, hint=hint)
        self.detail = message  # NB: without the file/target/field prefix, to re-attribute it
        self.file = file
        self.target = target
        self.field = field


class LabelError(UsageError):
    """A label or pattern could not be parsed or resolved."""


class StoreError(RsiError):
    """The local store cannot be read or written (full disk, permissions, wrong digest function)."""


class CorruptEntry(StoreError):
    """A blob or action result failed verification; it is removed and never served."""


class ExecutionError(RsiError):
    """An action could not be run for a reason outside the action itself (infrastructure)."""


class RemoteError(RsiError):
    """A remote cache or execution service failed or could not be reached."""


def not_writable(exc: OSError) -> RsiError | None:
    """A folder rsi could not write or read (a read-only mount, an immutable folder, a mode
    closed to this user) met after the up-front checks, as one clean error (exit 2) naming
    the path; None for any other OSError, which stays what it is."""
    import errno

    if exc.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
        return None
    where = exc.filename or "a file"
    return DeclarationError(
        f"cannot write {where}: {exc.strerror or exc}",
        file=str(where) if exc.filename else None,
        hint="a read-only mount or an immutable folder (`lsattr`)? make it writable, or point "
        "rsi elsewhere (`store` in rsi.toml, --store)",
    )
