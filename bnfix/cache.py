"""The findings cache (`.bnfix_cache/`, like ruff's): a file whose size and modification time, or
content hash, are unchanged since the last run with the same bnfix version, rule book and
configuration is not analysed again. The cache is plain JSON, never pickle: a cache file that
came with a repository must not be able to run code."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bnfix import __version__
from bnfix.engine import Diagnostic, diagnostic_from_dict, diagnostic_to_dict

CACHE_DIR = ".bnfix_cache"
FORMAT = 1


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def cache_key(rules_digest: str, enabled: frozenset[str], targets: dict[str, tuple[int, ...]]) -> str:
    """What the cached findings depend on besides the file itself."""
    parts = [__version__, str(FORMAT), rules_digest, ",".join(sorted(enabled)),
             json.dumps({k: list(v) for k, v in sorted(targets.items())})]
    return digest("\n".join(parts).encode())


def rules_digest(folder: Path) -> str:
    """A digest of the rule book's files: editing a rule or the catalogue empties the cache."""
    h = hashlib.sha256()
    for path in sorted(folder.rglob("*.toml")):
        h.update(path.relative_to(folder).as_posix().encode())
        h.update(path.read_bytes())
    return h.hexdigest()


@dataclass
class Entry:
    mtime_ns: int
    size: int
    digest: str
    ignored: tuple[str, ...]
    diagnostics: list[dict[str, Any]]


class Cache:
    def __init__(self, root: Path, key: str) -> None:
        self.folder = root / CACHE_DIR
        self.path = self.folder / f"{key[:24]}.json"
        self.entries: dict[str, Entry] = {}
        self.changed: dict[str, Entry] = {}
        self._load()

    def _load(self) -> None:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            files = data["files"] if data.get("format") == FORMAT else {}
            self.entries = {}
            for name, fields in files.items():
                entry = Entry(**fields)
                entry.ignored = tuple(entry.ignored)
                self.entries[name] = entry
        except (OSError, ValueError, KeyError, TypeError):
            self.entries = {}  # no cache yet, or an unreadable one: analyse everything

    @staticmethod
    def name(path: Path) -> str:
        return os.path.abspath(path)  # not realpath: resolving links costs a stat per component

    def lookup(self, path: Path, ignored: frozenset[str]) -> tuple[Entry | None, bool]:
        """The entry for `path` and whether its size and mtime still match (then the file need
        not even be read)."""
        entry = self.entries.get(self.name(path))
        if entry is None or entry.ignored != tuple(sorted(ignored)):
            return None, False
        try:
            st = path.stat()
        except OSError:
            return None, False
        return entry, (st.st_mtime_ns, st.st_size) == (entry.mtime_ns, entry.size)

    @staticmethod
    def diagnostics(entry: Entry, shown: str) -> list[Diagnostic]:
        return [diagnostic_from_dict(d, shown) for d in entry.diagnostics]

    def store(self, path: Path, data_digest: str, ignored: frozenset[str],
              diagnostics: list[Diagnostic]) -> None:
        try:
            st = path.stat()
        except OSError:
            return
        entry = Entry(st.st_mtime_ns, st.st_size, data_digest, tuple(sorted(ignored)),
                      [diagnostic_to_dict(d) for d in diagnostics])
        self.changed[self.name(path)] = entry

    def save(self) -> None:
        """Merge this run's entries into the file (another bnfix process, e.g. a parallel
        pre-commit chunk, may have written it meanwhile) and replace it atomically."""
        if not self.changed:
            return
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            ignore = self.folder / ".gitignore"
            if not ignore.exists():
                ignore.write_text("# created by bnfix\n*\n", encoding="utf-8")
            self._load()
            self.entries.update(self.changed)
            payload = {"format": FORMAT, "files": {k: vars(v) for k, v in self.entries.items()}}
            fd, tmp = tempfile.mkstemp(prefix=".cache.", dir=self.folder)
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(payload, fh, separators=(",", ":"))
            os.replace(tmp, self.path)
        except OSError:
            return  # a read-only checkout: run without a cache rather than fail
