"""A file's summary, taken from its lifted IR and the walker's records (no second walk)."""

from __future__ import annotations

import ast
import functools
from typing import TYPE_CHECKING

from bnfix.findings import Span
from bnfix.ir import BNSite, Const, FromParam, FunctionInfo, ModuleIR, Unknown, Value
from bnfix.project.summary import (
    MODULE_SCOPE,
    SIGNATURE,
    BNBuild,
    CallRecord,
    ClassSummary,
    FunctionSummary,
    Loc,
    ModuleSummary,
    ParamSpec,
    Ref,
)
from bnfix.rulebook import LayerSpec
from bnfix.source.torch_context import freeze_switch
from bnfix.source.walk import binding

if TYPE_CHECKING:
    from bnfix.source.resolve import Resolver
    from bnfix.source.walk import RawCall

_JSON_SCALARS = (bool, int, float, str, type(None))


def loc(span: Span) -> Loc:
    return (span.start.row, span.start.col, span.end.row, span.end.col)


def ref(value: Value | None, function: FunctionInfo | None) -> Ref:
    """A Value as seen from inside `function`."""
    if isinstance(value, Const):
        if isinstance(value.value, _JSON_SCALARS) and not (
                isinstance(value.value, float) and value.value != value.value):
            return Ref("nc" if value.negated else "c", value.value,
                       loc(value.span) if value.span else None)
        return Ref("u", value.text, loc(value.span) if value.span else None)
    if isinstance(value, FromParam) and value.function is function:
        return Ref("n" if value.negated else "p", value.name,
                   loc(value.span) if value.span else None)
    if isinstance(value, (Unknown, FromParam)):
        text = value.text if isinstance(value, Unknown) else value.name
        return Ref("u", text, loc(value.span) if value.span else None)
    return Ref("u", "?")


def key(function: FunctionInfo | None) -> str:
    return function.qualname if function is not None else MODULE_SCOPE


class Summarizer:
    """Turns one lifted module into its ModuleSummary."""

    def __init__(self, resolver: Resolver, module: ModuleIR, module_id: str, import_name: str,
                 path: str) -> None:
        self.r = resolver
        self.w = resolver.w
        self.module = module
        self.module_id = module_id
        self.import_name = import_name
        self.path = path

    def summary(self) -> ModuleSummary:
        bn: dict[str, list[BNBuild]] = {}
        for site in self.module.bn_sites:
            if site.origin is None:
                bn.setdefault(key(site.function), []).append(self._build(site))
        calls: dict[str, list[CallRecord]] = {}
        for raw, record in self.call_records():
            calls.setdefault(key(raw.ctx.function), []).append(record)
        facts = self.function_facts()
        functions: dict[str, FunctionSummary] = {}
        for function in self.w.functions:
            name = function.qualname
            functions[name] = FunctionSummary(
                qualname=name, name=function.name, class_name=function.class_name,
                loc=loc(function.span), params=self._params(function),
                bn=tuple(bn.get(name, ())), calls=tuple(calls.get(name, ())),
                facts=tuple(sorted(facts.get(name, ()))),
                returns=self._returns(function),
                method=binding(self.w, function) if function.class_name is not None else (),
            )
        classes = self._class_summaries
        if self.r.aliases:
            classes = dict(classes)
            self._alias_constructors(functions, classes)
        if MODULE_SCOPE in bn or MODULE_SCOPE in calls:
            functions[MODULE_SCOPE] = FunctionSummary(
                MODULE_SCOPE, MODULE_SCOPE, None, (1, 0, 1, 0), (),
                bn=tuple(bn.get(MODULE_SCOPE, ())), calls=tuple(calls.get(MODULE_SCOPE, ())))
        return ModuleSummary(
            module=self.module_id, import_name=self.import_name, path=self.path,
            imports={local: target for local, target in self.w.imports.bindings().items()
                     if self.w.imports.first_party(target)},
            star_imports=tuple(self.w.imports.star),
            library_imports={local: target for local, target in self.w.imports.bindings().items()
                             if not self.w.imports.first_party(target)},
            functions=functions,
            classes=classes,
            constants=self._constants(),
            facts=tuple(sorted(self.module_facts())),
            marks=tuple((m.kind, loc(m.span), m.function) for m in self.module.marks),
        )

    def _alias_constructors(self, functions: dict[str, FunctionSummary],
                            classes: dict[str, ClassSummary]) -> None:
        """A BN subclass taken as its BN (subclasses.py): constructing it in another file
        builds that BN. Its `__init__` (the one it writes, or one standing for the base's)
        holds the BN build, the base's parameters flowing into it: positionally and by keyword
        for one standing for the base's, by keyword (what `**kwargs` passes on) beside the
        parameters of one it writes, which keep their own defaults (`name=`, `fused=False`)."""
        for name, alias in self.r.aliases.items():
            klass = classes.get(name)
            if klass is None:
                continue
            spec = alias.spec
            written = {c: w for w, c in spec.canonical.items()}
            keywords = [written.get(k, k) for k in spec.defaults if k not in spec.call_params]
            names = list(dict.fromkeys((*spec.params, *keywords)))
            init = f"{name}.__init__"
            build = BNBuild(spec.id, self.w.cat.normalize(alias.written), klass.loc,
                            {spec.canonical_name(p): Ref("p", p) for p in names})
            own = functions.get(init)
            if own is not None:  # its parameters stay its own; the base's come as keywords
                mine = {p.name for p in own.params}
                functions[init] = own._replace(
                    params=(*own.params, *(ParamSpec(p, -1, None) for p in names
                                           if p not in mine)),
                    bn=(*own.bn, build))
                continue
            functions[init] = FunctionSummary(
                init, "__init__", name, klass.loc,
                (ParamSpec("self", 0, None), *(ParamSpec(p, i + 1, None)
                                              for i, p in enumerate(spec.params)),
                 *(ParamSpec(p, -1, None) for p in names[len(spec.params):])),
                bn=(build,))
            classes[name] = klass._replace(methods=(*klass.methods, "__init__"))

    def _params(self, function: FunctionInfo) -> tuple[ParamSpec, ...]:
        return tuple(ParamSpec(p.name, p.index if p.positional else -1,
                               ref(p.default, None) if p.default is not None else None)
                     for p in function.params.values())

    def _build(self, site: BNSite) -> BNBuild:
        # `bound`, for a site of this file: the parameters a forwarding factory passes on
        args = {name: ref(value, site.function) for name, value in site.bound.items()}
        args.update((name, ref(arg.value, site.function)) for name, arg in site.args.items())
        return BNBuild(site.api.id, site.qualname, loc(site.span), args, site.unpacked,
                       site.opt_out)

    # -- calls -------------------------------------------------------------------------------

    def call_records(self) -> list[tuple[RawCall, CallRecord]]:
        """Calls of first-party code, with what they pass (cached on the resolver: the project
        view maps the index's answers back onto these same calls)."""
        cached = getattr(self.r, "_call_records", None)
        if cached is not None:
            return cached
        out = []
        for raw in [*self.w.local_calls, *self.w.ext_calls]:
            target = self._target(raw)
            if target is None:
                continue
            target, bound = target
            out.append((raw, self._record(raw, target, bound)))
        for raw in self.w.chained_calls:
            method = self._instance_method(raw)
            if method is not None:
                target, chained = method
                record = self._record(raw, target, True)
                out.append((raw, record._replace(super_call=not chained, chain=chained)))
        self.r._call_records = out  # type: ignore[attr-defined]
        return out

    def _target(self, raw: RawCall) -> tuple[str, bool] | None:
        """The absolute (`pkg.mod.f`) or local (`@Class.method`) name a call reaches, and
        whether its first parameter is bound implicitly."""
        func = raw.call.func
        if raw.kind == "first_party":
            return raw.written, False
        if isinstance(func, ast.Name):
            if func.id in self.w.class_names or func.id in self._top_functions:
                return f"@{func.id}", False
            function = raw.ctx.function
            if func.id == "cls" and function is not None and function.class_name is not None:
                return f"@{function.class_name}", False  # a classmethod's `cls(...)`
            return None
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            owner = func.value.id
            if owner in ("self", "cls"):
                cls = raw.ctx.function.class_name if raw.ctx.function else raw.ctx.class_name
                if cls is None:
                    return None
                return f"@{cls}.{func.attr}", True
            if owner in self.w.class_names:
                return f"@{owner}.{func.attr}", False
        return None

    def _instance_method(self, raw: RawCall) -> tuple[str, tuple[str, ...]] | None:
        """`super().m()` and `self.a().m()` in a method of class C: (`@C.m`, the chain's
        methods; () for `super`). The index resolves them on the instance's class."""
        func = raw.call.func
        function = raw.ctx.function
        assert isinstance(func, ast.Attribute)
        found = self.w.chains[id(raw.call)]
        if function is None or function.class_name is None:
            return None
        if found[0] == "super" and function.class_name not in self._derived:
            return None  # `super().__init__()` of a class with no first-party base
        return f"@{function.class_name}.{func.attr}", found[1]

    @functools.cached_property
    def _derived(self) -> set[str]:
        """The classes with a first-party base (where `super()` can lead)."""
        return {name for name, klass in self._class_summaries.items() if klass.bases}

    @functools.cached_property
    def _top_functions(self) -> set[str]:
        return {f.name for f in self.w.functions
                if f.class_name is None and "<locals>" not in f.qualname}

    def _tags(self, raw: RawCall, texts: list[str]) -> tuple[str, ...]:
        """Where the call sits: in a TF1 tower loop, under a tf.distribute strategy scope, in
        an evaluation region; and which of its arguments were put in eval mode before it in
        the same function."""
        tags = list(self.r.call_tags(raw))
        row = raw.call.lineno
        evals = self._evals.get(id(raw.ctx.function), {})
        for text in texts:
            if text in evals and evals[text] < row:
                tags.append(f"prepared:{text}")
        return tuple(tags)

    @functools.cached_property
    def _evals(self) -> dict[int, dict[str, int]]:
        """Per function: the first row where each target is put in eval mode."""
        out: dict[int, dict[str, int]] = {}
        for m in self.module.mode_calls:
            if m.kind == "eval":
                rows = out.setdefault(id(m.function), {})
                rows[m.target] = min(rows.get(m.target, m.span.start.row), m.span.start.row)
        return out

    def _record(self, raw: RawCall, target: str, bound: bool) -> CallRecord:
        call = raw.call
        function = raw.ctx.function
        args: dict[str, Ref] = {}
        texts: list[tuple[str, str]] = []
        star = False
        passed: list[tuple[str, ast.expr]] = []
        for i, arg in enumerate(call.args):
            if isinstance(arg, ast.Starred):
                star = True
                break
            passed.append((f"#{i}", arg))
        for kw in call.keywords:
            if kw.arg is None:
                star = True
            else:
                passed.append((kw.arg, kw.value))
        for key, expr in passed:
            sp = self.r.text.span(expr)
            text = self.r.text.slice(sp)
            args[key] = self._arg(expr, function, sp, text)
            texts.append((key, text))
        stmt = raw.stmt
        assigned = None
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and \
                self.w.receiver_chain(stmt.value) is call:
            assigned = self.r.text.slice(self.r.text.span(stmt.targets[0]))
        return CallRecord(target, loc(self.r.text.span(call)), args, star, bound,
                          self._tags(raw, [t for _, t in texts]), tuple(texts), assigned)

    # -- facts -------------------------------------------------------------------------------

    def function_facts(self) -> dict[str, set[str]]:
        """Per function: what other files' rules ask about it."""
        facts: dict[str, set[str]] = {}
        for name in self.module.freezers:
            facts.setdefault(name, set()).add("freezes_bn")
        for step in self.module.model_steps:
            function = step.function
            if function is None:
                continue
            kind = "model_wrap_replicas" if step.kind == "model_wrap" and step.replicas else step.kind
            owned = facts.setdefault(function.qualname, set())
            if step.target in function.params:
                owned.add(f"{kind}_param:{step.target}")
            returned = {self.r.text.slice(self.r.text.span(v))
                        for v in self.w.returns.get(id(function), ())}
            if step.assigned in returned or step.text.strip().startswith("return "):
                owned.add(f"returns:{kind}")
        for qualname, (param, fresh) in self.module.converters.items():
            owned = facts.setdefault(qualname, set())
            owned.add(f"sync_convert_param:{param}")
            if fresh:
                owned.add("fresh_parameters")
        for mode in self.module.mode_calls:  # `def set_eval(m): m.eval()`: an eval helper
            function = mode.function
            if mode.kind == "eval" and function is not None and mode.target in function.params:
                facts.setdefault(function.qualname, set()).add(f"eval_param:{mode.target}")
        for mark in self.module.marks:
            if mark.kind.startswith("registers:"):
                facts.setdefault(mark.function or MODULE_SCOPE, set()).add(mark.kind)
        return facts

    def module_facts(self) -> set[str]:
        facts = {f"train:{m.target}" for m in self.module.mode_calls if m.kind == "train"}
        if self.module.loss_scaled_per_tower:
            facts.add("loss_scaled_per_tower")
        if any(m.kind == "graph_switch" for m in self.module.graph_mode):
            facts.add("graph_switch")
        if any(s.kind == "sync_convert" for s in self.module.model_steps):
            facts.add("sync_convert")  # the module converts BN to SyncBN (maybe under a flag)
        return facts

    def class_facts(self, name: str) -> set[str]:
        """`freeze:<method>` for its BN freeze methods, `init_freeze:<text>` for a freeze it
        applies to itself at construction, `train_refreezes` when its train() re-freezes,
        `layer:...` when it is a biased layer under another name (wrappers.py),
        `call_trains` when its Keras `call` defaults `training` to True, `call_params:<names>`
        for the parameters of its `call` that can be passed by position (BN012)."""
        facts = {f"freeze:{q.split('.', 1)[1]}" for q in self.module.freezers
                 if q.startswith(name + ".") and q.count(".") == 1}
        for call in self.module.freeze_calls:
            function = call.function
            if call.target == "self" and function is not None and \
                    function.class_name == name and function.name == "__init__":
                switch = freeze_switch(call.condition, function)
                facts.add(f"init_freeze:{call.text}{switch.encode() if switch else ''}")
        if name in self.module.freezing_trains:
            facts.add("train_refreezes")
        layer = self.r.layer_aliases.get(name)
        if layer is not None:
            facts.add(layer_fact(layer))
        if self.r.trains_by_default(name):
            facts.add("call_trains")
        signature = self.r.call_signature(name)
        if signature is not None:
            facts.add(SIGNATURE + ",".join(signature))
        return facts

    def _returns(self, function: FunctionInfo) -> tuple[str, ...]:
        """What the function returns is built by: `return Net(...)`, `model = build(); return
        model` (absolute or `@local` names)."""
        out = []
        for value in self.w.returns.get(id(function), ()):
            call = value if isinstance(value, ast.Call) else None
            if isinstance(value, ast.Name):
                defs = self.w.defs.get((id(function), value.id), [])
                if len(defs) == 1 and isinstance(defs[0][1], ast.Call):
                    call = defs[0][1]
            if call is None:
                continue
            target = self._callee_name(call.func)
            if target is not None and target not in out:
                out.append(target)
        return tuple(out)

    def _callee_name(self, func: ast.expr) -> str | None:
        qual = self.w.imports.qualname(func)
        if qual is not None:
            return qual if self.w.imports.first_party(qual) else None
        if isinstance(func, ast.Name) and (func.id in self.w.class_names or
                                           func.id in self._top_functions):
            return f"@{func.id}"
        return None

    def _arg(self, expr: ast.expr, function: FunctionInfo | None, sp: Span, text: str) -> Ref:
        """What a call passes (`expr`, written at `sp` as `text`): literals and names are
        resolved (a parameter, a constant); other expressions are unknown, kept as text
        (resolving every argument of every call of a large module costs more than it tells)."""
        if isinstance(expr, (ast.Constant, ast.Name, ast.UnaryOp, ast.BinOp)):
            return ref(self.r.value(expr, function), function)
        return Ref("u", text, loc(sp))

    # -- classes and constants -------------------------------------------------------------------

    @functools.cached_property
    def _class_summaries(self) -> dict[str, ClassSummary]:
        out = {}
        for node, ctx in self.w.class_defs:
            if ctx.function is not None:
                continue  # a class defined inside a function is not reachable by name
            bases = []
            for base in node.bases:
                qual = self.w.imports.qualname(base)
                if qual is not None and self.w.imports.first_party(qual):
                    bases.append(qual)
                elif isinstance(base, ast.Name) and base.id in self.w.class_names:
                    bases.append(f"@{base.id}")
            methods = tuple(f.name for f in self.w.functions if f.class_name == node.name
                            and f.qualname == f"{node.name}.{f.name}")
            out[node.name] = ClassSummary(node.name, loc(self.r.text.span(node)), tuple(bases),
                                          methods,
                                          tuple(sorted(self.class_facts(node.name))))
        return out

    def _constants(self) -> dict[str, Ref]:
        out: dict[str, Ref] = {}
        for (scope, name), defs in self.w.defs.items():
            if scope != 0 or "." in name or len(defs) != 1 or defs[0][0] != "assign":
                continue
            value = self.r.value(defs[0][1], None)
            if isinstance(value, Const):
                out[name] = ref(value, None)
        return out


def layer_fact(spec: LayerSpec) -> str:
    """A class taken as a biased layer, as a class fact: what BN104 needs at a call of it."""
    return ":".join(("layer", spec.framework, spec.bias, spec.activation or "",
                     ",".join(spec.params)))


def layer_of(fact: str) -> LayerSpec | None:
    """The layer a `layer:` class fact describes."""
    parts = fact.split(":")
    if len(parts) != 5 or parts[0] != "layer":
        return None
    _, framework, bias, activation, params = parts
    return LayerSpec(framework, tuple(p for p in params.split(",") if p), bias, activation or None)
