"""Resolution of the PyTorch (and Keras layer-stacking) training context: evaluation regions
and the module calls inside them, train/eval switches, BN freezes and where they are applied,
frozen parameters, the order of SyncBN conversion / DDP wrap / optimizer, and biased layers
that feed a BatchNorm. Like `resolve.py`, it reads the walker's records only."""

from __future__ import annotations

import ast
import dataclasses
import itertools
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple

from bnfix.ir import (
    BiasBeforeBN,
    BiasedLayer,
    Block,
    BNSite,
    Condition,
    Const,
    FromParam,
    FreezeCall,
    FunctionInfo,
    ModeCall,
    ModelCall,
    ModelStep,
    ModuleIR,
    ParamFreeze,
    Region,
    Related,
    ShadowedMethod,
    Switch,
    Value,
    is_const,
)
from bnfix.source.calls import call_info, unpacks
from bnfix.source.subclasses import docstring
from bnfix.source.text import SourceText
from bnfix.source.walk import Ctx, RawCall, fkey

if TYPE_CHECKING:
    from bnfix.rulebook import ApiSpec, LayerSpec
    from bnfix.source.resolve import Resolver


class TorchContext:
    def __init__(self, resolver: Resolver) -> None:
        self.r = resolver
        self.w = resolver.w
        self.text = resolver.text
        self._regions: dict[int, Region | None] = {}

    def lift_into(self, module: ModuleIR) -> None:
        self.bn_targets = self._bn_targets(module.bn_sites)
        module.mode_calls = [m for m in map(self._mode_call, self.w.attr_calls) if m is not None]
        module.mode_calls += self._helper_evals(module.mode_calls)
        module.model_calls = [m for m in map(self._model_call, self.w.model_calls) if m is not None]
        self._callers_eval(module)
        self._freezes(module)
        module.param_freezes = self._param_freezes()
        module.model_steps = [s for s in map(self._model_step, self.w.step_raw) if s is not None]
        module.bias_before_bn = self.bias_pairs(module.bn_sites)
        trains = any(s.kind == "optimizer" for s in module.model_steps) or any(
            raw.kind in ("backward", "step", "minimize", "apply_gradients", "fit")
            for raw in self.w.attr_calls) or bool(self.w.train_raw)
        module.trains = trains
        module.script = "__main__" in self.text.text or any(
            isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)
            for stmt in self.w.tree.body)
        module.script_without_training = "__main__" in self.text.text and not trains

    # -- helpers ---------------------------------------------------------------------------

    def _text(self, node: ast.AST) -> str:
        return self.text.slice(self.text.span(node))

    def _bn_targets(self, sites: list[BNSite]) -> dict[str, BNSite]:
        """Texts that name a BN module: `self.bn1` (assigned a BN in a class), `bn`."""
        out = {}
        for site in sites:
            target = self.r.site_target(site)
            if target is not None:
                out[target[0]] = site
        return out

    def _narrowed_to_bn(self, name: str, ctx: Ctx, updating: bool = False) -> bool:
        """`name` is a BN here: an enclosing isinstance() names a BN class, or an enclosing test
        looks for "BatchNorm" in a class name, or it is a BN module attribute. With `updating`,
        only BNs whose running statistics move in train mode (not FrozenBatchNorm2d)."""
        site = self.bn_targets.get(name)
        if site is not None:
            return not updating or site.api.updates == "module"
        for guarded, test in ctx.guards:
            if guarded == "*":
                return True
            if guarded != name:
                continue
            if any(spec is not None and (not updating or spec.updates == "module")
                   for spec in self.w.guard_specs(test)):
                return True
        return False

    def _region(self, node: ast.AST | None) -> Region | None:
        if node is None:
            return None
        if id(node) not in self._regions:
            span = self.text.span(node)
            if isinstance(node, (ast.With, ast.AsyncWith)):
                ok = self.text.starts_row(span.start)
                body = Block(node.lineno, node.lineno, node.end_lineno or node.lineno,
                             self.text.indentation(node.lineno)) if ok else None
                before = self.w.preceding(node)
                self._regions[id(node)] = Region("with", span, body,
                                                 before[-1].lineno if before else None)
            else:
                function = next(f for f in self.w.functions
                                if self.w.function_nodes[id(f)] is node)
                self._regions[id(node)] = Region("function", span, function.body)
        return self._regions[id(node)]

    # -- eval / train ----------------------------------------------------------------------

    def _mode_call(self, raw: RawCall) -> ModeCall | None:
        call = raw.call
        if raw.kind == "eval" and not call.args and not call.keywords:
            kind = "eval"
        elif raw.kind == "train":
            if len(call.args) > 1 or any(k.arg != "mode" for k in call.keywords) or \
                    (call.args and call.keywords):
                return None  # not Module.train(mode): a logger's `log.train(len_dataset=n)`
            flag = call.args[0] if call.args else next(
                (k.value for k in call.keywords if k.arg == "mode"), None)
            if flag is None or (isinstance(flag, ast.Constant) and flag.value is True):
                kind = "train"
            elif isinstance(flag, ast.Constant) and flag.value is False:
                kind = "eval"
            else:
                kind = "restore"  # model.train(was_training): puts back what it was
        else:
            return None
        assert isinstance(call.func, ast.Attribute)
        target = self._text(call.func.value)
        return ModeCall(kind, target, self.text.span(call), self.r.statement(raw.stmt),
                        raw.ctx.function, self._narrowed_to_bn(target, raw.ctx),
                        kind != "train" or self._used_after(raw, call.func.value))

    def _used_after(self, raw: RawCall, receiver: ast.expr) -> bool:
        """Whether the function may run the object after this statement: it names the
        receiver's root again after it, or the statement is in a loop (the next round comes
        back to what came before). Attributes of `self` and module-level names live on past
        the function: always."""
        function = raw.ctx.function
        node = self.w.function_nodes.get(id(function)) if function is not None else None
        root = receiver
        while isinstance(root, ast.Attribute):
            root = root.value
        if node is None or not isinstance(root, ast.Name) or root.id == "self" or \
                root.id not in function.params and (0, root.id) in self.w.defs:
            return True
        stmt = raw.stmt
        end = (stmt.end_lineno or stmt.lineno, stmt.end_col_offset or 0)
        for sub in ast.walk(node):
            if isinstance(sub, (ast.For, ast.AsyncFor, ast.While)) and \
                    sub.lineno <= stmt.lineno and end <= (sub.end_lineno or 0, sub.end_col_offset or 0):
                return True
            if isinstance(sub, ast.Name) and sub.id == root.id and (sub.lineno, sub.col_offset) > end:
                return True
        return False

    def _module_function_calls(self) -> list[tuple[RawCall, FunctionInfo]]:
        """Calls by name of the module's top-level functions, and of functions nested in the
        calling function (closures)."""
        by_qualname = {f.qualname: f for f in self.w.functions}
        out = []
        for raw in self.w.local_calls:
            func = raw.call.func
            if not isinstance(func, ast.Name):
                continue
            caller = raw.ctx.function
            nested = by_qualname.get(f"{caller.qualname}.<locals>.{func.id}") if caller else None
            target = nested or by_qualname.get(func.id)
            if target is not None and target.class_name is None:
                out.append((raw, target))
        return out

    def _own_method_calls(self) -> list[tuple[RawCall, FunctionInfo]]:
        """`self.evaluate(...)` in a method: calls of the class's own methods on the instance."""
        by_qualname = self.w.by_qualname()
        out = []
        for raw in self.w.local_calls:
            func, caller = raw.call.func, raw.ctx.function
            if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and \
                    func.value.id == "self" and caller is not None and caller.class_name:
                target = by_qualname.get(f"{caller.class_name}.{func.attr}")
                if target is not None:
                    out.append((raw, target))
        return out

    def _helper_evals(self, calls: list[ModeCall]) -> list[ModeCall]:
        """`set_eval(model)` where `def set_eval(m): m.eval()`: an eval of `model`; and
        `self._prep_for_test()` where that method calls `self.net.eval()`: an eval of
        `self.net`."""
        helpers: dict[int, int] = {}  # function -> index of the parameter it puts in eval mode
        own: dict[int, set[str]] = defaultdict(set)  # method -> attributes of self it evals
        for call in calls:
            f = call.function
            if call.kind == "eval" and f is not None and call.target in f.params:
                helpers.setdefault(id(f), f.params[call.target].index)
            elif call.kind == "eval" and f is not None and f.class_name and \
                    call.target.startswith("self."):
                own[id(f)].add(call.target)
        out = []
        for raw, f in self._module_function_calls():
            index = helpers.get(id(f))
            if index is not None and 0 <= index < len(raw.call.args):
                out.append(ModeCall("eval", self._text(raw.call.args[index]),
                                    self.text.span(raw.call), self.r.statement(raw.stmt),
                                    raw.ctx.function, False))
        for raw, f in self._own_method_calls():
            out.extend(ModeCall("eval", target, self.text.span(raw.call),
                                self.r.statement(raw.stmt), raw.ctx.function, False)
                       for target in sorted(own.get(id(f), ())))
        return out

    def _callers_eval(self, module: ModuleIR) -> None:
        """Parameters of an evaluation function that every caller puts in eval mode before the
        call (`model.eval(); validate(model, loader)`)."""
        evals = [m for m in module.mode_calls if m.kind == "eval"]
        with_calls = {id(m.function) for m in module.model_calls if m.function is not None}
        sites: dict[int, list[tuple[RawCall, FunctionInfo]]] = {}
        for raw, f in [*self._module_function_calls(), *self._own_method_calls()]:
            if id(f) in with_calls:
                sites.setdefault(id(f), []).append((raw, f))
        for calls in sites.values():
            f = calls[0][1]
            ordered = sorted((p for p in f.params.values() if p.positional), key=lambda p: p.index)
            if f.class_name and ordered and ordered[0].name in ("self", "cls"):
                ordered = ordered[1:]  # called on the instance: `self` is not among the arguments
            items = self._param_items(f)
            prepared: set[str] | None = None
            for raw, _ in calls:
                before = {e.target for e in evals if e.function is raw.ctx.function
                          and e.span.start.row < raw.call.lineno}
                passed = [(p.name, a) for p, a in zip(ordered, raw.call.args)]
                passed += [(k.arg, k.value) for k in raw.call.keywords if k.arg in f.params]
                here = {name for name, arg in passed if self._text(arg) in before}
                given = dict(passed)
                for local, (param, key) in items.items():
                    item = self._item(given[param], key, raw.ctx.function) \
                        if param in given else None
                    if item is not None and self._text(item) in before:
                        here.add(local)
                if "<locals>" in f.qualname:  # a closure sees the caller's names themselves
                    here |= before
                elif f.class_name:  # `self.evaluate()`: the same instance, its attributes
                    here |= {target for target in before if target.startswith("self.")}
                prepared = here if prepared is None else prepared & here
            f.callers_eval = frozenset(prepared or ())

    def _param_items(self, function: FunctionInfo) -> dict[str, tuple[str, str]]:
        """Locals taken from a parameter by a constant key, and which: `paraphraser =
        nets['paraphraser']` (Knowledge-Distillation-Zoo hands its models over in a dict)."""
        out = {}
        for (key, name), defs in self.w.defs.items():
            if key != fkey(function) or len(defs) != 1 or defs[0][0] != "assign":
                continue
            value = defs[0][1]
            if isinstance(value, ast.Subscript) and isinstance(value.value, ast.Name) and \
                    value.value.id in function.params and \
                    isinstance(value.slice, ast.Constant) and isinstance(value.slice.value, str):
                out[name] = (value.value.id, value.slice.value)
        return out

    def _item(self, arg: ast.expr, key: str, function: FunctionInfo | None) -> ast.expr | None:
        """The value a dict argument holds under `key`: a literal at the call, or the one
        definition of the local passed (`nets = {'paraphraser': paraphraser, ...}`)."""
        if isinstance(arg, ast.Name):
            defs = self.w.defs.get((fkey(function), arg.id), [])
            if len(defs) != 1 or defs[0][0] != "assign":
                return None
            arg = defs[0][1]
        if not isinstance(arg, ast.Dict):
            return None
        return next((v for k, v in zip(arg.keys, arg.values)
                     if isinstance(k, ast.Constant) and k.value == key), None)

    def _model_call(self, raw: RawCall) -> ModelCall | None:
        func = raw.call.func
        if isinstance(func, ast.Name) and (func.id in self.w.class_names or any(
                f.name == func.id and f.class_name is None for f in self.w.functions)):
            return None  # the module's own function or class, not a model
        iterates = " ".join(self._text(loop.node.iter) for loop in raw.ctx.loops)
        if isinstance(raw.ctx.region, (ast.With, ast.AsyncWith)):  # what the block iterates
            iterates += " " + " ".join(self._text(node.iter) for node in ast.walk(raw.ctx.region)
                                       if isinstance(node, (ast.For, ast.comprehension)))
        return ModelCall(self._text(func), self.text.span(raw.call), raw.ctx.function,
                         self._region(raw.ctx.region), iterates, self._bound_row(func, raw))

    def _bound_row(self, func: ast.expr, raw: RawCall) -> int | None:
        """The last row before the call that binds the called name as a local of its function
        (`paraphraser = nets['paraphraser']`): code put before it cannot use the name."""
        if not isinstance(func, ast.Name) or raw.ctx.function is None:
            return None
        rows = [stmt.lineno for _, _, stmt in self.w.defs.get((fkey(raw.ctx.function), func.id), ())
                if stmt.lineno < raw.call.lineno]
        return max(rows) if rows else None

    # -- BN freezes ------------------------------------------------------------------------

    def _freezes(self, module: ModuleIR) -> None:
        """Freeze functions are those that put BN modules in eval mode, or apply another freeze
        function; freeze calls are where they are applied, to which object."""
        evals_bn = {id(m.function) for m in module.mode_calls
                    if m.kind == "eval" and m.bn_guarded and m.function is not None}
        freezers = {id(f): f for f in self.w.functions if id(f) in evals_bn}
        calls: list[FreezeCall] = []
        for _ in range(3):  # a freeze that applies a freeze (`self.apply(set_bn_eval)`)
            calls = self._freeze_calls(freezers)
            grown = {id(c.function): c.function for c in calls  # construction is not a freeze
                     if c.function is not None and id(c.function) not in freezers
                     and c.function.name != "__init__"}
            if not grown:
                break
            freezers.update(grown)
        calls += self._instance_freezes(calls, freezers)
        module.freeze_calls = calls
        module.freezers = frozenset(f.qualname for f in freezers.values())
        # a `train()` that applies a freeze, or that is one itself (temporal-shift-module's
        # `TSN.train` puts the BN back in eval mode after `super().train(mode)`)
        module.freezing_trains = frozenset(
            {c.function.class_name for c in calls
             if c.function is not None and c.function.name == "train" and c.function.class_name}
            | {f.class_name for f in freezers.values() if f.name == "train" and f.class_name})
        for key, defs in self.w.defs.items():
            if key[0] != 0 or "." not in key[1]:
                continue
            cls, attr = key[1].split(".", 1)
            if any(f.name == attr and f.class_name == cls for f in freezers.values()):
                for _, _, stmt in defs:
                    module.shadowed_methods.append(ShadowedMethod(cls, attr, self.text.span(stmt)))

    def _freeze_calls(self, freezers: dict[int, FunctionInfo]) -> list[FreezeCall]:
        methods = {f.name for f in freezers.values() if f.class_name}
        functions = {f.name for f in freezers.values() if not f.class_name}
        out = []
        for raw in self.w.attr_calls:
            call = raw.call
            assert isinstance(call.func, ast.Attribute)
            receiver = self._text(call.func.value)
            if raw.kind in methods and not call.args:
                out.append(self._freeze(raw, receiver, f"{{target}}.{raw.kind}()"))
            elif raw.kind == "apply" and len(call.args) == 1 and \
                    isinstance(call.args[0], ast.Name) and call.args[0].id in functions:
                out.append(self._freeze(raw, receiver, f"{{target}}.apply({call.args[0].id})"))
        for raw in self.w.local_calls:
            func = raw.call.func
            if isinstance(func, ast.Name) and func.id in functions and raw.call.args:
                target = self._text(raw.call.args[0])
                out.append(self._freeze(raw, target, f"{func.id}({{target}})"))
        return out

    def _freeze(self, raw: RawCall, target: str, template: str) -> FreezeCall:
        condition = in_class = None
        if raw.ctx.conditions:
            negated, test = raw.ctx.conditions[-1]
            condition = self._condition(negated, self._text(test))
            stored = self._through_self(test, raw.ctx.function)
            in_class = self._condition(negated, stored) if stored is not None else None
        return FreezeCall(target, template, self.text.span(raw.call), self.r.statement(raw.stmt),
                          raw.ctx.function, condition, in_class)

    @staticmethod
    def _condition(negated: bool, text: str) -> str:
        return f"not ({text})" if negated else text

    def _through_self(self, test: ast.expr, function: FunctionInfo | None) -> str | None:
        """`args.freeze_bn` -> `self.args.freeze_bn` when the method stored its parameter
        `args` as `self.args`; None when the test needs names other methods cannot see."""
        if function is None or function.class_name is None:
            return None
        stored: dict[str, str] = {}
        for key, defs in self.w.defs.items():
            if key[0] == 0 and key[1].startswith(function.class_name + "."):
                for _, value, _ in defs:
                    if isinstance(value, ast.Name) and value.id in function.params:
                        stored[value.id] = "self." + key[1].split(".", 1)[1]
        text = self._text(test)
        span = self.text.span(test)
        edits = []
        for node in ast.walk(test):
            if isinstance(node, ast.Name) and node.id != "self":
                if node.id not in stored:
                    if node.id in function.params or node.id in self.w.names:
                        return None
                    continue  # a builtin or module global: visible from any method
                start = self.text.span(node)
                if start.start.row != span.start.row:
                    return None
                edits.append((start.start.col - span.start.col, len(node.id), stored[node.id]))
        for offset, length, replacement in sorted(edits, reverse=True):
            text = text[:offset] + replacement + text[offset + length:]
        return text

    def _instance_freezes(self, calls: list[FreezeCall], freezers: dict[int, FunctionInfo]
                          ) -> list[FreezeCall]:
        """`self.freeze_bn()` in `__init__` of class C freezes every `x = C(...)` instance."""
        out = []
        for call in calls:
            function = call.function
            if call.target != "self" or function is None or function.class_name is None or \
                    id(function) in freezers:
                continue
            switch = freeze_switch(call.condition, function)
            for key, defs in self.w.defs.items():
                for _, value, stmt in defs:
                    built = self._built_by(value)
                    if not (isinstance(built, ast.Call) and isinstance(built.func, ast.Name) and
                            built.func.id == function.class_name):
                        continue
                    condition, reapplicable = None, True
                    if switch is not None:
                        value, node = _passed(built, function, switch.param)
                        if not switch.freezes(value):
                            continue
                        if value is UNKNOWN_VALUE:
                            reapplicable = node is not None
                            condition = switch.test(self._text(node)) if node else None
                    in_class = key[0] == 0 and "." in key[1]
                    name = "self." + key[1].split(".", 1)[1] if in_class else key[1]
                    out.append(FreezeCall(
                        name, call.text, self.text.span(built), self.r.statement(stmt),
                        self._enclosing(stmt), condition,
                        origin=f"applied at construction by `{function.class_name}(...)`, "
                               f"line {call.span.start.row}", reapplicable=reapplicable))
        return out

    def _built_by(self, value: ast.expr) -> ast.expr:
        """`Net(...).to(device)` -> `Net(...)` (module methods that return the module)."""
        kinds = self.w.vocab.method_kind
        while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and \
                kinds.get(value.func.attr) == "returns_self":
            value = value.func.value
        return value

    def _enclosing(self, stmt: ast.stmt) -> FunctionInfo | None:
        """The innermost function whose body holds `stmt`."""
        row = stmt.lineno
        inside = [f for f in self.w.functions if f.span.start.row < row <= f.span.end.row]
        return max(inside, key=lambda f: f.span.start.row, default=None)

    def _param_freezes(self) -> list[ParamFreeze]:
        out = []
        for target, value, stmt, ctx in self.w.attr_sets:
            if target.attr != "requires_grad":
                continue
            switch = None
            found = self.r.value(value, ctx.function)
            if not is_const(found, False):
                switch = self._false_by_default(value, found, ctx.function)
                if switch is None:
                    continue
            owner_node = target.value
            owner = self._text(owner_node)
            after = stmt
            loop = next((lp for lp in ctx.param_loops if lp[0] == owner), None)
            only_bias = False
            if loop is not None:
                owner, after = loop[1], loop[2]
            elif isinstance(owner_node, ast.Attribute) and owner_node.attr in ("weight", "bias"):
                owner, only_bias = self._text(owner_node.value), owner_node.attr == "bias"
            else:
                continue
            out.append(ParamFreeze(owner, self._narrowed_to_bn(owner, ctx, True), self.text.span(stmt),
                                   self.r.statement(after, compound_ok=True), ctx.function,
                                   only_bias, switch))
        for raw in self.w.attr_calls:
            call = raw.call
            if raw.kind != "requires_grad_":
                continue
            flag = call.args[0] if call.args else next(
                (k.value for k in call.keywords if k.arg == "requires_grad"), None)
            if not (isinstance(flag, ast.Constant) and flag.value is False):
                continue
            assert isinstance(call.func, ast.Attribute)
            owner = self._text(call.func.value)
            out.append(ParamFreeze(owner, self._narrowed_to_bn(owner, raw.ctx, True),
                                   self.text.span(call), self.r.statement(raw.stmt),
                                   raw.ctx.function))
        return out

    def _false_by_default(self, value: ast.expr, found: Value, function: FunctionInfo | None
                          ) -> str | None:
        """`value` (what is known of it: `found`) is a parameter of `function` (or
        `self.<attr>` that `__init__` sets to one) whose default is False, and no call of the
        module passes it a literal True (Seg-Uncertainty's `i.requires_grad = train_bn` with
        `train_bn=False`, its `--train_bn` a `store_true` flag): the text of the flag, else
        None."""
        if isinstance(found, FromParam) and not found.negated:
            owner, name = found.function, found.name
        else:
            bound = self.r.attribute_param(value, function)
            if bound is None:
                return None
            owner, name = bound
        param = owner.params.get(name)
        if param is None or not is_const(param.default, False) or any(
                is_const(site.args.get(name), True) for site in owner.call_sites):
            return None
        return self._text(value)

    # -- distributed set-up ----------------------------------------------------------------

    def _model_step(self, raw: RawCall) -> ModelStep | None:
        call = raw.call
        if not call.args:
            return None
        if raw.kind == "optimizer":
            owner = self._parameters_of(call.args[0], raw.ctx.function)
            if owner is None:
                return None
            target = self._text(owner)
        else:
            target = self._text(call.args[0])
        stmt = raw.stmt
        assigned = None
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and \
                self.w.receiver_chain(stmt.value) is call:  # `DataParallel(model).cuda()` too
            assigned = self._text(stmt.targets[0])
        replicas = self.r.vocab.fn_kind.get(raw.written) == "replica_wrap"
        step = ModelStep(raw.kind, target, assigned, call_info(self.text, call),
                         self.r.statement(stmt), raw.ctx.function, self._text(stmt),
                         qualname=raw.written, replicas=replicas,
                         conditions=conditions_of(self.text, raw),
                         builders=self.r.model_builders(call.args[0], raw.ctx.function, stmt)
                         if raw.kind == "model_wrap" and replicas else ())
        if raw.kind == "sync_convert" and assigned == target:
            owner = self.w.block_owner.get(self.w.block_of.get(id(stmt), 0))
            movable: ast.stmt = stmt
            if owner is not None and len(owner.body) == 1 and not owner.orelse:
                movable = owner  # `if args.sync_bn: model = convert(model)` moves as a whole
            step.move = self.r.statement(movable, compound_ok=True)
            step.move_lines = self._rows(movable)
        return step

    def _parameters_of(self, expr: ast.expr, function: FunctionInfo | None) -> ast.expr | None:
        """The module whose parameters an optimizer is given: `model.parameters()` in its
        argument, or in the one definition of the local it is given (FixMatch's
        `grouped_parameters = [{'params': [p for n, p in model.named_parameters() ...]}]`)."""
        if isinstance(expr, ast.Name):
            defs = self.w.defs.get((fkey(function), expr.id), [])
            if len(defs) == 1 and defs[0][0] == "assign":
                expr = defs[0][1]
        return next((n.func.value for n in ast.walk(expr)
                     if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                     and n.func.attr in ("parameters", "named_parameters")), None)

    def _rows(self, stmt: ast.stmt) -> tuple[str, ...]:
        """A statement's rows with its own indentation removed (inner indentation kept)."""
        indent = self.text.indentation(stmt.lineno)
        rows = [self.text.line(r) for r in range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1)]
        return tuple(row[len(indent):] if row.startswith(indent) else row.lstrip() for row in rows)

    # -- biased layers feeding a BN ---------------------------------------------------------

    def bias_pairs(self, sites: list[BNSite],
                   foreign: Sequence[tuple[RawCall, LayerSpec, Related]] = (),
                   foreign_bn: Sequence[tuple[RawCall, BNSite]] = ()) -> list[BiasBeforeBN]:
        """Biased layers whose output goes straight into a BN: the file's own layer calls and
        `foreign` ones, calls of classes of other files that are a biased layer (the project
        view knows them; the related location is the class); the BN are the file's own and
        `foreign_bn`, constructions of BN classes of other files."""
        if not sites and not foreign_bn:
            return []  # no BN here: nothing for a bias to go into
        layers: dict[int, BiasedLayer] = {}
        layer_targets: dict[str, BiasedLayer] = {}
        calls = [(raw, spec, None) for raw, spec in self.w.layer_raw] + list(foreign)
        for raw, spec, origin in calls:
            args = self.r.bind_args(raw, spec.params)
            switch = spec.legacy_bias if spec.legacy_bias in args else spec.bias
            if switch not in args and unpacks(raw.call):
                continue  # `nn.Conv2d(..., **kwargs)`: the bias may be in there (OpenPCDet)
            layer = BiasedLayer(spec.framework, call_info(self.text, raw.call), args.get(switch),
                                args.get(spec.activation) if spec.activation else None, switch,
                                origin, spec.functional)
            layers[id(raw.call)] = layer
            target = _assigned(raw.stmt, raw.call)
            if target is not None:
                layer_targets[self._scoped(target, raw.ctx)] = layer
        built = [*((raw, site) for (raw, _), site in zip(self.w.bn_raw, sites)), *foreign_bn]
        bn_calls = {id(raw.call): site for raw, site in built}
        bn_targets: dict[str, BNSite] = {}
        for raw, site in built:
            target = _assigned(raw.stmt, raw.call)
            if target is not None:
                bn_targets[self._scoped(target, raw.ctx)] = site
        # containers of the class (`self.convs = nn.ModuleList()` filled by `.append(...)`):
        # their elements, by `Class:self.convs`, when all are one kind of layer or BN
        for table, items in ((layer_targets, [(r, layers.get(id(r.call))) for r, _, _ in calls]),
                             (bn_targets, built)):
            table.update(self._containers(items))
        pairs: list[BiasBeforeBN] = []

        def named(item: ast.expr | None) -> str | None:
            """A name or `self.<attr>` an item of a chain refers to."""
            return item.id if isinstance(item, ast.Name) else \
                _self_attr(item) if item is not None else None

        def bn_of(item: ast.expr | None, ctx: Ctx) -> BNSite | None:
            if isinstance(item, ast.Call):
                return bn_calls.get(id(item))
            name = named(item)
            return bn_targets.get(self._scoped(name, ctx)) if name else None

        def chained(runs: list[list[ast.expr]], ctx: Ctx) -> None:
            """The layer-then-BN pairs of runs of items applied one after the other."""
            for run in runs:
                for first, second in itertools.pairwise(run):
                    name = named(first)
                    layer = layers.get(id(first)) if isinstance(first, ast.Call) else \
                        layer_targets.get(self._scoped(name, ctx)) if name else None
                    bn = bn_of(second, ctx)
                    if layer is None or bn is None:
                        continue
                    # the same module also chained without a BN after it (VGG's `make_layers`:
                    # `[conv2d, BN, ReLU]` if batch_norm else `[conv2d, ReLU]`)
                    alone = next((item for other in runs for item, after in
                                  itertools.zip_longest(other, other[1:])
                                  if isinstance(first, ast.Name) and isinstance(item, ast.Name)
                                  and item.id == first.id and bn_of(after, ctx) is None),
                                 None)
                    pairs.append(BiasBeforeBN(layer, bn, "sequential",
                                              self.text.span(alone) if alone else None))

        for raw in self.w.sequential_raw:
            chained(self._sequence_runs(raw), raw.ctx)
        for loop in self.w.loops:
            held = _applied_in_turn(loop.node)
            if held is not None:
                ctx = Ctx(loop.function, loop.function.class_name if loop.function else None)
                chained(self._held_runs(held, ctx), ctx)

        def applied(node: ast.expr, ctx: Ctx, table: dict, calls: dict) -> object | None:
            """The layer / BN that `node` applies: `self.conv(x)` or `Conv2D(8, 3)(x)`, or a
            function of the TF1 API applied to its input (`tf.layers.conv2d(x, 8, 3)`)."""
            if not isinstance(node, ast.Call):
                return None
            found = calls.get(id(node))
            if isinstance(found, BiasedLayer) and found.functional or \
                    isinstance(found, BNSite) and found.api.kind == "function":
                return found
            if isinstance(node.func, ast.Call):
                return calls.get(id(self._unwrapped(node.func)))
            element = self._element_of(node.func, ctx)  # `self.bns[i](x)`, `bn(x)` from a loop
            if element is not None:
                return table.get(self._scoped(element, ctx))
            return table.get(self._scoped(self._text(node.func), ctx))

        specs = {id(raw.call): spec for raw, spec in self.w.bn_raw}
        helpers = self._normalizing_helpers(
            lambda node: applied(node, Ctx(), bn_targets, bn_calls), specs)
        functional = [raw for raw, spec in self.w.bn_raw if spec.kind == "function"]
        for raw in self.w.local_calls + self.w.attr_calls + self.w.indexed_calls + functional:
            site = applied(raw.call, raw.ctx, bn_targets, bn_calls)
            if site is None and isinstance(raw.call.func, ast.Name):
                site = helpers.get(raw.call.func.id)  # `_bn_relu(conv)`
            given = raw.call.args[0] if raw.call.args else \
                self._bn_input(raw.call, specs) if site is not None else None
            if site is None or given is None:
                continue  # the input as the API's keyword: `batch_normalization(inputs=x, ...)`
            inner = applied(given, raw.ctx, layer_targets, layers)
            if isinstance(inner, BiasedLayer):
                pairs.append(BiasBeforeBN(inner, site, "nested"))  # type: ignore[arg-type]
                continue
            def bn_step(stmt: ast.stmt, ctx: Ctx = raw.ctx) -> bool:
                """`x = <a BN>(x)`: the other branch of an `if` normalizes too."""
                return isinstance(stmt, ast.Assign) and \
                    applied(stmt.value, ctx, bn_targets, bn_calls) is not None

            previous, switched = self._previous_assignment(raw, given, bn_step)
            if previous is not None:
                inner = applied(previous, raw.ctx, layer_targets, layers)
                if isinstance(inner, BiasedLayer):
                    pairs.append(BiasBeforeBN(inner, site, "consecutive",  # type: ignore[arg-type]
                                              switched=switched))
        unique: dict[int, BiasBeforeBN] = {}
        for pair in pairs:  # one per layer: the BN of each branch of an `if` cancels one bias
            unique.setdefault(id(pair.layer), pair)
        return list(unique.values())

    def _unwrapped(self, layer: ast.Call) -> ast.expr:
        """The layer a wrapper applies (`TimeDistributed(Conv2D(...))`: the Conv2D), else the
        layer itself."""
        kind = self.r.vocab.fn_kind.get(self.w.qualname(layer.func) or "")
        return layer.args[0] if kind == "layer_wrapper" and layer.args else layer

    def _containers(self, items: Sequence[tuple[RawCall, object | None]]) -> dict[str, object]:
        """The elements of container attributes (`self.mlp_convs.append(nn.Conv2d(...))` in a
        loop, `self.linears = nn.ModuleList([nn.Linear(...) for ...])`), by scoped attribute:
        a container all of whose elements built here are one kind (the first stands for all)."""
        found: dict[str, list[object]] = {}
        for raw, element in items:
            if element is None:
                continue
            owner = _container(raw)
            if owner is not None:
                found.setdefault(self._scoped(f"self.{owner}", raw.ctx), []).append(element)
        out: dict[str, object] = {}
        for key, elements in found.items():
            # one kind of record, built alike (the same bias argument, or none: a BN)
            kinds = {(type(e), getattr(e, "bias_param", None),
                      getattr(getattr(e, "bias", None), "value_text", None)) for e in elements}
            if len(kinds) == 1:
                first = elements[0]
                out[key] = dataclasses.replace(first, container=key.split(":", 1)[1]) \
                    if isinstance(first, BiasedLayer) else first
        return out

    def _element_of(self, func: ast.expr, ctx: Ctx) -> str | None:
        """`self.bns[i]`, or a name bound to an element of `self.bns` in the function (`bn =
        self.bns[i]`, `for conv in self.convs`, `for i, conv in enumerate(self.convs)`, `for
        conv, bn in zip(self.convs, self.bns)`): `self.bns`."""
        if isinstance(func, ast.Subscript):
            return _self_attr(func.value)
        if not isinstance(func, ast.Name) or ctx.function is None:
            return None
        defs = self.w.defs.get((fkey(ctx.function), func.id), ())
        if len(defs) == 1 and defs[0][0] == "assign" and isinstance(defs[0][1], ast.Subscript):
            return _self_attr(defs[0][1].value)
        for loop in self.w.loops:
            if loop.function is not ctx.function:
                continue
            target, source = loop.node.target, loop.node.iter
            if isinstance(source, ast.Call) and isinstance(source.func, ast.Name) and \
                    source.func.id == "enumerate" and source.args and \
                    isinstance(target, ast.Tuple) and len(target.elts) == 2:
                target, source = target.elts[1], source.args[0]
            if isinstance(target, ast.Name) and target.id == func.id:
                return _self_attr(source)
            if isinstance(source, ast.Call) and isinstance(source.func, ast.Name) and \
                    source.func.id == "zip" and isinstance(target, ast.Tuple):
                for element, iterable in zip(target.elts, source.args):
                    if isinstance(element, ast.Name) and element.id == func.id:
                        return _self_attr(iterable)
        return None

    def _normalizing_helpers(self, bn_of: Callable[[ast.expr], object | None],
                             specs: dict[int, ApiSpec]) -> dict[str, BNSite]:
        """Module-level functions whose first statement that reads their first parameter
        applies a BN to it (`def _bn_relu(x): norm = BatchNormalization()(x)`, then an
        activation; statements before it that neither read the parameter nor return may set
        up the BN's arguments): a call `_bn_relu(conv)` puts `conv` straight into that BN."""
        out: dict[str, BNSite] = {}
        for node in self.w.tree.body:
            if not isinstance(node, ast.FunctionDef) or not node.args.args:
                continue
            first = _first_use(node, node.args.args[0].arg)
            value = first.value if isinstance(first, (ast.Assign, ast.Return)) else None
            if not isinstance(value, ast.Call):
                continue
            given = self._bn_input(value, specs)
            if not (isinstance(given, ast.Name) and given.id == node.args.args[0].arg):
                continue
            site = bn_of(value)
            if isinstance(site, BNSite):
                out[node.name] = site
        return out

    @staticmethod
    def _bn_input(call: ast.Call, specs: dict[int, ApiSpec]) -> ast.expr | None:
        """What a BN call normalizes: its one positional argument, or the keyword of the API's
        input parameter (`tf.contrib.layers.batch_norm(inputs=x, ...)`, `BN()(inputs=x)`)."""
        if call.args:
            return call.args[0] if len(call.args) == 1 else None
        spec = specs.get(id(call))
        params = spec.params if spec is not None else ()
        if spec is None and isinstance(call.func, ast.Call):  # a layer object applied
            spec = specs.get(id(call.func))
            params = spec.call_params if spec is not None else ()
        name = params[0] if params else None
        return next((k.value for k in call.keywords if name is not None and k.arg == name), None)

    def _sequence_runs(self, raw: RawCall) -> list[list[ast.expr]]:
        """The runs of items a `Sequential(...)` call chains, each run in order: its arguments,
        a list it is given (`keras.Sequential([...])`, `nn.Sequential(*[...])`), the modules of
        an `OrderedDict`, or a local list (or a list attribute of the class) it unpacks or is
        given (`nn.Sequential(*layers)`, `keras.Sequential(layers)`, `nn.Sequential(*self.layers)`)
        as the code builds it: each list literal assigned or added (`layers += [conv, bn]`, `.extend([...])`) is a run, and so are
        `.append(x)` statements that follow each other in one block. Items of different runs
        are not known to be adjacent (a loop or a branch may come between). An empty one
        assigned to a name is filled by the `.add(layer)` / `.add_module(name, module)`
        statements that follow it, and an empty `OrderedDict` by the `od[key] = module`
        assignments that follow it."""
        args = raw.call.args
        if not args:
            return self._added_runs(raw)
        if len(args) != 1:
            return [list(args)]
        only = args[0].value if isinstance(args[0], ast.Starred) else args[0]
        literal = _literal_runs(only)
        if literal:
            return literal
        named = self._named_modules(only)
        if named is not None:
            return [named]
        if not isinstance(only, ast.Name) and _self_attr(only) is None:
            return [list(args)]
        return self._held_runs(only, raw.ctx)

    def _held_runs(self, held: ast.expr, ctx: Ctx) -> list[list[ast.expr]]:
        """The runs of items of a list a name (`layers`, also one of an enclosing function's:
        a closure) or an attribute of the class (`self.layers`) holds, as the code builds it."""
        attribute = _self_attr(held)
        if isinstance(held, ast.Name):  # `nn.Sequential(*layers)`, `keras.Sequential(layers)`
            function = ctx.function
            defs = self.w.defs.get((fkey(function), held.id), ())
            while not defs and function is not None and "<locals>" in function.qualname and \
                    held.id not in function.params:
                function = self.w.by_qualname().get(function.qualname.rsplit(".<locals>.", 1)[0])
                defs = self.w.defs.get((fkey(function), held.id), ()) if function else ()
        elif attribute is not None:  # `nn.Sequential(*self.parametrized_layers)`
            owner = ctx.function.class_name if ctx.function else ctx.class_name
            defs = self.w.defs.get((0, f"{owner}.{attribute.removeprefix('self.')}"), ())
        else:
            return []
        runs: list[list[ast.expr]] = []
        last_append: ast.stmt | None = None
        for kind, value, stmt in defs:
            appended = kind == "accumulate" and isinstance(stmt, ast.Expr) and \
                isinstance(stmt.value, ast.Call) and isinstance(stmt.value.func, ast.Attribute) \
                and stmt.value.func.attr == "append"
            if appended:
                before = self.w.preceding(stmt)
                if last_append is not None and runs and before and before[-1] is last_append:
                    runs[-1].append(value)
                else:
                    runs.append([value])
                last_append = stmt
                continue
            last_append = None
            literal = _literal_runs(value)
            if literal:
                runs += literal
            elif isinstance(held, ast.Name) and self._empty_ordered_dict(value):
                # `head = OrderedDict()`, then `head['fc1'] = nn.Linear(...)`, `head['bn2'] =
                # nn.BatchNorm1d(...)` (suncet's prediction heads)
                runs += self._runs_in(self._following(stmt), held.id)
        return runs

    def _empty_ordered_dict(self, value: ast.expr) -> bool:
        return isinstance(value, ast.Call) and \
            self.w.qualname(value.func) == "collections.OrderedDict" and not value.keywords and \
            (not value.args or isinstance(value.args[0], (ast.List, ast.Tuple))
             and not value.args[0].elts and len(value.args) == 1)

    def _following(self, stmt: ast.stmt) -> list[ast.stmt]:
        """The statements after `stmt` in its block."""
        block = self.w.blocks.get(self.w.block_of.get(id(stmt), -1)) or []
        return block[next((i for i, s in enumerate(block) if s is stmt), len(block)) + 1:]

    def _named_modules(self, arg: ast.expr) -> list[ast.expr] | None:
        """The modules of `OrderedDict([('conv', nn.Conv2d(...)), ('bn', ...)])`, in order: a
        `Sequential` given one names its modules (HRank's VGG classifier)."""
        if not (isinstance(arg, ast.Call) and len(arg.args) == 1 and
                self.w.qualname(arg.func) == "collections.OrderedDict" and
                isinstance(arg.args[0], (ast.List, ast.Tuple))):
            return None
        pairs = arg.args[0].elts
        if not all(isinstance(p, ast.Tuple) and len(p.elts) == 2 for p in pairs):
            return None
        return [p.elts[1] for p in pairs]  # type: ignore[attr-defined]

    def _added_runs(self, raw: RawCall) -> list[list[ast.expr]]:
        """`seq = keras.Sequential()` then `seq.add(Conv2D(...))`, `seq.add(BN())`: the items
        of the `.add()` / `.add_module()` statements that follow each other in the block after
        the assignment, each unbroken sequence a run; in the body of a loop there, those that
        follow each other within one turn."""
        target = _assigned(raw.stmt, raw.call)
        if target is None:
            return []
        return self._runs_in(self._following(raw.stmt), target)

    def _runs_in(self, stmts: list[ast.stmt], target: str) -> list[list[ast.expr]]:
        """The runs of `.add()` items on `target` in `stmts`, up to a statement that binds the
        name to something else (nothing after it adds to the same object); in the body of a
        loop or `with`, and in each branch of an `if`, those that follow each other there."""
        runs: list[list[ast.expr]] = []
        run: list[ast.expr] = []
        for stmt in stmts:
            call = stmt.value if isinstance(stmt, ast.Expr) else None
            item = None
            if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and \
                    self._text(call.func.value) == target and not call.keywords:
                if call.func.attr == "add" and len(call.args) == 1:
                    item = call.args[0]
                elif call.func.attr == "add_module" and len(call.args) == 2:
                    item = call.args[1]
            elif isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and \
                    isinstance(stmt.targets[0], ast.Subscript) and \
                    self._text(stmt.targets[0].value) == target:
                item = stmt.value  # `head['bn2'] = nn.BatchNorm1d(...)` into an OrderedDict
            if item is not None:
                run.append(item)
                continue
            if run:
                runs.append(run)
                run = []
            if _binds(stmt, target.split(".", 1)[0]) and not target.startswith("self."):
                return runs  # the name holds something else from here on
            if isinstance(stmt, (ast.For, ast.While, ast.With)):
                runs += self._runs_in(stmt.body, target)
            elif isinstance(stmt, ast.If):  # each branch's adds follow each other on its path
                runs += self._runs_in(stmt.body, target) + self._runs_in(stmt.orelse, target)
        if run:
            runs.append(run)
        return runs

    def _previous_assignment(self, raw: RawCall, given: ast.expr,
                             bn_step: Callable[[ast.stmt], bool]) -> tuple[ast.expr | None, bool]:
        """`x = self.conv(x)` before `x = self.bn(x)` (or `return self.bn(x)`, or the BN call
        inside the statement: `lrelu(tf.layers.batch_normalization(x))`) in the same block: the
        value last assigned to the name this call takes (`given`). Statements between that do
        not assign the name (`channel_axis = ...`, `identity = x`) do not separate the two; one
        that assigns it, anywhere inside, does. A BN in a branch of an `if` reads what came before the `if`
        when the other branch starts with a BN too (`bn_step`: `if sync: x = SyncBN()(x)
        else: x = BN()(x)`); where the other path does not normalize (no `else`, or an
        `elif` that applies another norm) the bias survives there, and the pair is marked
        `switched` (`if is_batchnorm: x = BN()(x)`: the rule decides by the switch's values)."""
        stmt, call = raw.stmt, raw.call
        if not (isinstance(stmt, (ast.Assign, ast.Return, ast.Expr)) and
                isinstance(given, ast.Name)) or _conditional(stmt, call):
            return None, False
        name, switched = given.id, False
        while True:
            for before in reversed(self.w.preceding(stmt)):
                if isinstance(before, ast.Assign) and len(before.targets) == 1 and \
                        isinstance(before.targets[0], ast.Name) and before.targets[0].id == name:
                    return before.value, switched
                if _binds(before, name):
                    return None, False
            block = self.w.block_of.get(id(stmt), -1)
            owner = self.w.block_owner.get(block)
            if owner is None:
                return None, False
            other = owner.orelse if block == id(owner.body) else owner.body
            first = next((s for s in other if _binds(s, name)), None)
            if first is None or not bn_step(first):
                switched = True  # the other path leaves the bias (or does something else)
            stmt = owner

    @staticmethod
    def _scoped(target: str, ctx: Ctx) -> str:
        """Attribute targets are per class, names per function."""
        if target.startswith("self."):
            owner = ctx.function.class_name if ctx.function else ctx.class_name
            return f"{owner}:{target}"
        return f"{id(ctx.function)}:{target}"


class FreezeSwitch(NamedTuple):
    """A construction-time freeze under `if <param>:` (or `if not <param>:`) of `__init__`:
    an instance is frozen unless its construction makes the test false."""

    param: str
    negated: bool

    def freezes(self, passed: object) -> bool:
        """`passed`: the literal value the construction binds (UNKNOWN_VALUE when unknown)."""
        if passed is UNKNOWN_VALUE:
            return True
        return bool(passed) != self.negated

    def test(self, passed: str) -> str:
        """The test, written with what the construction passes."""
        return f"not ({passed})" if self.negated else passed

    def encode(self) -> str:
        return f"?{'!' if self.negated else ''}{self.param}"

    @staticmethod
    def decode(fact: str) -> tuple[str, FreezeSwitch | None]:
        """`init_freeze:` payload -> (freeze text, switch)."""
        text, sep, switch = fact.rpartition("?")
        if not sep or not switch.lstrip("!").isidentifier():
            return fact, None
        return text, FreezeSwitch(switch.lstrip("!"), switch.startswith("!"))


UNKNOWN_VALUE = object()


def freeze_switch(condition: str | None, init: FunctionInfo) -> FreezeSwitch | None:
    """The switch of a freeze applied in `__init__` under `condition`, when the test is one of
    its parameters (any other test is not followed: the instance is possibly frozen)."""
    if condition is None:
        return None
    negated = condition.startswith("not (") and condition.endswith(")")
    name = condition[5:-1] if negated else condition
    if name.isidentifier() and name in init.params:
        return FreezeSwitch(name, negated)
    return None


def _passed(call: ast.Call, init: FunctionInfo, name: str) -> tuple[object, ast.expr | None]:
    """What a construction `C(...)` binds to `__init__`'s parameter `name`: the literal (its
    default when not passed) or UNKNOWN_VALUE, and the argument as written (None when not
    visible: not passed, or maybe in *args/**kwargs)."""
    node: ast.expr | None = next((k.value for k in call.keywords if k.arg == name), None)
    param = init.params[name]
    starred = any(isinstance(a, ast.Starred) for a in call.args)
    if node is None and param.positional and 0 < param.index <= len(call.args) and \
            not any(isinstance(a, ast.Starred) for a in call.args[:param.index]):
        node = call.args[param.index - 1]
    if node is None:
        if starred or any(k.arg is None for k in call.keywords):
            return UNKNOWN_VALUE, None
        default = param.default
        return (default.value if isinstance(default, Const) else UNKNOWN_VALUE), None
    return (node.value if isinstance(node, ast.Constant) else UNKNOWN_VALUE), node


def _literal_runs(value: ast.expr) -> list[list[ast.expr]]:
    """The items of a list literal, or of list literals added together (`[conv, bn] + ([act]
    if last else []) + [drop]`, fairseq's Postnet): the literals that follow each other make
    one run, any other term (a branch, a name) ends it."""
    terms: list[ast.expr] = []
    todo = [value]
    while todo:  # the `+` chain, left to right
        term = todo.pop()
        if isinstance(term, ast.BinOp) and isinstance(term.op, ast.Add):
            todo += [term.right, term.left]
        else:
            terms.append(term)
    if not any(isinstance(t, (ast.List, ast.Tuple)) for t in terms):
        return []
    runs: list[list[ast.expr]] = [[]]
    for term in terms:
        if isinstance(term, (ast.List, ast.Tuple)):
            runs[-1] += term.elts
        elif runs[-1]:
            runs.append([])
    return [run for run in runs if run]


AttributeParam = Callable[[ast.expr], "tuple[FunctionInfo, str] | None"]


def conditions_of(text: SourceText, raw: RawCall,
                  uses: Callable[[ast.expr], frozenset[str]] | None = None,
                  attribute: AttributeParam | None = None) -> tuple[Condition, ...]:
    """The `if` tests a call runs under (with the names each depends on, given `uses`; with
    `attribute`, a test of `self.x` reads as one of the `__init__` parameter it holds)."""
    out = []
    for negated, test in raw.ctx.conditions:
        start = text.offset(text.span(test).start)
        names_at = tuple((text.offset(text.span(n).start) - start, n.id) for n in ast.walk(test)
                         if isinstance(n, ast.Name))
        out.append(Condition(id(test), text.slice(text.span(test)), negated,
                             uses(test) if uses is not None else frozenset(), names_at,
                             _switch(test, attribute)))
    return tuple(out)


_EQUALITY = {ast.Eq: True, ast.Is: True, ast.NotEq: False, ast.IsNot: False}


def _switch(test: ast.expr, attribute: AttributeParam | None) -> Switch | None:
    """`batch_norm`, `norm == "batch"`, `mode is not None`: a test of one name alone (or of
    an attribute of `self` that holds an `__init__` parameter, given `attribute`)."""
    subject = test.left if isinstance(test, ast.Compare) else test
    if isinstance(subject, ast.Name):
        name, function = subject.id, None
    else:
        held = attribute(subject) if attribute is not None else None
        if held is None:
            return None
        function, name = held
    if subject is test:
        return Switch(name, function=function)
    assert isinstance(test, ast.Compare)
    if len(test.ops) != 1 or type(test.ops[0]) not in _EQUALITY:
        return None
    try:
        literal = ast.literal_eval(test.comparators[0])
    except (ValueError, TypeError, RecursionError):  # not a literal
        return None
    return Switch(name, literal, _EQUALITY[type(test.ops[0])], function)


def _binds(stmt: ast.stmt, name: str) -> bool:
    """The statement may rebind `name` (an assignment, a loop or `with` target, a `def`, an
    import, `del`, `global`) anywhere in it."""
    for node in ast.walk(stmt):
        if isinstance(node, ast.Name) and node.id == name and not isinstance(node.ctx, ast.Load):
            return True
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and \
                node.name == name:
            return True
        if isinstance(node, (ast.Import, ast.ImportFrom)) and any(
                (a.asname or a.name.split(".")[0]) == name for a in node.names):
            return True
        if isinstance(node, (ast.Global, ast.Nonlocal)) and name in node.names:
            return True
    return False


def _first_use(function: ast.FunctionDef, param: str) -> ast.stmt | None:
    """The first statement of `function` that mentions `param`, when every statement before
    it (the docstring aside) neither mentions it nor returns or raises (CasiaFan's
    `bn_with_relu` picks its gamma initializer first)."""
    for stmt in function.body:
        if docstring(stmt):
            continue
        nodes = list(ast.walk(stmt))
        if any(isinstance(n, ast.Name) and n.id == param for n in nodes):
            return stmt
        if any(isinstance(n, (ast.Return, ast.Raise)) for n in nodes):
            return None
    return None


def _applied_in_turn(loop: ast.For | ast.AsyncFor) -> ast.expr | None:
    """What a loop applies item by item to one value: `for layer in stem_layers: x =
    layer(x)` (arcface's HRNet stem), a chain like a `Sequential` of the list."""
    body, target = loop.body, loop.target
    if len(body) != 1 or not isinstance(target, ast.Name) or not isinstance(body[0], ast.Assign):
        return None
    stmt = body[0]
    value = stmt.value
    if len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name) and \
            isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and \
            value.func.id == target.id and len(value.args) == 1 and \
            isinstance(value.args[0], ast.Name) and value.args[0].id == stmt.targets[0].id and \
            (isinstance(loop.iter, ast.Name) or _self_attr(loop.iter) is not None):
        return loop.iter
    return None


def _self_attr(expr: ast.expr) -> str | None:
    """`self.convs` -> `self.convs`."""
    if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name) and \
            expr.value.id == "self":
        return f"self.{expr.attr}"
    return None


def _container(raw: RawCall) -> str | None:
    """The attribute of `self` a layer call is put in: `self.convs.append(<call>)`, or an
    element of `self.convs = nn.ModuleList([...])` (a list literal or comprehension)."""
    for parent in reversed(raw.parents):
        func = parent.func
        if isinstance(func, ast.Attribute) and func.attr == "append" and \
                _self_attr(func.value) is not None and parent.args and \
                any(a is raw.call or any(n is raw.call for n in ast.walk(a)) for a in parent.args):
            return func.value.attr  # type: ignore[attr-defined]
        if isinstance(func, ast.Attribute) and func.attr == "ModuleList" or \
                isinstance(func, ast.Name) and func.id == "ModuleList":
            name = _assigned(raw.stmt, parent)
            return name[5:] if name and name.startswith("self.") else None
    return None


def _assigned(stmt: ast.stmt, call: ast.Call) -> str | None:
    if isinstance(stmt, ast.Assign) and stmt.value is call and len(stmt.targets) == 1:
        target = stmt.targets[0]
        return target.id if isinstance(target, ast.Name) else _self_attr(target)
    return None


def _conditional(stmt: ast.stmt, call: ast.Call) -> bool:
    """`call` runs only on some paths of `stmt`: in a branch of a conditional expression
    (`self.bn(x) if self.with_bn else x`), after `and`/`or`, or in a lambda or comprehension."""
    for node in ast.walk(stmt):
        if isinstance(node, ast.IfExp):
            parts: list[ast.AST] = [node.body, node.orelse]
        elif isinstance(node, ast.BoolOp):
            parts = node.values[1:]
        elif isinstance(node, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp,
                               ast.GeneratorExp)):
            parts = [node]
        else:
            continue
        if any(call is inner for part in parts for inner in ast.walk(part)):
            return True
    return False
