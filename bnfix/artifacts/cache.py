"""The inspect cache: per artifact, its findings and its `full` table, reused while every file
the artifact is made of (`bnfix.artifacts.parts`) keeps its size, modification time, inode and
change time. A run whose artifacts are all cached reads none of them and imports no framework.

It lives beside `check`'s cache (`.bnfix_cache/`, `cache-dir`, BNFIX_CACHE_DIR) in a file of
its own, `inspect-<key>.json`. The key covers the bnfix version, a digest of bnfix's code and
rule book (all of it: the readers reach into the TF-graph, ONNX and torch packages), the
installed versions of the libraries the readers use (an upgrade may read what the old version
refused; installing a missing one counts), the enabled artifact rules, `--allow-pickle` and
`--max-tensor-bytes`; an entry also records the rules its artifact was checked with
(`per-file-ignores` differ per file), the reader and the path as given (findings and tables
name it).

What is stored is what was read: the files are stat-ed before the read and again after it, and
an artifact whose files changed meanwhile is not stored. As in `check`'s cache, an entry whose
files were modified (or had their metadata changed) within 2 s of the run is stored *racy*: an
edit in the same clock tick keeps size and time, so a racy entry is never served — the next run
reads the artifact again (no content digest: that would read a multi-gigabyte checkpoint as far
as reading its BN tensors does).

Only artifacts that were read are stored: never an internal error (a bug of bnfix's, to be
reported again), and never BN902. An unreadable artifact is one to act on, the readers refuse it
early (magic bytes, declared sizes), and its cause is often outside the files (permissions of a
folder, memory, a library error that says neither): a cached BN902 could outlive its cause with
no stat to tell. So inspecting only broken or hostile files writes nothing.

Plain JSON read as a regular file only (a FIFO planted there does not block), bounded, every
entry checked for shape; a malformed file or entry is ignored. Written atomically, merged with
what another run wrote meanwhile; entries found stale, and those of artifacts none of whose files
exist any more, are dropped.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bnfix import __version__
from bnfix.artifacts.discover import Candidate
from bnfix.artifacts.model import ArtifactFinding
from bnfix.artifacts.parts import Stat, listed, stat
from bnfix.artifacts.table import Table
from bnfix.cache import (
    CACHE_DIR,
    MAX_CACHE_BYTES,
    RACY_NS,
    mark_used,
    prepare_folder,
    prune_other_keys,
    write_json,
)
from bnfix.source.reader import Skipped, SourceError, read_source

FORMAT = 1
PREFIX = "inspect-"
# the distributions whose code reads artifacts (TensorFlow under its several names)
LIBRARIES = ("torch", "tensorflow", "tensorflow-cpu", "tensorflow-macos", "tf-keras", "keras",
             "h5py", "onnx", "protobuf", "numpy")


def code_digest() -> str:
    """A digest of every module and rule file of the installed bnfix."""
    package = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for path in sorted([*package.rglob("*.py"), *package.rglob("*.toml")]):
        try:
            data = path.read_bytes()
        except OSError:
            continue
        h.update(path.relative_to(package).as_posix().encode())
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()


def library_versions() -> str:
    """The installed versions of LIBRARIES, from their metadata (nothing is imported)."""
    from importlib import metadata

    versions = []
    for name in LIBRARIES:
        try:
            versions.append(f"{name}={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            versions.append(f"{name}=-")
    return ",".join(versions)


def cache_key(enabled: frozenset[str], allow_pickle: bool, max_tensor_bytes: int) -> str:
    parts = [__version__, str(FORMAT), code_digest(), library_versions(),
             ",".join(sorted(enabled)), str(allow_pickle), str(max_tensor_bytes)]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def cache_folder(root: Path, configured: Path | None) -> Path:
    """Where `check` keeps its cache: BNFIX_CACHE_DIR, then `cache-dir`, then .bnfix_cache/."""
    env = os.environ.get("BNFIX_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    return configured if configured is not None else root / CACHE_DIR


@dataclass
class Entry:
    reader: str
    shown: str                        # the path as given: findings and the table name it
    codes: tuple[str, ...]            # the rules the artifact was checked with
    files: dict[str, Stat]            # every file it is made of, stat-ed before the read
    findings: list[ArtifactFinding]
    table: Table
    racy: bool


class InspectCache:
    def __init__(self, folder: Path, key: str, read: bool = True) -> None:
        self.folder = folder
        self.path = folder / f"{PREFIX}{key[:24]}.json"
        self.started_ns = time.time_ns()
        self.entries: dict[str, Entry] = _load(self.path) if read else {}
        if self.entries:
            mark_used(self.path)
        self.changed: dict[str, Entry] = {}
        self.stale: set[str] = set()  # entries whose files changed: dropped when saved

    @staticmethod
    def name(candidate: Candidate) -> str:
        return os.path.abspath(candidate.path)

    def lookup(self, candidate: Candidate, codes: frozenset[str]) -> Entry | None:
        """The entry for `candidate` while its files are unchanged; None otherwise."""
        entry = self.entries.get(self.name(candidate))
        if entry is None or entry.reader != candidate.reader or entry.shown != candidate.path \
                or entry.codes != tuple(sorted(codes)):
            return None
        if entry.racy or any(stat(path) != before for path, before in entry.files.items()) or \
                not {os.path.abspath(path) for path in listed(candidate)} <= entry.files.keys():
            # changed, or a file joined the artifact (a new shard, a checkpoint beside a .meta)
            self.stale.add(self.name(candidate))
            return None
        return entry

    def store(self, candidate: Candidate, codes: frozenset[str], before: Mapping[str, Stat],
              findings: list[ArtifactFinding], table: Table) -> None:
        """Remember what reading `candidate` gave, its files as stat-ed before the read; not
        when one of them changed during the read."""
        if any(stat(path) != st for path, st in before.items()):
            return
        racy_ns = self.started_ns - RACY_NS
        racy = any(st is not None and max(st[1], st[3]) >= racy_ns for st in before.values())
        self.changed[self.name(candidate)] = Entry(
            candidate.reader, candidate.path, tuple(sorted(codes)), dict(before),
            list(findings), table, racy)

    def save(self) -> None:
        """Merge into what is on disk (another run may have written it) and replace it
        atomically; a folder that cannot be written means no cache, not a failure."""
        if not self.changed and not self.stale:
            return
        try:
            prepare_folder(self.folder)
            merged = {**_load(self.path), **self.changed}
            entries = {name: entry for name, entry in merged.items()
                       if (name in self.changed or name not in self.stale)
                       and any(os.path.exists(path) for path in entry.files)}
            write_json(self.path, {"format": FORMAT,
                                   "entries": {k: _data(v) for k, v in entries.items()}})
            prune_other_keys(self.path, PREFIX, ".json")
        except OSError:
            return


def _load(path: Path) -> dict[str, Entry]:
    try:  # never blocks on a FIFO planted where the cache file goes
        data = json.loads(read_source(path, MAX_CACHE_BYTES).decode("utf-8"))
    except (SourceError, Skipped, ValueError, RecursionError):
        return {}
    if not isinstance(data, dict) or data.get("format") != FORMAT or \
            not isinstance(data.get("entries"), dict):
        return {}
    out = {}
    for name, fields in data["entries"].items():
        entry = _entry(fields)
        if isinstance(name, str) and entry is not None:
            out[name] = entry
    return out


def _data(entry: Entry) -> dict[str, Any]:
    table = {"path": entry.table.path, "facts": entry.table.facts, "graph": entry.table.graph,
             "rows": entry.table.rows, "seconds": entry.table.seconds}
    return {"reader": entry.reader, "shown": entry.shown, "codes": list(entry.codes),
            "files": {k: None if v is None else list(v) for k, v in entry.files.items()},
            "findings": [[f.code, f.path, f.layer, f.message] for f in entry.findings],
            "table": table, "racy": entry.racy}


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _entry(fields: Any) -> Entry | None:
    """An entry read back from JSON, or None when anything in it has the wrong shape."""
    if not isinstance(fields, dict):
        return None
    reader, shown, codes = fields.get("reader"), fields.get("shown"), fields.get("codes")
    files, findings, table = fields.get("files"), fields.get("findings"), fields.get("table")
    if not (isinstance(reader, str) and isinstance(shown, str) and _strings(codes)
            and isinstance(fields.get("racy"), bool) and isinstance(files, dict)
            and isinstance(findings, list)):
        return None
    stats: dict[str, Stat] = {}
    for path, st in files.items():
        if st is not None and not (isinstance(st, list) and len(st) == 4 and
                                   all(type(v) is int for v in st)):
            return None
        stats[path] = None if st is None else (st[0], st[1], st[2], st[3])
    if not all(_strings(f) and len(f) == 4 for f in findings):
        return None
    shown_table = _table(table)
    if shown_table is None:
        return None
    return Entry(reader, shown, tuple(codes), stats, [ArtifactFinding(*f) for f in findings],
                 shown_table, fields["racy"])


def _table(fields: Any) -> Table | None:
    if not isinstance(fields, dict):
        return None
    path, facts, graph = fields.get("path"), fields.get("facts"), fields.get("graph")
    rows, seconds = fields.get("rows"), fields.get("seconds")
    if not (isinstance(path, str) and _strings(facts) and (graph is None or isinstance(graph, str))
            and isinstance(rows, list) and all(_strings(r) and len(r) == 6 for r in rows)
            and isinstance(seconds, (int, float)) and not isinstance(seconds, bool)):
        return None
    return Table(path, facts, graph, rows, float(seconds), cached=True)
