"""The one traversal: a walk of a module's CPython `ast` that records raw facts with their
lexical context — BN calls, collection reads, train ops, `with` scopes, loops, assignments,
imports and calls of module-local functions. `bnfix.source.resolve` turns them into the IR."""

from __future__ import annotations

import ast
import functools
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

from bnfix.ir import Block, FunctionInfo, Param, WithItem
from bnfix.rulebook import ApiSpec, Catalogue, LayerSpec
from bnfix.source.imports import ImportTable, ModuleContext
from bnfix.source.text import SourceText

RANGE_NAMES = {"range", "xrange", "six.moves.range", "six.moves.xrange"}
WATCHED_ATTRIBUTES = frozenset({"trainable", "requires_grad"})  # `x.<attr> = value` recorded


class Vocabulary(NamedTuple):
    """The catalogue's TF1 training-graph names, indexed for lookups during the walk."""

    fn_kind: dict[str, str]  # qualified name -> get_collection | group | device | ...
    method_kind: dict[str, str]  # method name -> get_collection | control_dependencies | ...
    collections: dict[str, str]  # qualified name of a GraphKeys member -> canonical key
    collection_values: dict[str, str]  # its string value -> canonical key
    train_methods: frozenset[str]
    train_helpers: frozenset[str]
    var_sources: dict[str, frozenset[str]]
    coll_sources: dict[str, frozenset[str]]
    training_flags: frozenset[str]
    optimizer_prefixes: tuple[str, ...]
    bn_free_prefixes: tuple[str, ...]  # library layers that hold no BN unless given one
    ema_restore_methods: frozenset[str]
    weight_methods: frozenset[str]
    weight_functions: frozenset[str]
    weight_keywords: frozenset[str]
    weight_string_keywords: frozenset[str]
    collection_keywords: frozenset[str]
    removed_by_keras3: tuple[str, ...]  # prefixes of APIs gone from the TF that has Keras 3
    donor_methods: frozenset[str]  # all a model built only to give its weights away is used for
    # the last part of the names of BN APIs with a migration (`batch_norm`): a name or
    # attribute ending so may be a reference to a removed API (`normalizer_fn` in a dict)
    migrated_tails: frozenset[str]


@functools.lru_cache(maxsize=8)
def vocabulary(catalogue: Catalogue) -> Vocabulary:
    tf1 = catalogue.training
    fn_kind = {name: kind for kind, names in tf1.get("functions", {}).items() for name in names}
    method_kind = {name: kind for kind, names in tf1.get("methods", {}).items() for name in names}
    collections: dict[str, str] = {}
    values: dict[str, str] = {}
    for key, spec in tf1.get("collections", {}).items():
        for name in spec["names"]:
            collections[name] = key
        values[spec["value"]] = key
    train = tf1.get("train_ops", {})
    restores = tf1.get("restores", {})
    return Vocabulary(
        fn_kind=fn_kind,
        method_kind=method_kind,
        collections=collections,
        collection_values=values,
        train_methods=frozenset(train.get("methods", ())),
        train_helpers=frozenset(train.get("with_update_ops", ())),
        var_sources={k: frozenset(v) for k, v in tf1.get("variable_sources", {}).items()},
        coll_sources={k: frozenset(v) for k, v in tf1.get("collection_sources", {}).items()},
        training_flags=frozenset(tf1.get("training_flags", {}).get("names", ())),
        optimizer_prefixes=tuple(tf1.get("optimizers", {}).get("prefixes", ())),
        bn_free_prefixes=tuple(tf1.get("bn_free", {}).get("prefixes", ())),
        ema_restore_methods=frozenset(restores.get("ema_methods", ())),
        weight_methods=frozenset(restores.get("weight_methods", ())),
        weight_functions=frozenset(restores.get("weight_functions", ())),
        weight_keywords=frozenset(restores.get("weight_keywords", ())),
        weight_string_keywords=frozenset(restores.get("weight_string_keywords", ())),
        collection_keywords=frozenset(restores.get("collection_keywords", ())),
        removed_by_keras3=tuple(tf1.get("removed_by_keras3", {}).get("prefixes", ())),
        donor_methods=frozenset(restores.get("donor_methods", ())),
        migrated_tails=frozenset(name.rsplit(".", 1)[-1] for name, spec in catalogue.apis.items()
                                 if spec.migration is not None),
    )


@dataclass
class Loop:
    node: ast.For | ast.AsyncFor
    function: FunctionInfo | None
    targets: frozenset[str]
    loop_var: str | None
    starts_at_zero: bool
    reuse: bool = False
    device: tuple[WithItem, Block | None] | None = None
    name_scope: WithItem | None = None
    zip_star: bool = False  # `for grad_and_vars in zip(*tower_grads)`: one entry per tower
    synced: bool = False  # inside `with bnfix.tf1.sync_towers(...)`
    conditions: tuple[tuple[bool, ast.expr], ...] = ()  # the `if` tests it runs under


@dataclass
class WithFrame:
    category: str  # device | name_scope | variable_scope | control_dependencies | other
    item: WithItem
    expr: ast.expr | None  # the first argument (device string, scope name, control inputs)
    function: FunctionInfo | None
    reuse: bool  # a variable_scope opened with reuse=<not False/None> (AUTO_REUSE included)
    call: ast.Call | None = None  # the context expression, when it is a call (an arg_scope)


class Ctx(NamedTuple):
    function: FunctionInfo | None = None
    class_name: str | None = None
    withs: tuple[WithFrame, ...] = ()
    loops: tuple[Loop, ...] = ()
    guards: tuple[tuple[str, ast.expr], ...] = ()  # `if isinstance(name, Class):` around here
    region: ast.AST | None = None  # the innermost `with torch.no_grad()` / decorated function
    param_loops: tuple[tuple[str, str, ast.stmt], ...] = ()  # `for p in m.parameters()`: p, m
    conditions: tuple[tuple[bool, ast.expr], ...] = ()  # enclosing `if` tests (negated?, test)


@dataclass
class Division:
    """`a / b`, `tf.div(a, b)`, `a * (1 / b)`: what is divided by what."""

    left: ast.expr
    right: ast.expr
    function: FunctionInfo | None


@dataclass
class RawCall:
    call: ast.Call
    ctx: Ctx
    stmt: ast.stmt
    parents: tuple[ast.Call, ...] = ()  # the calls whose arguments hold this one
    kind: str = ""  # for train ops: minimize, apply_gradients, create_train_op ...
    written: str = ""  # for BN calls: the qualified name as imported, before aliases


class Zip(NamedTuple):
    """A loop over `zip(*tower_values)`: its target names, and the name of the per-entry tuple."""

    targets: frozenset[str]
    name: str | None


def fkey(function: FunctionInfo | None) -> int:
    return id(function) if function is not None else 0


Def = tuple[str, ast.expr, ast.stmt]  # (assign | accumulate | with | unknown, value, statement)


class Walker:
    """Walks one module once; its attributes are the facts the resolver reads."""

    def __init__(self, text: SourceText, tree: ast.Module, catalogue: Catalogue,
                 context: ModuleContext | None = None) -> None:
        self.text = text
        self.tree = tree
        self.cat = catalogue
        self.vocab = vocabulary(catalogue)
        self.imports = ImportTable(context)
        self.functions: list[FunctionInfo] = []
        self.defaults: dict[int, dict[str, ast.expr]] = {}
        self.static: set[int] = set()
        self.defs: dict[tuple[int, str], list[Def]] = defaultdict(list)
        self.loads: dict[tuple[int, str], int] = defaultdict(int)
        self.names: set[str] = set()
        self.class_names: set[str] = set()
        self.bn_raw: list[tuple[RawCall, ApiSpec]] = []
        self.gets: dict[int, RawCall] = {}
        self.conds: dict[int, ast.Call] = {}  # `tf.cond(...)` calls (their branches: conditions)
        self.train_raw: list[RawCall] = []
        self.group_raw: list[RawCall] = []
        self.run_raw: list[RawCall] = []
        self.apply_raw: list[RawCall] = []
        # functions that open a variable_scope with reuse, and the reuse value they give it
        self.reuse_scopes: list[tuple[FunctionInfo, ast.expr]] = []
        self.local_calls: list[RawCall] = []
        # names passed as arguments (`create_clones(cfg, clone_fn)`): a function of the module
        # handed to a helper that calls it back
        self.callback_refs: list[tuple[ast.Name, RawCall]] = []
        # calls of a name or `self.x` (or `self`) under a `tf.GradientTape` without `training`
        # (with the outermost tape's frame), and the callees given a `training` argument under
        # a tape (by the id of that frame)
        self.tape_raw: list[tuple[RawCall, WithFrame]] = []
        self.indexed_calls: list[RawCall] = []
        self.training_receivers: set[tuple[int, str]] = set()
        # `super().m(...)` and fluent `self.a(...).m(...)`: methods of the instance reached
        # through a call, and each one's `self_chain` (by the call's id)
        self.chained_calls: list[RawCall] = []
        self.chains: dict[int, tuple[str, tuple[str, ...]]] = {}
        self.loops: list[Loop] = []
        self.uses_compat_v1 = False
        self.uses_contrib = False  # TF1-only `tf.contrib` (slim included) is used
        self.removed_by_keras3: str | None = None  # an API called here gone with Keras 3 (2.16)
        self.uses_tf1_api = False  # TF1 graph API called as `tf.X`, not `tf.compat.v1.X`
        self.sum_raw: list[tuple[RawCall, Zip]] = []
        self.divisions: list[Division] = []
        self.divided: set[int] = set()  # ids of expressions that are divided
        self.divided_names: set[tuple[int, str]] = set()
        self.attr_sets: list[tuple[ast.Attribute, ast.expr, ast.stmt, Ctx]] = []
        self.arg_scoped: set[str] = set()  # BN API ids named in an arg_scope
        self.markers: list[tuple[str, ast.AST]] = []
        self.averages_loss = False  # tf.nn.compute_average_loss & co.
        self.attr_calls: list[RawCall] = []  # `x.method(...)` with a plain receiver
        self.model_calls: list[RawCall] = []  # `net(x)` / `self.net(x)` / `m.f(x)` in a region
        self.block_of: dict[int, int] = {}  # statement -> the id of the body holding it
        self.blocks: dict[int, list[ast.stmt]] = {}  # that id -> the body
        self.block_owner: dict[int, ast.If] = {}  # an `if` body's (or else's) id -> the `if`
        self.layer_raw: list[tuple[RawCall, LayerSpec]] = []
        self.step_raw: list[RawCall] = []  # model wraps, optimizers, SyncBN conversions
        self.scope_raw: list[tuple[ast.Call, Ctx, ast.With | ast.AsyncWith]] = []  # `x.scope()`
        self.sequential_raw: list[RawCall] = []
        self.bn_model_raw: list[RawCall] = []  # library models known to hold plain BN
        self.function_nodes: dict[int, ast.FunctionDef | ast.AsyncFunctionDef] = {}
        self.bindings: dict[int, tuple[str, ...]] = {}  # `binding` of a method, by id
        self._by_qualname: dict[str, FunctionInfo] | None = None
        self.ext_calls: list[RawCall] = []  # calls of first-party code imported from elsewhere
        # `with ...control_dependencies(...)` blocks, the names their bodies assign, and the
        # `with` frames around them
        self.control_frames: list[tuple[WithFrame, frozenset[str], tuple[WithFrame, ...]]] = []
        # project marks: what other files' rules ask about this module (`arg_scope:<api>`,
        # `loads_weights`, `registers:<collection>`), with the node and its context
        self.marks: list[tuple[str, ast.AST, Ctx]] = []
        self.restore_raw: list[RawCall] = []  # `x.variables_to_restore(...)`
        # slim's idiom: a layer (or an arg_scope) given `normalizer_fn=slim.batch_norm` builds
        # that BN with `normalizer_params`
        self.normalizer_raw: list[tuple[RawCall, ApiSpec, ast.keyword]] = []
        # names and attributes that may refer to a removed BN API without calling it (a dict
        # value, an `arg_scope` list, a default), and the ids of those a call uses: its callee,
        # its `normalizer_fn=` (the BN sites cover them)
        self.api_mentions: list[tuple[ast.Name | ast.Attribute, Ctx]] = []
        self.api_used: set[int] = set()
        self.training_raw: list[RawCall] = []  # `model(x, training=True)` on a plain receiver
        self.loader_raw: list[RawCall] = []  # `DataLoader(...)`
        # `parser.add_argument("--batch-size", default=256)`: each option's default, by dest
        self.option_defaults: dict[str, ast.expr] = {}
        self.class_defs: list[tuple[ast.ClassDef, Ctx]] = []
        self.returns: dict[int, list[ast.expr]] = defaultdict(list)  # function -> returned values
        # `if isinstance(<a parameter>, <classes>):` by function (what BN converters test)
        self.param_guards: dict[int, list[tuple[ast.If, str, ast.expr]]] = defaultdict(list)

    def walk(self) -> Walker:
        for stmt in self.tree.body:  # module-level imports first: they bind file-wide
            if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                self.imports.add(stmt)
        self._body(self.tree.body, Ctx())
        return self

    def preceding(self, stmt: ast.stmt) -> list[ast.stmt]:
        """The statements before `stmt` in its block, in order (none for a statement the walk
        did not place in a block)."""
        block = self.blocks.get(self.block_of.get(id(stmt), -1)) or []
        index = next((i for i, s in enumerate(block) if s is stmt), 0)
        return block[:index]

    def _in_branches(self, call: ast.Call, parents: tuple[ast.Call, ...], ctx: Ctx) -> Ctx:
        """`ctx` with the predicates of the `cond(pred, true_fn, false_fn)` calls whose branch
        holds `call` (negated in the false branch), outermost first, as enclosing `if` tests."""
        where = (call.lineno, call.col_offset)
        tests = []
        for parent in parents:
            if id(parent) not in self.conds:
                continue
            branches = dict(zip(("true_fn", "false_fn"), parent.args[1:3]))
            branches.update((k.arg, k.value) for k in parent.keywords
                            if k.arg in ("true_fn", "false_fn"))
            pred = next((k.value for k in parent.keywords if k.arg == "pred"), parent.args[0])
            for name, branch in branches.items():
                if (branch.lineno, branch.col_offset) <= where and \
                        (call.end_lineno, call.end_col_offset) <= (branch.end_lineno, branch.end_col_offset):
                    tests.append((name == "false_fn", pred))
        return ctx._replace(conditions=(*ctx.conditions, *tests)) if tests else ctx

    def receiver_chain(self, value: ast.expr) -> ast.expr:
        """`Net(...).to(device).train()` -> `Net(...)`: module methods that return the module
        keep what is assigned the object the call built."""
        kinds = self.vocab.method_kind
        while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and \
                kinds.get(value.func.attr) == "returns_self":
            value = value.func.value
        return value

    def by_qualname(self) -> dict[str, FunctionInfo]:
        """The module's functions by qualified name (made once, after the walk)."""
        if self._by_qualname is None:
            self._by_qualname = {f.qualname: f for f in self.functions}
        return self._by_qualname

    def _body(self, stmts: list[ast.stmt], ctx: Ctx) -> None:
        block = id(stmts)
        self.blocks[block] = stmts
        for stmt in stmts:
            self.block_of[id(stmt)] = block
            self._stmt(stmt, ctx)
            if isinstance(stmt, ast.If) and not stmt.orelse and ctx.function is not None and \
                    isinstance(stmt.body[-1], (ast.Return, ast.Raise)):
                # `if incre_only: return ...`: what follows runs only where the test is false
                ctx = ctx._replace(conditions=(*ctx.conditions, (True, stmt.test)))

    def _stmt(self, stmt: ast.stmt, ctx: Ctx) -> None:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            self._function(stmt, ctx)
        elif isinstance(stmt, ast.ClassDef):
            self.names.add(stmt.name)
            self.class_names.add(stmt.name)
            self.class_defs.append((stmt, ctx))
            for expr in [*stmt.bases, *stmt.decorator_list]:
                self._expr(expr, ctx, stmt)
            self._body(stmt.body, ctx._replace(function=None, class_name=stmt.name, guards=()))
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
            if isinstance(stmt.op, ast.Div) or (isinstance(stmt.op, ast.Mult) and
                                                self._reciprocal(stmt.value, ctx)):
                self._note_division(stmt.target, stmt.value, ctx)
        elif isinstance(stmt, ast.Return):
            if stmt.value is not None:
                self._expr(stmt.value, ctx, stmt)
                self.returns[fkey(ctx.function)].append(stmt.value)
        elif isinstance(stmt, ast.If):
            self._if(stmt, ctx)
        else:
            if isinstance(stmt, ast.Assert):  # `assert isinstance(branch, nn.BatchNorm2d)` (RepVGG)
                self._bn_isinstance(stmt.test, ctx)
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

    def _bias_kept(self, bias: ast.Attribute, ctx: Ctx) -> bool:
        """A use of `m.bias` that a dropped conv bias cannot break: under a test of a bias
        (`if m.bias is not None:`), or of a module narrowed to a BN class (BN keeps its
        bias: `isinstance(m, nn.BatchNorm2d)`, then `m.bias.data.zero_()`)."""
        if any(isinstance(n, ast.Attribute) and n.attr == "bias"
               for _, test in ctx.conditions for n in ast.walk(test)):
            return True
        owner = bias.value
        if not isinstance(owner, ast.Name):
            return False
        return any(name == owner.id and all(s is not None for s in self.guard_specs(classes))
                   for name, classes in ctx.guards)

    def guard_specs(self, classes: ast.expr) -> list[ApiSpec | None]:
        """The catalogue's BN spec of each class an `isinstance` test names (`(A, B)` or `A`),
        None for a class the catalogue does not know."""
        options = classes.elts if isinstance(classes, ast.Tuple) else [classes]
        return [self.cat.apis.get(self.qualname(option) or "") for option in options]

    def _plain_bn_only(self, classes: ast.expr) -> bool:
        """`isinstance(m, nn.BatchNorm2d)`: a test of BN classes of the catalogue that a torch
        plain BN passes and its synchronized counterpart (what a conversion makes of it) does
        not (a class the catalogue does not know may be a base of both: not such a test)."""
        specs = self.guard_specs(classes)
        return bool(specs) and all(s is not None and s.framework == "torch" and not s.synced
                                   and s.synced_counterpart for s in specs)

    def _bn_isinstance(self, test: ast.expr, ctx: Ctx) -> tuple[str, ast.expr] | None:
        """The guard a test makes (see `_guard`), marked where it tests plain BN classes only
        (what a SyncBatchNorm conversion makes of the layers no longer passes it)."""
        guard = _guard(test)
        if guard is not None and guard[0] != "*" and self._plain_bn_only(guard[1]):
            self.marks.append(("bn_isinstance", test, ctx))
        return guard

    def _if(self, stmt: ast.If, ctx: Ctx) -> None:
        """An `if` and its `elif` chain, walked in a loop: a chain of hundreds of branches is
        hundreds of nested `If` nodes, which a recursive walk would not survive."""
        while True:
            self.block_owner[id(stmt.body)] = stmt
            self._expr(stmt.test, ctx, stmt)
            guard = self._bn_isinstance(stmt.test, ctx)
            guards = (*ctx.guards, guard) if guard is not None else ctx.guards
            if guard is not None and ctx.function is not None and guard[0] in ctx.function.params:
                self.param_guards[fkey(ctx.function)].append((stmt, guard[0], guard[1]))
            self._body(stmt.body, ctx._replace(guards=guards,
                                               conditions=(*ctx.conditions, (False, stmt.test))))
            ctx = ctx._replace(conditions=(*ctx.conditions, (True, stmt.test)))
            orelse = stmt.orelse
            if len(orelse) != 1 or not isinstance(orelse[0], ast.If):
                if orelse:
                    self.block_owner[id(orelse)] = stmt
                self._body(orelse, ctx)
                return
            self.blocks[id(orelse)] = orelse  # what _body records for the `elif` ...
            self.block_of[id(orelse[0])] = id(orelse)
            stmt = orelse[0]  # ... which is walked by the next turn of the loop

    def _bind_target(self, target: ast.expr, value: ast.expr, stmt: ast.stmt, ctx: Ctx,
                     kind: str) -> None:
        key = fkey(ctx.function)
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
            if isinstance(target, ast.Attribute) and target.attr in WATCHED_ATTRIBUTES:
                self.attr_sets.append((target, value, stmt, ctx))
            self._expr(target, ctx, stmt)

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef, ctx: Ctx) -> None:
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
        owner = ctx.class_name if ctx.function is None else None  # a nested def is no method
        function = FunctionInfo(qual, node.name, owner, self.text.span(node), params)
        self.defaults[id(function)] = defaults  # resolved once module constants are known
        self.names.update(params)
        self.functions.append(function)
        if any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in node.decorator_list):
            self.static.add(id(function))
        self.function_nodes[id(function)] = node
        no_grad = any(self.vocab.fn_kind.get(self.qualname(
            d.func if isinstance(d, ast.Call) else d) or "") == "no_grad" for d in node.decorator_list)
        self._body(node.body, ctx._replace(function=function,
                                           class_name=ctx.class_name if ctx.function is None
                                           else None,
                                           region=node if no_grad else None, guards=(),
                                           param_loops=(), conditions=()))

    def _for(self, node: ast.For | ast.AsyncFor, ctx: Ctx) -> None:
        self._expr(node.iter, ctx, node)
        targets = frozenset(n.id for n in ast.walk(node.target) if isinstance(n, ast.Name))
        self.names.update(targets)
        loop_var, zero = self._loop_index(node)
        loop = Loop(node, ctx.function, targets, loop_var, zero,
                    reuse=any(w.reuse for w in ctx.withs),
                    zip_star=_is_zip_star(node.iter) or _is_entry_index(node.iter),
                    synced=any(w.category == "sync_towers" for w in ctx.withs),
                    conditions=ctx.conditions)
        inner = ctx._replace(loops=(*ctx.loops, loop))
        it = node.iter
        if isinstance(node.target, ast.Name) and isinstance(it, ast.Call) and \
                isinstance(it.func, ast.Attribute) and it.func.attr == "parameters" and not it.args:
            owner = self.text.slice(self.text.span(it.func.value))
            inner = inner._replace(param_loops=(*ctx.param_loops, (node.target.id, owner, node)))
        self._body(node.body, inner)
        self._body(node.orelse, ctx)
        self.loops.append(loop)

    def _loop_index(self, node: ast.For | ast.AsyncFor) -> tuple[str | None, bool]:
        it = node.iter
        if not isinstance(it, ast.Call):
            return (node.target.id if isinstance(node.target, ast.Name) else None), False
        fname = _dotted(it.func)
        if fname in RANGE_NAMES and isinstance(node.target, ast.Name):
            zero = len(it.args) == 1 or (
                len(it.args) >= 2 and isinstance(it.args[0], ast.Constant) and it.args[0].value == 0
            )
            return node.target.id, zero
        if fname == "enumerate" and isinstance(node.target, ast.Tuple) and node.target.elts and \
                isinstance(node.target.elts[0], ast.Name):
            zero = not it.keywords and len(it.args) == 1
            return node.target.elts[0].id, zero
        return None, False

    def _with(self, node: ast.With | ast.AsyncWith, ctx: Ctx) -> None:
        frames: list[WithFrame] = []
        for item in node.items:
            self._expr(item.context_expr, ctx, node)
            as_name = None
            if item.optional_vars is not None:
                if isinstance(item.optional_vars, ast.Name):
                    as_name = item.optional_vars.id
                    self.names.add(as_name)
                    self.defs[(fkey(ctx.function), as_name)].append(("with", item.context_expr, node))
                else:
                    self._expr(item.optional_vars, ctx, node)
            frames.append(self._with_frame(item, as_name, node, ctx))
            expr = item.context_expr
            if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and \
                    expr.func.attr == "scope" and not expr.args and not expr.keywords:
                self.scope_raw.append((expr, ctx, node))
        withs = ctx.withs + tuple(frames)
        for frame in frames:
            self._note_scope(frame, node, ctx)
            if frame.category == "control_dependencies":
                assigned = frozenset(t.id for stmt in node.body if isinstance(stmt, ast.Assign)
                                     for t in stmt.targets if isinstance(t, ast.Name))
                self.control_frames.append((frame, assigned, ctx.withs))
        no_grad = any(frame.category == "no_grad" for frame in frames)
        self._body(node.body, ctx._replace(withs=withs, region=node if no_grad else ctx.region))

    def _with_frame(self, item: ast.withitem, as_name: str | None, node: ast.With | ast.AsyncWith,
                    ctx: Ctx) -> WithFrame:
        expr = item.context_expr
        end = item.optional_vars if item.optional_vars is not None else expr
        category, arg, qual, reuse = "other", None, "", False
        if isinstance(expr, ast.Call):
            qual = self.qualname(expr.func) or ""
            category = self.vocab.fn_kind.get(qual, "other")
            if category == "other" and isinstance(expr.func, ast.Attribute) and \
                    self.vocab.method_kind.get(expr.func.attr) == "control_dependencies":
                category = "control_dependencies"
            arg = expr.args[0] if expr.args else (expr.keywords[0].value if expr.keywords else None)
            if category == "variable_scope":
                flag = next((k.value for k in expr.keywords if k.arg == "reuse"), None)
                reuse = flag is not None and not (
                    isinstance(flag, ast.Constant) and flag.value in (False, None))
                if reuse:
                    for loop in ctx.loops:
                        loop.reuse = True
                    if ctx.function is not None:  # a helper a tower loop may call (resolver)
                        self.reuse_scopes.append((ctx.function, flag))
        item_end = self.text.pos(expr.end_lineno, expr.end_col_offset)  # type: ignore[arg-type]
        with_item = WithItem(
            qualname=qual,
            span=self.text.span(expr),
            as_name=as_name,
            item_end=item_end if item.optional_vars is None else self.text.pos(
                end.end_lineno, end.end_col_offset),  # type: ignore[arg-type]
            arg_text=self.text.slice(self.text.span(arg)) if arg is not None else "",
        )
        return WithFrame(category, with_item, arg, ctx.function, reuse,
                         expr if isinstance(expr, ast.Call) else None)

    def _note_scope(self, frame: WithFrame, node: ast.With | ast.AsyncWith, ctx: Ctx) -> None:
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

    def _note_division(self, left: ast.expr, right: ast.expr, ctx: Ctx) -> None:
        self.divisions.append(Division(left, right, ctx.function))
        self.divided.add(id(left))
        if isinstance(left, ast.Name):
            self.divided_names.add((fkey(ctx.function), left.id))

    def _reciprocal(self, expr: ast.expr, ctx: Ctx, depth: int = 0) -> bool:
        """`1 / n`, `1.0 / n`: multiplying by it divides; also through a conversion
        (`tf.constant(np.float32(1.0 / n))`) and a local name assigned one (`coef`)."""
        if _reciprocal(expr):
            return True
        if depth >= 3:
            return False
        if isinstance(expr, ast.Call):
            return any(self._reciprocal(a, ctx, depth + 1) for a in expr.args)
        if isinstance(expr, ast.Name):
            return any(self._reciprocal(value, ctx, depth + 1)
                       for _, value, _ in self.defs.get((fkey(ctx.function), expr.id), ()))
        return False

    def _block(self, node: ast.With | ast.AsyncWith) -> Block | None:
        first, last = node.body[0], node.body[-1]
        if first.lineno == node.lineno:
            return None
        return Block(node.lineno, first.lineno, last.end_lineno or last.lineno,
                     self.text.indentation(first.lineno))

    # -- expressions -----------------------------------------------------------------------

    def _expr(self, root: ast.expr, ctx: Ctx, stmt: ast.stmt) -> None:
        """Visit every call in `root`, outermost first, knowing the calls around each."""
        key = fkey(ctx.function)
        loads = self.loads
        tails = self.vocab.migrated_tails
        stack: list[tuple[ast.AST, tuple[ast.Call, ...], tuple[Zip, ...]]] = [(root, (), ())]
        while stack:
            node, parents, zips = stack.pop()
            kind = type(node)
            if kind is ast.Name:
                if type(node.ctx) is ast.Load:  # type: ignore[attr-defined]
                    loads[(key, node.id)] += 1  # type: ignore[attr-defined]
                    if node.id in tails:  # type: ignore[attr-defined]
                        self.api_mentions.append((node, ctx))  # type: ignore[arg-type]
                continue
            if kind is ast.Constant:
                continue
            if kind is ast.Call:
                self._call(node, ctx, stmt, parents, zips)  # type: ignore[arg-type]
                self.api_used.add(id(node.func))  # type: ignore[attr-defined]
                parents = (*parents, node)  # type: ignore[assignment]
            elif kind is ast.Attribute:
                if node.attr in tails:  # type: ignore[attr-defined]
                    self.api_mentions.append((node, ctx))  # type: ignore[arg-type]
                if _other_bias(node.value) and not self._bias_kept(node.value, ctx):  # type: ignore[attr-defined]
                    # `fc.bias.data = ...`, `self.projector[6].bias.requires_grad = False`
                    self.marks.append(("bias_used", node.value, ctx))  # type: ignore[arg-type]
            elif kind in _COMPREHENSIONS:
                for generator in node.generators:  # type: ignore[attr-defined]
                    if _is_zip_star(generator.iter):
                        zips = (*zips, _zip(generator.target))
            elif kind is ast.BinOp:
                op = type(node.op)  # type: ignore[attr-defined]
                if op is ast.Div:
                    self._note_division(node.left, node.right, ctx)  # type: ignore[attr-defined]
                elif op is ast.Mult:
                    if self._reciprocal(node.right, ctx):  # type: ignore[attr-defined]
                        self._note_division(node.left, node.right, ctx)  # type: ignore[attr-defined]
                    elif self._reciprocal(node.left, ctx):  # type: ignore[attr-defined]
                        self._note_division(node.right, node.left, ctx)  # type: ignore[attr-defined]
            elif kind is ast.Subscript and _names_bias(node.slice):  # type: ignore[attr-defined]
                self.marks.append(("bias_by_name", node, ctx))  # type: ignore[arg-type]
            elif kind is ast.NamedExpr and isinstance(node.target, ast.Name):  # type: ignore[attr-defined]
                self.names.add(node.target.id)  # type: ignore[attr-defined]
                self.defs[(key, node.target.id)].append(("assign", node.value, stmt))  # type: ignore[attr-defined]
            for field in _child_fields(kind):
                value = getattr(node, field)
                if type(value) is list:
                    stack.extend((item, parents, zips) for item in value if isinstance(item, ast.AST))
                elif value is not None and not isinstance(value, (str, int, float)):
                    stack.append((value, parents, zips))

    def qualname(self, func: ast.expr) -> str | None:
        qual = self.imports.qualname(func)
        if qual is None:
            if not self.imports.library_star or not isinstance(func, ast.Name) or \
                    func.id in self.names:
                return None
            qual = self._star_name(func.id)
            if qual is None:
                return None
        if qual.startswith("tensorflow.compat.v1."):
            self.uses_compat_v1 = True
        elif qual.startswith("tensorflow.contrib."):
            self.uses_contrib = True
        if self.removed_by_keras3 is None and qual.startswith(self.vocab.removed_by_keras3):
            self.removed_by_keras3 = qual
        return self.cat.normalize(qual)

    def _option_default(self, call: ast.Call) -> None:
        """`add_argument("-b", "--batch-size", default=256)`: the default of `args.batch_size`
        (argparse's dest: `dest=`, else the first long option, dashes made underscores)."""
        default = next((k.value for k in call.keywords if k.arg == "default"), None)
        if default is None:
            return
        dest = next((k.value.value for k in call.keywords if k.arg == "dest"
                     and isinstance(k.value, ast.Constant) and isinstance(k.value.value, str)), None)
        options = [a.value for a in call.args
                   if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        if dest is None:
            long = [o for o in options if o.startswith("--")]
            dest = (long[0][2:] if long else options[0].lstrip("-") if options else "")
            dest = dest.replace("-", "_")
        if dest.isidentifier():
            self.option_defaults[dest] = default

    def _star_name(self, name: str) -> str | None:
        """`BatchNormalization` after `from keras.layers import *`: the star-imported module's
        name, when the catalogue knows it (a BN API, a biased layer, a training function);
        later star imports win, as at run time."""
        for module in reversed(self.imports.library_star):
            qual = f"{module}.{name}"
            known = self.cat.normalize(qual)
            if known in self.cat.apis or known in self.cat.layers or known in self.vocab.fn_kind:
                self.imports.bind(name, qual)
                return qual
        return None

    def _call(self, call: ast.Call, ctx: Ctx, stmt: ast.stmt, parents: tuple[ast.Call, ...],
              zips: tuple[Zip, ...] = ()) -> None:
        func = call.func
        qual = self.qualname(func)
        if self.conds and parents:
            ctx = self._in_branches(call, parents, ctx)
        raw = RawCall(call, ctx, stmt, parents)
        if call.keywords:
            self._keyword_marks(call, ctx, stmt)
        for arg in (*call.args, *(k.value for k in call.keywords)):
            if type(arg) is ast.Name:
                self.callback_refs.append((arg, raw))
            elif _other_bias(arg) and not self._bias_kept(arg, ctx):
                self.marks.append(("bias_used", arg, ctx))  # `nn.init.constant_(m.bias, 0)`
        tape = next((f for f in ctx.withs if f.category == "gradient_tape"), None) \
            if ctx.withs else None
        if tape is not None and _receiver(func):
            if any(k.arg == "training" for k in call.keywords):
                self.training_receivers.add((id(tape), ast.unparse(func)))
            elif call.args and not any(isinstance(a, ast.Starred) for a in call.args) \
                    and all(k.arg is not None for k in call.keywords):
                self.tape_raw.append((raw, tape))
        if qual is not None:
            if qual in self.vocab.weight_functions:
                self.marks.append(("loads_weights", call, ctx))
            spec = self.cat.apis.get(qual)
            if spec is not None:
                raw.written = self.imports.qualname(func) or qual
                self.bn_raw.append((raw, spec))
                return
            layer = self.cat.layers.get(qual)
            if layer is not None:
                self.layer_raw.append((raw, layer))
                return
            kind = self.vocab.fn_kind.get(qual)
            if kind == "get_collection":
                self.gets[id(call)] = raw
            elif kind == "cond" and call.args:
                self.conds[id(call)] = call
            elif kind == "group":
                self.group_raw.append(raw)
            elif kind == "ema_optimizer":
                raw.kind = kind
                self.apply_raw.append(raw)
            elif qual in self.vocab.train_helpers:
                raw.kind = qual.rsplit(".", 1)[-1]
                self.train_raw.append(raw)
            elif kind in ("add_n", "reduce_sum"):
                loop = next((lp for lp in reversed(ctx.loops) if lp.zip_star), None)
                inner = zips[-1] if zips else (_zip(loop.node.target) if loop else None)
                if inner is not None:
                    raw.kind = kind
                    self.sum_raw.append((raw, inner))
            elif kind == "divide" and len(call.args) >= 2:
                self._note_division(call.args[0], call.args[1], ctx)
            elif kind == "multiply" and len(call.args) >= 2:
                first, second = call.args[0], call.args[1]
                if self._reciprocal(second, ctx):
                    self._note_division(first, second, ctx)
                elif self._reciprocal(first, ctx):
                    self._note_division(second, first, ctx)
            elif kind == "arg_scope" and call.args and isinstance(call.args[0], (ast.List, ast.Tuple)):
                for element in call.args[0].elts:
                    spec = self.cat.apis.get(self.qualname(element) or "")
                    if spec is not None:
                        self.arg_scoped.add(spec.id)
                        self.marks.append((f"arg_scope:{spec.id}", call, ctx))
            elif kind == "learning_phase":
                self.marks.append(("learning_phase", call, ctx))
            elif kind in ("graph_mode", "graph_switch"):
                self.markers.append((kind, call))
                if kind == "graph_switch":
                    self.marks.append(("graph_switch", call, ctx))
                if not (self.imports.qualname(func) or "").startswith("tensorflow.compat."):
                    self.uses_tf1_api = True  # `tf.Session()`: TF1 code (TF2 lacks it)
            elif kind == "add_to_collection" and call.args:
                for node in ast.walk(call.args[0]):
                    key = self.vocab.collections.get(self.qualname(node) or "") \
                        if isinstance(node, ast.Attribute) else None
                    if key is not None:
                        self.marks.append((f"registers:{key}", call, ctx))
            elif kind == "average_loss":
                self.averages_loss = True
            elif kind in ("model_wrap", "replica_wrap", "sync_convert"):
                raw.kind = "model_wrap" if kind == "replica_wrap" else kind
                raw.written = qual
                self.step_raw.append(raw)
            elif kind == "sequential":
                self.sequential_raw.append(raw)
            elif kind == "bn_model":
                raw.written = qual
                self.bn_model_raw.append(raw)
            elif kind == "data_loader":
                self.loader_raw.append(raw)
            elif qual.startswith(self.vocab.optimizer_prefixes):
                raw.kind = "optimizer"
                self.step_raw.append(raw)
            elif self.imports.first_party(qual):
                raw.kind, raw.written = "first_party", qual
                self.ext_calls.append(raw)
            return
        if call.keywords and _plain_receiver(func) and any(
                k.arg == "training" and type(k.value) is ast.Constant and k.value.value is True
                for k in call.keywords):
            self.training_raw.append(raw)
        if isinstance(func, ast.Attribute):
            attr = func.attr
            method = self.vocab.method_kind.get(attr)
            if method == "get_collection":
                self.gets[id(call)] = raw
            elif method == "reuse_variables":
                for loop in ctx.loops:
                    loop.reuse = True
            elif attr in self.vocab.train_methods:
                raw.kind = attr
                self.train_raw.append(raw)
            elif attr == "apply":
                self.apply_raw.append(raw)
            elif attr in self.vocab.ema_restore_methods:
                self.restore_raw.append(raw)
            elif attr in self.vocab.weight_methods:
                self.marks.append(("loads_weights", call, ctx))
            elif attr == "run":
                self.run_raw.append(raw)
            elif attr == "add_argument":
                self._option_default(call)
            elif attr == "as_default" and isinstance(func.value, ast.Call) and \
                    self.vocab.fn_kind.get(self.qualname(func.value.func) or "") == "graph":
                self.markers.append(("graph_switch", call))
                self.marks.append(("graph_switch", call, ctx))
            elif attr in ("extend", "append") and isinstance(func.value, ast.Name) and call.args:
                self.defs[(fkey(ctx.function), func.value.id)].append(
                    ("accumulate", call.args[0], stmt))
            owner = func.value.id if isinstance(func.value, ast.Name) else None
            if owner in ("self", "cls") or owner in self.class_names:
                self.local_calls.append(raw)
            elif isinstance(func.value, ast.Call):
                chain = self_chain(func.value)
                if chain is not None:
                    self.chains[id(call)] = chain
                    self.chained_calls.append(raw)
            if _plain_receiver(func.value):
                raw.kind = attr
                self.attr_calls.append(raw)
        elif isinstance(func, (ast.Name, ast.Call)):
            self.local_calls.append(raw)
        elif isinstance(func, ast.Subscript):
            self.indexed_calls.append(raw)  # `self.bns[i](x)`: an element of a container
        if ctx.region is not None and _plain_receiver(func):
            raw.kind = raw.kind or "model_call"
            self.model_calls.append(raw)


    def _keyword_marks(self, call: ast.Call, ctx: Ctx, stmt: ast.stmt) -> None:
        """`resnet50(pretrained=True)` loads published weights; `get_variable(...,
        collections=[..., MOVING_AVERAGE_VARIABLES])` registers a variable in a collection;
        `conv2d(..., normalizer_fn=slim.batch_norm)` builds a BN."""
        for kw in call.keywords:
            if kw.arg == "normalizer_fn":
                spec = self.cat.apis.get(self.qualname(kw.value) or "")
                if spec is not None:
                    self.normalizer_raw.append((RawCall(call, ctx, stmt), spec, kw))
                    self.api_used.add(id(kw.value))
                continue
            literal = kw.value.value if isinstance(kw.value, ast.Constant) else ...
            if (kw.arg in self.vocab.weight_keywords and literal not in (None, False, "")) or (
                    kw.arg in self.vocab.weight_string_keywords and isinstance(literal, str)
                    and literal):
                self.marks.append(("loads_weights", call, ctx))
            elif kw.arg in self.vocab.collection_keywords:
                for node in self._collection_nodes(kw.value, ctx):
                    if isinstance(node, ast.Attribute):
                        key = self.vocab.collections.get(self.qualname(node) or "")
                        if key is not None:
                            self.marks.append((f"registers:{key}", call, ctx))


    def _collection_nodes(self, value: ast.expr, ctx: Ctx) -> Iterator[ast.AST]:
        """The nodes of a `collections=` value, through a local list assigned before it in the
        same function (`moving_collections = [..., GraphKeys.MOVING_AVERAGE_VARIABLES]`)."""
        yield from ast.walk(value)
        if isinstance(value, ast.Name):
            for _, assigned, _ in self.defs.get((fkey(ctx.function), value.id), ()):
                if isinstance(assigned, (ast.List, ast.Tuple, ast.Set)):
                    yield from ast.walk(assigned)


@functools.cache
def _child_fields(kind: type) -> tuple[str, ...]:
    """The fields of an ast node class that can hold expressions (not `ctx`, not names)."""
    return tuple(f for f in kind._fields if f not in ("ctx", "op", "attr", "id", "arg", "kind",
                                                       "conversion", "type_comment"))


def _dotted(expr: ast.expr) -> str | None:
    parts = []
    while isinstance(expr, ast.Attribute):
        parts.append(expr.attr)
        expr = expr.value
    if isinstance(expr, ast.Name):
        parts.append(expr.id)
        return ".".join(reversed(parts))
    return None


def _reciprocal(expr: ast.expr) -> bool:
    """`1 / n`, `1.0 / n`: multiplying by it divides."""
    return isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Div) and \
        isinstance(expr.left, ast.Constant) and expr.left.value == 1


def _guard(test: ast.expr) -> tuple[str, ast.expr] | None:
    """`isinstance(layer, BatchNormalization)` -> ("layer", <the class expression>); a test on
    the class name (`classname.find('BatchNorm') != -1`) -> ("*", <the test>)."""
    if isinstance(test, ast.Call) and isinstance(test.func, ast.Name) and \
            test.func.id == "isinstance" and len(test.args) == 2 and \
            isinstance(test.args[0], ast.Name):
        return test.args[0].id, test.args[1]
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.Or):
        # `isinstance(m, nn.BatchNorm1d) or isinstance(m, nn.BatchNorm2d)`: one test of the
        # classes together
        parts = [_guard(value) for value in test.values]
        names = {part[0] for part in parts if part is not None}
        if None not in parts and len(names) == 1 and "*" not in names:
            classes = [c for part in parts for c in (  # type: ignore[union-attr]
                part[1].elts if isinstance(part[1], ast.Tuple) else [part[1]])]  # type: ignore[index]
            return names.pop(), ast.Tuple(elts=classes, ctx=ast.Load())
    if any(isinstance(n, ast.Constant) and isinstance(n.value, str) and "BatchNorm" in n.value
           for n in ast.walk(test)):
        return "*", test
    return None


_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)


def _other_bias(node: ast.AST) -> bool:
    """`m.bias`, `self.fc.bias`: another module's bias parameter (not a module's own
    `self.bias`), which a layer built with `bias=False` does not have."""
    return type(node) is ast.Attribute and node.attr == "bias" and not (  # type: ignore[attr-defined]
        type(node.value) is ast.Name and node.value.id == "self")  # type: ignore[attr-defined]


def _names_bias(key: ast.expr) -> bool:
    """A subscript key that names a bias parameter by its state-dict name (`'fc.bias'`,
    `f'conv{block}.0.bias'`): code that looks parameters up by name needs the bias to exist."""
    if isinstance(key, ast.JoinedStr) and key.values:
        key = key.values[-1]
    return isinstance(key, ast.Constant) and isinstance(key.value, str) and \
        key.value.endswith(".bias")


def _is_zip_star(expr: ast.expr) -> bool:
    """`zip(*tower_grads)`: one entry per variable, holding one value per tower."""
    return isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and \
        expr.func.id == "zip" and len(expr.args) == 1 and isinstance(expr.args[0], ast.Starred)


def _is_entry_index(expr: ast.expr) -> bool:
    """`range(len(tower_grads[0]))`: the index loop that transposes a list of per-tower lists
    (`[g[i] for g in tower_grads]`), the same walk as `zip(*tower_grads)`; Python 2's
    `xrange` (also through `six.moves`) is the same loop."""
    if not (isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and
            expr.func.id in RANGE_NAMES and len(expr.args) == 1):
        return False
    inner = expr.args[0]
    return isinstance(inner, ast.Call) and isinstance(inner.func, ast.Name) and \
        inner.func.id == "len" and len(inner.args) == 1 and \
        isinstance(inner.args[0], ast.Subscript) and isinstance(inner.args[0].value, ast.Name)


def _zip(target: ast.expr) -> Zip:
    names = frozenset(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    return Zip(names, target.id if isinstance(target, ast.Name) else None)


def binding(walker: Walker, function: FunctionInfo) -> tuple[str, ...]:
    """How a method binds and what it returns: `staticmethod` / `classmethod`, and
    `returns_self` when every return gives the instance back (so `self.m().n()` calls `n` on
    it): from the method's own returns, or, decorated, from its decorator's wrapper when that
    decorator is a function of this module (`def layer(op): def wrapper(self, ...): ...;
    return self`)."""
    found = walker.bindings.get(id(function))
    if found is not None:
        return found
    decorators = walker.function_nodes[id(function)].decorator_list
    facts = {d.id for d in decorators if isinstance(d, ast.Name)} & {"staticmethod",
                                                                     "classmethod"}
    if "staticmethod" not in facts:
        wrapped = [d for d in decorators
                   if not (isinstance(d, ast.Name) and d.id == "classmethod")]
        returner: FunctionInfo | None = function
        if wrapped:
            returner = _wrapper_of(walker, wrapped[0].id) \
                if len(wrapped) == 1 and isinstance(wrapped[0], ast.Name) else None
        if returner is not None and _returns_first(walker, returner):
            facts.add("returns_self")
    found = walker.bindings[id(function)] = tuple(sorted(facts))
    return found


def _wrapper_of(walker: Walker, decorator: str) -> FunctionInfo | None:
    """The function a decorator of this module (a top-level function) returns when it
    returns one it defines."""
    if decorator not in walker.names:  # `property`, `abstractmethod`: defined elsewhere
        return None
    by_qualname = walker.by_qualname()
    outer = by_qualname.get(decorator)
    if outer is None:
        return None
    values = walker.returns.get(id(outer), [])
    if len(values) != 1 or not isinstance(values[0], ast.Name):
        return None
    return by_qualname.get(f"{decorator}.<locals>.{values[0].id}")


def _returns_first(walker: Walker, function: FunctionInfo) -> bool:
    """Every `return` of `function` returns its first parameter (and it has one)."""
    first = next(iter(function.params), None)
    values = walker.returns.get(id(function), [])
    if first is None or not values or not all(isinstance(v, ast.Name) and v.id == first
                                              for v in values):
        return False
    node = walker.function_nodes[id(function)]  # no bare `return` (nested ones count too)
    return not any(isinstance(n, ast.Return) and n.value is None for n in ast.walk(node))


MAX_CHAIN = 64  # links of a fluent chain followed (a network's block is a few dozen layers)


def self_chain(receiver: ast.Call) -> tuple[str, tuple[str, ...]] | None:
    """The instance a method is called on through a call: `super()` / `super(C, self)` as
    (`super`, ()), and a fluent chain `self.a(x).b(y)` as (`self`, ("a", "b")): the methods
    called on the way, which must each return `self` for the chain to stay on the instance."""
    func = receiver.func
    if isinstance(func, ast.Name) and func.id == "super" and len(receiver.args) in (0, 2):
        return "super", ()
    links: list[str] = []
    node: ast.expr = receiver
    while isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        if len(links) == MAX_CHAIN:
            return None  # each call of a chain is recorded with the links before it
        links.append(node.func.attr)
        node = node.func.value
    if isinstance(node, ast.Name) and node.id in ("self", "cls") and links:
        return node.id, tuple(reversed(links))
    return None


def _plain_receiver(expr: ast.expr) -> bool:
    """`model`, `self.model`, `self.net.backbone`: a name or attribute chain, nothing computed."""
    while isinstance(expr, ast.Attribute):
        expr = expr.value
    return isinstance(expr, ast.Name)


def _receiver(func: ast.expr) -> bool:
    """A call's callee that may hold a model: a name, `self.<name>`, or `self` itself."""
    return isinstance(func, ast.Name) or isinstance(func, ast.Attribute) and \
        isinstance(func.value, ast.Name) and func.value.id == "self"
