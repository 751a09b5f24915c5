"""Reading and parsing a source file, with the two ways that can fail as plain sentences:
BN901 (cannot read or decode) and BN900 (does not parse, Python 2 named as such)."""

from __future__ import annotations

import os
import re
import stat
import sys
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    import ast

# what marks a line that does not parse as Python 2 (compiled when one is met)
_PY2_HINTS = (
    (r"^\s*print\s+[^\s(=]", "a `print` statement"),
    (r"^\s*exec\s+[\"'\w]", "an `exec` statement"),
    (r"except\s+[\w.]+\s*,\s*\w+\s*:", "`except X, e:`"),
    (r"^\s*raise\s+[\w.]+\s*,", "`raise X, msg`"),
    (r"\b0[0-7]+\b", "an old-style octal literal"),
    (r"\b(?:0[xX][0-9a-fA-F]+|\d+)[lL]\b", "a `long` literal (`10L`)"),
    (r"\bur[\"']", "a `ur''` string"),
    (r"<>", "the `<>` operator"),
    (r"`[^`]+`", "backtick repr"),
)

# `async` and `await` became keywords in Python 3.7: code of 3.6 and earlier used them as names
# (torch 0.3's `.cuda(async=True)`, now `non_blocking=True`)
_ASYNC_NAME = re.compile(r"(?<![\w.])(?:async|await)\s*=(?!=)|\.(?:async|await)\b|"
                         r"\bdef\s+(?:async|await)\b")


class SourceError(Exception):
    """A file bnfix cannot analyse: `code` is BN900 or BN901, `row`/`col` where known."""

    def __init__(self, code: str, message: str, row: int = 1, col: int = 0) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.row = row
        self.col = col


class Decoded(NamedTuple):
    """A file's text and the encoding it was read with (kept for writing it back)."""

    text: str
    encoding: str  # as declared or detected; `utf-8-sig` keeps a BOM on write-back


def decode(data: bytes) -> Decoded:
    """Decode with the PEP 263 cookie / BOM, as the interpreter would."""
    import io
    import tokenize  # here: a run whose files all come from the cache reads none

    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError as exc:
        if "unknown encoding" in str(exc):
            raise SourceError("BN901", f"{exc}; declare a codec Python knows") from exc
        encoding = "utf-8"  # undecodable bytes in the first two rows: located below
    try:
        return Decoded(data.decode(encoding), encoding)
    except UnicodeDecodeError as exc:
        row = data[: exc.start].count(b"\n") + 1
        raise SourceError(
            "BN901",
            f"not valid {encoding} (byte 0x{data[exc.start]:02x} at offset {exc.start}); "
            "declare the encoding with a `# -*- coding: ... -*-` line or re-save as UTF-8",
            row,
        ) from exc
    except LookupError as exc:
        raise SourceError("BN901", f"unknown encoding `{encoding}` declared") from exc


def parse(text: str, path: str) -> ast.Module:
    import ast  # here: a run whose files all come from the cache parses none

    try:
        return ast.parse(text, filename=path)
    except SyntaxError as exc:
        row, col = exc.lineno or 1, max((exc.offset or 1) - 1, 0)
        line = (exc.text or "").rstrip("\n")
        hint = python2_hint(exc.msg, line)
        if hint:
            message = (f"Python 2 source ({hint}): bnfix analyses Python 3; port it "
                       "(e.g. with 2to3 or pyupgrade) or exclude the file")
        elif _ASYNC_NAME.search(line.split("#", 1)[0]):
            message = ("Python 3.6 source (`async` or `await` as a name, keywords since Python "
                       "3.7): bnfix analyses Python 3.7 and later; rename it (torch's "
                       "`.cuda(async=True)` is `.cuda(non_blocking=True)`) or exclude the file")
        else:
            version = f"{sys.version_info.major}.{sys.version_info.minor}"
            message = (f"syntax error (parsed as Python {version}): {exc.msg}"
                       + (f": `{line.strip()}`" if line.strip() else ""))
        raise SourceError("BN900", message, row, col) from exc
    except (ValueError, RecursionError, MemoryError) as exc:
        raise SourceError("BN900", f"cannot parse: {_reason(exc)}") from exc


def _reason(exc: BaseException) -> str:
    """Why CPython's parser gave up, never empty (its MemoryError on deep nesting has no
    message)."""
    if isinstance(exc, RecursionError):
        return (f"nested too deeply for Python's parser (RecursionError: {exc}); simplify the "
                "nesting or exclude the file")
    if isinstance(exc, MemoryError):
        return ("Python's parser ran out of memory (MemoryError), usually from nesting too deep "
                "for it; simplify the nesting or exclude the file")
    return str(exc) or type(exc).__name__


def python2_hint(message: str, line: str) -> str | None:
    """What marks the failing line as Python 2, if anything does."""
    if "Missing parentheses in call to 'print'" in message:
        return "a `print` statement"
    if "Missing parentheses in call to 'exec'" in message:
        return "an `exec` statement"
    if "inconsistent use of tabs and spaces" in message:
        return "tabs and spaces mixed in its indentation, which only Python 2 ran"
    code = line.split("#", 1)[0]
    for pattern, what in _PY2_HINTS:
        if re.search(pattern, code):
            return what
    return None


# Larger "source" files are generated data. The largest .py files met in a site-packages of
# 12,426 of them (tensorflow, torch, keras, libcst ...): 1.38 MB hand-written (torch's
# common_methods_invocations.py), 0.68 MB generated (tensorflow's gen_*_ops.py).
DEFAULT_MAX_FILE_BYTES = 2 * 1024 * 1024
UNLIMITED = 1 << 62  # no size limit (`max-file-size = 0`)


class Skipped(Exception):
    """A file bnfix does not analyse on purpose (too large): one line, not a finding."""


def read_source(path: str | os.PathLike[str], max_bytes: int = DEFAULT_MAX_FILE_BYTES) -> bytes:
    """The bytes of a regular file. FIFOs, devices and sockets (also behind a symlink) are
    refused without blocking — the descriptor is opened non-blocking and checked with fstat —
    and a file larger than `max_bytes` is skipped before it is read."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise SourceError("BN901", f"cannot read: {exc.strerror or exc}") from exc
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise SourceError("BN901", f"cannot read: {_kind(info.st_mode)}, not a regular file")
        if info.st_size > max_bytes:
            raise Skipped(f"skipped: {info.st_size} bytes > max-file-size ({max_bytes} bytes); "
                          "raise it with --max-file-size or `max-file-size` in [tool.bnfix] "
                          "to check it")
        chunks = []
        left = max_bytes + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        if len(data) > max_bytes:  # grew while being read
            raise Skipped(f"skipped: more than max-file-size ({max_bytes} bytes) when read")
        return data
    except OSError as exc:
        raise SourceError("BN901", f"cannot read: {exc.strerror or exc}") from exc
    finally:
        os.close(fd)


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a special file"
