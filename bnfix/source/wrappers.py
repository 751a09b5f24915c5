"""Project classes that are a biased layer (conv, linear, dense) under another name.

Projects wrap their framework's conv in a class of their own: a subclass that only re-routes
arguments, or a module holding one conv whose `forward` returns that conv's output after
preparing the input (EfficientDet's `Conv2dStaticSamePadding` pads, then convolves). Either
adds the conv's per-channel bias to its output, and a BN right after it cancels that bias as it
cancels the conv's own (BN104). Such a class is taken as a layer whose bias switch is the
parameter of its own that reaches the conv's bias, when that parameter defaults to a bias: a
class that always adds one, with no switch a call could turn off, is not taken (nothing to fix
at the call), nor is one that computes anything from the conv's output.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from bnfix.rulebook import Catalogue, LayerSpec
from bnfix.source.imports import ImportTable
from bnfix.source.subclasses import FORWARDS, docstring, reroutes_only, super_call


def layer_aliases(classes: list[ast.ClassDef], imports: ImportTable,
                  catalogue: Catalogue) -> dict[str, LayerSpec]:
    """The module-level classes of a module that are biased layers, by name."""
    out: dict[str, LayerSpec] = {}
    for node in classes:
        spec = _subclassed(node, imports, catalogue) or _holder(node, imports, catalogue)
        if spec is not None:
            out[node.name] = spec
    return out


def _layer(expr: ast.expr, imports: ImportTable, catalogue: Catalogue) -> LayerSpec | None:
    written = imports.qualname(expr)
    return catalogue.layers.get(catalogue.normalize(written)) if written else None


def _method(node: ast.ClassDef, names: tuple[str, ...]) -> ast.FunctionDef | None:
    return next((s for s in node.body if isinstance(s, ast.FunctionDef) and s.name in names),
                None)


def _subclassed(node: ast.ClassDef, imports: ImportTable,
                catalogue: Catalogue) -> LayerSpec | None:
    """`class Conv(nn.Conv2d)` that only re-routes arguments to the base."""
    if len(node.bases) != 1 or node.keywords:
        return None
    base = _layer(node.bases[0], imports, catalogue)
    if base is None or not reroutes_only(node):
        return None
    init = _method(node, ("__init__",))
    if init is None:
        return base
    call = next((n for n in ast.walk(init) if super_call(n, "__init__")), None)
    assert isinstance(call, ast.Call)  # reroutes_only: its __init__ calls the base's
    return _through(init, call, base, forwards_kwargs=True)


def _holder(node: ast.ClassDef, imports: ImportTable, catalogue: Catalogue) -> LayerSpec | None:
    """A class whose `__init__` builds one biased layer into `self.<name>` and whose forward
    returns that layer's output as it is."""
    init, forward = _method(node, ("__init__",)), _method(node, FORWARDS)
    if init is None or forward is None:
        return None
    returned = _output_of(forward)  # first: most classes return something else (one look)
    if returned is None:
        return None
    held = [(s.targets[0].attr, s.value, spec) for s in _statements(init.body)
            if isinstance(s, ast.Assign) and len(s.targets) == 1 and _self_attr(s.targets[0])
            and isinstance(s.value, ast.Call)
            and (spec := _layer(s.value.func, imports, catalogue)) is not None]
    if len(held) != 1 or held[0][0] != returned:
        return None
    _, call, base = held[0]
    return _through(init, call, base, forwards_kwargs=False)


def _statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Every statement of `body`, those of nested blocks too (expressions are not entered:
    an assignment is a statement)."""
    for stmt in body:
        yield stmt
        for field in ("body", "orelse", "finalbody"):
            yield from _statements(getattr(stmt, field, ()))
        for part in (*getattr(stmt, "handlers", ()), *getattr(stmt, "cases", ())):
            yield from _statements(part.body)


def _self_attr(node: ast.expr) -> bool:
    return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and \
        node.value.id == "self"


def _output_of(forward: ast.FunctionDef) -> str | None:
    """`<attr>` of `return self.<attr>(...)`, or of `x = self.<attr>(...)` right before
    `return x`."""
    body = [s for s in forward.body if not docstring(s)]
    if not body or not isinstance(body[-1], ast.Return) or body[-1].value is None:
        return None
    value = body[-1].value
    if isinstance(value, ast.Name) and len(body) > 1:
        last = body[-2]
        if not (isinstance(last, ast.Assign) and len(last.targets) == 1 and
                isinstance(last.targets[0], ast.Name) and last.targets[0].id == value.id):
            return None
        value = last.value
    ok = isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and \
        _self_attr(value.func)
    return value.func.attr if ok else None  # type: ignore[union-attr]


def _through(init: ast.FunctionDef, call: ast.Call, base: LayerSpec,
             forwards_kwargs: bool) -> LayerSpec | None:
    """The layer as the class's own `__init__` exposes it: its parameters, the one that reaches
    the base's bias switch (a subclass's `**kwargs` passed on carry it by its base name), and
    the activation the same way (none passed: no activation)."""
    args = init.args
    params = [a.arg for a in (*args.posonlyargs, *args.args)][1:] + [a.arg for a in args.kwonlyargs]
    defaults = _defaults(init)
    passes_kwargs = forwards_kwargs and args.kwarg is not None and any(
        k.arg is None and isinstance(k.value, ast.Name) and k.value.id == args.kwarg.arg
        for k in call.keywords)
    bias = _param_passed(call, base, base.bias, params)
    if bias is None:
        if not passes_kwargs:
            return None  # a bias always on (or fixed): no switch at the call
        bias = base.bias
        params.append(bias)
    elif not (bias not in defaults or _is_true(defaults[bias])):
        return None
    activation = None
    if base.activation is not None:
        written = _argument(call, base, base.activation)
        if written is None:
            activation = base.activation if passes_kwargs else None
        elif isinstance(written, ast.Name) and written.id in params:
            default = defaults.get(written.id)
            if default is not None and not (isinstance(default, ast.Constant) and
                                            default.value is None):
                return None
            activation = written.id
        elif not (isinstance(written, ast.Constant) and written.value is None):
            return None  # an activation after the bias: nothing cancels it
    return LayerSpec(base.framework, tuple(params), bias, activation)


def _defaults(function: ast.FunctionDef) -> dict[str, ast.expr]:
    args = function.args
    positional = [*args.posonlyargs, *args.args]
    out = {a.arg: d for a, d in zip(positional[len(positional) - len(args.defaults):],
                                    args.defaults)}
    out.update({a.arg: d for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None})
    return out


def _argument(call: ast.Call, base: LayerSpec, name: str) -> ast.expr | None:
    """What `call` passes for the base's parameter `name`, by keyword or position."""
    for keyword in call.keywords:
        if keyword.arg == name:
            return keyword.value
    index = base.params.index(name) if name in base.params else -1
    if 0 <= index < len(call.args) and not any(isinstance(a, ast.Starred)
                                               for a in call.args[:index + 1]):
        return call.args[index]
    return None


def _param_passed(call: ast.Call, base: LayerSpec, name: str, params: list[str]) -> str | None:
    """The class's own parameter passed, as it is, for the base's `name`."""
    written = _argument(call, base, name)
    return written.id if isinstance(written, ast.Name) and written.id in params else None


def _is_true(expr: ast.expr) -> bool:
    return isinstance(expr, ast.Constant) and expr.value is True


__all__ = ["layer_aliases"]
