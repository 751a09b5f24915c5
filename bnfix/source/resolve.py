"""Resolution: the walker's raw facts become IR records. Values are followed through
parameters and the call sites of their functions, local assignments and module constants;
collections through locals into control dependencies, groups and fetches; variable lists into
the families they hold. Works on recorded nodes only: it never walks the module again."""

from __future__ import annotations

import ast
import functools
import operator
import re
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence

from bnfix.findings import Pos, Span
from bnfix.ir import (
    ApiMention,
    Arg,
    AttributeSet,
    Block,
    BNSite,
    Builder,
    CallInfo,
    CallSite,
    CollectionGet,
    Const,
    DeviceScope,
    EmaApply,
    FromParam,
    FunctionInfo,
    GradientSum,
    LayerCall,
    LibraryModel,
    Mark,
    Marker,
    ModuleIR,
    Param,
    Statement,
    TapeCall,
    TowerLoop,
    TrainingCall,
    TrainOp,
    Unknown,
    Value,
    VarsExpr,
    VarsTerm,
    is_const,
    negate,
)
from bnfix.rulebook import ApiRef, ApiSpec, LayerSpec
from bnfix.source.calls import call_info, unpacks
from bnfix.source.subclasses import Alias, bn_aliases
from bnfix.source.torch_context import TorchContext, conditions_of
from bnfix.source.walk import Ctx, Loop, RawCall, Walker, Zip, binding, fkey
from bnfix.source.wrappers import layer_aliases

TRACE_DEPTH = 6
_ARITHMETIC = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
               ast.Div: operator.truediv}


MOMENTS = ("moments", "sufficient_statistics", "weighted_moments")  # tf.nn's batch moments
MOVES = ("cuda", "to", "cpu")  # torch module methods that return the module itself (moved)
# torch's BN base classes (as the catalogue normalizes them), which a project's BN class extends
TORCH_BN_BASES = frozenset({"torch.nn._BatchNorm", "torch.nn._NormBase"})
MAX_CLASS_DEPTH = 8  # classes between a project's BN class and torch's, tuples, loop lists


class Resolver:
    def __init__(self, walker: Walker, path: str) -> None:
        self.w = walker
        self.text = walker.text
        self.vocab = walker.vocab
        self.path = path
        self._site_targets: dict[int, tuple[str, object]] = {}
        self._tower_loop: dict[int, Loop] = {}
        self._done_sites: set[tuple[int, int]] = set()
        self._aliased: dict[int, tuple[str, bool]] = {}  # call id -> (BN subclass, own __init__)
        self.aliases: dict[str, Alias] = {}  # the module's BN subclasses taken as their BN
        self.layer_aliases: dict[str, LayerSpec] = {}  # its classes taken as a biased layer

    def resolve(self) -> ModuleIR:
        self._subclass_constructions()
        for function in self.w.functions:
            self._resolve_defaults(function)
        self._forwarded = self._forwarding_factories()
        self._reuse_through_calls()
        self._resolve_call_sites()
        towers = self._towers()
        module = ModuleIR(path=self.path, functions=list(self.w.functions), tower_loops=towers)
        module.bn_sites = [self._bn_site(raw, spec) for raw, spec in self.w.bn_raw]
        module.bn_sites += [self._normalizer_site(*item) for item in self.w.normalizer_raw]
        _mark_opt_outs(module.bn_sites)
        module.api_mentions = self._api_mentions()
        module.loader_batch = self._loader_batch()
        module.training_calls = [
            TrainingCall(self.text.slice(self.text.span(raw.call.func)),
                         self.bind_args(raw, ())["training"], raw.ctx.function)
            for raw in self.w.training_raw]
        self._instance_calls(module.bn_sites)
        module.collection_gets = [self._collection_get(raw, towers) for raw in self.w.gets.values()]
        runs_update_ops = any("UPDATE_OPS" in self._keys(r.call, r.ctx.function) for r in self.w.run_raw)
        module.train_ops = [self._train_op(raw, towers, runs_update_ops) for raw in self.w.train_raw]
        module.ema_applies = [a for a in map(self._ema_apply, self.w.apply_raw) if a is not None]
        bindings = self.w.imports.bindings()
        for local, target in bindings.items():
            module.aliases.setdefault(target, local)
        module.names_in_use = frozenset(self.w.names)
        module.tf1_prefix = self._tf1_prefix()
        module.tf1_code = not self.w.uses_compat_v1 and (
            self.w.uses_contrib or self.w.uses_tf1_api or any(
                target.startswith("tensorflow.contrib") for target in bindings.values()))
        module.removed_by_keras3 = self.w.removed_by_keras3
        module.gradient_sums = [g for g in map(self._gradient_sum, self.w.sum_raw) if g is not None]
        module.attribute_sets = [self._attribute_set(*item, module.bn_sites)
                                 for item in self.w.attr_sets]
        module.graph_mode = [Marker(kind, self.text.span(node), self.text.slice(self.text.span(node)))
                             for kind, node in self.w.markers]
        module.loss_scaled_per_tower = self.w.averages_loss or any(
            self._scales_loss(d.left, d.right) for d in self.w.divisions)
        module.legacy_keras = "TF_USE_LEGACY_KERAS" in self.text.text
        module.arg_scoped = frozenset(self.w.arg_scoped)
        module.device_scopes = self.device_scopes
        module.bn_models = [LibraryModel(r.written, self.text.slice(self.text.span(r.call.func)),
                                         self.text.span(r.call), r.ctx.function,
                                         _assigned_name(r.stmt, r.call))
                            for r in self.w.bn_model_raw]
        module.tape_calls = self._tape_calls()
        module.backends = _backends(self.text.text)
        module.marks = [Mark(kind, self.text.span(node), None,
                             ctx.function.qualname if ctx.function else None)
                        for kind, node, ctx in self.w.marks
                        if kind != "bn_isinstance" or not self._at_construction(ctx.function)]
        module.marks += [Mark("ema_restore", self.text.span(raw.call), None,
                              raw.ctx.function.qualname if raw.ctx.function else None)
                         for raw in self.w.restore_raw
                         if self._is_ema(raw.call.func.value, raw.ctx, 0)]  # type: ignore[attr-defined]
        module.marks += _update_ops_marks(module)
        module.import_row = self._import_row()
        module.converters = self._converters()
        TorchContext(self).lift_into(module)
        return module

    # -- BN converters -----------------------------------------------------------------------

    def _converters(self) -> dict[str, tuple[str, bool]]:
        """Functions that convert a model's BN layers: under `isinstance(<param>, <torch BN
        class>)` they build a synchronized BN (the catalogue's, or a class of this file
        derived from torch's BN) from the parameter's `num_features` and return it — torch's
        converter copied into a project, vacancy's `convert_model` (whose classes come from a
        `for` over `zip` of class lists). Fresh: the new layer is not given the old one's
        parameter objects (`new.weight = module.weight`), so an optimizer built over the old
        ones no longer trains them."""
        if not self.w.param_guards or "num_features" not in self.text.text:
            return {}
        classes = {node.name: node for node, ctx in self.w.class_defs if ctx.function is None}
        out: dict[str, tuple[str, bool]] = {}
        for function in self.w.functions:
            guards = self.w.param_guards.get(fkey(function))
            if guards:
                found = self._conversion(function, guards, classes)
                if found is not None:
                    out[function.qualname] = found
        return out

    def _conversion(self, function: FunctionInfo, guards: list[tuple[ast.If, str, ast.expr]],
                    classes: dict[str, ast.ClassDef]) -> tuple[str, bool] | None:
        returned = {v.id for v in self.w.returns.get(fkey(function), ()) if isinstance(v, ast.Name)}
        if not returned:
            return None  # a converter returns the module it made
        loops = _loop_classes(lp.node for lp in self.w.loops if lp.function is function)
        for branch, param, tested in guards:
            if not self._bn_class(tested, loops, classes, function, False):
                continue
            for stmt in (n for s in branch.body for n in ast.walk(s)):
                if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                        and isinstance(stmt.targets[0], ast.Name)
                        and stmt.targets[0].id in returned and isinstance(stmt.value, ast.Call)
                        and any(_attribute_of(a, param, "num_features") for a in
                                (*stmt.value.args, *(k.value for k in stmt.value.keywords)))
                        and self._bn_class(stmt.value.func, loops, classes, function, True)):
                    continue
                new = stmt.targets[0].id
                reused = any(isinstance(a, ast.Assign) and any(
                    _attribute_of(t, new, "weight") for t in a.targets)
                    and _attribute_of(a.value, param, "weight")
                    for s in branch.body for a in ast.walk(s))
                return param, not reused
        return None

    def _bn_class(self, expr: ast.expr, loops: dict[str, list[ast.expr]],
                  classes: dict[str, ast.ClassDef], function: FunctionInfo, synced: bool,
                  depth: int = 0) -> bool:
        """`expr` names torch BN classes (a tuple of them, a loop variable over lists of
        them); `synced`: synchronized ones (the catalogue's), or classes of this file derived
        from torch's BN."""
        if depth > MAX_CLASS_DEPTH:
            return False
        if isinstance(expr, ast.Tuple):
            return bool(expr.elts) and all(
                self._bn_class(e, loops, classes, function, synced, depth + 1) for e in expr.elts)
        if isinstance(expr, ast.Name) and expr.id in loops:
            return all(self._bn_class(e, {}, classes, function, synced, depth + 1)
                       for e in loops[expr.id])
        if isinstance(expr, ast.Name) and expr.id == "cls" and function.class_name in classes:
            expr = ast.Name(function.class_name)
        if isinstance(expr, ast.Name) and expr.id in classes and \
                self.w.imports.qualname(expr) is None:
            return any(self._bn_class(b, {}, classes, function, False, depth + 1)
                       for b in classes[expr.id].bases)
        qualname = self.w.qualname(expr) if isinstance(expr, (ast.Name, ast.Attribute)) else None
        if qualname is None:
            return False
        normal = self.w.cat.normalize(qualname)
        spec = self.w.cat.apis.get(normal)
        if spec is not None:
            return spec.framework == "torch" and (spec.synced or not synced)
        return not synced and normal in TORCH_BN_BASES

    def _tf1_prefix(self) -> str | None:
        compat = self.w.imports.alias_of("tensorflow.compat.v1")
        if compat:
            return compat
        tf = self.w.imports.alias_of("tensorflow")
        if tf:
            return f"{tf}.compat.v1" if self.w.uses_compat_v1 else tf
        return None

    def _function_body(self, function: FunctionInfo) -> Block | None:
        node = self.w.function_nodes[id(function)]
        body = node.body
        first = body[0]
        if len(body) > 1 and isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                and isinstance(first.value.value, str):
            first = body[1]  # keep the docstring first
        if first.lineno == node.lineno or not self.text.starts_row(self.text.span(first).start):
            return None
        last = body[-1]
        return Block(node.lineno, first.lineno, last.end_lineno or last.lineno,
                     self.text.indentation(first.lineno))

    def site_target(self, site: BNSite) -> tuple[str, object] | None:
        """What a BN site was assigned to (`self.bn` in class C, `bn` in a function)."""
        return self._site_targets.get(id(site))

    def _gradient_sum(self, item: tuple[RawCall, Zip]) -> GradientSum | None:
        """A sum over the towers of one variable's gradients, or None if the call sums
        something else (another axis, values not derived from the loop's tuple)."""
        raw, loop = item
        call = raw.call
        function = raw.ctx.function
        if not call.args:
            return None
        if raw.kind == "reduce_sum":
            axis = call.args[1] if len(call.args) > 1 else next(
                (k.value for k in call.keywords if k.arg in ("axis", "reduction_indices")), None)
            if axis is None or not _is_axis_zero(axis):
                return None
        if not self._derives_from(call.args[0], loop.targets, function):
            return None
        target = _assigned_name(raw.stmt, call)
        if target is None and isinstance(raw.stmt, ast.Assign) and len(raw.stmt.targets) == 1 \
                and isinstance(raw.stmt.targets[0], ast.Name) and \
                isinstance(raw.stmt.value, ast.IfExp) and call in (raw.stmt.value.body,
                                                                   raw.stmt.value.orelse):
            target = raw.stmt.targets[0].id  # `g = g[0] if len(g) == 1 else tf.add_n(g)`
        divided = id(call) in self.w.divided or (
            target is not None and (fkey(function), target) in self.w.divided_names) or (
            target is not None and self._divided_later(call, target, function))
        stmt_value = getattr(raw.stmt, "value", None)
        nested = stmt_value is not call and not (raw.parents and call in raw.parents[-1].args)
        return GradientSum(raw.kind, call_info(self.text, call), function, loop.name, divided, nested)

    def weights_only(self, raw: RawCall) -> bool:
        """The object the call builds is assigned to a name that is only the receiver of
        methods that read or load weights (a pretrained model built to give its weights to
        the model that trains)."""
        name = _assigned_name(raw.stmt, raw.call)
        if name is None:
            return False
        key = (fkey(raw.ctx.function), name)
        uses = self.w.loads.get(key, 0)
        return uses > 0 and self._donations.get(key, 0) == uses

    @functools.cached_property
    def _donations(self) -> dict[tuple[int, str], int]:
        """Per (function, name): the calls of a weight-reading method on it (`m.load_weights`,
        `m.get_layer(...)`), counted once for the module."""
        out: dict[tuple[int, str], int] = defaultdict(int)
        for r in self.w.attr_calls:
            func = r.call.func
            if r.kind in self.vocab.donor_methods and isinstance(func, ast.Attribute) and \
                    isinstance(func.value, ast.Name):
                out[(fkey(r.ctx.function), func.value.id)] += 1
        return out

    def _divided_later(self, call: ast.Call, target: str, function: FunctionInfo | None) -> bool:
        """A division after the sum, in the same function, of a value computed from it (the
        sums collected, then each scaled by `1 / count` in a later loop)."""
        return any(d.function is function and d.left.lineno > call.lineno and
                   self._derives_from(d.left, frozenset((target,)), function)
                   for d in self.w.divisions)

    def attribute_param(self, node: ast.expr, function: FunctionInfo | None
                        ) -> tuple[FunctionInfo, str] | None:
        """`self.batch_norm` in a method of a class whose `__init__` sets it, once in the class
        and in its body's own statements, to a parameter as passed (`self.batch_norm =
        batch_norm`): `__init__` and that parameter (mmagic's VGG16, spektral's MLP)."""
        if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and
                node.value.id == "self" and function is not None and function.class_name):
            return None
        init = self.w.by_qualname().get(f"{function.class_name}.__init__")
        defs = self.w.defs.get((0, f"{function.class_name}.{node.attr}"), ())
        if init is None or len(defs) != 1:
            return None
        kind, value, stmt = defs[0]
        if kind != "assign" or not isinstance(value, ast.Name) or value.id not in init.params \
                or value.id in ("self", "cls") or \
                not any(s is stmt for s in self.w.function_nodes[id(init)].body):
            return None
        return init, value.id

    def names_used(self, expr: ast.expr, function: FunctionInfo | None) -> frozenset[str]:
        """The names `expr` depends on: its own, and (through local assignments in
        `function`) those their values were computed from."""
        out: set[str] = set()
        todo = [expr]
        for _ in range(TRACE_DEPTH):
            found = {n.id for e in todo for n in ast.walk(e)
                     if isinstance(n, ast.Name) and n.id not in out}
            if not found:
                break
            out |= found
            todo = [value for name in found
                    for _, value, _ in self.w.defs.get((fkey(function), name), [])]
        return frozenset(out)

    def _derives_from(self, expr: ast.expr, names: frozenset[str], function: FunctionInfo | None,
                      depth: int = 0, seen: frozenset[str] = frozenset()) -> bool:
        """`expr` is computed from one of `names`, directly or through local assignments."""
        if depth > TRACE_DEPTH:
            return False
        for node in ast.walk(expr):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                if node.id in names:
                    return True
                if node.id in seen:
                    continue
                for _, value, _ in self.w.defs.get((fkey(function), node.id), []):
                    if self._derives_from(value, names, function, depth + 1, seen | {node.id}):
                        return True
        return False

    def _scales_loss(self, left: ast.expr, right: ast.expr) -> bool:
        """`loss / num_towers`, `tf.div(total_loss, 1.0 * num_clones)`: per-tower loss scaling."""
        numerator = self.text.slice(self.text.span(left)).lower()
        denominator = self.text.slice(self.text.span(right)).lower()
        return "loss" in numerator and _TOWER_COUNT.search(denominator) is not None

    def _attribute_set(self, target: ast.Attribute, value: ast.expr, stmt: ast.stmt, ctx: Ctx,
                       sites: list[BNSite]) -> AttributeSet:
        owner = self.text.slice(self.text.span(target.value))
        site = None
        for candidate in sites:
            key = self._site_targets.get(id(candidate))
            if key is None:
                continue
            name, scope = key
            if name == owner and (scope is ctx.function or (
                    owner.startswith("self.") and ctx.function is not None
                    and scope == ctx.function.class_name)):
                site = candidate
                break
        guard = None
        for name, classes in ctx.guards:
            if name == owner:
                for spec in self.w.guard_specs(classes):
                    if spec is not None:
                        guard = spec.ref
        return AttributeSet(target.attr, self.value(value, ctx.function), self.text.span(stmt),
                            owner, site, guard, ctx.function)

    def _resolve_defaults(self, function: FunctionInfo) -> None:
        function.body = self._function_body(function)
        function.training_flag = next(
            (p for p in function.params if p in self.vocab.training_flags), None)
        for name, expr in self.w.defaults[id(function)].items():
            param = function.params[name]
            value = self.value(expr, None)
            function.params[name] = Param(name, value, self.text.span(expr), param.positional,
                                          param.index)

    def _reuse_through_calls(self) -> None:
        """A device loop whose towers share variables through a function of this module: the
        loop calls a helper that opens `variable_scope(..., reuse=<flag>)`, directly or through
        the module's other functions (PSENet's `tower_loss(images, ..., reuse_variables)`,
        whose flag the loop sets True after the first tower). A call that passes the flag as
        False or None does not share."""
        if not self.w.reuse_scopes or not any(
                lp.device is not None and not lp.reuse for lp in self.w.loops):
            return
        flags: dict[int, str | None] = {}  # reusing function -> its flag parameter, if any
        for function, flag in self.w.reuse_scopes:
            name = flag.id if isinstance(flag, ast.Name) and flag.id in function.params else None
            flags[id(function)] = name if flags.get(id(function), name) == name else None
        by_name = self._by_name
        calls = [(raw, self._targets(raw, by_name))
                 for raw in [*self.w.local_calls, *self.w.chained_calls]]
        changed = True
        while changed:  # the module's functions that call a reusing one
            changed = False
            for raw, targets in calls:
                caller = raw.ctx.function
                if caller is not None and id(caller) not in flags and any(
                        id(t) in flags for t, _ in targets):
                    flags[id(caller)] = None
                    changed = True
        for raw, targets in calls:
            if any(id(t) in flags and not self._passes_false(raw, t, bound, flags[id(t)])
                   for t, bound in targets):
                for loop in raw.ctx.loops:
                    if loop.device is not None:
                        loop.reuse = True

    def _passes_false(self, raw: RawCall, function: FunctionInfo, bound: bool,
                      param: str | None) -> bool:
        """The call gives `function`'s parameter `param` False or None: a literal, or a local
        name that every assignment of the calling function sets to one (terngrad's tower loop
        passes `reuse_variables`, set to None before the loop and again after each tower)
        (`bound`: `self` is the first parameter, not passed)."""
        if param is None:
            return False
        spec = function.params[param]
        value = next((k.value for k in raw.call.keywords if k.arg == param), None)
        index = spec.index - 1 if bound else spec.index
        if value is None and spec.positional and 0 <= index < len(raw.call.args):
            value = raw.call.args[index]
        if isinstance(value, ast.Name):
            caller = raw.ctx.function
            defs = self.w.defs.get((fkey(caller), value.id), [])
            return caller is not None and value.id not in caller.params and bool(defs) and all(
                kind == "assign" and _false_literal(assigned) for kind, assigned, _ in defs)
        return value is not None and _false_literal(value)

    def _resolve_call_sites(self) -> None:
        """Call sites of the functions that hold BN sites or collect UPDATE_OPS, and of their
        callers (three levels): only those can change what a BN site receives, so only those
        are resolved (the project view asks for more: `resolve_call_sites`)."""
        needed = {id(raw.ctx.function) for raw, _ in self.w.bn_raw if raw.ctx.function}
        needed |= {id(raw.ctx.function) for raw, _, _ in self.w.normalizer_raw if raw.ctx.function}
        needed |= {id(raw.ctx.function) for raw in self.w.gets.values() if raw.ctx.function}
        needed |= {id(raw.ctx.function) for raw in self.w.model_calls if raw.ctx.function}
        needed |= {id(raw.ctx.function) for raw, _ in self.w.tape_raw if raw.ctx.function}
        self.resolve_call_sites(needed)

    def _at_construction(self, function: FunctionInfo | None) -> bool:
        """Code that runs while a model is constructed: `__init__`, or a function that only
        `__init__` methods of the file call (`self._initialize_weights()`), before anything
        could have converted its BN."""
        if function is None:
            return False
        if function.name == "__init__":
            return True
        self.resolve_call_sites({id(function)})
        return bool(function.call_sites) and all(
            s.caller is not None and s.caller.name == "__init__" for s in function.call_sites)

    def resolve_call_sites(self, functions: set[int]) -> None:
        """Resolve the module-local call sites of `functions` (by id) and of their callers,
        three levels up (each call resolved once, however often this is asked)."""
        by_name = self._by_name
        needed = set(functions)
        done = self._done_sites
        for _ in range(3):
            callers: set[int] = set()
            for node, raw, function, skip in self._reaching(by_name):
                key = (id(node), id(function))
                if id(function) not in needed or key in done:
                    continue
                done.add(key)
                function.call_sites.append(
                    self._call_site(function, raw, skip) if skip is not None
                    else self._callback_site(function, node, raw))  # type: ignore[arg-type]
                if raw.ctx.function is not None:
                    callers.add(id(raw.ctx.function))
            if callers <= needed:
                break
            needed |= callers

    def _reaching(self, by_name: dict[tuple[str | None, str], list[FunctionInfo]]
                  ) -> Iterator[tuple[ast.AST, RawCall, FunctionInfo, bool | None]]:
        """What reaches a function of the module: its calls (the call, whether `self` is
        bound) and the names that hand it to a helper (the name, None)."""
        for raw in [*self.w.local_calls, *self.w.chained_calls]:
            for function, skip in self._targets(raw, by_name):
                yield raw.call, raw, function, skip
        for name, raw, function in self._callbacks:
            yield name, raw, function, None

    @functools.cached_property
    def _callbacks(self) -> list[tuple[ast.Name, RawCall, FunctionInfo]]:
        """The names passed as arguments that stand for a function of the module, with it
        (worked out once: most names passed are values, filtered by the module's names)."""
        defined = {name for owner, name in self._by_name if owner is None}
        out = []
        for name, raw in self.w.callback_refs:
            if name.id in defined:
                function = self._callback(name, raw)
                if function is not None:
                    out.append((name, raw, function))
        return out

    def _callback(self, name: ast.Name, raw: RawCall) -> FunctionInfo | None:
        """The module's function that `name`, passed as an argument of `raw`, stands for: one
        defined at the top level or nested in the calling function (or a function around it),
        unless the caller has a parameter of that name."""
        caller = raw.ctx.function
        if caller is not None and name.id in caller.params:
            return None
        scopes = caller.qualname.split(".<locals>.") if caller is not None else []
        visible = {name.id, *(".<locals>.".join([*scopes[:i], name.id])
                              for i in range(1, len(scopes) + 1))}
        found = [f for f in self._by_name.get((None, name.id), ()) if f.qualname in visible]
        return max(found, key=lambda f: f.qualname.count("<locals>")) if found else None

    def _callback_site(self, function: FunctionInfo, name: ast.Name, raw: RawCall) -> CallSite:
        """A function handed to a helper (`create_clones(cfg, clone_fn, [batch])`,
        `mp.spawn(main_worker, ...)`) runs where the helper is called: a call site of it, which
        passes what the helper passes (unknown) for each parameter without a default and
        leaves the defaults (a helper calls back with the arguments a callback needs). Tagged
        `callback`: nothing edits the helper's call for it."""
        callee = call_info(self.text, raw.call).callee
        args: dict[str, Value] = {
            p.name: Unknown(f"what `{callee}` passes", None)
            for p in function.params.values() if p.default is None}
        return CallSite(self.text.span(name), args, call_info(self.text, raw.call), raw.ctx.function,
                        tags=(*self.call_tags(raw), "callback"))

    @functools.cached_property
    def _by_name(self) -> dict[tuple[str | None, str], list[FunctionInfo]]:
        by_name: dict[tuple[str | None, str], list[FunctionInfo]] = defaultdict(list)
        for function in self.w.functions:
            by_name[(function.class_name, function.name)].append(function)
        return by_name

    def _targets(self, raw: RawCall, by_name: dict[tuple[str | None, str], list[FunctionInfo]]
                 ) -> list[tuple[FunctionInfo, bool]]:
        """The module's functions a call may reach, and whether `self` is bound implicitly."""
        func = raw.call.func
        if isinstance(func, ast.Name):
            functions = by_name.get((None, func.id), [])
            if not functions:  # `Net(...)` runs `Net.__init__`, or the one it inherits
                for klass in (func.id, *self._bases.get(func.id, ())):
                    if by_name.get((klass, "__init__")):
                        return [(f, True) for f in by_name[(klass, "__init__")]]
                return []
            return [(f, False) for f in functions]
        if id(raw.call) in self.w.chains:
            assert isinstance(func, ast.Attribute)
            return self._instance_targets(raw, func.attr, by_name)
        if not (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)):
            return []
        owner = func.value.id
        if owner not in ("self", "cls"):
            return [(f, False) for f in by_name.get((owner, func.attr), [])]
        cls = raw.ctx.function.class_name if raw.ctx.function else raw.ctx.class_name
        targets = by_name.get((cls, func.attr), [])
        if not targets:
            candidates = [f for f in self.w.functions if f.name == func.attr and f.class_name]
            targets = candidates if len(candidates) == 1 else []
        return [(f, f.class_name is not None and id(f) not in self.w.static) for f in targets]

    def _instance_targets(self, raw: RawCall, name: str,
                          by_name: dict[tuple[str | None, str], list[FunctionInfo]]
                          ) -> list[tuple[FunctionInfo, bool]]:
        """`super().name()` (the method of the nearest base class of this file that has it)
        and `self.a().name()` (while each method on the way returns `self`), in a method of
        class C of this file: what the project index resolves the same way when the classes
        are in other files."""
        found = self.w.chains[id(raw.call)]
        cls = raw.ctx.function.class_name if raw.ctx.function else None
        if cls is None:
            return []
        bases = self._bases.get(cls, [])
        classes = bases if found[0] == "super" else [cls, *bases]

        def lookup(method: str) -> list[FunctionInfo]:
            return next((by_name[(k, method)] for k in classes if by_name.get((k, method))), [])

        for link in found[1]:  # each must hand the instance back
            links = lookup(link)
            if not links or not all("returns_self" in binding(self.w, f) for f in links):
                return []
        return [(f, id(f) not in self.w.static) for f in lookup(name)]

    @functools.cached_property
    def _bases(self) -> dict[str, list[str]]:
        """Each class of the module: its base classes defined in the module, nearest first."""
        direct = {node.name: [b.id for b in node.bases if isinstance(b, ast.Name)]
                  for node, ctx in self.w.class_defs if ctx.function is None}
        out: dict[str, list[str]] = {}
        for cls, own in direct.items():
            order: list[str] = []
            queue = list(own)
            while queue and len(order) < 32:
                base = queue.pop(0)
                if base in direct and base not in order and base != cls:
                    order.append(base)
                    queue.extend(direct[base])
            out[cls] = order
        return out

    def _call_site(self, function: FunctionInfo, raw: RawCall, skip_first: bool) -> CallSite:
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
        return CallSite(self.text.span(call), args, call_info(self.text, call), caller,
                        tags=self.call_tags(raw))

    def call_tags(self, raw: RawCall) -> tuple[str, ...]:
        """Where a call sits: in a TF1 tower loop, after one in the same function, under a
        multi-device tf.distribute strategy scope, in an evaluation region (`no_grad` block or
        decorated function)."""
        tags = []
        row = raw.call.lineno
        if any(loop.device is not None and loop.reuse for loop in raw.ctx.loops):
            tags.append("tower")
        elif any(loop.function is raw.ctx.function and loop.device is not None and loop.reuse
                 and (loop.node.end_lineno or row) < row for loop in self.w.loops):
            tags.append("after_tower")
        if any(s.function is raw.ctx.function and s.first_row <= row <= s.last_row
               for s in self.device_scopes):
            tags.append("strategy")
        if raw.ctx.region is not None:
            tags.append("no_grad")
        return tuple(tags)

    @functools.cached_property
    def device_scopes(self) -> list[DeviceScope]:
        return [d for d in map(self._device_scope, self.w.scope_raw) if d]

    def _towers(self) -> list[TowerLoop]:
        towers = []
        for loop in self.w.loops:
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
                header=Span(self.text.span(node).start, self.text.span(node.iter).end),
                count=self._tower_count(node),
                statement=self.statement(node, compound_ok=True),
                synced=loop.synced,
            ))
            self._tower_loop[id(towers[-1])] = loop
        return towers

    def _import_row(self) -> int:
        """The row after the module's last top-level import (after its docstring and
        `__future__` imports when it has none)."""
        body = self.w.tree.body
        imports = [s for s in body if isinstance(s, (ast.Import, ast.ImportFrom))]
        if imports:
            return (imports[-1].end_lineno or imports[-1].lineno) + 1
        first = body[0] if body else None
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and \
                isinstance(first.value.value, str):
            return (first.end_lineno or first.lineno) + 1
        return 1

    def _tower_count(self, node: ast.For | ast.AsyncFor) -> str | None:
        """How many towers the loop builds, as source text: `n` of `range(n)`, `len(xs)` of
        `enumerate(xs)` (None when the loop's shape says nothing)."""
        it = node.iter
        if not isinstance(it, ast.Call) or it.keywords:
            return None
        name = self.text.slice(self.text.span(it.func))
        if name == "range" and len(it.args) == 1:
            return self.text.slice(self.text.span(it.args[0]))
        if name == "range" and len(it.args) == 2 and isinstance(it.args[0], ast.Constant) and \
                it.args[0].value == 0:
            return self.text.slice(self.text.span(it.args[1]))
        if name in ("enumerate", "len") and len(it.args) == 1:
            return f"len({self.text.slice(self.text.span(it.args[0]))})"
        return None

    def _device_scope(self, item: tuple[ast.Call, Ctx, ast.With | ast.AsyncWith]
                      ) -> DeviceScope | None:
        """`with X.scope():` where X is a multi-device tf.distribute strategy: resolved through
        the assignments of X, or — when X comes from elsewhere — judged by its name."""
        call, ctx, node = item
        receiver = call.func.value  # type: ignore[attr-defined]
        kind = self._strategy_kind(receiver, ctx)
        if kind == "large_batch_strategy":
            return None
        if kind is None:
            name = receiver.attr if isinstance(receiver, ast.Attribute) else getattr(receiver, "id", "")
            if not (name == "strategy" or name.endswith("_strategy")):
                return None
        elif kind != "strategy":
            return None
        last = node.body[-1]
        return DeviceScope(self.text.slice(self.text.span(receiver)), self.text.span(call),
                           ctx.function, node.body[0].lineno, last.end_lineno or last.lineno,
                           kind is not None)

    def _strategy_kind(self, expr: ast.expr, ctx: Ctx, depth: int = 0) -> str | None:
        """"strategy" / "single_strategy" for an expression that builds one, else None."""
        if isinstance(expr, ast.Call):
            kind = self.vocab.fn_kind.get(self.w.qualname(expr.func) or "")
            return kind if kind in ("strategy", "single_strategy", "large_batch_strategy") else None
        if depth > 2:
            return None
        for _, value, _ in self._defs_of(expr, ctx.function, ctx.class_name):
            kind = self._strategy_kind(value, ctx, depth + 1)
            if kind is not None:
                return kind
        return None

    def _tower_for(self, raw: RawCall, towers: list[TowerLoop]) -> tuple[TowerLoop | None, bool]:
        """The tower loop a call sits in (innermost), else the last one before it in the same
        function."""
        active = {id(loop) for loop in raw.ctx.loops}
        for tower in reversed(towers):
            if id(self._tower_loop[id(tower)]) in active:
                return tower, True
        row = raw.call.lineno
        before = [t for t in towers if t.function is raw.ctx.function and t.body_last_row < row]
        return (before[-1], False) if before else (None, False)

    def _api_args(self, raw: RawCall, spec: ApiSpec, params: tuple[str, ...]) -> dict[str, Arg]:
        """A BN call's arguments by canonical name, bound against the API's parameter order."""
        return {spec.canonical_name(name): arg for name, arg in self.bind_args(raw, params).items()}

    def bind_args(self, raw: RawCall, params: tuple[str, ...]) -> dict[str, Arg]:
        """A call's arguments by parameter name, bound against a parameter order."""
        args: dict[str, Arg] = {}
        function = raw.ctx.function
        for i, arg in enumerate(raw.call.args):
            if isinstance(arg, ast.Starred) or i >= len(params):
                break
            name = params[i]
            span = self.text.span(arg)
            args[name] = Arg(name, self.value(arg, function), span, False, span,
                             self.text.slice(span), self._items(arg))
        for kw in raw.call.keywords:
            if kw.arg is not None:
                value_span = self.text.span(kw.value)
                args[kw.arg] = Arg(kw.arg, self.value(kw.value, function), self.text.span(kw), True,
                                   value_span, self.text.slice(value_span), self._items(kw.value))
        return args

    def _items(self, expr: ast.expr) -> tuple[tuple[object, str], ...] | None:
        """A dict literal with constant keys as (key, value text) pairs (`param_initializers`)."""
        if not isinstance(expr, ast.Dict) or not all(
                isinstance(k, ast.Constant) for k in expr.keys):
            return None
        return tuple((k.value, self.text.slice(self.text.span(v)))  # type: ignore[union-attr]
                     for k, v in zip(expr.keys, expr.values))

    def _subclass_constructions(self) -> None:
        """Constructions of the module's BN subclasses that only re-route arguments: BN
        calls of the API they extend (subclasses.py); of its classes that are a biased layer
        under another name: layer calls (wrappers.py)."""
        classes = [node for node, ctx in self.w.class_defs if ctx.function is None]
        aliases = self.aliases = bn_aliases(classes, self.w.imports, self.w.cat) if classes else {}
        layers = self.layer_aliases = layer_aliases(classes, self.w.imports, self.w.cat) \
            if classes else {}
        if not aliases and not layers:
            return
        for raw in self.w.local_calls:
            func = raw.call.func
            if isinstance(func, ast.Name) and func.id in layers:
                self.w.layer_raw.append((raw, layers[func.id]))
            elif isinstance(func, ast.Name) and func.id in aliases:
                alias = aliases[func.id]
                raw.written = alias.written
                self._aliased[id(raw.call)] = (func.id, alias.own_init)
                self.w.bn_raw.append((raw, alias.spec))

    def _bn_site(self, raw: RawCall, spec: ApiSpec) -> BNSite:
        via, own_init = self._aliased.get(id(raw.call), (None, False))
        # a subclass with its own `__init__`: its positional parameters are not the base's
        args = self._api_args(raw, spec, () if own_init else spec.params)
        for name, arg in self._scope_defaults(raw, spec).items():
            args.setdefault(name, arg)
        qual = self.w.cat.normalize(raw.written)
        unpacked = unpacks(raw.call) or (own_init and bool(raw.call.args))
        site = BNSite(spec.ref, qual, call_info(self.text, raw.call, align=True), args, raw.ctx.function,
                      unpacked=unpacked, written=raw.written,
                      conditions=conditions_of(self.text, raw, functools.partial(
                          self.names_used, function=raw.ctx.function), functools.partial(
                          self.attribute_param, function=raw.ctx.function)), via_class=via,
                      alternatives=self._alternatives(raw.call.func))
        site.shared_stats = self._shared_stats(raw, spec)
        for name in self._forwarded.get(id(raw.call), ()):
            site.bound[spec.canonical_name(name)] = FromParam(raw.ctx.function, name, None)  # type: ignore[arg-type]
        target = self._assigned_target(raw)
        if target is not None:
            self._site_targets[id(site)] = target
        return site

    def _shared_stats(self, raw: RawCall, spec: ApiSpec) -> bool:
        """A BN given its mean (`tf.nn.batch_normalization(x, mean, ...)`) that is a name of its
        function none of whose assignments is the batch's moments (`tf.nn.moments`, or a call
        of a function of this file that computes them) made where the BN is (in the loop that
        builds the towers, when there is one): statistics shared by every tower (CRNN's
        cross-tower BN averages the towers' moments before its loop) or moving averages."""
        if "mean" not in spec.params:
            return False
        index = spec.params.index("mean")
        call = raw.call
        mean = next((k.value for k in call.keywords if k.arg == "mean"),
                    call.args[index] if len(call.args) > index else None)
        if not isinstance(mean, ast.Name) or any(isinstance(a, ast.Starred) for a in call.args):
            return False
        defs = self.w.defs.get((fkey(raw.ctx.function), mean.id), ())
        loop = raw.ctx.loops[-1].node if raw.ctx.loops else None
        return bool(defs) and not any(
            self._moments(value) and (loop is None or
                                      loop.lineno <= stmt.lineno <= (loop.end_lineno or 0))
            for _, value, stmt in defs)

    def _moments(self, value: ast.expr) -> bool:
        """`tf.nn.moments(x, axes)` (or a function of this file that calls it) or a value
        taken from one (`moments[0]`)."""
        while isinstance(value, (ast.Subscript, ast.Attribute)):
            value = value.value
        if not isinstance(value, ast.Call):
            return False
        qual = self.w.qualname(value.func) or ""
        if qual.rsplit(".", 1)[-1] in MOMENTS:
            return True
        return isinstance(value.func, (ast.Name, ast.Attribute)) and \
            ast.unparse(value.func).rsplit(".", 1)[-1] in self._moment_functions

    @functools.cached_property
    def _moment_functions(self) -> frozenset[str]:
        """The functions of this file whose body computes batch moments (tensorlayer's
        `mean_var_with_update` closure)."""
        out = set()
        for function in self.w.functions:
            node = self.w.function_nodes[id(function)]
            if any(isinstance(n, ast.Call) and (self.w.imports.qualname(n.func) or "")
                   .rsplit(".", 1)[-1] in MOMENTS for n in ast.walk(node)):
                out.add(function.name)
        return frozenset(out)

    def _forwarding_factories(self) -> dict[int, tuple[str, ...]]:
        """BN calls that pass on their function's own `*args` / `**kwargs` (keras-YOLOv3's
        `def CustomBatchNormalization(*args, **kwargs): return BatchNorm(*args, **kwargs)`):
        what the function's callers pass reaches the BN, by keyword, and by position when the
        function has no positional parameter of its own. The BN's parameters it does not name
        become its parameters (a caller that does not pass one leaves it unknown, as
        `**kwargs` does); by call id, the names forwarded."""
        out: dict[int, tuple[str, ...]] = {}
        for raw, spec in self.w.bn_raw:
            function = raw.ctx.function
            if function is None:
                continue
            node = self.w.function_nodes[id(function)].args
            call = raw.call
            starred = [a.value for a in call.args if isinstance(a, ast.Starred)]
            double = [k.value for k in call.keywords if k.arg is None]
            if not (starred or double) or not all(
                    isinstance(v, ast.Name) and node.vararg is not None and v.id == node.vararg.arg
                    for v in starred) or not all(
                    isinstance(v, ast.Name) and node.kwarg is not None and v.id == node.kwarg.arg
                    for v in double):
                continue
            positional = bool(starred) and len(call.args) == 1 and not any(
                p.positional for p in function.params.values())
            written = {c: w for w, c in spec.canonical.items()}
            keywords = [written.get(k, k) for k in spec.defaults if k not in spec.call_params]
            passed = {k.arg for k in call.keywords if k.arg is not None}
            names = [p for p in dict.fromkeys((*spec.params, *keywords))
                     if p not in function.params and p not in passed
                     and (double or positional and p in spec.params)]
            for name in names:
                index = spec.params.index(name) if positional and name in spec.params else -1
                function.params[name] = Param(name, Unknown(f"not passed to `{function.name}`",
                                                            None), None, index >= 0, index)
            if names:
                out[id(call)] = tuple(names)
        return out

    def _tape_calls(self) -> list[TapeCall]:
        """Models called without `training` under a GradientTape, in functions that apply
        gradients (a TF2 training step), where nothing under the same tape passes `training`
        to that callee (a gradient penalty's inner tape): with what builds the model."""
        steps: dict[int, list[tuple[int, str]]] = defaultdict(list)
        for r in self.w.train_raw:
            if r.kind in ("apply_gradients", "minimize"):
                steps[fkey(r.ctx.function)].append((r.call.lineno, ast.unparse(r.call)))
        out = []
        for raw, tape in self.w.tape_raw:
            function = raw.ctx.function
            written = ast.unparse(raw.call.func)
            updates = sorted(steps.get(fkey(function), ()))
            if not updates or (id(tape), written) in self.w.training_receivers:
                continue
            # the step's update of this model (a GAN applies two): the one that names its
            # variables, else the first after the call
            row = next((r for r, text in updates if f"{written}." in text),
                       next((r for r, _ in updates if r > raw.call.lineno), updates[-1][0]))
            func = raw.call.func
            owner = function.class_name if isinstance(func, ast.Name) and func.id == "self" \
                and function is not None else None
            builders: tuple[Builder, ...] = ()
            if isinstance(func, ast.Name) and owner is None:
                builders = self._builders_of(func.id, function, 2)
            elif isinstance(func, ast.Attribute) and function is not None and function.class_name:
                builders = self._built(self.w.defs.get((0, f"{function.class_name}.{func.attr}"),
                                                       ()))
            if not builders and owner is None:
                continue
            classes = {owner} | {b.local_class for b in builders}
            signatures = {self.call_signature(c) for c in classes if c}
            out.append(TapeCall(call_info(self.text, raw.call), written, function, builders,
                                owner, row, any(self.trains_by_default(c) for c in classes if c),
                                len(raw.call.args),
                                signatures.pop() if len(signatures) == 1 else None))
        return out

    def _builders_of(self, name: str, function: FunctionInfo | None, depth: int
                     ) -> tuple[Builder, ...]:
        """The calls that build what `name` holds in `function`: its assignments there, else
        (a closure) the enclosing functions', else the module's, else (a parameter) what the
        callers here pass, `depth` levels up."""
        if function is not None and name in function.params:
            out: list[Builder] = []
            for site in function.call_sites if depth > 0 else ():
                value = site.args.get(name)
                if site.where or not isinstance(value, Unknown) or value.span is None:
                    continue
                if value.text.isidentifier():
                    out.extend(self._builders_of(value.text, site.caller, depth - 1))
                elif value.span.start in self._calls_at:  # `step(Net(), opt, x)`
                    call = self._calls_at[value.span.start]
                    out.extend(self._built([("assign", call, call)]))  # type: ignore[list-item]
            return tuple(out)
        local = self.w.defs.get((fkey(function), name), ()) if function is not None else ()
        outer = function
        while not local and outer is not None and "<locals>" in outer.qualname:
            # a closure's free name: what the enclosing function binds (tensorflow/gan's
            # ESRGAN `train_step` runs the `discriminator` its `train` builds)
            outer = self.w.by_qualname().get(outer.qualname.rsplit(".<locals>.", 1)[0])
            if outer is not None and name in outer.params:
                return self._builders_of(name, outer, depth)
            local = self.w.defs.get((fkey(outer), name), ()) if outer is not None else ()
        return self._built(local or self.w.defs.get((0, name), ()))

    def _built(self, defs: Sequence[tuple[str, ast.expr, ast.stmt]], depth: int = 2
               ) -> tuple[Builder, ...]:
        out: list[Builder] = []
        for kind, value, stmt in defs:
            if kind != "assign":
                continue
            function = max((f for f in self.w.functions
                            if f.span.start.row <= stmt.lineno <= f.span.end.row),
                           key=lambda f: f.span.start.row, default=None)
            if isinstance(value, ast.Name) and function is not None and \
                    value.id in function.params and depth > 0:
                # `self.model = model` in `__init__(self, model)`: what its callers pass
                self.resolve_call_sites({id(function)})
                out.extend(self._builders_of(value.id, function, depth - 1))
                continue
            if not isinstance(value, ast.Call):
                continue
            func = value.func
            qual = self.w.qualname(func) or ""
            kind_of = self.vocab.fn_kind.get(qual)
            local = func.id if isinstance(func, ast.Name) and func.id in self.w.class_names \
                else None
            since = None
            if kind_of == "functional_model" and function is not None:
                inputs = value.args[0] if value.args else next(
                    (k.value for k in value.keywords if k.arg == "inputs"), None)
                made = self.w.defs.get((fkey(function), inputs.id), ()) \
                    if isinstance(inputs, ast.Name) else ()
                since = self.text.span(made[0][1]).start if made else function.span.start
            out.append(Builder(self.text.span(value), function, since, local,
                               bool(qual) and qual.startswith(self.vocab.bn_free_prefixes)))
        return tuple(out)

    def model_builders(self, expr: ast.expr, function: FunctionInfo | None, stmt: ast.stmt
                       ) -> tuple[Builder, ...]:
        """The calls that build the model `expr` is (`Net().cuda(rank)`, `model.to(device)`,
        `model` assigned here or passed by this file's callers, `self.model` assigned in the
        class); empty when not known."""
        while isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and \
                expr.func.attr in MOVES:
            expr = expr.func.value  # `.cuda()`, `.to(device)` return the model itself
        if isinstance(expr, ast.Call):
            return self._built([("assign", expr, stmt)])
        if isinstance(expr, ast.Name):
            return self._builders_of(expr.id, function, 2)
        attribute = expr.attr if isinstance(expr, ast.Attribute) and \
            isinstance(expr.value, ast.Name) and expr.value.id == "self" else None
        if attribute is not None and function is not None and function.class_name:
            return self._built(self.w.defs.get((0, f"{function.class_name}.{attribute}"), ()))
        return ()

    @functools.cached_property
    def _calls_at(self) -> dict[Pos, ast.Call]:
        return {self.text.span(node).start: node for node in ast.walk(self.w.tree)
                if isinstance(node, ast.Call)}

    def call_signature(self, class_name: str) -> tuple[str, ...] | None:
        """The parameters of the file's class `class_name`'s Keras `call` that can be passed by
        position, `self` aside (`*args` is not among them; None: it defines no `call`)."""
        call = next((f for f in self.w.functions if f.class_name == class_name
                     and f.name == "call"), None)
        if call is None:
            return None
        return tuple(p.name for p in call.params.values() if p.positional)[1:]

    def trains_by_default(self, class_name: str) -> bool:
        """The file's class `class_name` defaults its `call`'s `training` to True: a call
        without `training` trains."""
        call = next((f for f in self.w.functions if f.class_name == class_name
                     and f.name == "call"), None)
        param = call.params.get("training") if call is not None else None
        return param is not None and is_const(param.default, True)

    def _loader_batch(self) -> int | None:
        """The batch of this file's training data loaders (shuffled, or given a sampler): the
        smallest, when every one is a known integer (a literal, a module constant, an
        argparse default: `batch_size=args.batch_size`); else None."""
        sizes = []
        for raw in self.w.loader_raw:
            keywords = {k.arg: k.value for k in raw.call.keywords if k.arg is not None}
            shuffle = keywords.get("shuffle")
            if "sampler" not in keywords and not (isinstance(shuffle, ast.Constant)
                                                  and shuffle.value is True):
                continue  # an evaluation loader
            size = keywords.get("batch_size", raw.call.args[1] if len(raw.call.args) > 1 else None)
            known = self._known_int(size, raw.ctx.function) if size is not None else None
            if known is None:
                return None
            sizes.append(known)
        return min(sizes, default=None)

    def _known_int(self, expr: ast.expr, function: FunctionInfo | None) -> int | None:
        """An integer known statically, also through arithmetic on known integers
        (`batch_size=args.batch_size * args.mu`: FixMatch's unlabeled loader)."""
        if isinstance(expr, ast.BinOp) and type(expr.op) in _ARITHMETIC:
            left = self._known_int(expr.left, function)
            right = self._known_int(expr.right, function)
            if left is None or right is None or (right == 0 and type(expr.op) is ast.Div):
                return None
            result = _ARITHMETIC[type(expr.op)](left, right)
            return result if type(result) is int else None
        value = self.value(expr, function)
        if not isinstance(value, Const) and isinstance(expr, ast.Attribute) and \
                expr.attr in self.w.option_defaults:
            value = self.value(self.w.option_defaults[expr.attr], None)
        if isinstance(value, Const) and type(value.value) is int:
            return value.value
        return None

    def _api_mentions(self) -> list[ApiMention]:
        """The removed BN APIs this module names without calling them (a call's callee and
        its `normalizer_fn=` are BN sites already)."""
        out = []
        for node, ctx in self.w.api_mentions:
            if id(node) in self.w.api_used:
                continue
            written = self.w.imports.qualname(node)
            spec = self.w.cat.apis.get(self.w.cat.normalize(written)) if written else None
            if spec is None or spec.migration is None:
                continue
            span = self.text.span(node)
            out.append(ApiMention(spec.ref, written, self.text.slice(span), span, ctx.function,
                                  self._alternatives(node)))
        return out

    def _normalizer_site(self, raw: RawCall, spec: ApiSpec, keyword: ast.keyword) -> BNSite:
        """slim's idiom: `conv2d(..., normalizer_fn=slim.batch_norm, normalizer_params=p)`
        (or the same in an arg_scope) builds that BN with `p` (a dict, written here or in a
        local variable) and the defaults of enclosing `arg_scope([slim.batch_norm], ...)`."""
        function = raw.ctx.function
        args: dict[str, Arg] = {}
        params = next((k.value for k in raw.call.keywords if k.arg == "normalizer_params"), None)
        for name, arg in self._dict_args(params, function).items():
            args[spec.canonical_name(name)] = arg
        for name, arg in self._scope_defaults(raw, spec).items():
            args.setdefault(name, arg)
        value_span = self.text.span(keyword.value)
        info = call_info(self.text, raw.call)
        info = CallInfo(info.span, self.text.slice(value_span), info.args_end, info.close_paren,
                        info.trailing_comma, info.multiline)
        written = self.w.imports.qualname(keyword.value) or spec.names[0]
        return BNSite(spec.ref, self.w.cat.normalize(written), info, args, function,
                      unpacked=params is not None and not args, written=written,
                      conditions=conditions_of(self.text, raw, functools.partial(
                          self.names_used, function=function)),
                      indirect="normalizer_fn", alternatives=self._alternatives(keyword.value))

    def _alternatives(self, node: ast.expr) -> tuple[tuple[str, ApiRef | None], ...]:
        """What else the name `node` may stand for (imports under a version test), each with
        its catalogue entry."""
        out = []
        for qualname in self.w.imports.alternatives(node):
            spec = self.w.cat.apis.get(self.w.cat.normalize(qualname))
            out.append((qualname, spec.ref if spec is not None else None))
        return tuple(out)

    def _dict_args(self, expr: ast.expr | None, function: FunctionInfo | None,
                   depth: int = 0) -> dict[str, Arg]:
        """The string-keyed items of a dict literal (or `dict(k=v)`, or a local variable
        holding one) as arguments."""
        if expr is None or depth > 2:
            return {}
        if isinstance(expr, ast.Name):
            defs = self._defs_of(expr, function)
            if len(defs) == 1 and defs[0][0] == "assign":
                owner = function if self.w.defs.get((fkey(function), expr.id)) else None
                return self._dict_args(defs[0][1], owner, depth + 1)
            return {}
        pairs: list[tuple[str, ast.expr]] = []
        if isinstance(expr, ast.Dict):
            pairs = [(k.value, v) for k, v in zip(expr.keys, expr.values)
                     if isinstance(k, ast.Constant) and isinstance(k.value, str)]
        elif isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and \
                expr.func.id == "dict":
            pairs = [(k.arg, k.value) for k in expr.keywords if k.arg is not None]
        out = {}
        for name, value in pairs:
            span = self.text.span(value)
            out[name] = Arg(name, self.value(value, function), span, True, span,
                            self.text.slice(span), self._items(value))
        return out

    def _scope_defaults(self, raw: RawCall, spec: ApiSpec) -> dict[str, Arg]:
        """Arguments that enclosing `arg_scope([..., this BN API], key=value, **params)`
        blocks give the BN call (innermost first; a call's own arguments win)."""
        out: dict[str, Arg] = {}
        for frame in reversed(raw.ctx.withs):
            call = frame.call
            if call is None or self.vocab.fn_kind.get(self.w.qualname(call.func) or "") != \
                    "arg_scope" or not call.args or not isinstance(call.args[0], (ast.List, ast.Tuple)):
                continue
            listed = [self.w.cat.apis.get(self.w.qualname(e) or "") for e in call.args[0].elts]
            if not any(s is not None and s.id == spec.id for s in listed):
                continue
            for kw in call.keywords:
                items = self._dict_args(kw.value, frame.function) if kw.arg is None else {}
                if kw.arg is not None and kw.arg not in ("normalizer_fn", "normalizer_params"):
                    span = self.text.span(kw.value)
                    items = {kw.arg: Arg(kw.arg, self.value(kw.value, frame.function), span, True,
                                         span, self.text.slice(span), self._items(kw.value))}
                for name, arg in items.items():
                    out.setdefault(spec.canonical_name(name), arg)
        return out

    def _assigned_target(self, raw: RawCall) -> tuple[str, object] | None:
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
        by_call = {id(raw.call): site for (raw, _), site in zip(self.w.bn_raw, sites)}
        targets: dict[tuple[str, object], BNSite] = {}
        for site in sites:
            target = self._site_targets.get(id(site))
            if target is not None:
                targets[target] = site
        for raw in self.w.local_calls:
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
            spec = self.w.cat.apis[site.qualname]
            site.instance_calls.append(LayerCall(self._api_args(raw, spec, spec.call_params),
                                                 raw.ctx.function, call_info(self.text, raw.call)))

    def _collection_get(self, raw: RawCall, towers: list[TowerLoop]) -> CollectionGet:
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
        parent = raw.parents[-1] if raw.parents else None
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is call:
            usage = "assign"
        elif (isinstance(stmt, ast.AugAssign) and stmt.value is call) or (
                parent is not None and isinstance(parent.func, ast.Attribute)
                and parent.func.attr in ("extend", "append")):
            usage = "accumulate"
        after_scope = bool(inside and tower and tower.name_scope and
                           tower.name_scope.span.start.row <= call.lineno)
        always = True
        if tower is not None and not inside:  # the loop under an `if` the read is not under
            held = {(negated, id(test)) for negated, test in raw.ctx.conditions}
            loop = self._tower_loop[id(tower)]
            always = all((negated, id(test)) in held for negated, test in loop.conditions)
        return CollectionGet(
            key=self._collection_key(key_expr) or "",
            scoped=scoped,
            call=call_info(self.text, call),
            function=raw.ctx.function,
            tower=tower,
            inside_tower=inside,
            usage=usage,
            row_in_loop_after_scope=after_scope,
            tower_always=always,
        )

    def _collection_key(self, expr: ast.expr | None) -> str | None:
        if expr is None:
            return None
        if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
            return self.vocab.collection_values.get(expr.value)
        qual = self.w.qualname(expr)
        return self.vocab.collections.get(qual) if qual else None

    def _train_op(self, raw: RawCall, towers: list[TowerLoop], runs_update_ops: bool) -> TrainOp:
        call = raw.call
        function = raw.ctx.function
        control = [w for w in raw.ctx.withs if w.category == "control_dependencies"]
        keys: frozenset[str] = frozenset()
        for frame in control:
            if frame.expr is not None:
                keys |= self._keys(frame.expr, frame.function)
        kind = raw.kind
        # update ops made control dependencies of a value the train op is built from (`loss =
        # tf.identity(loss)` under them, then `opt.minimize(loss)`): they run each step
        used = {n.id for n in ast.walk(call) if isinstance(n, ast.Name)}
        target = _assigned_name(raw.stmt, call) or _listed_in(raw.stmt, call)
        adds = runs_update_ops
        for frame, assigned, outer in self.w.control_frames:
            if frame.function is not function or frame.expr is None:
                continue
            wired = self._keys(frame.expr, function)
            for around in outer:
                if around.category == "control_dependencies" and around.expr is not None:
                    wired |= self._keys(around.expr, around.function)
            if "UPDATE_OPS" not in wired:
                continue
            # `loss = tf.identity(loss)` under the update ops, then minimize(loss); or the
            # train op itself a control input next to them (`with deps([train_op]): no_op()`)
            if used & assigned or (target is not None and self._mentions_name(frame.expr, target)):
                adds = True
        if kind not in self.vocab.train_methods:
            update_arg = next((k.value for k in call.keywords if k.arg == "update_ops"), None)
            adds = adds or not (isinstance(update_arg, (ast.List, ast.Tuple)) and not update_arg.elts)
        groups = [p for p in raw.parents if any(g.call is p for g in self.w.group_raw)]
        if any("UPDATE_OPS" in self._keys(g, function) for g in groups):
            adds = True
        if target is not None:
            for group in self.w.group_raw:
                # the group holds the train op, or a value computed from it (`train_op =
                # tf.case([(early, lambda: train_rpn_op)], default=lambda: train_rcnn_op)`)
                if group.ctx.function is not function or not self._derives_from(
                        group.call, frozenset({target}), function):
                    continue
                # the group holds the update ops, or is built under control dependencies on
                # them (`with tf.control_dependencies(update_ops): tf.group(apply_op, ema_op)`)
                wired = self._keys(group.call, function)
                for frame in group.ctx.withs:
                    if frame.category == "control_dependencies" and frame.expr is not None:
                        wired |= self._keys(frame.expr, frame.function)
                if "UPDATE_OPS" in wired:
                    adds = True
        statement = self.statement(raw.stmt)
        tower, inside = self._tower_for(raw, towers)
        return TrainOp(
            kind=kind,
            call=call_info(self.text, call),
            statement=statement,
            function=function,
            control_keys=keys,
            under_control_deps=bool(control),
            adds_update_ops=adds,
            after_tower=tower if not inside else None,
            conditions=conditions_of(self.text, raw, functools.partial(self.names_used,
                                                                       function=function)),
        )

    def statement(self, stmt: ast.stmt, compound_ok: bool = False) -> Statement:
        """A statement's rows, and whether whole-row edits (wrap, insert after) are safe."""
        span = self.text.span(stmt)
        simple = compound_ok or not isinstance(stmt, (
            ast.With, ast.AsyncWith, ast.For, ast.AsyncFor, ast.If, ast.While, ast.FunctionDef,
            ast.AsyncFunctionDef, ast.ClassDef, ast.Try))
        return Statement(
            span=span,
            first_row=stmt.lineno,
            last_row=stmt.end_lineno or stmt.lineno,
            wrappable=simple and self.text.starts_row(span.start) and self.text.ends_row(span.end),
            indent=self.text.indentation(stmt.lineno),
            block=self.w.block_of.get(id(stmt), 0),
        )

    @staticmethod
    def _mentions_name(expr: ast.expr, name: str) -> bool:
        return any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(expr))

    @staticmethod
    def _mentions(call: ast.Call, name: str) -> bool:
        return any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(call))

    def _ema_apply(self, raw: RawCall) -> EmaApply | None:
        """`ema.apply(var_list)`, or an optimizer given an EMA and the variables it averages
        (`SyncReplicasOptimizer(opt, variable_averages=ema, variables_to_average=...)`)."""
        call, func = raw.call, raw.call.func
        keywords = {k.arg: k.value for k in call.keywords if k.arg}
        if raw.kind == "ema_optimizer":
            ema = keywords.get("variable_averages")
            if ema is None or not self._is_ema(ema, raw.ctx, 0):
                return None
            arg = keywords.get("variables_to_average")
            var_list = self._vars_expr(arg, raw.ctx.function) if arg is not None else None
            return EmaApply(call_info(self.text, call), var_list, raw.ctx.function)
        assert isinstance(func, ast.Attribute)
        if not self._is_ema(func.value, raw.ctx, 0):
            return None
        arg = call.args[0] if call.args else keywords.get("var_list")
        var_list = self._vars_expr(arg, raw.ctx.function) if arg is not None else None
        return EmaApply(call_info(self.text, call), var_list, raw.ctx.function)

    def _is_ema(self, expr: ast.expr, ctx: Ctx, depth: int) -> bool:
        if depth > TRACE_DEPTH:
            return False
        if isinstance(expr, ast.Call):
            return self.vocab.fn_kind.get(self.w.qualname(expr.func) or "") == "ema"
        for _, value, _ in self._defs_of(expr, ctx.function, ctx.class_name):
            if self._is_ema(value, ctx, depth + 1):
                return True
        return False

    def _defs_of(self, expr: ast.expr, function: FunctionInfo | None,
                 class_name: str | None = None) -> list[tuple[str, ast.expr, ast.stmt]]:
        if isinstance(expr, ast.Name):
            local = self.w.defs.get((fkey(function), expr.id))
            if local:
                return local
            return self.w.defs.get((0, expr.id), [])
        if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name) and \
                expr.value.id in ("self", "cls"):
            owner = function.class_name if function is not None else class_name
            return self.w.defs.get((0, f"{owner}.{expr.attr}"), [])
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
        if isinstance(expr, ast.Name) and depth < TRACE_DEPTH:
            key = fkey(function)
            local = self.w.defs.get((key, expr.id))
            if function is not None and expr.id in function.params and not local:
                return FromParam(function, expr.id, span)
            defs = local if local else self.w.defs.get((0, expr.id), [])
            if len(defs) == 1 and defs[0][0] == "assign":
                owner = function if local else None
                return self.value(defs[0][1], owner, depth + 1)
        if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.Not) and depth < TRACE_DEPTH:
            inner = self.value(expr.operand, function, depth + 1)
            if isinstance(inner, (Const, FromParam)):
                return negate(inner)
        if isinstance(expr, ast.BinOp) and type(expr.op) in _ARITHMETIC and depth < TRACE_DEPTH:
            left = self.value(expr.left, function, depth + 1)
            right = self.value(expr.right, function, depth + 1)
            if _number(left) and _number(right):
                try:
                    folded = _ARITHMETIC[type(expr.op)](left.value, right.value)  # type: ignore[union-attr]
                except ZeroDivisionError:
                    folded = None
                if folded is not None:
                    return Const(folded, self.text.slice(span), span)
        qualname = self.w.qualname(expr) if isinstance(expr, (ast.Attribute, ast.Name)) else None
        return Unknown(self.text.slice(span), span, qualname, "str" if _stringy(expr) else None)

    def _keys(self, expr: ast.AST, function: FunctionInfo | None, depth: int = 0,
              seen: frozenset[str] = frozenset()) -> frozenset[str]:
        """Collection keys (`UPDATE_OPS` …) whose contents can reach `expr`, through locals and
        attributes of `self` (hourglass' `self.update_ops = tf.get_collection(UPDATE_OPS)`)."""
        if depth > TRACE_DEPTH:
            return frozenset()
        if isinstance(expr, ast.Call) and id(expr) in self.w.gets:
            raw = self.w.gets[id(expr)]
            key_expr = raw.call.args[0] if raw.call.args else next(
                (k.value for k in raw.call.keywords if k.arg in ("key", "name")), None)
            key = self._collection_key(key_expr)
            return frozenset((key,)) if key else frozenset({"?"})
        name = expr.id if isinstance(expr, ast.Name) else \
            f"self.{expr.attr}" if isinstance(expr, ast.Attribute) and \
            isinstance(expr.value, ast.Name) and expr.value.id in ("self", "cls") else None
        if name is not None:
            if name in seen:
                return frozenset()
            out: frozenset[str] = frozenset()
            for _, value, _ in self._defs_of(expr, function):  # type: ignore[arg-type]
                out |= self._keys(value, function, depth + 1, seen | {name})
            if out or isinstance(expr, ast.Name):
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
        if depth > TRACE_DEPTH:
            return [VarsTerm(span, text, frozenset())]
        if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add):
            return self._vars_terms(expr.left, function, depth + 1) + \
                self._vars_terms(expr.right, function, depth + 1)
        if isinstance(expr, ast.Call):
            if id(expr) in self.w.gets:
                key = self._collection_key(expr.args[0] if expr.args else None)
                return [VarsTerm(span, text, self.vocab.coll_sources.get(key or "", frozenset()))]
            qual = self.w.qualname(expr.func)
            if qual in self.vocab.var_sources:
                return [VarsTerm(span, text, self.vocab.var_sources[qual])]
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
                owner = function if self.w.defs.get((fkey(function), arg.id)) else None
                uses = self.w.loads.get((fkey(owner), arg.id), 0)
                terms = tuple(self._vars_terms(value, owner))
                edit_span = self.text.span(value) if uses == 1 else self.text.span(arg)
                return VarsExpr(edit_span, self.text.slice(edit_span), terms,
                                self.text.span(stmt), arg.id, uses)
        span = self.text.span(arg)
        return VarsExpr(span, self.text.slice(span), tuple(self._vars_terms(arg, function)),
                        None, None, 0)


def _mark_opt_outs(sites: list[BNSite]) -> None:
    """`if sync_bn: SyncBatchNormalization(...) else: BatchNormalization(...)`: the plain one
    is the user's explicit choice (a flag that turns synchronization off). So is a name bound
    to a synchronized BN on one path and a plain one on another (`BatchNorm =
    SyncBatchNormalization if <version test> else BatchNormalization`, then `BatchNorm(...)`)."""
    synced = [s for s in sites if s.api.synced or is_const(s.value("synchronized"), True)]
    for site in sites:
        if site.api.synced:
            continue
        site.opt_out = any(mine.node == theirs.node and mine.negated != theirs.negated
                           for other in synced for mine in site.conditions
                           for theirs in other.conditions) or \
            any(ref is not None and ref.synced for _, ref in site.alternatives)


def _listed_in(stmt: ast.stmt, call: ast.Call) -> str | None:
    """`train_ops = [opt.apply_gradients(grads)]`: the name of the list (or tuple) literal
    that holds the call, which later code extends and groups."""
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and \
            isinstance(stmt.targets[0], ast.Name) and isinstance(stmt.value, (ast.List, ast.Tuple)) \
            and any(element is call for element in stmt.value.elts):
        return stmt.targets[0].id
    return None


def _assigned_name(stmt: ast.stmt, call: ast.Call) -> str | None:
    if isinstance(stmt, ast.Assign) and stmt.value is call and len(stmt.targets) == 1 and \
            isinstance(stmt.targets[0], ast.Name):
        return stmt.targets[0].id
    return None


BACKEND = re.compile(r"""(?<=["'])(gloo|nccl|mpi)(?=["'])""")


def _backends(text: str) -> frozenset[str]:
    """The torch.distributed backends the text names as strings (a substring test first: the
    look-behind scan costs ~0.4 ms on a file that names none)."""
    if "gloo" not in text and "nccl" not in text and "mpi" not in text:
        return frozenset()
    return frozenset(BACKEND.findall(text))
_TOWER_COUNT = re.compile(r"tower|gpu|clone|replica|device|worker|split")


def _loop_classes(loops: Iterable[ast.For | ast.AsyncFor]) -> dict[str, list[ast.expr]]:
    """The names `for` loops bind to the elements of literal lists or tuples (`for bn, sync
    in zip([nn.BatchNorm1d, ...], [SyncBN1d, ...])`)."""
    out: dict[str, list[ast.expr]] = {}
    for loop in loops:
        it, target = loop.iter, loop.target
        if isinstance(it, (ast.List, ast.Tuple)) and isinstance(target, ast.Name):
            out[target.id] = list(it.elts)
        elif isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and \
                it.func.id == "zip" and isinstance(target, ast.Tuple) and \
                len(target.elts) == len(it.args) and \
                all(isinstance(a, (ast.List, ast.Tuple)) for a in it.args):
            for name, seq in zip(target.elts, it.args):
                if isinstance(name, ast.Name):
                    out[name.id] = list(seq.elts)  # type: ignore[attr-defined]
    return out


def _attribute_of(expr: ast.expr, owner: str, attr: str) -> bool:
    """`expr` is `<owner>.<attr>` (not `.data` of it: `new.weight.data = old.weight.data`
    shares the storage, not the parameter an optimizer holds)."""
    return isinstance(expr, ast.Attribute) and expr.attr == attr and \
        isinstance(expr.value, ast.Name) and expr.value.id == owner


def _false_literal(expr: ast.expr) -> bool:
    return isinstance(expr, ast.Constant) and expr.value in (False, None)


def _number(value: Value) -> bool:
    return isinstance(value, Const) and isinstance(value.value, (int, float)) and \
        not isinstance(value.value, bool)


def _is_axis_zero(expr: ast.expr) -> bool:
    if isinstance(expr, ast.Constant):
        return expr.value == 0 and not isinstance(expr.value, bool)
    if isinstance(expr, (ast.List, ast.Tuple)) and len(expr.elts) == 1:
        return _is_axis_zero(expr.elts[0])
    return False


def _stringy(expr: ast.expr) -> bool:
    """An expression that builds a string: an f-string, `'%s' % x`, `'a' + x`, `'{}'.format()`."""
    if isinstance(expr, ast.JoinedStr):
        return True
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, (ast.Mod, ast.Add)):
        return any(isinstance(side, ast.Constant) and isinstance(side.value, str) or _stringy(side)
                   for side in (expr.left, expr.right))
    return isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and \
        expr.func.attr == "format" and isinstance(expr.func.value, ast.Constant) and \
        isinstance(expr.func.value.value, str)


def _update_ops_marks(module: ModuleIR) -> list[Mark]:
    """What the project's other files ask of its update ops: `update_ops_unrun` for each train
    op that does not run UPDATE_OPS, and `update_ops_read` for the first place that runs or
    reads them (one per module: whether any code runs them is what is asked). A BN whose
    training flag a fix turns on reads moving statistics that only these ops update."""
    def where(function: FunctionInfo | None) -> str | None:
        return function.qualname if function is not None else None

    marks = [Mark("update_ops_unrun", op.call.span, None, where(op.function))
             for op in module.train_ops
             if not op.adds_update_ops and "UPDATE_OPS" not in op.control_keys]
    reads = [(op.call.span, op.function) for op in module.train_ops
             if op.adds_update_ops or "UPDATE_OPS" in op.control_keys]
    reads += [(get.call.span, get.function) for get in module.collection_gets
              if get.key == "UPDATE_OPS"]
    if reads:
        span, function = min(reads, key=lambda r: r[0].start)
        marks.append(Mark("update_ops_read", span, None, where(function)))
    return marks
