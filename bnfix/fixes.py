"""Writing a fixed file back (`bnfix fix`).

A fix is written only over the bytes it was computed from: just before the file is replaced,
its content is read again and compared with the digest of what was analysed, so an edit saved
meanwhile (by an editor, or by another `bnfix fix` with other rules) is never overwritten — the
file is left as it is and the run says so. A read-only file is reported, not replaced.

The new content goes to a temporary file in the same folder, which gets the file's mode, owner
and group and is renamed over it: a reader sees the old file or the new one, never a mixture,
and an interrupted run leaves every file whole. Two kinds of file cannot be replaced that way
without changing what they are: a file with several hard links (a rename would split them) and
one whose owner or group the temporary file cannot be given (not running as its owner); those
are rewritten in place, after the same digest check, with SIGINT and SIGTERM held off during
the rewrite. Temporary names are shortened to fit NAME_MAX; those a killed run left behind
(`.NAME.xxxxxxxx.bnfix`, ours, older than this run) are removed from the folders bnfix writes.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import signal
import stat
import time
from collections.abc import Iterator
from pathlib import Path

from bnfix.atomic import RANDOM, temporary_file
from bnfix.source.reader import UNLIMITED, Skipped, SourceError, read_source

TEMP_SUFFIX = ".bnfix"
# `.NAME.` + 8 random characters (atomic.RANDOM) + `.bnfix`: nothing else is ever removed
_TEMP_NAME = re.compile(r"\..+\.[a-z0-9_]{8}\.bnfix", re.DOTALL)
STALE_TEMP_SECONDS = 60  # a temporary file older than the run by this much was left by a kill
NAME_MAX = 255
_FLAGS = getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)  # a FIFO never blocks


class NotWritten(Exception):
    """The file was left as it is; the message says why (one clause, no path)."""


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def current_digest(path: Path) -> str | None:
    """The digest of what `path` holds now (opened again by name: an editor that saved by
    renaming a new file over it is seen); None when it is not a readable regular file."""
    try:
        return digest(read_source(path, UNLIMITED))
    except (SourceError, Skipped):
        return None


class Writer:
    """Writes the fixed files of one run."""

    def __init__(self, started: float | None = None) -> None:
        self.started = time.time() if started is None else started
        self.cleaned: set[str] = set()  # folders already cleared of stale temporary files

    def write(self, path: Path, text: str, encoding: str, analysed: str) -> str:
        """Replace the file's content with `text` if it still has the digest `analysed`;
        returns the digest of what was written. Raises NotWritten (left unchanged, with why),
        OSError or UnicodeEncodeError (nothing written either)."""
        target = Path(os.path.realpath(path))  # a symlink keeps pointing at its target
        data = text.encode(encoding)
        self.clean(target.parent)
        info = os.stat(target)
        if not stat.S_ISREG(info.st_mode):
            raise NotWritten("it is no longer a regular file")
        if not info.st_mode & 0o222 or not os.access(target, os.W_OK):
            raise NotWritten(f"it is read-only (mode {stat.S_IMODE(info.st_mode):04o}); make it "
                             "writable to fix it")
        if info.st_nlink > 1 or not self._replace(target, data, info, analysed):
            self._rewrite(target, data, analysed)
        return digest(data)

    def _replace(self, target: Path, data: bytes, info: os.stat_result, analysed: str) -> bool:
        """Write a temporary file with the file's mode, owner and group, then rename it over
        the file (after the digest check). False when the owner or group cannot be given to
        it (then nothing was changed)."""
        tmp_fd, tmp = temporary_file(target.parent, temp_prefix(target), TEMP_SUFFIX)
        try:
            with os.fdopen(tmp_fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            mine = os.stat(tmp)
            if (mine.st_uid, mine.st_gid) != (info.st_uid, info.st_gid):
                try:
                    os.chown(tmp, info.st_uid, info.st_gid)
                except PermissionError:
                    os.unlink(tmp)
                    return False
            os.chmod(tmp, stat.S_IMODE(info.st_mode))  # after chown, which clears set-id bits
            if current_digest(target) != analysed:  # as late as possible: just before
                raise NotWritten(_CHANGED)
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        return True

    def _rewrite(self, target: Path, data: bytes, analysed: str) -> None:
        """Overwrite the file in place (its inode, links, owner and mode stay), after the
        digest check; SIGINT/SIGTERM wait until the content is whole again."""
        fd = os.open(target, _FLAGS | os.O_RDWR)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise NotWritten("it is no longer a regular file")
            original = _read_all(fd)
            if current_digest(target) != analysed or digest(original) != analysed:
                raise NotWritten(_CHANGED)
            with _signals_held():
                try:
                    _write_all(fd, data)
                    os.fsync(fd)
                except OSError:
                    _write_all(fd, original)  # e.g. the disk filled up: put the old bytes back
                    raise
        finally:
            os.close(fd)

    def clean(self, folder: Path) -> None:
        """Remove bnfix's own temporary files that a killed run left in `folder`: regular
        files named like ours, owned by this user, last written before this run began."""
        key = str(folder)
        if key in self.cleaned:
            return
        self.cleaned.add(key)
        try:
            entries = list(os.scandir(folder))
        except OSError:
            return
        uid = os.geteuid() if hasattr(os, "geteuid") else None
        for entry in entries:
            if not entry.name.endswith(TEMP_SUFFIX) or not _TEMP_NAME.fullmatch(entry.name):
                continue
            try:
                info = entry.stat(follow_symlinks=False)
                if stat.S_ISREG(info.st_mode) and (uid is None or info.st_uid == uid) and \
                        info.st_mtime < self.started - STALE_TEMP_SECONDS:
                    os.unlink(entry.path)
            except OSError:
                continue


_CHANGED = ("the file changed after bnfix read it (saved by an editor, or by another bnfix "
            "run?); run bnfix fix again")


def temp_prefix(target: Path) -> str:
    """`.NAME.`, NAME shortened so that the temporary name fits the folder's NAME_MAX."""
    try:
        name_max = os.pathconf(target.parent, "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):
        name_max = NAME_MAX
    room = name_max - len(".") - len(".") - RANDOM - len(TEMP_SUFFIX)
    name = target.name
    while len(os.fsencode(name)) > room:
        name = name[:-1]
    return f".{name}."


def _read_all(fd: int) -> bytes:
    os.lseek(fd, 0, os.SEEK_SET)
    chunks = []
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _write_all(fd: int, data: bytes) -> None:
    os.lseek(fd, 0, os.SEEK_SET)
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        if written == 0:
            raise OSError(errno.EIO, "short write")
        view = view[written:]
    os.ftruncate(fd, len(data))


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM are delivered after the block, not inside it."""
    held = {signal.SIGINT, signal.SIGTERM}
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
