"""BatchNorm subclasses that only re-route arguments, taken as the BN class they extend.

Projects wrap their framework's BN in a class of their own (Mask R-CNN's `BatchNorm`, the
TF2 YOLO ports' `BatchNormalization` whose `call` ANDs `training` with `trainable`, a class
that only fixes the default `name`). Constructing such a class is constructing that BN: the
rules must see it. A subclass that changes what BN computes — its own `_moments`, a
`forward` with collectives (detectron2's `NaiveSyncBatchNorm`), a class attribute the base
reads — is not taken: what it does is not the base's, and a synchronized one would read as
plain BN. What counts as re-routing:

- `__init__` that calls the base's `__init__`; `get_config`;
- `call` / `forward` whose statements only assign the method's parameters (also under `if`)
  before returning the base's method called through `super()`;
- a docstring, `pass`.
"""

from __future__ import annotations

import ast
from typing import NamedTuple

from bnfix.rulebook import ApiSpec, Catalogue
from bnfix.source.imports import ImportTable

CLASS_KINDS = ("layer", "module")  # catalogue kinds that are classes one can subclass
FORWARDS = ("call", "forward")
MAX_DEPTH = 8  # first-party classes between the subclass and the framework's BN


class Alias(NamedTuple):
    """A first-party class taken as a BN API."""

    spec: ApiSpec
    written: str  # the base's qualified name as imported
    own_init: bool  # it defines `__init__`: positional arguments are its own, not the base's


def bn_aliases(classes: list[ast.ClassDef], imports: ImportTable,
               catalogue: Catalogue) -> dict[str, Alias]:
    """The module-level classes of a module that are BN subclasses re-routing arguments only,
    by name."""
    by_name = {c.name: c for c in classes}
    out: dict[str, Alias] = {}
    for node in classes:
        alias = _alias(node, by_name, imports, catalogue, 0)
        if alias is not None:
            out[node.name] = alias
    return out


def _alias(node: ast.ClassDef, by_name: dict[str, ast.ClassDef], imports: ImportTable,
           catalogue: Catalogue, depth: int) -> Alias | None:
    if depth > MAX_DEPTH or len(node.bases) != 1 or node.keywords:
        return None
    base = node.bases[0]
    own_init = any(isinstance(s, ast.FunctionDef) and s.name == "__init__" for s in node.body)
    if isinstance(base, ast.Name) and base.id in by_name and by_name[base.id] is not node:
        inner = _alias(by_name[base.id], by_name, imports, catalogue, depth + 1)
        alias = inner._replace(own_init=inner.own_init or own_init) if inner else None
    else:  # the base first: most classes extend no BN, and their bodies need no reading
        written = imports.qualname(base)
        spec = catalogue.lookup(written) if written else None
        if spec is None or spec.kind not in CLASS_KINDS:
            return None
        alias = Alias(spec, written or "", own_init)
    return alias if alias is not None and reroutes_only(node) else None


def reroutes_only(node: ast.ClassDef) -> bool:
    for stmt in node.body:
        if isinstance(stmt, ast.Pass) or docstring(stmt):
            continue
        if not isinstance(stmt, ast.FunctionDef) or stmt.decorator_list:
            return False
        if stmt.name == "__init__":
            if not any(super_call(n, "__init__") for n in ast.walk(stmt)):
                return False
        elif stmt.name in FORWARDS:
            if not _forwards(stmt):
                return False
        elif stmt.name != "get_config":
            return False
    return True


def _forwards(method: ast.FunctionDef) -> bool:
    """Only assigns its parameters, then returns the base's method of the same name."""
    body = [s for s in method.body if not docstring(s)]
    if not body or not isinstance(body[-1], ast.Return) or body[-1].value is None or \
            not super_call(body[-1].value, method.name):
        return False
    params = {a.arg for a in (*method.args.posonlyargs, *method.args.args,
                              *method.args.kwonlyargs)}
    return all(_assigns_params(s, params) for s in body[:-1])


def _assigns_params(stmt: ast.stmt, params: set[str]) -> bool:
    if isinstance(stmt, ast.Assign):
        return all(isinstance(t, ast.Name) and t.id in params for t in stmt.targets)
    if isinstance(stmt, ast.If):
        return all(_assigns_params(s, params) for s in (*stmt.body, *stmt.orelse))
    return False


def super_call(node: ast.AST, name: str) -> bool:
    """`super().name(...)`, `super(Cls, self).name(...)`, `super(self.__class__, self)...`."""
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
        node.func.attr == name and isinstance(node.func.value, ast.Call) and \
        isinstance(node.func.value.func, ast.Name) and node.func.value.func.id == "super"


def docstring(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and \
        isinstance(stmt.value.value, str)


__all__ = ["Alias", "bn_aliases", "docstring", "reroutes_only", "super_call"]
