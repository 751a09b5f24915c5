"""The project model: which dotted module name each file has, and which file an import names.

Python finds a module through the entries of `sys.path`; a training repository is run in one
of a few ways (`python train.py` from its folder, `python -m pkg.train` from the root, an
installed `src/` package), so a file can be imported under more than one name. A file's
*canonical* name comes from its package: walk up while the folder has an `__init__.py`; the
first folder without one is its root, and the dotted path from there is its import name. A
file's identity in the project (its *module id*) is its dotted path from the project root, which
is unique even where research code leaves out `__init__.py` files (`models/net.py` and
`utils/net.py` are both `net` to a script run from their folders). An import is resolved against
the importing file's own root, the folder of the importing script, the project root and a
`src/` folder under it — the places Python would search — and to nothing when none of them holds
the module (never guessed)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from bnfix.files import git_root

if TYPE_CHECKING:
    from bnfix.source.imports import ModuleContext

INIT = "__init__.py"


class ModuleFile(NamedTuple):
    """A source file's place in the project: its module name and import name."""

    name: str  # module id: the dotted path from the project root (`models.net`, `pkg`)
    import_name: str  # the dotted name from its package root (what relative imports use)
    path: str  # as discovered (relative or absolute, as the user named it)
    root: str  # absolute folder the import name is relative to
    package: bool  # an `__init__.py` (or a namespace folder)


def _is_package(folder: str, files: set[str]) -> bool:
    return os.path.join(folder, INIT) in files


def module_name(path: str, files: set[str],
                packages: dict[str, tuple[str, str]] | None = None) -> tuple[str, str]:
    """The import (name, root) of the file at absolute `path`: its package chain.
    `packages`: each folder's (dotted name, root) found so far (a tree's files share them)."""
    folder, base = os.path.split(path)
    stem = base.rsplit(".", 1)[0]
    package, root = _package(folder, files, {} if packages is None else packages)
    if stem == "__init__":
        return package, root
    return (f"{package}.{stem}" if package else stem), root


def _package(folder: str, files: set[str], known: dict[str, tuple[str, str]]
             ) -> tuple[str, str]:
    """The dotted name of `folder` as a package ("" when it is not one) and its root (found
    going up without recursion: a hostile tree nests folders thousands deep)."""
    chain: list[tuple[str, str]] = []  # (folder, name) of packages not yet known, deepest first
    while folder not in known:
        parent, name = os.path.split(folder)
        if parent == folder or not _is_package(folder, files):
            known[folder] = ("", folder)
            break
        chain.append((folder, name))
        folder = parent
    above, root = known[folder]
    for below, name in reversed(chain):
        above = f"{above}.{name}" if above else name
        known[below] = (above, root)
    return known[chain[0][0]] if chain else known[folder]


class ModuleMap:
    """Every discovered Python file under its canonical module name, plus the search roots
    (made by `build`)."""

    __slots__ = ("_dirs", "_files", "_resolved", "by_name", "by_path", "project_root")

    def __init__(self, project_root: str) -> None:
        self.project_root = project_root
        self.by_name: dict[str, list[ModuleFile]] = {}
        self.by_path: dict[str, ModuleFile] = {}
        self._files: set[str] = set()  # absolute paths of .py files
        self._dirs: set[str] = set()  # absolute folders holding .py files
        # resolve()'s answers by (dotted name, importer): every file of a package asks the same
        self._resolved: dict[tuple[str, str | None], tuple[ModuleFile, str] | None] = {}

    @classmethod
    def build(cls, paths: Iterable[str | Path], project_root: str | Path) -> ModuleMap:
        shown = {os.path.abspath(p): str(p) for p in paths if str(p).endswith(".py")}
        modules = cls(os.path.abspath(project_root))
        modules._files = set(shown)
        for absolute in shown:
            folder = os.path.dirname(absolute)
            while folder not in modules._dirs:
                modules._dirs.add(folder)
                parent = os.path.dirname(folder)
                if parent == folder:
                    break
                folder = parent
        packages: dict[str, tuple[str, str]] = {}
        for absolute, given in sorted(shown.items()):
            import_name, root = module_name(absolute, modules._files, packages)
            if not import_name:
                continue
            dotted = _dotted_from(absolute, modules.project_root)
            # the module id is unique whatever the folders are called (`06-CIFAR-VGG/main.py`
            # and `07-Inception/main.py` are two modules, each its own summary); `by_name`
            # groups the files a bare import of one name may mean
            name = dotted or _dotted_from(absolute, modules.project_root, strict=False) or \
                import_name
            record = ModuleFile(name, import_name, given, root, absolute.endswith(os.sep + INIT))
            modules.by_name.setdefault(dotted or import_name, []).append(record)
            modules.by_path[absolute] = record
        return modules

    def of(self, path: str | Path) -> ModuleFile | None:
        return self.by_path.get(os.path.abspath(path))

    def conflicts(self) -> list[tuple[str, list[str]]]:
        """Module names that two files claim (two scripts `train.py` in sibling folders)."""
        return [(name, [m.path for m in files]) for name, files in sorted(self.by_name.items())
                if len(files) > 1]

    def first_party_tops(self) -> frozenset[str]:
        """Top-level names a first-party import can start with: canonical packages and
        modules, and every folder/file name (scripts import siblings by bare name)."""
        tops = {record.import_name.split(".", 1)[0] for record in self.by_path.values()}
        for absolute in self._files:
            base = os.path.basename(absolute)
            if base != INIT:
                tops.add(base[:-3])
        root = self.project_root + os.sep
        tops.update(os.path.basename(d) for d in self._dirs if d.startswith(root))
        return frozenset(t for t in tops if t.isidentifier())

    def resolve(self, dotted: str, importer: str | None) -> tuple[ModuleFile, str] | None:
        """The module file an absolute import of `dotted` reaches from the file `importer`
        (absolute path), and the rest of the dotted name inside it (`models.net.Net` ->
        (models/net.py, "Net")). None when no search root holds it."""
        key = (dotted, importer)
        if key not in self._resolved:
            self._resolved[key] = self._search(dotted, importer)
        return self._resolved[key]

    def _search(self, dotted: str, importer: str | None) -> tuple[ModuleFile, str] | None:
        parts = dotted.split(".")
        for root in self._roots(importer):
            for cut in range(len(parts), 0, -1):
                found = self._lookup(root, parts[:cut])
                if found is not None:
                    return found, ".".join(parts[cut:])
        return None

    def _roots(self, importer: str | None) -> list[str]:
        roots: list[str] = []
        if importer is not None:
            absolute = os.path.abspath(importer)
            record = self.by_path.get(absolute)
            if record is not None:
                roots.append(record.root)
            roots.append(os.path.dirname(absolute))
        roots += [self.project_root, os.path.join(self.project_root, "src")]
        out: list[str] = []
        for root in roots:
            if root not in out:
                out.append(root)
        return out

    def _lookup(self, root: str, parts: list[str]) -> ModuleFile | None:
        base = os.path.join(root, *parts)
        for candidate in (base + ".py", os.path.join(base, INIT)):
            record = self.by_path.get(candidate)
            if record is not None:
                return record
        if base in self._dirs:  # a namespace package: a folder without __init__.py
            dotted = ".".join(parts)
            return ModuleFile(_dotted_from(base, self.project_root) or dotted, dotted, base, root,
                              True)
        return None


def _dotted_from(path: str, root: str, strict: bool = True) -> str | None:
    """`root/models/net.py` -> `models.net`; None outside `root` or (`strict`) for
    non-identifiers (both absolute and normalised: a prefix test, not `relpath`, which
    normalises both again and was a fifth of mapping the torch tree's 2,300 files)."""
    prefix = root.rstrip(os.sep) + os.sep
    if not path.startswith(prefix):
        return None
    parts = path[len(prefix):].split(os.sep)
    last = parts[-1]
    if last.endswith(".py"):
        parts[-1] = last[:-3]
        if parts[-1] == "__init__":
            parts.pop()
    if not parts or strict and not all(p.isidentifier() for p in parts):
        return None
    return ".".join(parts)


class ModuleRef(NamedTuple):
    """How a file sits in the project (sent to workers instead of the module map)."""

    module_id: str
    import_name: str
    package: bool

    def context(self, first_party: frozenset[str]) -> ModuleContext:
        from bnfix.source.imports import ModuleContext  # with the analysis (it imports ast)

        return ModuleContext(self.import_name, self.package, first_party)


def project_root(paths: list[Path], configured: Path | None) -> Path:
    """The folder whose Python files form the project: the configuration's root, else the
    git work tree holding the paths, else their common folder."""
    if configured is not None:
        return configured
    absolute = [Path(os.path.abspath(p)) for p in paths] or [Path.cwd()]
    common = Path(os.path.commonpath([str(p if os.path.isdir(p) else p.parent)
                                      for p in absolute]))
    return git_root(common) or common
