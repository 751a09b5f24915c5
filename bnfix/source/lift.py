"""Lifting Python source into the IR with one traversal of CPython's `ast`.

The walk records raw facts (BN calls, collection reads, train ops, `with` scopes, loops,
assignments, calls of module-local functions) with their lexical context; a resolution step
then turns them into IR records, following values through parameters, call sites, local
assignments and module constants. Rules never see the tree.
"""

from __future__ import annotations

import ast
import functools
from collections import defaultdict
from dataclasses import dataclass, field

from bnfix.ir import (
    Arg,
    BNSite,
    Block,
    CallInfo,
    CallSite,
    CollectionGet,
    Const,
    EmaApply,
    FromParam,
    FunctionInfo,
    ModuleIR,
    Param,
    Pos,
    Span,
    Statement,
    TowerLoop,
    TrainOp,
    Unknown,
    Value,
    VarsExpr,
    VarsTerm,
    WithItem,
)
from bnfix.rulebook import ApiSpec, Catalogue
from bnfix.source.imports import ImportTable
from bnfix.source.text import SourceText

_TRACE_DEPTH = 6
_RANGE_NAMES = {"range", "xrange", "six.moves.range", "six.moves.xrange"}


@dataclass
class _Loop:
    node: ast.For | ast.AsyncFor
    function: FunctionInfo | None
    targets: frozenset[str]
    loop_var: str | None
    starts_at_zero: bool
    reuse: bool = False
    device: tuple[WithItem, Block | None] | None = None
    name_scope: WithItem | None = None


@dataclass
class _With:
    category: str  # device | name_scope | variable_scope | control_dependencies | other
    item: WithItem
    expr: ast.expr | None  # the first argument (device string, scope name, control inputs)
    function: FunctionInfo | None
    reuse: bool  # a variable_scope opened with reuse=<not False/None> (AUTO_REUSE included)


@dataclass(frozen=True)
class _Ctx:
    function: FunctionInfo | None = None
    class_name: str | None = None
    withs: tuple[_With, ...] = ()
    loops: tuple[_Loop, ...] = ()


@dataclass
class _Raw:
    call: ast.Call
    ctx: _Ctx
    stmt: ast.stmt
    parents: tuple[ast.Call, ...] = ()
    extra: dict = field(default_factory=dict)


def _fkey(function: FunctionInfo | None) -> int:
    return id(function) if function is not None else 0


class Lifter:
    """One traversal of a module; `lift()` returns its ModuleIR."""

    def __init__(self, text: SourceText, tree: ast.Module, path: str, catalogue: Catalogue) -> None:
        self.text = text
        self.tree = tree
        self.path = path
        self.cat = catalogue
        tf1 = catalogue.tf1
        self._fn_kind: dict[str, str] = {}
        for kind, names in tf1.get("functions", {}).items():
            for name in names:
                self._fn_kind[name] = kind
        self._method_kind: dict[str, str] = {}
        for kind, names in tf1.get("methods", {}).items():
            for name in names:
                self._method_kind[name] = kind
        self._collections: dict[str, str] = {}
        self._collection_values: dict[str, str] = {}
        for key, spec in tf1.get("collections", {}).items():
            for name in spec["names"]:
                self._collections[name] = key
            self._collection_values[spec["value"]] = key
        train = tf1.get("train_ops", {})
        self._train_methods = set(train.get("methods", ()))
        self._train_helpers = set(train.get("with_update_ops", ()))
        self._var_sources = {k: frozenset(v) for k, v in tf1.get("variable_sources", {}).items()}
        self._coll_sources = {
            k: frozenset(v) for k, v in tf1.get("collection_sources", {}).items()
        }

        self.imports = ImportTable()
        self.functions: list[FunctionInfo] = []
        self._defaults: dict[int, dict[str, ast.expr]] = {}
        self._static: set[int] = set()
        self._site_targets: dict[int, tuple[str, object]] = {}
        self._tower_loop: dict[int, _Loop] = {}
        self.defs: dict[tuple[int, str], list[tuple[str, ast.expr, ast.stmt]]] = defaultdict(list)
        self.loads: dict[tuple[int, str], int] = defaultdict(int)
        self.names: set[str] = set()
        self.class_names: set[str] = set()
        self.bn_raw: list[tuple[_Raw, ApiSpec, str]] = []
        self.gets: dict[int, _Raw] = {}
        self.train_raw: list[_Raw] = []
        self.group_raw: list[_Raw] = []
        self.run_raw: list[_Raw] = []
        self.apply_raw: list[_Raw] = []
        self.local_calls: list[_Raw] = []
        self.loops: list[_Loop] = []
        self._uses_compat_v1 = False

    # -- traversal -------------------------------------------------------------------------

    def lift(self) -> ModuleIR:
        for stmt in self.tree.body:  # module-level imports first: they bind file-wide
            if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                self.imports.add(stmt)
        self._body(self.tree.body, _Ctx())
        return self._resolve()

    def _body(self, stmts: list[ast.stmt], ctx: _Ctx) -> None:
        for stmt in stmts:
            self._stmt(stmt, ctx)

    def _stmt(self, stmt: ast.stmt, ctx: _Ctx) -> None:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            self._function(stmt, ctx)
        elif isinstance(stmt, ast.ClassDef):
            self.names.add(stmt.name)
            self.class_names.add(stmt.name)
            for expr in [*stmt.bases, *stmt.decorator_list]:
                self._expr(expr, ctx, stmt)
            self._body(stmt.body, _Ctx(None, stmt.name, ctx.withs, ctx.loops))
        elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
            self.imports.add(stmt)
            for alias in stmt.names:
                self.names.add((alias.asname or alias.name).split(".")[0])
        elif isinstance(stmt, (ast.For, ast.AsyncFor)):
            self._for(stmt, ctx)
        elif isinstance(stmt, (ast.With, ast.AsyncWith)):
            self._with(stmt, ctx)
        elif isinstance(stmt, ast.Assign):
            self._expr(stmt.value, ctx, stmt)
            for target in stmt.targets:
                self._bind_target(target, stmt.value, stmt, ctx, "assign")
            if len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name) and \
                    isinstance(stmt.value, (ast.Attribute, ast.Name)):
                # `slim = tf.contrib.slim`, `tf = tf.compat.v1`: an alias like an import
                target = self.imports.qualname(stmt.value)
                if target is not None:
                    self.imports.bind(stmt.targets[0].id, target)
        elif isinstance(stmt, ast.AnnAssign):
            if stmt.value is not None:
                self._expr(stmt.value, ctx, stmt)
                self._bind_target(stmt.target, stmt.value, stmt, ctx, "assign")
        elif isinstance(stmt, ast.AugAssign):
            self._expr(stmt.value, ctx, stmt)
            self._expr(stmt.target, ctx, stmt)
            kind = "accumulate" if isinstance(stmt.op, ast.Add) else "assign"
            self._bind_target(stmt.target, stmt.value, stmt, ctx, kind)
        else:
            for name, value in ast.iter_fields(stmt):
                if isinstance(value, list):
                    if value and isinstance(value[0], ast.stmt):
                        self._body(value, ctx)
                    else:
                        for item in value:
                            if isinstance(item, ast.expr):
                                self._expr(item, ctx, stmt)
                            elif isinstance(item, ast.excepthandler):
                                if item.type is not None:
                                    self._expr(item.type, ctx, stmt)
                                if item.name:
                                    self.names.add(item.name)
                                self._body(item.body, ctx)
                            elif isinstance(item, ast.match_case):
                                if item.guard is not None:
                                    self._expr(item.guard, ctx, stmt)
                                self._body(item.body, ctx)
                elif isinstance(value, ast.expr):
                    self._expr(value, ctx, stmt)

    def _bind_target(self, target: ast.expr, value: ast.expr, stmt: ast.stmt, ctx: _Ctx,
                     kind: str) -> None:
        key = _fkey(ctx.function)
        if isinstance(target, ast.Name):
            self.names.add(target.id)
            self.defs[(key, target.id)].append((kind, value, stmt))
        elif isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and \
                target.value.id in ("self", "cls") and ctx.class_name:
            self.defs[(0, f"{ctx.class_name}.{target.attr}")].append((kind, value, stmt))
        elif isinstance(target, (ast.Tuple, ast.List)):
            for elt in target.elts:
                inner = elt.value if isinstance(elt, ast.Starred) else elt
                if isinstance(inner, ast.Name):
                    self.names.add(inner.id)
                    self.defs[(key, inner.id)].append(("unknown", value, stmt))
        else:
            self._expr(target, ctx, stmt)

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef, ctx: _Ctx) -> None:
        self.names.add(node.name)
        for expr in node.decorator_list:
            self._expr(expr, ctx, node)
        args = node.args
        positional = [*args.posonlyargs, *args.args]
        defaults: dict[str, ast.expr] = {}
        for arg, default in zip(positional[len(positional) - len(args.defaults):], args.defaults):
            defaults[arg.arg] = default
        for arg, default in zip(args.kwonlyargs, args.kw_defaults):
            if default is not None:
                defaults[arg.arg] = default
        for default in defaults.values():
            self._expr(default, ctx, node)
        qual = f"{ctx.class_name}.{node.name}" if ctx.class_name else node.name
        if ctx.function is not None:
            qual = f"{ctx.function.qualname}.<locals>.{node.name}"
        params: dict[str, Param] = {}
        for i, arg in enumerate(positional):
            params[arg.arg] = Param(arg.arg, None, None, True, i)
        for arg in args.kwonlyargs:
            params[arg.arg] = Param(arg.arg, None, None, False, -1)
        function = FunctionInfo(qual, node.name, ctx.class_name, self.text.span(node), params)
        self._defaults[id(function)] = defaults  # resolved once module constants are known
        self.names.update(params)
        self.functions.append(function)
        if any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in node.decorator_list):
            self._static.add(id(function))
        self._body(node.body, _Ctx(function, ctx.class_name if ctx.function is None else None,
                                   ctx.withs, ctx.loops))

    def _for(self, node: ast.For | ast.AsyncFor, ctx: _Ctx) -> None:
        self._expr(node.iter, ctx, node)
        targets = frozenset(n.id for n in ast.walk(node.target) if isinstance(n, ast.Name))
        self.names.update(targets)
        loop_var, zero = self._loop_index(node)
        loop = _Loop(node, ctx.function, targets, loop_var, zero,
                     reuse=any(w.reuse for w in ctx.withs))
        inner = _Ctx(ctx.function, ctx.class_name, ctx.withs, (*ctx.loops, loop))
        self._body(node.body, inner)
        self._body(node.orelse, ctx)
        self.loops.append(loop)

    def _loop_index(self, node: ast.For | ast.AsyncFor) -> tuple[str | None, bool]:
        it = node.iter
        if not isinstance(it, ast.Call):
            return (node.target.id if isinstance(node.target, ast.Name) else None), False
        fname = _dotted(it.func)
        if fname in _RANGE_NAMES and isinstance(node.target, ast.Name):
            zero = len(it.args) == 1 or (
                len(it.args) >= 2 and isinstance(it.args[0], ast.Constant) and it.args[0].value == 0
            )
            return node.target.id, zero
        if fname == "enumerate" and isinstance(node.target, ast.Tuple) and node.target.elts and \
                isinstance(node.target.elts[0], ast.Name):
            zero = not it.keywords and len(it.args) == 1
            return node.target.elts[0].id, zero
        return None, False

    def _with(self, node: ast.With | ast.AsyncWith, ctx: _Ctx) -> None:
        frames: list[_With] = []
        for item in node.items:
            self._expr(item.context_expr, ctx, node)
            as_name = None
            if item.optional_vars is not None:
                if isinstance(item.optional_vars, ast.Name):
                    as_name = item.optional_vars.id
                    self.names.add(as_name)
                    self.defs[(_fkey(ctx.function), as_name)].append(("with", item.context_expr, node))
                else:
                    self._expr(item.optional_vars, ctx, node)
            frames.append(self._with_frame(item, as_name, node, ctx))
        withs = ctx.withs + tuple(frames)
        for frame in frames:
            self._note_scope(frame, node, ctx)
        self._body(node.body, _Ctx(ctx.function, ctx.class_name, withs, ctx.loops))

    def _with_frame(self, item: ast.withitem, as_name: str | None, node: ast.With | ast.AsyncWith,
                    ctx: _Ctx) -> _With:
        expr = item.context_expr
        end = item.optional_vars if item.optional_vars is not None else expr
        category, arg, qual, reuse = "other", None, "", False
        if isinstance(expr, ast.Call):
            qual = self._qualname(expr.func) or ""
            category = self._fn_kind.get(qual, "other")
            if category == "other" and isinstance(expr.func, ast.Attribute):
                if self._method_kind.get(expr.func.attr) == "control_dependencies":
                    category = "control_dependencies"
            arg = expr.args[0] if expr.args else (expr.keywords[0].value if expr.keywords else None)
            if category == "variable_scope":
                flag = next((k.value for k in expr.keywords if k.arg == "reuse"), None)
                reuse = flag is not None and not (
                    isinstance(flag, ast.Constant) and flag.value in (False, None))
                if reuse:
                    for loop in ctx.loops:
                        loop.reuse = True
        item_end = self.text.pos(expr.end_lineno, expr.end_col_offset)  # type: ignore[arg-type]
        with_item = WithItem(
            qualname=qual,
            span=self.text.span(expr),
            as_name=as_name,
            item_end=item_end if item.optional_vars is None else self.text.pos(
                end.end_lineno, end.end_col_offset),  # type: ignore[arg-type]
            arg_text=self.text.slice(self.text.span(arg)) if arg is not None else "",
        )
        return _With(category, with_item, arg, ctx.function, reuse)

    def _note_scope(self, frame: _With, node: ast.With | ast.AsyncWith, ctx: _Ctx) -> None:
        """Tower-loop evidence: a device / name scope that depends on a loop's variable."""
        if frame.category not in ("device", "name_scope") or frame.expr is None:
            return
        used = {n.id for n in ast.walk(frame.expr) if isinstance(n, ast.Name)}
        for loop in ctx.loops:
            if not used & loop.targets:
                continue
            if frame.category == "device" and loop.device is None:
                loop.device = (frame.item, self._block(node))
            elif frame.category == "name_scope" and loop.name_scope is None:
                loop.name_scope = frame.item

    def _block(self, node: ast.With | ast.AsyncWith) -> Block | None:
        first, last = node.body[0], node.body[-1]
        if first.lineno == node.lineno:
            return None
        return Block(node.lineno, first.lineno, last.end_lineno or last.lineno,
                     self.text.indentation(first.lineno))

    # -- expressions -----------------------------------------------------------------------

    def _expr(self, root: ast.expr, ctx: _Ctx, stmt: ast.stmt) -> None:
        """Visit every call in `root`, outermost first, knowing the calls around each."""
        fkey = _fkey(ctx.function)
        loads = self.loads
        stack: list[tuple[ast.AST, tuple[ast.Call, ...]]] = [(root, ())]
        while stack:
            node, parents = stack.pop()
            kind = type(node)
            if kind is ast.Name:
                if type(node.ctx) is ast.Load:  # type: ignore[attr-defined]
                    loads[(fkey, node.id)] += 1  # type: ignore[attr-defined]
                continue
            if kind is ast.Constant:
                continue
            if kind is ast.Call:
                self._call(node, ctx, stmt, parents)  # type: ignore[arg-type]
                parents = (*parents, node)  # type: ignore[assignment]
            elif kind is ast.NamedExpr and isinstance(node.target, ast.Name):  # type: ignore[attr-defined]
                self.names.add(node.target.id)  # type: ignore[attr-defined]
                self.defs[(fkey, node.target.id)].append(("assign", node.value, stmt))  # type: ignore[attr-defined]
            for field in _child_fields(kind):
                value = getattr(node, field)
                if type(value) is list:
                    stack.extend((item, parents) for item in value if isinstance(item, ast.AST))
                elif value is not None and not isinstance(value, (str, int, float)):
                    stack.append((value, parents))

    def _qualname(self, func: ast.expr) -> str | None:
        qual = self.imports.qualname(func)
        if qual is None:
            return None
        if qual.startswith("tensorflow.compat.v1."):
            self._uses_compat_v1 = True
        return self.cat.normalize(qual)

    def _call(self, call: ast.Call, ctx: _Ctx, stmt: ast.stmt, parents: tuple[ast.Call, ...]) -> None:
        func = call.func
        qual = self._qualname(func)
        raw = _Raw(call, ctx, stmt, parents)
        if qual is not None:
            spec = self.cat.apis.get(qual)
            if spec is not None:
                self.bn_raw.append((raw, spec, qual))
                return
            kind = self._fn_kind.get(qual)
            if kind == "get_collection":
                self.gets[id(call)] = raw
            elif kind == "group":
                self.group_raw.append(raw)
            elif qual in self._train_helpers:
                raw.extra["kind"] = qual.rsplit(".", 1)[-1]
                self.train_raw.append(raw)
            return
        if isinstance(func, ast.Attribute):
            attr = func.attr
            method = self._method_kind.get(attr)
            if method == "get_collection":
                self.gets[id(call)] = raw
            elif method == "reuse_variables":
                for loop in ctx.loops:
                    loop.reuse = True
            elif attr in self._train_methods:
                raw.extra["kind"] = attr
                self.train_raw.append(raw)
            elif attr == "apply":
                self.apply_raw.append(raw)
            elif attr == "run":
                self.run_raw.append(raw)
            elif attr in ("extend", "append") and isinstance(func.value, ast.Name) and call.args:
                self.defs[(_fkey(ctx.function), func.value.id)].append(
                    ("accumulate", call.args[0], stmt))
            if isinstance(func.value, ast.Name) and func.value.id in ("self", "cls"):
                self.local_calls.append(raw)
            elif isinstance(func.value, ast.Name) and func.value.id in self.class_names:
                self.local_calls.append(raw)
        elif isinstance(func, ast.Name):
            self.local_calls.append(raw)
        elif isinstance(func, ast.Call):
            self.local_calls.append(raw)

    # -- resolution ------------------------------------------------------------------------

    def _resolve(self) -> ModuleIR:
        for function in self.functions:
            self._resolve_defaults(function)
        self._resolve_call_sites()
        towers = self._towers()
        module = ModuleIR(path=self.path, functions=list(self.functions), tower_loops=towers)
        module.bn_sites = [self._bn_site(raw, spec, qual) for raw, spec, qual in self.bn_raw]
        self._instance_calls(module.bn_sites)
        module.collection_gets = [self._collection_get(raw, towers) for raw in self.gets.values()]
        runs_update_ops = any("UPDATE_OPS" in self._keys(r.call, r.ctx.function) for r in self.run_raw)
        module.train_ops = [self._train_op(raw, towers, runs_update_ops) for raw in self.train_raw]
        module.ema_applies = [a for a in map(self._ema_apply, self.apply_raw) if a is not None]
        bindings = self.imports.bindings()
        for local, target in bindings.items():
            module.aliases.setdefault(target, local)
        module.names_in_use = frozenset(self.names)
        module.tf1_prefix = self._tf1_prefix()
        return module

    def _tf1_prefix(self) -> str | None:
        compat = self.imports.alias_of("tensorflow.compat.v1")
        if compat:
            return compat
        tf = self.imports.alias_of("tensorflow")
        if tf:
            return f"{tf}.compat.v1" if self._uses_compat_v1 else tf
        return None

    def _resolve_defaults(self, function: FunctionInfo) -> None:
        for name, expr in self._defaults[id(function)].items():
            param = function.params[name]
            value = self.value(expr, None)
            function.params[name] = Param(name, value, self.text.span(expr), param.positional,
                                          param.index)

    def _resolve_call_sites(self) -> None:
        """Call sites of the functions that hold BN sites, and of their callers (three levels):
        only those can change what a BN site receives, so only those are resolved."""
        by_name: dict[tuple[str | None, str], list[FunctionInfo]] = defaultdict(list)
        for function in self.functions:
            by_name[(function.class_name, function.name)].append(function)
        needed = {id(raw.ctx.function) for raw, _, _ in self.bn_raw if raw.ctx.function}
        done: set[tuple[int, int]] = set()
        for _ in range(3):
            callers: set[int] = set()
            for raw in self.local_calls:
                for function, skip in self._targets(raw, by_name):
                    key = (id(raw.call), id(function))
                    if id(function) not in needed or key in done:
                        continue
                    done.add(key)
                    function.call_sites.append(self._call_site(function, raw, skip))
                    if raw.ctx.function is not None:
                        callers.add(id(raw.ctx.function))
            if callers <= needed:
                break
            needed |= callers

    def _targets(self, raw: _Raw, by_name: dict[tuple[str | None, str], list[FunctionInfo]]
                 ) -> list[tuple[FunctionInfo, bool]]:
        """The module's functions a call may reach, and whether `self` is bound implicitly."""
        func = raw.call.func
        if isinstance(func, ast.Name):
            return [(f, False) for f in by_name.get((None, func.id), [])]
        if not (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)):
            return []
        owner = func.value.id
        if owner not in ("self", "cls"):
            return [(f, False) for f in by_name.get((owner, func.attr), [])]
        cls = raw.ctx.function.class_name if raw.ctx.function else raw.ctx.class_name
        targets = by_name.get((cls, func.attr), [])
        if not targets:
            candidates = [f for f in self.functions if f.name == func.attr and f.class_name]
            targets = candidates if len(candidates) == 1 else []
        return [(f, f.class_name is not None and id(f) not in self._static) for f in targets]

    def _call_site(self, function: FunctionInfo, raw: _Raw, skip_first: bool) -> CallSite:
        call = raw.call
        caller = raw.ctx.function
        ordered = sorted((p for p in function.params.values() if p.positional), key=lambda p: p.index)
        if skip_first:
            ordered = ordered[1:]
        args: dict[str, Value] = {}
        star = False
        for i, arg in enumerate(call.args):
            if isinstance(arg, ast.Starred):
                star = True
                break
            if i < len(ordered):
                args[ordered[i].name] = self.value(arg, caller)
        for kw in call.keywords:
            if kw.arg is None:
                star = True
            else:
                args[kw.arg] = self.value(kw.value, caller)
        if star:
            for name in function.params:
                args.setdefault(name, Unknown("*args/**kwargs", None))
        return CallSite(self.text.span(call), args, self.call_info(call), caller)

    def _towers(self) -> list[TowerLoop]:
        towers = []
        for loop in self.loops:
            if loop.device is None or not loop.reuse:
                continue
            node = loop.node
            item, block = loop.device
            towers.append(TowerLoop(
                span=self.text.span(node),
                function=loop.function,
                loop_var=loop.loop_var,
                starts_at_zero=loop.starts_at_zero,
                reuse=loop.reuse,
                name_scope=loop.name_scope,
                device_block=block,
                device_item=item,
                body_last_row=node.body[-1].end_lineno or node.lineno,
            ))
            self._tower_loop[id(towers[-1])] = loop
        return towers

    def _tower_for(self, raw: _Raw, towers: list[TowerLoop]) -> tuple[TowerLoop | None, bool]:
        """The tower loop a call sits in (innermost), else the last one before it in the same
        function."""
        active = {id(loop) for loop in raw.ctx.loops}
        for tower in reversed(towers):
            if id(self._tower_loop[id(tower)]) in active:
                return tower, True
        row = raw.call.lineno
        before = [t for t in towers if t.function is raw.ctx.function and t.body_last_row < row]
        return (before[-1], False) if before else (None, False)

    def _bn_site(self, raw: _Raw, spec: ApiSpec, qual: str) -> BNSite:
        call = raw.call
        args: dict[str, Arg] = {}
        for i, arg in enumerate(call.args):
            if isinstance(arg, ast.Starred) or i >= len(spec.params):
                break
            name = spec.params[i]
            args[spec.canonical_name(name)] = Arg(name, self.value(arg, raw.ctx.function),
                                                  self.text.span(arg), False)
        for kw in call.keywords:
            if kw.arg is not None:
                args[spec.canonical_name(kw.arg)] = Arg(
                    kw.arg, self.value(kw.value, raw.ctx.function), self.text.span(kw), True)
        site = BNSite(spec.ref, qual, self.call_info(call), args, raw.ctx.function)
        target = self._assigned_target(raw)
        if target is not None:
            self._site_targets[id(site)] = target
        return site

    def _assigned_target(self, raw: _Raw) -> tuple[str, object] | None:
        stmt = raw.stmt
        if isinstance(stmt, ast.Assign) and stmt.value is raw.call and len(stmt.targets) == 1:
            target = stmt.targets[0]
            if isinstance(target, ast.Name):
                return target.id, raw.ctx.function
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and \
                    target.value.id == "self":
                return f"self.{target.attr}", raw.ctx.function.class_name if raw.ctx.function else None
        return None

    def _instance_calls(self, sites: list[BNSite]) -> None:
        """Calls of a BN layer object (`bn(x, training=...)`), for APIs with call-time args."""
        by_call = {id(raw.call): site for (raw, _, _), site in zip(self.bn_raw, sites)}
        targets: dict[tuple[str, object], BNSite] = {}
        for site in sites:
            target = self._site_targets.get(id(site))
            if target is not None:
                targets[target] = site
        for raw in self.local_calls:
            func = raw.call.func
            site = None
            if isinstance(func, ast.Call):
                site = by_call.get(id(func))
            elif isinstance(func, ast.Name):
                site = targets.get((func.id, raw.ctx.function))
            elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and \
                    func.value.id == "self" and raw.ctx.function is not None:
                site = targets.get((f"self.{func.attr}", raw.ctx.function.class_name))
            if site is None:
                continue
            spec = self.cat.apis[site.qualname]
            args: dict[str, Arg] = {}
            for i, arg in enumerate(raw.call.args):
                if isinstance(arg, ast.Starred) or i >= len(spec.call_params):
                    break
                name = spec.call_params[i]
                args[spec.canonical_name(name)] = Arg(name, self.value(arg, raw.ctx.function),
                                                      self.text.span(arg), False)
            for kw in raw.call.keywords:
                if kw.arg is not None:
                    args[spec.canonical_name(kw.arg)] = Arg(
                        kw.arg, self.value(kw.value, raw.ctx.function), self.text.span(kw), True)
            site.instance_calls.append(args)

    def _collection_get(self, raw: _Raw, towers: list[TowerLoop]) -> CollectionGet:
        call = raw.call
        key_expr = call.args[0] if call.args else next(
            (k.value for k in call.keywords if k.arg in ("key", "name")), None)
        scope_expr = call.args[1] if len(call.args) > 1 else next(
            (k.value for k in call.keywords if k.arg == "scope"), None)
        scoped = scope_expr is not None and not (
            isinstance(scope_expr, ast.Constant) and scope_expr.value in (None, ""))
        tower, inside = self._tower_for(raw, towers)
        usage = "other"
        stmt = raw.stmt
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is call:
            usage = "assign"
        elif isinstance(stmt, ast.AugAssign) and stmt.value is call:
            usage = "accumulate"
        elif raw.parents and isinstance(raw.parents[-1].func, ast.Attribute) and \
                raw.parents[-1].func.attr in ("extend", "append"):
            usage = "accumulate"
        after_scope = bool(inside and tower and tower.name_scope and
                           tower.name_scope.span.start.row <= call.lineno)
        return CollectionGet(
            key=self._collection_key(key_expr) or "",
            scoped=scoped,
            call=self.call_info(call),
            function=raw.ctx.function,
            tower=tower,
            inside_tower=inside,
            usage=usage,
            row_in_loop_after_scope=after_scope,
        )

    def _collection_key(self, expr: ast.expr | None) -> str | None:
        if expr is None:
            return None
        if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
            return self._collection_values.get(expr.value)
        qual = self._qualname(expr)
        return self._collections.get(qual) if qual else None

    def _train_op(self, raw: _Raw, towers: list[TowerLoop], runs_update_ops: bool) -> TrainOp:
        call = raw.call
        function = raw.ctx.function
        control = [w for w in raw.ctx.withs if w.category == "control_dependencies"]
        keys: frozenset[str] = frozenset()
        for frame in control:
            if frame.expr is not None:
                keys |= self._keys(frame.expr, frame.function)
        kind = raw.extra["kind"]
        adds = runs_update_ops
        if kind not in self._train_methods:
            update_arg = next((k.value for k in call.keywords if k.arg == "update_ops"), None)
            adds = adds or not (isinstance(update_arg, (ast.List, ast.Tuple)) and not update_arg.elts)
        groups = [p for p in raw.parents if any(g.call is p for g in self.group_raw)]
        if any("UPDATE_OPS" in self._keys(g, function) for g in groups):
            adds = True
        target = _assigned_name(raw.stmt, call)
        if target is not None:
            for group in self.group_raw:
                if group.ctx.function is function and self._mentions(group.call, target) and \
                        "UPDATE_OPS" in self._keys(group.call, function):
                    adds = True
        stmt = raw.stmt
        span = self.text.span(stmt)
        statement = Statement(
            span=span,
            first_row=stmt.lineno,
            last_row=stmt.end_lineno or stmt.lineno,
            wrappable=self.text.starts_row(span.start) and self.text.ends_row(span.end)
            and not isinstance(stmt, (ast.With, ast.AsyncWith, ast.For, ast.If, ast.While,
                                      ast.FunctionDef, ast.ClassDef, ast.Try)),
        )
        tower, inside = self._tower_for(raw, towers)
        return TrainOp(
            kind=kind,
            call=self.call_info(call),
            statement=statement,
            function=function,
            control_keys=keys,
            under_control_deps=bool(control),
            adds_update_ops=adds,
            after_tower=tower if not inside else None,
        )

    @staticmethod
    def _mentions(call: ast.Call, name: str) -> bool:
        return any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(call))

    def _ema_apply(self, raw: _Raw) -> EmaApply | None:
        func = raw.call.func
        assert isinstance(func, ast.Attribute)
        if not self._is_ema(func.value, raw.ctx, 0):
            return None
        call = raw.call
        arg = call.args[0] if call.args else next(
            (k.value for k in call.keywords if k.arg == "var_list"), None)
        var_list = self._vars_expr(arg, raw.ctx.function) if arg is not None else None
        return EmaApply(self.call_info(call), var_list, raw.ctx.function)

    def _is_ema(self, expr: ast.expr, ctx: _Ctx, depth: int) -> bool:
        if depth > _TRACE_DEPTH:
            return False
        if isinstance(expr, ast.Call):
            return self._fn_kind.get(self._qualname(expr.func) or "") == "ema"
        for _, value, _ in self._defs_of(expr, ctx.function, ctx.class_name):
            if self._is_ema(value, ctx, depth + 1):
                return True
        return False

    def _defs_of(self, expr: ast.expr, function: FunctionInfo | None,
                 class_name: str | None = None) -> list[tuple[str, ast.expr, ast.stmt]]:
        if isinstance(expr, ast.Name):
            local = self.defs.get((_fkey(function), expr.id))
            if local:
                return local
            return self.defs.get((0, expr.id), [])
        if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name) and \
                expr.value.id in ("self", "cls"):
            owner = function.class_name if function is not None else class_name
            return self.defs.get((0, f"{owner}.{expr.attr}"), [])
        return []

    # -- values ----------------------------------------------------------------------------

    def value(self, expr: ast.expr, function: FunctionInfo | None, depth: int = 0) -> Value:
        """What is statically known of `expr` evaluated in `function`."""
        span = self.text.span(expr)
        if isinstance(expr, ast.Constant):
            return Const(expr.value, self.text.slice(span), span)
        if isinstance(expr, ast.UnaryOp) and isinstance(expr.operand, ast.Constant) and \
                isinstance(expr.op, (ast.USub, ast.Not)):
            inner = expr.operand.value
            if isinstance(expr.op, ast.Not):
                return Const(not inner, self.text.slice(span), span)
            if isinstance(inner, (int, float)) and not isinstance(inner, bool):
                return Const(-inner, self.text.slice(span), span)
        if isinstance(expr, ast.Name) and depth < _TRACE_DEPTH:
            fkey = _fkey(function)
            local = self.defs.get((fkey, expr.id))
            if function is not None and expr.id in function.params and not local:
                return FromParam(function, expr.id, span)
            defs = local if local else self.defs.get((0, expr.id), [])
            if len(defs) == 1 and defs[0][0] == "assign":
                owner = function if local else None
                return self.value(defs[0][1], owner, depth + 1)
        return Unknown(self.text.slice(span), span)

    def _keys(self, expr: ast.AST, function: FunctionInfo | None, depth: int = 0,
              seen: frozenset[str] = frozenset()) -> frozenset[str]:
        """Collection keys (`UPDATE_OPS` …) whose contents can reach `expr`, through locals."""
        if depth > _TRACE_DEPTH:
            return frozenset()
        if isinstance(expr, ast.Call) and id(expr) in self.gets:
            raw = self.gets[id(expr)]
            key_expr = raw.call.args[0] if raw.call.args else next(
                (k.value for k in raw.call.keywords if k.arg in ("key", "name")), None)
            key = self._collection_key(key_expr)
            return frozenset((key,)) if key else frozenset({"?"})
        if isinstance(expr, ast.Name):
            if expr.id in seen:
                return frozenset()
            out: frozenset[str] = frozenset()
            for _, value, _ in self._defs_of(expr, function):
                out |= self._keys(value, function, depth + 1, seen | {expr.id})
            return out
        out = frozenset()
        for child in ast.iter_child_nodes(expr):
            if isinstance(child, (ast.expr, ast.keyword)):
                out |= self._keys(child, function, depth + 1, seen)
        return out

    def _vars_terms(self, expr: ast.expr, function: FunctionInfo | None,
                    depth: int = 0) -> list[VarsTerm]:
        span = self.text.span(expr)
        text = self.text.slice(span)
        if depth > _TRACE_DEPTH:
            return [VarsTerm(span, text, frozenset())]
        if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add):
            return self._vars_terms(expr.left, function, depth + 1) + \
                self._vars_terms(expr.right, function, depth + 1)
        if isinstance(expr, ast.Call):
            if id(expr) in self.gets:
                key = self._collection_key(expr.args[0] if expr.args else None)
                return [VarsTerm(span, text, self._coll_sources.get(key or "", frozenset()))]
            qual = self._qualname(expr.func)
            if qual in self._var_sources:
                return [VarsTerm(span, text, self._var_sources[qual])]
            if isinstance(expr.func, ast.Name) and expr.func.id in ("list", "tuple", "sorted") \
                    and len(expr.args) == 1:
                inner = self._vars_terms(expr.args[0], function, depth + 1)
                return [VarsTerm(span, text, frozenset().union(*(t.tags for t in inner)))]
        if isinstance(expr, ast.Name):
            defs = self._defs_of(expr, function)
            tags: frozenset[str] = frozenset()
            for _, value, _ in defs:
                for term in self._vars_terms(value, function, depth + 1):
                    tags |= term.tags
            return [VarsTerm(span, text, tags)]
        if isinstance(expr, (ast.List, ast.Tuple)):
            tags = frozenset()
            for elt in expr.elts:
                if isinstance(elt, ast.Starred):
                    for term in self._vars_terms(elt.value, function, depth + 1):
                        tags |= term.tags
            return [VarsTerm(span, text, tags)]
        return [VarsTerm(span, text, frozenset())]

    def _vars_expr(self, arg: ast.expr, function: FunctionInfo | None) -> VarsExpr:
        """A var_list argument, traced through one local variable when it has a single
        definition: the fix then edits the definition if the variable has no other use."""
        if isinstance(arg, ast.Name):
            defs = self._defs_of(arg, function)
            if len(defs) == 1 and defs[0][0] == "assign":
                _, value, stmt = defs[0]
                owner = function if self.defs.get((_fkey(function), arg.id)) else None
                uses = self.loads.get((_fkey(owner), arg.id), 0)
                terms = tuple(self._vars_terms(value, owner))
                edit_span = self.text.span(value) if uses == 1 else self.text.span(arg)
                return VarsExpr(edit_span, self.text.slice(edit_span), terms,
                                self.text.span(stmt), arg.id, uses)
        span = self.text.span(arg)
        return VarsExpr(span, self.text.slice(span), tuple(self._vars_terms(arg, function)),
                        None, None, 0)

    def call_info(self, call: ast.Call) -> CallInfo:
        span = self.text.span(call)
        items: list[ast.AST] = [*call.args, *call.keywords]
        args_end: Pos | None = None
        if items:
            last = max(items, key=lambda n: (n.end_lineno, n.end_col_offset))  # type: ignore[attr-defined]
            args_end = self.text.pos(last.end_lineno, last.end_col_offset)  # type: ignore[attr-defined]
        close = Pos(span.end.row, span.end.col - 1)
        between = self.text.slice(Span(args_end, close)) if args_end else ""
        return CallInfo(
            span=span,
            callee=self.text.slice(self.text.span(call.func)),
            args_end=args_end,
            close_paren=close,
            trailing_comma="," in _strip_comments(between),
            multiline=span.start.row != span.end.row,
        )


@functools.lru_cache(maxsize=None)
def _child_fields(kind: type) -> tuple[str, ...]:
    """The fields of an ast node class that can hold expressions (not `ctx`, not names)."""
    return tuple(f for f in kind._fields if f not in ("ctx", "op", "attr", "id", "arg", "kind",
                                                       "conversion", "type_comment"))


def _strip_comments(text: str) -> str:
    return "\n".join(line.split("#", 1)[0] for line in text.splitlines())


def _dotted(expr: ast.expr) -> str | None:
    parts = []
    while isinstance(expr, ast.Attribute):
        parts.append(expr.attr)
        expr = expr.value
    if isinstance(expr, ast.Name):
        parts.append(expr.id)
        return ".".join(reversed(parts))
    return None


def _assigned_name(stmt: ast.stmt, call: ast.Call) -> str | None:
    if isinstance(stmt, ast.Assign) and stmt.value is call and len(stmt.targets) == 1 and \
            isinstance(stmt.targets[0], ast.Name):
        return stmt.targets[0].id
    return None


def lift(text: SourceText, tree: ast.Module, path: str, catalogue: Catalogue) -> ModuleIR:
    return Lifter(text, tree, path, catalogue).lift()
