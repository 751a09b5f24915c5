"""Which files to check: walk the given paths, skip excluded and git-ignored ones, stream
the rest (no whole-tree list is needed to start working)."""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from bnfix.findings import shown_path
from bnfix.source.reader import Skipped, SourceError, read_source

if TYPE_CHECKING:  # imported where a folder has one (a tree without any never imports it)
    from bnfix.gitignore import GitIgnore

DEFAULT_EXCLUDE = (
    ".bzr", ".direnv", ".eggs", ".git", ".git-rewrite", ".hg", ".mypy_cache", ".nox",
    ".pants.d", ".pytype", ".ruff_cache", ".bnfix_cache", ".svn", ".tox", ".venv",
    "__pypackages__", "__pycache__", "_build", "buck-out", "build", "dist", "node_modules",
    "site-packages", "venv",
)
PYTHON_SUFFIXES = (".py", ".pyi")
MAX_GITIGNORE_BYTES = 4 * 1024 * 1024
_WILDCARD = re.compile(r"[*?\[]")


class Candidate(NamedTuple):
    """A file the walk found, and how it was found."""

    path: Path
    explicit: bool  # named on the command line (checked even when excluded, unless forced)
    link: bool = False  # met in a walk as a symbolic link (its target may lie anywhere)


class _Exclude:
    """ruff's exclude semantics: a pattern matches an entry's name or its path relative to the
    configuration root; only entries met during the walk are tested, so a folder named on the
    command line is checked even when an ancestor would be excluded."""

    def __init__(self, patterns: list[str], root: Path) -> None:
        self.root = root
        names = [p.rstrip("/") for p in patterns if "/" not in p.rstrip("/")]
        self.literal = frozenset(n for n in names if not _WILDCARD.search(n))
        globs = [fnmatch.translate(n) for n in names if _WILDCARD.search(n)]
        self.name_glob = re.compile("|".join(globs)) if globs else None
        paths = [fnmatch.translate(p.strip("/")) for p in patterns if "/" in p.rstrip("/")]
        self.path_glob = re.compile("|".join(paths)) if paths else None

    def __call__(self, path: Path) -> bool:
        name = path.name
        if name in self.literal or (self.name_glob is not None and self.name_glob.match(name)):
            return True
        if self.path_glob is None:
            return False
        try:
            rel = path.relative_to(self.root).as_posix()
        except ValueError:
            return False
        return self.path_glob.match(rel) is not None

    def covers(self, path: Path) -> bool:
        """`path` or one of its folders below the root is excluded (for --force-exclude)."""
        for candidate in (path, *path.parents):
            if candidate == self.root or self.root not in candidate.parents:
                break
            if self(candidate):
                return True
        return self(path)


class IgnoreFiles:
    """The ignore files of one run, each read and parsed once however many walks meet it (a
    check of a subfolder walks it and then the project root around it), and a line for each
    one that is not applied."""

    __slots__ = ("_parsed", "notes")

    def __init__(self) -> None:
        self._parsed: dict[Path, GitIgnore | None] = {}
        self.notes: list[str] = []

    def read(self, path: Path) -> GitIgnore | None:
        if path not in self._parsed:
            self._parsed[path] = _read_gitignore(path, self.notes)
        return self._parsed[path]


class _Ignores:
    """Exclude patterns plus the .gitignore files that apply below a folder (deepest last)."""

    def __init__(self, exclude: _Exclude, git: list[tuple[Path, GitIgnore]],
                 files: IgnoreFiles) -> None:
        self.exclude = exclude
        self.git = git
        self.files = files  # the run's (shared by its walks)

    def child(self, folder: Path, respect_gitignore: bool) -> _Ignores:
        spec = self.files.read(folder / ".gitignore") if respect_gitignore else None
        if spec is None:
            return self
        return _Ignores(self.exclude, [*self.git, (folder, spec)], self.files)

    def ignored(self, path: Path, is_dir: bool) -> bool:
        if self.exclude(path):
            return True
        for base, spec in reversed(self.git):
            try:
                rel_git = path.relative_to(base).as_posix()
            except ValueError:
                continue
            include = spec.match(rel_git, is_dir)
            if include is not None:
                return include
        return False


def _read_gitignore(path: Path, notes: list[str]) -> GitIgnore | None:
    try:  # only a regular file: a FIFO never blocks the walk, a link to /dev/zero is refused
        lines = read_source(path, MAX_GITIGNORE_BYTES).decode("utf-8", "replace").splitlines()
    except Skipped:  # git would apply it: say that bnfix does not
        notes.append(f"{shown_path(str(path))}: not applied: larger than the "
                     f"{MAX_GITIGNORE_BYTES >> 20} MB bnfix reads of an ignore file (the files it "
                     "ignores are checked; exclude them with `extend-exclude`)")
        return None
    except SourceError:  # none (most folders), or not a regular file
        return None
    if not lines:
        return None
    from bnfix.gitignore import GitIgnore

    return GitIgnore.from_lines(lines)


def git_root(start: Path) -> Path | None:
    """The nearest folder from `start` upwards that holds `.git` (a work tree's root)."""
    for folder in (start, *start.parents):
        if os.path.exists(folder / ".git"):  # os.path: False for a path over the length limit
            return folder
    return None


def _ancestor_ignores(folder: Path, base: _Ignores, respect: bool) -> _Ignores:
    """The .gitignore files between the repository root and `folder` (exclusive)."""
    if not respect:
        return base
    root = git_root(folder)
    if root is None:
        return base
    ignores = base
    info = base.files.read(root / ".git" / "info" / "exclude")
    if info is not None:
        ignores = _Ignores(ignores.exclude, [*ignores.git, (root, info)], base.files)
    chain = [p for p in (folder, *folder.parents) if p == root or root in p.parents]
    for parent in reversed(chain[1:]):
        ignores = ignores.child(parent, respect)
    # A folder named on the command line is walked even when an ancestor's .gitignore covers
    # it (as ruff does): such a .gitignore would otherwise match everything below.
    kept = [(base_dir, spec) for base_dir, spec in ignores.git
            if folder == base_dir or not spec.covers(folder.relative_to(base_dir).as_posix())]
    return _Ignores(ignores.exclude, kept, base.files)


def discover(
    paths: list[Path],
    *,
    root: Path,
    exclude: list[str] | None,
    extend_exclude: list[str],
    respect_gitignore: bool = True,
    force_exclude: bool = False,
    walked: list[Path] | None = None,
    ignore_files: IgnoreFiles | None = None,
) -> Iterator[Candidate]:
    """Python files under `paths`, in a stable order, each once. `walked`, when given, is
    appended with each folder walked (absolute): a later walk of it would find nothing new;
    `ignore_files`: the run's, shared with its other walks (its notes name the ignore files
    that are not applied)."""
    patterns = list(DEFAULT_EXCLUDE if exclude is None else exclude) + list(extend_exclude)
    base = _Ignores(_Exclude(patterns, root.resolve()), [],
                    IgnoreFiles() if ignore_files is None else ignore_files)
    seen: set[Path] = set()
    for given in paths:
        absolute = Path(os.path.abspath(given))
        if not os.path.isdir(absolute):
            ignores = _ancestor_ignores(absolute.parent, base, respect_gitignore)
            ignores = ignores.child(absolute.parent, respect_gitignore)
            if force_exclude and (ignores.ignored(absolute, False) or base.exclude.covers(absolute)):
                continue
            if absolute not in seen:
                seen.add(absolute)
                yield Candidate(given, explicit=True)
            continue
        ignores = _ancestor_ignores(absolute, base, respect_gitignore)
        if force_exclude and (ignores.ignored(absolute, True) or base.exclude.covers(absolute)):
            continue
        if walked is not None:
            walked.append(absolute)
        yield from _walk(given, absolute, ignores, respect_gitignore, seen)


def _walk(shown: Path, folder: Path, ignores: _Ignores, respect: bool,
          seen: set[Path]) -> Iterator[Candidate]:
    """A folder's files (by name), then its folders' in turn, depth first: with a stack of
    the folders still to walk, not recursion (a tree nested 1,500 folders deep, a path of
    3,000 characters, exceeded Python's recursion limit)."""
    todo = [(shown, folder, ignores)]
    while todo:
        shown, folder, ignores = todo.pop()
        ignores = ignores.child(folder, respect)
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError:
            continue
        subdirs = []
        for entry in entries:
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
                is_link = not is_dir and entry.is_symlink()
            except OSError:
                continue
            if not is_dir and not entry.name.endswith(PYTHON_SUFFIXES):
                continue  # most entries of a real tree (data, docs, binaries): no path object
            path = folder / entry.name
            if is_dir:
                if not ignores.ignored(path, True):
                    subdirs.append(entry.name)
                continue
            if ignores.ignored(path, False):
                continue
            if path not in seen:
                seen.add(path)
                yield Candidate(shown / entry.name, explicit=False, link=is_link)
        todo.extend((shown / name, folder / name, ignores) for name in reversed(subdirs))
