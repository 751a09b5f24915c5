"""The two ways a validation ends without numbers: the command was called wrongly (exit 2, one
line) or a run (a rank, a worker process) failed (exit 2, with that run's error)."""

from __future__ import annotations


class ValidateUsageError(Exception):
    """Bad arguments, a factory that cannot be imported, called, or fed the input shape."""


class RunFailed(Exception):
    """A rank or worker process failed, hung past its timeout, or produced no result.

    `detail` holds the failing run's traceback (shown after the one-line message)."""

    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__(message)
        self.detail = detail
