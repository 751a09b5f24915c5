"""Import analysis: which module or object each local name is bound to, so that
`tf.layers.batch_normalization`, `tf1.layers.batch_normalization` and `BN` resolve to the same
qualified name whatever the import style. Relative imports are the user's own code and resolve
to nothing."""

from __future__ import annotations

import ast


class ImportTable:
    def __init__(self) -> None:
        self._names: dict[str, str] = {}

    def add(self, node: ast.Import | ast.ImportFrom) -> None:
        """Record the bindings of one import statement (later bindings win, as at run time)."""
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    self._names[alias.asname] = alias.name
                else:
                    top = alias.name.split(".", 1)[0]
                    self._names[top] = top
            return
        if node.level or not node.module:
            for alias in node.names:
                self._names.pop(alias.asname or alias.name, None)
            return
        for alias in node.names:
            if alias.name == "*":
                continue
            self._names[alias.asname or alias.name] = f"{node.module}.{alias.name}"

    def bind(self, name: str, qualname: str) -> None:
        """`name = tf.contrib.slim`: the name now stands for that qualified name."""
        self._names[name] = qualname

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

    def alias_of(self, module: str) -> str | None:
        """The local name bound exactly to `module`, if any."""
        for local, target in self._names.items():
            if target == module:
                return local
        return None

    def bindings(self) -> dict[str, str]:
        return dict(self._names)
