"""The one exception type for mistakes a user can fix: the command line prints its message in one line
and exits with status 2, never with a traceback."""


class UserError(ValueError):
    """Bad input, named with what is wrong and how to fix it."""


class RunError(UserError):
    """A run that could not start or finish for a reason the user can fix; the message says which."""


class ConfigError(UserError):
    """A user mistake in the configuration; the message is one sentence saying what to change."""


class StorageError(RunError, OSError):
    """A write the file system refused for a reason the user can fix (no space left, a read-only file system);
    the message names the path and what was being written. Whatever was stored before is intact: every write is
    atomic, so the failed one left nothing behind. Also an ``OSError``, as the error it replaces was: code that
    treats a failed write as optional (the buffer catalog, a monitor) still does.

    ``fault`` says what happened to which file; the message adds what to do about it (for a run: resume it)."""

    def __init__(self, fault: str, advice: str = "") -> None:
        super().__init__(f"{fault}; {advice}" if advice else fault)
        self.fault = fault


class DiskFullError(StorageError):
    """No space left on the device (or over the disk quota) while writing."""
