"""The cache (`.bnfix_cache/`, like ruff's): per file, what the last run learnt — its summary
(for the project index) and its findings, with what they depended on.

A file whose size and modification time (or, after a checkout touched it, content digest) are
unchanged keeps its summary. Its findings are reused only while its content is unchanged *and*
the digests of every summary they consulted (its dependency cone) are unchanged, or, when some
changed, what its check reads of them (its project context) is the same: editing a model file
re-checks the files whose context it changes and nothing else. The key of the cache file
covers the bnfix version, a digest of bnfix's own lint code and rule book, the enabled rules
and the targets: a changed rule implementation never serves stale findings.

The cache is plain JSON, never pickle: a cache file that came with a repository cannot run
code. It is JSON lines: a header (format, meta), then one line per file, so that a run writes
again only the entries it changed and copies the others' lines as it read them (re-encoding
every summary cost more than the rest of a warm run after an edit); a line's summary, itself
compact JSON, follows its fields after a tab (kept as text: parsed only when consulted). A
malformed entry (or header) is ignored, never trusted. What is stored is what was analysed: the
file is stat-ed before it is read, so an edit saved during the run is seen as a
change by the next run. A file's modification time has a coarse clock on some systems (one
tick, up to 2 s on FAT): an edit saved within that tick of the read would keep the size and the
time. So, as git does with its index, an entry whose time is that close to the run is stored
"racy": the next run compares its content digest (cheap: read, not analysed) instead of trusting
the time."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from bnfix import __version__
from bnfix.atomic import replace_text
from bnfix.findings import Diagnostic, diagnostic_from_dict, diagnostic_to_dict
from bnfix.source.reader import Skipped, SourceError, read_source

if TYPE_CHECKING:
    from collections.abc import Iterable

    from bnfix.config import Settings

CACHE_DIR = ".bnfix_cache"
FORMAT = 7
MAX_CACHE_BYTES = 512 * 1024 * 1024
STALE_TEMP_SECONDS = 3600  # a temporary cache file older than this was left by a killed run
# A cache file of another key (another bnfix version or rule set, other rules selected) not
# used for this long is removed when a run writes its own: each upgrade of bnfix starts a new
# file (the key covers its code), and the old ones were kept for ever (30 MB each on torch).
# A file read is marked used (its time set to now) at most once in TOUCH_SECONDS.
STALE_CACHE_SECONDS = 14 * 24 * 3600
TOUCH_SECONDS = 24 * 3600
RACY_NS = 2_000_000_000  # a file modified this close to the run is verified by content
RACY = -1  # the stored mtime of a racy entry: it never matches a file's time


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def cache_key(rules_digest: str, enabled: frozenset[str], targets: dict[str, tuple[int, ...]]) -> str:
    """What the cached findings depend on besides the files themselves."""
    parts = [__version__, str(FORMAT), rules_digest, code_digest(), ",".join(sorted(enabled)),
             json.dumps({k: list(v) for k, v in sorted(targets.items())})]
    return digest("\n".join(parts).encode())


def files_digest(paths: Iterable[Path], root: Path) -> str:
    """A digest of files by name, size and modification time, not content: reading bnfix's
    ~170 code and rule files at every start cost a twentieth of its start-up. A file modified
    within RACY_NS of now is digested by content too (an edit within its clock's tick keeps
    size and time, git's racy rule); such a digest changes once more when the file ages, a
    cache miss, never a stale hit. A file that cannot be stat-ed counts as absent."""
    now = time.time_ns()
    h = hashlib.sha256()
    for path in paths:
        name = path.relative_to(root).as_posix()
        try:
            st = path.stat()
            h.update(f"{name}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
            if now - st.st_mtime_ns < RACY_NS:
                h.update(path.read_bytes())
        except OSError:
            h.update(f"{name}\0absent\0".encode())
    return h.hexdigest()


_LINT_CODE = ("source", "checks", "project")
_LINT_MODULES = ("engine.py", "findings.py", "ir.py", "rulebook.py", "cache.py")


def code_digest() -> str:
    """A digest of the bnfix code that decides findings (the analysis, the rules' logic)."""
    package = Path(__file__).resolve().parent
    paths = [package / name for name in _LINT_MODULES]
    for folder in _LINT_CODE:
        paths.extend(sorted((package / folder).glob("*.py")))
    return files_digest(paths, package)


class Findings(NamedTuple):
    """A file's cached findings, the digest of the summaries they consulted and the digest of
    what the check read of them (its project context)."""

    ignored: tuple[str, ...]
    consulted: str  # digest of the summaries of its dependency cone
    diagnostics: list[dict[str, Any]]
    context: str  # FileContext.digest() ("": the file had no summary, no context)


class Entry:
    """What the cache knows of one file: how to tell it is unchanged, its summary, its findings.
    (Filled in as the run learns more of the file; a plain class, see `FileResult`.)"""

    __slots__ = (
        "callees",
        "checked",
        "context",
        "digest",
        "edges",
        "findings",
        "mtime_ns",
        "outline",
        "relevant",
        "size",
        "summary",
        "summary_digest",
    )

    def __init__(self, mtime_ns: int, size: int, digest: str, context: str, relevant: bool,
                 summary: str | None, summary_digest: str | None, edges: list[str] | None,
                 checked: str | None, findings: Findings | None,
                 callees: list[list[str]] | None = None, outline: str | None = None) -> None:
        self.mtime_ns = mtime_ns
        self.size = size
        self.digest = digest
        # digest of the file's place in the project (its summary depends on it)
        self.context = context
        self.relevant = relevant
        self.summary = summary  # the summary as JSON text (parsed only when consulted)
        self.summary_digest = summary_digest
        self.edges = edges  # the modules its summary depends on (valid for one scope)
        self.checked = checked  # digest of the name set a non-relevant file was searched for
        self.findings = findings
        # the functions its calls resolve to, [module, qualname] (valid with `edges`)
        self.callees = callees
        # digest of the summary's marks and BN APIs (what every file's check reads)
        self.outline = outline


def _entry(fields: Any) -> Entry | None:
    """An entry read back from JSON, or None when its shape is wrong."""
    try:
        findings = fields["findings"]
        entry = Entry(
            mtime_ns=fields["mtime_ns"], size=fields["size"], digest=fields["digest"],
            context=fields["context"], relevant=fields["relevant"], summary=fields["summary"],
            summary_digest=fields["summary_digest"], edges=fields["edges"],
            checked=fields["checked"], callees=fields["callees"], outline=fields["outline"],
            findings=None if findings is None else Findings(
                tuple(findings["ignored"]), findings["consulted"],
                list(findings["diagnostics"]), findings["context"]),
        )
    except (TypeError, KeyError, ValueError):
        return None
    types_ok = (isinstance(entry.mtime_ns, int) and isinstance(entry.size, int)
                and isinstance(entry.digest, str) and isinstance(entry.context, str)
                and isinstance(entry.relevant, bool)
                and (entry.summary is None) == (entry.summary_digest is None)
                and (entry.summary is None or isinstance(entry.summary, str))
                and (entry.summary_digest is None or isinstance(entry.summary_digest, str))
                and (entry.edges is None or (isinstance(entry.edges, list)
                                             and all(isinstance(e, str) for e in entry.edges)))
                and (entry.checked is None or isinstance(entry.checked, str))
                and (entry.outline is None or isinstance(entry.outline, str))
                and (entry.callees is None or (
                    isinstance(entry.callees, list) and (entry.edges is not None) and all(
                        isinstance(c, list) and len(c) == 2 and all(isinstance(x, str) for x in c)
                        for c in entry.callees)))
                and (entry.findings is None or (
                    all(isinstance(c, str) for c in entry.findings.ignored)
                    and isinstance(entry.findings.consulted, str)
                    and isinstance(entry.findings.context, str)
                    and all(isinstance(d, dict) for d in entry.findings.diagnostics))))
    return entry if types_ok else None


def cache_folder(settings: Settings) -> Path:
    """Where a run's caches go: the configured folder (`--cache-dir`), else .bnfix_cache/ in
    the configuration's root."""
    return settings.root / CACHE_DIR if settings.cache_dir is None else settings.cache_dir


class Cache:
    def __init__(self, root: Path, key: str, folder: Path | None = None) -> None:
        self.folder = root / CACHE_DIR if folder is None else folder  # folder: --cache-dir
        self.path = self.folder / f"{key[:24]}.jsonl"
        self.entries: dict[str, Entry] = {}
        self.changed: dict[str, Entry] = {}
        self._lines: dict[str, str] = {}  # each entry's line as read (written back unchanged)
        self.meta: dict[str, Any] = {}  # `scope`: the project the edges were computed in
        self.started_ns = time.time_ns()
        self._loaded: tuple[int, ...] | None = None  # the file's identity when it was read
        self._load()

    def _identity(self) -> tuple[int, ...] | None:
        """What changes when a process replaces the cache file (it renames a new file over
        it: a new inode and times)."""
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns

    def _load(self) -> None:
        self.entries = {}
        self._lines = {}
        self._loaded = self._identity()  # before the read: a write during it shows at save
        try:  # never blocks on a FIFO planted where the cache file goes
            lines = read_source(self.path, MAX_CACHE_BYTES).decode("utf-8").split("\n")
            head = json.loads(lines[0])
        except (SourceError, Skipped, ValueError, RecursionError):
            return  # no cache yet, or an unreadable one: analyse everything
        if not isinstance(head, dict) or head.get("format") != FORMAT:
            return
        mark_used(self.path)
        meta = head.get("meta")
        self.meta = {k: v for k, v in meta.items() if isinstance(v, str)} \
            if isinstance(meta, dict) else {}
        for line in lines[1:]:
            record, tab, summary = line.partition("\t")
            try:
                item = json.loads(record) if record else None
            except (ValueError, RecursionError):
                continue
            if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)
                    and isinstance(item[1], dict)):
                continue
            item[1]["summary"] = summary if tab else None
            entry = _entry(item[1])
            if entry is not None:
                self.entries[item[0]] = entry
                self._lines[item[0]] = line

    @staticmethod
    def name(path: str | Path) -> str:
        return os.path.abspath(path)  # not realpath: resolving links costs a stat per component

    def get(self, path: str | Path) -> Entry | None:
        name = self.name(path)
        return self.changed.get(name) or self.entries.get(name)

    def fresh(self, path: str | Path, context: str) -> Entry | None:
        """The entry for `path` when its size and mtime still match (then the file need not
        even be read) and it was made in the same project context."""
        entry = self.get(path)
        if entry is None or entry.context != context:
            return None
        try:
            st = os.stat(path)
        except OSError:
            return None
        return entry if (st.st_mtime_ns, st.st_size) == (entry.mtime_ns, entry.size) else None

    @staticmethod
    def stat(path: str | Path) -> tuple[int, int] | None:
        try:
            st = os.stat(path)
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size

    def put(self, path: str | Path, entry: Entry) -> None:
        self.changed[self.name(path)] = entry

    def forget(self, path: str | Path) -> None:
        """Drop what is known of a file (it was rewritten)."""
        self.changed.pop(self.name(path), None)
        self.entries.pop(self.name(path), None)

    @staticmethod
    def diagnostics(findings: Findings, shown: str) -> list[Diagnostic] | None:
        """The cached findings, or None when one of them is malformed (then: a miss)."""
        try:
            return [diagnostic_from_dict(d, shown) for d in findings.diagnostics]
        except (KeyError, TypeError, ValueError, IndexError):
            return None

    @staticmethod
    def findings(ignored: frozenset[str], consulted: str, diagnostics: list[Diagnostic],
                 context: str) -> Findings:
        return Findings(tuple(sorted(ignored)), consulted,
                        [diagnostic_to_dict(d) for d in diagnostics], context)

    def save(self) -> None:
        """Merge this run's entries into the file (another bnfix process, e.g. a parallel
        pre-commit chunk, may have written it meanwhile) and replace it atomically."""
        if not self.changed:
            return
        try:
            prepare_folder(self.folder)
            if self._loaded is None or self._identity() != self._loaded:
                meta = self.meta  # another process wrote the file meanwhile: merge with it
                self._load()
                self.meta = meta
            self.entries.update(self.changed)
            racy = self.started_ns - RACY_NS
            lines = [json.dumps({"format": FORMAT, "meta": self.meta}, separators=(",", ":"))]
            for name, entry in self.entries.items():
                line = self._lines.get(name) if name not in self.changed else None
                lines.append(line if line is not None else _line(name, entry, racy))
            replace_text(self.path, "\n".join(lines) + "\n", TEMPORARY)
            prune_other_keys(self.path, "", ".jsonl")
        except OSError:
            return  # a read-only checkout: run without a cache rather than fail


TEMPORARY = ".cache."  # the prefix of a cache file being written (check's and inspect's)


def prepare_folder(folder: Path) -> None:
    """The cache folder, ignored by git, without the temporary files killed runs left."""
    folder.mkdir(parents=True, exist_ok=True)
    ignore = folder / ".gitignore"
    if not ignore.exists():
        ignore.write_text("# created by bnfix\n*\n", encoding="utf-8")
    now = time.time()
    for path in folder.glob(TEMPORARY + "*"):
        try:
            if now - path.lstat().st_mtime > STALE_TEMP_SECONDS:
                path.unlink()
        except OSError:
            continue


def mark_used(path: Path) -> None:
    """Set the time of a cache file that was read and is older than a day to now, so that
    another key's run does not take it for unused (see STALE_CACHE_SECONDS)."""
    try:
        if time.time() - path.stat().st_mtime > TOUCH_SECONDS:
            os.utime(path)
    except OSError:
        pass  # a read-only cache: nothing to mark, nothing will be pruned either


CACHE_START = b'{"format":'  # how check's and inspect's cache files begin


def prune_other_keys(keep: Path, prefix: str, suffix: str) -> None:
    """Remove the cache files beside `keep` that another key wrote (named as `keep` is:
    `prefix`, as many hex digits, `suffix`; and starting as a bnfix cache does) and that no
    run used for STALE_CACHE_SECONDS. Only regular files are looked at, and none that could
    be the user's: `--cache-dir` may name a folder that holds other files."""
    now = time.time()
    length = len(keep.name)
    try:
        names = os.listdir(keep.parent)
    except OSError:
        return
    for name in names:
        key = name[len(prefix):len(name) - len(suffix)]
        if name == keep.name or len(name) != length or not name.startswith(prefix) or \
                not name.endswith(suffix) or key.strip("0123456789abcdef"):
            continue
        path = keep.parent / name
        try:
            st = path.lstat()
            if not stat.S_ISREG(st.st_mode) or now - st.st_mtime <= STALE_CACHE_SECONDS:
                continue
            with path.open("rb") as fh:
                if fh.read(len(CACHE_START)) != CACHE_START:
                    continue
            path.unlink()
        except OSError:
            continue


def write_json(path: Path, payload: dict[str, Any]) -> None:
    """Replace `path` with `payload` at once (a temporary file renamed over it)."""
    # json.dumps: the C encoder (json.dump is the pure-Python one, 1.6x slower on large data)
    replace_text(path, json.dumps(payload, separators=(",", ":")), TEMPORARY)


def _line(name: str, entry: Entry, racy_ns: int) -> str:
    """An entry's line: its fields as JSON, then its summary's text after a tab. The summary
    is compact JSON already (no tab, no line break: JSON escapes them in strings); kept as a
    JSON string it was escaped on every write and unescaped on every load (the torch tree's
    32 MB cache loaded in 246 ms, now in 102-131 ms)."""
    data = _data(entry, racy_ns)
    summary = data.pop("summary")
    record = json.dumps([name, data], separators=(",", ":"))
    return record if summary is None else f"{record}\t{summary}"


def _data(entry: Entry, racy_ns: int) -> dict[str, Any]:
    """An entry as JSON data; one whose file was modified after `racy_ns` is stored racy."""
    out = {name: getattr(entry, name) for name in Entry.__slots__}
    if entry.mtime_ns >= racy_ns:
        out["mtime_ns"] = RACY
    if entry.findings is not None:
        out["findings"] = entry.findings._asdict()
    return out
