"""Import analysis: which module or object each local name is bound to, so that
`tf.layers.batch_normalization`, `tf1.layers.batch_normalization` and `BN` resolve to the same
qualified name whatever the import style.

Relative imports are the user's own code: alone (one file, no project) they resolve to
nothing; inside a project (`ModuleContext`) they resolve to absolute dotted names from the
module's package, and imports of the project's own top-level names are marked first-party, so
the project index can follow calls into other files."""

from __future__ import annotations

import ast
from typing import NamedTuple


class ModuleContext(NamedTuple):
    """Where a file sits in its project: its import name, whether it is a package
    (`__init__.py`), and the top-level names that are the project's own; in the checking step,
    the library names each first-party module it star-imports binds (`from .imports import *`
    where that module does `import torch.nn as nn`: `nn` is `torch.nn` here too)."""

    import_name: str
    package: bool
    first_party: frozenset[str]
    star_names: dict[str, dict[str, str]] | None = None  # module -> local name -> target

    def absolute(self, level: int, module: str | None) -> str | None:
        """`from ..models import x` -> the absolute dotted module it names."""
        package = self.import_name.split(".")
        if not self.package:
            package = package[:-1]
        if level - 1 > len(package):
            return None
        base = package[: len(package) - (level - 1)]
        if module:
            base = [*base, *module.split(".")]
        return ".".join(base) or None


class ImportTable:
    def __init__(self, context: ModuleContext | None = None) -> None:
        self._names: dict[str, str] = {}
        # every target each name is bound to, in order: a name imported in both branches of
        # a version test (`if tf2: from .vendored import bn` / `else: from tf.contrib ...`)
        # is one of them at run time
        self.targets: dict[str, list[str]] = {}
        self.context = context
        self.star: list[str] = []  # modules whose names `from m import *` binds
        # library modules star-imported (`from keras.layers import *`), the latest last: a
        # name bound nowhere else may be theirs (the walker asks the catalogue which)
        self.library_star: list[str] = []

    def add(self, node: ast.Import | ast.ImportFrom) -> None:
        """Record the bindings of one import statement (later bindings win, as at run time)."""
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    self._set(alias.asname, alias.name)
                else:
                    top = alias.name.split(".", 1)[0]
                    self._set(top, top)
            return
        module = node.module
        if node.level:
            module = self.context.absolute(node.level, node.module) if self.context else None
        if not module:  # a relative import outside a known package: what it binds is unknown
            written = "." * node.level + (f"{node.module}." if node.module else "")
            for alias in node.names:
                local = alias.asname or alias.name
                self._names.pop(local, None)
                self._note(local, written + alias.name)
            return
        for alias in node.names:
            if alias.name == "*":
                if node.level or self.first_party(module):
                    if module not in self.star:
                        self.star.append(module)
                    names = (self.context.star_names or {}).get(module, {}) \
                        if self.context is not None else {}
                    for local, target in names.items():
                        self._set(local, target)
                elif module not in self.library_star:
                    self.library_star.append(module)
                continue
            self._set(alias.asname or alias.name, f"{module}.{alias.name}")

    def _set(self, local: str, target: str) -> None:
        self._names[local] = target
        self._note(local, target)

    def _note(self, local: str, target: str) -> None:
        seen = self.targets.setdefault(local, [])
        if target not in seen:
            seen.append(target)

    def alternatives(self, node: ast.expr) -> list[str]:
        """The other qualified names `node` (`batch_norm`, `slim.batch_norm`) stands for where
        its base name is bound to several targets (version-guarded imports)."""
        base = node
        while isinstance(base, ast.Attribute):
            base = base.value
        if not isinstance(base, ast.Name) or len(self.targets.get(base.id, ())) < 2:
            return []
        bound, written = self._names.get(base.id), self.qualname(node)
        if bound is None or written is None:
            return []
        rest = written[len(bound):]
        return [t + rest for t in self.targets[base.id] if t != bound]

    def bind(self, name: str, qualname: str) -> None:
        """`name = tf.contrib.slim`: the name now stands for that qualified name."""
        self._set(name, qualname)

    def qualname(self, node: ast.expr) -> str | None:
        """`tf.compat.v1.layers.batch_normalization` -> its qualified name, if the base is an
        imported name."""
        parts: list[str] = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name):
            return None
        base = self._names.get(node.id)
        if base is None:
            return None
        parts.append(base)
        return ".".join(reversed(parts))

    def first_party(self, qualname: str) -> bool:
        """A name of the project's own code (a relative import, or a top-level name that a
        project file or folder has)."""
        if self.context is None:
            return False
        return qualname.split(".", 1)[0] in self.context.first_party

    def alias_of(self, module: str) -> str | None:
        """The local name bound exactly to `module`, if any."""
        for local, target in self._names.items():
            if target == module:
                return local
        return None

    def bindings(self) -> dict[str, str]:
        return dict(self._names)
