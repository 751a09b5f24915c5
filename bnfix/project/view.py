"""The project as one module sees it: what the index knows about other files, attached to the
module's IR in the IR's own terms, so that rules keep reading only the IR.

Two halves, so that the index stays in one process: `file_context` (where the index is) says,
as plain data, what the project knows that concerns one module; `attach` (where the module was
lifted) turns that into IR:

- BN built in other files and reached by this module's first-party calls become `BNSite`s with
  an `origin` (`ModuleIR.reached_sites`), their arguments bound by the call made here.
- Calls of this module's functions made in other files become `CallSite`s (with `where` set)
  on those functions; their callers become `FunctionInfo` proxies with call sites of their own
  (CALLER_DEPTH levels): calling contexts, and so `ir.bindings`, span the project.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from bnfix.findings import Pos, Span, shown_path
from bnfix.ir import (
    BNSite,
    CallInfo,
    CallSite,
    Const,
    FreezeCall,
    FromParam,
    FunctionInfo,
    ModeCall,
    ModelStep,
    ModuleIR,
    Origin,
    Param,
    Related,
    Unknown,
    Value,
)
from bnfix.project.index import ProjectIndex, Reach
from bnfix.project.summarize import Summarizer, layer_of
from bnfix.project.summary import (
    MODULE_SCOPE,
    SIGNATURE,
    UNKNOWN,
    CallRecord,
    FunctionSummary,
    Loc,
    ParamSpec,
    Ref,
)
from bnfix.source.calls import call_info
from bnfix.source.torch_context import (
    UNKNOWN_VALUE,
    FreezeSwitch,
    TorchContext,
    conditions_of,
)

if TYPE_CHECKING:
    from bnfix.source.resolve import Resolver
    from bnfix.source.walk import RawCall

Marks = dict[str, list[tuple[str, Loc, str | None]]]  # by kind: (file, where, function)
CALLER_DEPTH = 3  # levels of callers in other files attached (as deep as ir.bindings looks)
Key = tuple[str, str]  # (module id, function qualname)


class ForeignFunction(NamedTuple):
    """A function of another file, as far as its callers' contexts need it."""

    path: str
    qualname: str
    name: str
    class_name: str | None
    loc: Loc
    params: tuple[ParamSpec, ...]


class ForeignCall(NamedTuple):
    """A call of `callee` made in another file by `caller` (None: its top-level code)."""

    path: str
    caller: Key | None
    call: CallRecord
    bound: bool
    facts: tuple[str, ...] = ()  # the calling module's facts


class ClassInfo(NamedTuple):
    """A first-party class (of another file) that a call here instantiates, with the facts of
    it and its first-party bases (`freeze:<method>`, `init_freeze:<text>`, `train_refreezes`),
    and `layer:...` when the class called is a biased layer (wrappers.py)."""

    path: str
    name: str
    loc: Loc
    facts: tuple[str, ...]


class HelperStep(NamedTuple):
    """What a call of a first-party helper does to a model for distributed training: wraps
    it, builds an optimizer over its parameters, converts its BN to SyncBN — to an argument
    (`target`, as written at the call) or to what it returns (target None)."""

    kind: str  # model_wrap | optimizer | sync_convert
    replicas: bool
    target: str | None
    path: str
    loc: Loc
    helper: str
    fresh: bool = False  # a conversion that gives the new BN layers new parameters


STEP_KINDS = ("model_wrap", "model_wrap_replicas", "optimizer", "sync_convert", "eval")


@dataclass
class FileContext:
    """What the project knows that concerns one module, as plain data."""

    path: str
    reaches: dict[Loc, tuple[Reach, ...]] = field(default_factory=dict)  # by call location
    calls: dict[Key, list[ForeignCall]] = field(default_factory=dict)  # callee -> callers
    functions: dict[Key, ForeignFunction] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    # every file's marks by kind (the index's, shared): (file, where, function); None once
    # sent to a worker process, which holds the project's (sent once, not with every file)
    marks: Marks | None = field(default_factory=dict)
    other_marks: bool = False  # some other file has marks
    facts: dict[str, list[tuple[str, Loc]]] = field(default_factory=dict)  # of code it calls
    apis: frozenset[str] = frozenset()  # BN APIs the project builds
    instances: dict[Loc, ClassInfo] = field(default_factory=dict)  # calls that build a class
    imported: bool = True  # some other module of the project imports or calls into it
    steps: dict[Loc, list[HelperStep]] = field(default_factory=dict)  # calls of set-up helpers
    neighbours: tuple[str, ...] = ()  # files of the modules it calls and of those calling it
    # library names bound by its star imports of first-party modules (ModuleContext's)
    star_names: dict[str, dict[str, str]] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not (self.reaches or self.calls or self.other_marks or self.facts or self.steps or
                    self.instances or self.star_names) and self.imported

    def digest(self) -> str:
        """A digest of all of it: the check of a file reads the project only through its
        context, so findings made against a context with this digest are the findings against
        this one (an edit elsewhere that leaves it the same re-checks nothing). Sets are taken
        sorted, everything else in its order (an order the check may follow). NamedTuple
        records are written as arrays without their class's name: each field holds records of
        one class, so the arrays say as much."""
        fields = [[k, list(v.items()) if isinstance(v, dict) else v]
                  for k, v in vars(self).items()]  # dicts keyed by tuples: as pairs
        text = json.dumps(fields, separators=(",", ":"), default=_plain)
        return hashlib.sha256(text.encode()).hexdigest()[:24]


def _plain(value: object) -> object:
    """What JSON writes for a record of a context (json calls it for what it cannot write)."""
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=lambda v: json.dumps(v, default=_plain))
    names = _FIELDS.get(type(value))
    if names is None:
        if not dataclasses.is_dataclass(value):
            raise TypeError(f"a file context holds a {type(value).__name__}")
        names = _FIELDS[type(value)] = tuple(f.name for f in dataclasses.fields(value))
    held = vars(value)
    if len(held) == len(names):  # its fields alone, as its __init__ set them: in their order
        return [type(value).__name__, *held.values()]
    return [type(value).__name__, *(getattr(value, n) for n in names)]


_FIELDS: dict[type, tuple[str, ...]] = {}


def span(loc: Loc) -> Span:
    return Span(Pos(loc[0], loc[1]), Pos(loc[2], loc[3]))


# -- where the index is ----------------------------------------------------------------------


def file_context(index: ProjectIndex, module_id: str) -> FileContext:
    summary = index.summaries.get(module_id)
    if summary is None:
        return FileContext("")
    context = FileContext(summary.path)
    facts: dict[str, dict[tuple[str, Loc], None]] = {}
    for function in summary.functions.values():
        for call in function.calls:
            if call.target.startswith("@") and all(
                    t.module == module_id
                    for t in index.call_targets(module_id, call, caller=function)):
                continue  # reached through this module's own functions: seen in-file already
            reached = tuple(index.reach_at(module_id, call, caller=function))
            if reached:
                context.reaches[call.loc] = reached
            for fact, places in index.facts_at(module_id, call, caller=function).items():
                seen = facts.setdefault(fact, {})  # each place once: many calls reach the same
                seen.update((p, None) for p in places if p[0] != summary.path)
            built = _instantiated(index, module_id, call)
            if built is not None:
                context.instances[call.loc] = built
        for call in function.calls:
            steps = _helper_steps(index, module_id, call, function)
            if steps:
                context.steps[call.loc] = steps
    context.facts = {k: list(v) for k, v in facts.items() if v}
    for function in summary.functions.values():
        _callers(index, (module_id, function.qualname), context, CALLER_DEPTH, module_id)
    context.marks = index.project_marks()
    context.other_marks = bool(index.marked_files() - {summary.path})
    context.apis = index.project_apis()
    context.notes = list(dict.fromkeys(index.gave_up))
    context.star_names = index.star_names(module_id)
    near = {m for m, _ in (index.callees or {}).get(module_id, ())} | \
        set((index.dependents or {}).get(module_id, ()))
    context.neighbours = tuple(sorted(index.summaries[m].path for m in near
                                      if m != module_id and m in index.summaries))
    return context


def _graph_facts(index: ProjectIndex, module: str, function: str) -> tuple[str, ...]:
    """What the code a caller runs puts in collections (`registers:KEY`): a custom BN that adds
    its statistics, or a BN API whose statistics join the collection (the graph a helper such as
    an EMA works on is its caller's)."""
    key = ("graph_facts", module, function)
    found = index.memo.get(key)
    if found is None:  # asked for each call a caller makes into the module, and per module
        found = index.memo[key] = _graph_facts_of(index, module, function)
    return found


def _graph_facts_of(index: ProjectIndex, module: str, function: str) -> tuple[str, ...]:
    facts = {f for f in index.facts_reached(module, function) if f.startswith("registers:")}
    for reach in index.reach(module, function):
        facts.add("builds_bn")
        facts.update(f"registers:{key}" for key in index.registers.get(reach.api, ()))
        named = reach.args.get("variables_collections")  # `[tf.GraphKeys.TRAINABLE_VARIABLES]`
        if named is not None and named.kind == "u":
            facts.update(f"registers:{key}" for key in GRAPH_KEY.findall(str(named.value)))
    return tuple(sorted(facts))


GRAPH_KEY = re.compile(r"GraphKeys\.([A-Z_]+)")


def _helper_steps(index: ProjectIndex, module_id: str, call: CallRecord,
                  caller: FunctionSummary) -> list[HelperStep]:
    """One step per kind: what the helper does to the argument it is passed, else to what it
    returns (a helper that converts its parameter and returns it does one conversion)."""
    out: list[HelperStep] = []
    for target in index.call_targets(module_id, call, caller=caller):
        function = index.function(*target.key)
        if function is None:
            continue
        path = index.summaries[target.module].path
        for fact in function.facts:
            head, _, rest = fact.partition(":")
            kind = head.removesuffix("_param") if head.endswith("_param") else rest
            if kind not in STEP_KINDS or head not in (f"{kind}_param", "returns"):
                continue
            text = function.passed(call, rest, target.bound) if head.endswith("_param") else None
            if head.endswith("_param") and text is None:
                continue
            step = HelperStep(kind.removesuffix("_replicas"), kind.endswith("_replicas"),
                              text, path, function.loc, function.qualname,
                              kind == "sync_convert" and "fresh_parameters" in function.facts)
            twin = next((s for s in out if s.kind == step.kind and s.helper == step.helper), None)
            if twin is None:
                out.append(step)
            elif twin.target is None and step.target is not None:
                out[out.index(twin)] = step
    return out


def _instantiated(index: ProjectIndex, module_id: str, call: CallRecord) -> ClassInfo | None:
    """The class a call builds an instance of: the class called, or the one a factory
    function returns (`build_model()` returning `Net(...)`). A construction-time freeze under
    `if <param>:` of `__init__` is kept only when the arguments (through the factory) can make
    the test true: `init_freeze:<text>` when it always applies, `init_freeze:<text>?=<test>`
    with the test as written at `call` when that decides, `?=` alone when nothing visible
    there does."""
    found = index.resolve_class(module_id, call.target)
    bind: Binder = lambda name, i: _bound(call, name, i)
    direct = found is not None
    if found is None:
        for target in index.targets(module_id, call.target):
            function = index.function(*target.key)
            if function is not None and function.class_name is None:
                for returned in function.returns:
                    found = index.resolve_class(target.module, returned)
                    if found is not None:
                        inner = next((c for c in function.calls if c.target == returned), None)
                        bind = _through_factory(call, function, inner, target.bound)
                        break
            if found is not None:
                break
    if found is None:
        return None
    owner, klass = found
    facts: list[str] = []
    for where, base in index.mro(owner, klass.name):
        init = index.function(where, f"{base.name}.__init__")
        for fact in base.facts:
            if fact.startswith("layer:") and not (direct and base is klass):
                continue  # what the class called is, not what a base or a factory's class is
            if fact.startswith("init_freeze:"):
                text, switch = FreezeSwitch.decode(fact.split(":", 1)[1])
                fact = f"init_freeze:{text}"
                spec = init.param(switch.param) if switch and init else None
                if switch is not None and spec is not None and base is klass:
                    passed, written = bind(switch.param, spec.index - 1 if spec.index > 0 else -1)
                    if passed is None:
                        passed = spec.default
                    if not switch.freezes(_literal(passed)):
                        continue
                    if _literal(passed) is UNKNOWN_VALUE:
                        fact += f"?={switch.test(written) if written else ''}"
                elif switch is not None:
                    fact += "?="
            if fact not in facts:
                facts.append(fact)
    summary = index.summaries[owner]
    return ClassInfo(summary.path, klass.name, klass.loc, tuple(facts))


Binder = Callable[[str, int], tuple[Ref | None, str | None]]


def _bound(call: CallRecord | None, name: str, position: int) -> tuple[Ref | None, str | None]:
    """What `call` passes for a parameter (by keyword, or at `position`) and its text;
    (UNKNOWN, None) when `*args`/`**kwargs` may carry it, (None, None) when it is not passed."""
    if call is None:
        return UNKNOWN, None
    texts = dict(call.texts)
    for key in (name, f"#{position}" if position >= 0 else None):
        if key is not None and key in call.args:
            return call.args[key], texts.get(key)
    return (UNKNOWN if call.star else None), None


def _through_factory(outer: CallRecord, factory: FunctionSummary, inner: CallRecord | None,
                     bound: bool) -> Binder:
    """Binding for the construction inside a factory: a factory parameter passed on is what
    the factory's caller passes (or the factory's default)."""
    def bind(name: str, position: int) -> tuple[Ref | None, str | None]:
        ref, _ = _bound(inner, name, position)
        if ref is None or ref.kind != "p":
            return ref, None
        spec = factory.param(ref.value)
        if spec is None:
            return UNKNOWN, None
        index = spec.index - (1 if bound else 0) if spec.index >= 0 else -1
        passed, written = _bound(outer, spec.name, index)
        if passed is None:
            return spec.default or UNKNOWN, None
        return passed, written
    return bind


def _literal(ref: Ref | None) -> object:
    return ref.value if ref is not None and ref.kind == "c" else UNKNOWN_VALUE


def _frozen_names(index: ProjectIndex, module_id: str, function: FunctionSummary | None,
                  call: CallRecord) -> tuple[str, ...]:
    """`frozen:<name>` for each local the caller assigned, before `call`, an instance whose
    BN its class freezes at construction (`=<origin>` after it): the callee's parameter that
    receives it holds a frozen model."""
    if function is None:
        return ()
    key = ("frozen_names", module_id, function.qualname)
    found = index.memo.get(key)
    if found is None:  # every call of a function asks: its assignments are looked at once
        found = index.memo[key] = []
        for record in function.calls:
            if record.assigned is None:
                continue
            info = _instantiated(index, module_id, record)
            if info is None or "train_refreezes" in info.facts:
                continue
            for fact in info.facts:
                if fact.startswith("init_freeze:"):
                    text = fact.split(":", 1)[1].partition("?=")[0]
                    path = index.summaries[module_id].path
                    frozen = (f"frozen:{record.assigned}={text}|{info.name}|"
                              f"{shown_path(path)}:{record.loc[0]}")
                    found.append((record.loc, frozen))
    return tuple(fact for loc, fact in found if loc < call.loc)


def _callers(index: ProjectIndex, callee: Key, context: FileContext, depth: int,
             local: str) -> None:
    if callee in context.calls or depth < 0:
        return
    found = []
    for caller in index.callers(*callee):
        if caller.module == local and callee[0] == local:
            continue  # a call inside the module itself: resolved in-file
        summary = index.summaries[caller.module]
        bound = next((t.bound for t in index.call_targets(
            caller.module, caller.call, caller=summary.functions.get(caller.function))
                      if t.key == callee), caller.call.bound)
        key = None if caller.function == MODULE_SCOPE else (caller.module, caller.function)
        facts = summary.facts + _graph_facts(index, caller.module, caller.function) \
            + _frozen_names(index, caller.module, summary.functions.get(caller.function),
                            caller.call)
        found.append(ForeignCall(summary.path, key, caller.call, bound, facts))
        if key is not None and key not in context.functions:
            function = summary.functions[caller.function]
            context.functions[key] = ForeignFunction(summary.path, function.qualname,
                                                     function.name, function.class_name,
                                                     function.loc, function.params)
            if caller.module != local:
                _callers(index, key, context, depth - 1, local)
    if found:
        context.calls[callee] = found


# -- where the module was lifted ---------------------------------------------------------------


class ProjectView:
    def __init__(self, context: FileContext, module_id: str, catalogue_ids: dict) -> None:  # type: ignore[type-arg]
        self.context = context
        self.module_id = module_id
        self.path = context.path
        self.by_id = catalogue_ids
        self._proxies: dict[Key, FunctionInfo] = {}

    def value(self, ref: Ref, function: FunctionInfo | None) -> Value:
        """A Ref in the terms of `function` (its `p` Refs name its parameters)."""
        where = None if ref.path in (None, self.path) else ref.path
        sp = span(ref.loc) if ref.loc else None
        if ref.kind in ("p", "n") and function is not None and ref.value in function.params:
            return FromParam(function, ref.value, sp if where is None else None, ref.kind == "n")
        if ref.kind in ("c", "nc"):
            return Const(ref.value, repr(not ref.value if ref.kind == "nc" else ref.value), sp,
                         where, ref.kind == "nc")
        return Unknown(str(ref.value), sp, where=where)

    def attach(self, resolver: Resolver, module: ModuleIR) -> None:
        summarizer = Summarizer(resolver, module, self.module_id, "", self.path)
        built: list[tuple[RawCall, BNSite]] = []  # BN classes of other files constructed here
        for raw, record in summarizer.call_records():
            info = self.context.instances.get(record.loc)  # the first-party class built, if any
            for reach in self.context.reaches.get(record.loc, ()):
                spec = self.by_id.get(reach.api)
                if spec is None:
                    continue
                function = raw.ctx.function
                module.reached_sites.append(BNSite(
                    api=spec.ref,
                    qualname=reach.qualname,
                    call=call_info(resolver.text, raw.call),
                    args={},
                    function=function,
                    unpacked=reach.unpacked,
                    origin=Origin(reach.path, span(reach.loc),
                                  tuple((p, span(lc), callee) for p, lc, callee in reach.via)),
                    bound={name: self.value(ref, function) for name, ref in reach.args.items()},
                    settable=dict(reach.settable),
                    opt_out=reach.opt_out,
                    weights_only=resolver.weights_only(raw),
                ))
                if info is not None and (info.path, info.loc) == (reach.path, reach.loc):
                    built.append((raw, module.reached_sites[-1]))  # the class is the BN
            if info is not None and "call_trains" in info.facts:
                module.training_models.append(span(record.loc))
            signature = next((f for f in info.facts if f.startswith(SIGNATURE)), None) \
                if info is not None else None
            if signature is not None:
                names = signature.removeprefix(SIGNATURE)
                module.call_signatures[span(record.loc)] = tuple(names.split(",")) if names else ()
        resolver.resolve_call_sites({id(s.function) for s in module.reached_sites if s.function})
        for function in resolver.w.functions:
            foreign = self.context.calls.get((self.module_id, function.qualname), [])
            for call in foreign:
                function.call_sites.append(self._call_site(call, function, CALLER_DEPTH))
            self._frozen_params(resolver, module, function, foreign)
        module.project_notes.extend(self.context.notes)
        module.project_marks = self.context.marks or {}
        module.project_path = self.context.path
        module.neighbours = frozenset(self.context.neighbours)
        module.reached_facts = self.context.facts
        module.project_apis = {a: self.by_id[a].ref for a in self.context.apis if a in self.by_id}
        module.imported = self.context.imported
        self._attach_freezes(resolver, module, summarizer)
        self._attach_steps(resolver, module, summarizer)
        self._attach_layers(resolver, module, summarizer, built)

    def _attach_layers(self, resolver: Resolver, module: ModuleIR, summarizer: Summarizer,
                       built: list[tuple[RawCall, BNSite]]) -> None:
        """Calls of classes of other files that are a biased layer (a conv wrapper) or a BN
        (a BN subclass taken as its base: arcface-tf2's `BatchNormalization`): BN104 pairs the
        layers with the BN their output goes into."""
        if not module.bn_sites and not built:
            return
        foreign = []
        for raw, record in summarizer.call_records():
            info = self.context.instances.get(record.loc)
            if info is None or info.path == self.path:
                continue
            for fact in info.facts:
                spec = layer_of(fact)
                if spec is not None:
                    foreign.append((raw, spec, Related(
                        info.path, span(info.loc), f"`{info.name}` adds its layer's bias")))
        if foreign or built:
            module.bias_before_bn = TorchContext(resolver).bias_pairs(module.bn_sites, foreign,
                                                                      built)

    def _attach_steps(self, resolver: Resolver, module: ModuleIR, summarizer: Summarizer) -> None:
        """Helpers that wrap a model, build its optimizer or convert its BN (BN103, BN006),
        or put it in eval mode (composer's `model_eval_mode(model)` context manager: BN101)."""
        for raw, record in summarizer.call_records():
            for step in self.context.steps.get(record.loc, ()):
                target = step.target if step.target is not None else record.assigned
                if target is None:
                    continue
                stmt = resolver.statement(raw.stmt)
                if step.kind == "eval":
                    if step.target is not None:
                        module.mode_calls.append(ModeCall("eval", target, resolver.text.span(
                            raw.call), stmt, raw.ctx.function, False))
                    continue
                given = next((a for a in (*raw.call.args, *(k.value for k in raw.call.keywords))
                              if resolver.text.slice(resolver.text.span(a)) == step.target),
                             None) if step.kind == "model_wrap" and step.replicas else None
                module.model_steps.append(ModelStep(
                    step.kind, target, record.assigned, call_info(resolver.text, raw.call), stmt,
                    raw.ctx.function, resolver.text.slice(stmt.span),
                    qualname=step.helper, replicas=step.replicas,
                    conditions=conditions_of(resolver.text, raw),
                    through=Origin(step.path, span(step.loc)), fresh=step.fresh,
                    builders=resolver.model_builders(given, raw.ctx.function, raw.stmt)
                    if given is not None else ()))

    def _attach_freezes(self, resolver: Resolver, module: ModuleIR, summarizer: Summarizer) -> None:
        """Instances of first-party classes of other files that freeze BN: a freeze at
        construction applies to the instance here; their freeze methods called here are
        freezes (BN102 then sees `model.train()` undo them)."""
        methods: set[str] = set()
        for raw, record in summarizer.call_records():
            info = self.context.instances.get(record.loc)
            if info is None or "train_refreezes" in info.facts or record.assigned is None:
                continue
            methods.update(f.split(":", 1)[1] for f in info.facts if f.startswith("freeze:"))
            for fact in info.facts:
                if not fact.startswith("init_freeze:"):
                    continue
                text, switched, test = fact.split(":", 1)[1].partition("?=")
                module.freeze_calls.append(FreezeCall(
                    record.assigned, text, resolver.text.span(raw.call),
                    resolver.statement(raw.stmt), raw.ctx.function, test or None,
                    origin=f"applied at construction by `{info.name}(...)`, "
                           f"{shown_path(info.path)}:{info.loc[0]}",
                    reapplicable=not switched or bool(test)))
        for raw in resolver.w.attr_calls:
            if raw.kind in methods and not raw.call.args:
                receiver = resolver.text.slice(resolver.text.span(raw.call.func.value))  # type: ignore[attr-defined]
                module.freeze_calls.append(FreezeCall(
                    receiver, f"{{target}}.{raw.kind}()", resolver.text.span(raw.call),
                    resolver.statement(raw.stmt), raw.ctx.function, None))

    def _frozen_params(self, resolver: Resolver, module: ModuleIR, function: FunctionInfo,
                       calls: list[ForeignCall]) -> None:
        """A parameter that callers in other files pass a model frozen at construction holds a
        frozen model; an `__init__` that stores it in `self.<attr>` makes that attribute one.
        The freeze is named, not re-applied by a fix: what decides it is in the other file."""
        for call in calls:
            written = dict(call.call.texts)
            for fact in call.facts:
                if not fact.startswith("frozen:") or call.path == self.path:
                    continue
                name, _, rest = fact[len("frozen:"):].partition("=")
                text, klass, place = rest.split("|")
                for key, arg in written.items():
                    param = self._param_of(function, key, call.bound)
                    if arg != name or param is None:
                        continue
                    origin = (f"applied at construction by `{klass}(...)` to the model built "
                              f"at {place} and passed as `{param}`")
                    for target, stmt in self._holders(resolver, function, param):
                        module.freeze_calls.append(FreezeCall(
                            target, text, resolver.text.span(stmt),
                            resolver.statement(stmt, compound_ok=True), function, None,
                            origin=origin, reapplicable=False))

    @staticmethod
    def _param_of(function: FunctionInfo, key: str, bound: bool) -> str | None:
        """The parameter an argument key (`name` or `#i`) of a call binds."""
        if not key.startswith("#"):
            return key if key in function.params else None
        ordered = sorted((p for p in function.params.values() if p.positional),
                         key=lambda p: p.index)[1 if bound else 0:]
        position = int(key[1:])
        return ordered[position].name if position < len(ordered) else None

    @staticmethod
    def _holders(resolver: Resolver, function: FunctionInfo,
                 param: str) -> list[tuple[str, ast.stmt]]:
        """Where the parameter's object lives in the function: `self.<attr>` when `__init__`
        stores it there, else the parameter itself (at the def)."""
        if function.name != "__init__" or function.class_name is None:
            node = resolver.w.function_nodes.get(id(function))
            return [(param, node)] if node is not None else []
        out = []
        prefix = f"{function.class_name}."
        for (scope, key), defs in resolver.w.defs.items():
            if scope != 0 or not key.startswith(prefix):
                continue
            for _, value, stmt in defs:
                if isinstance(value, ast.Name) and value.id == param and \
                        function.span.start.row < stmt.lineno <= function.span.end.row:
                    out.append((f"self.{key[len(prefix):]}", stmt))
        return out

    def _call_site(self, call: ForeignCall, target: FunctionInfo, depth: int) -> CallSite:
        caller = self._proxy(call.caller, depth - 1) if call.caller is not None else None
        args: dict[str, Value] = {}
        ordered = sorted((p for p in target.params.values() if p.positional), key=lambda p: p.index)
        if call.bound:
            ordered = ordered[1:]
        for name in target.params:
            ref = call.call.args.get(name)
            if ref is None:
                position = next((i for i, p in enumerate(ordered) if p.name == name), None)
                ref = call.call.args.get(f"#{position}") if position is not None else None
            if ref is not None:
                args[name] = self._foreign(ref, caller, call.path)
            elif call.call.star:
                args[name] = Unknown("*args/**kwargs", None, where=call.path)
        sp = span(call.call.loc)
        info = CallInfo(sp, call.call.target.lstrip("@").rsplit(".", 1)[-1], None, sp.end, False,
                        sp.start.row != sp.end.row)
        where = None if call.path == self.path else call.path
        return CallSite(sp, args, info, caller, where=where, tags=call.call.tags,
                        facts=call.facts)

    def _foreign(self, ref: Ref, caller: FunctionInfo | None, path: str) -> Value:
        """A value written in another file (or this one), in the terms of its caller."""
        sp = span(ref.loc) if ref.loc else None
        if ref.kind in ("p", "n") and caller is not None and ref.value in caller.params:
            return FromParam(caller, ref.value, None, ref.kind == "n")
        where = ref.path or path
        if where == self.path:
            where = None
        if ref.kind in ("c", "nc"):
            return Const(ref.value, repr(not ref.value if ref.kind == "nc" else ref.value), sp,
                         where, ref.kind == "nc")
        return Unknown(str(ref.value), sp, where=where)

    def _proxy(self, key: Key, depth: int) -> FunctionInfo | None:
        """A caller in another file, as a FunctionInfo whose call sites are its own callers.
        The proxies of its callers are made at once (the first walk to meet a caller fixes
        how many levels it gets, whichever rule reads first); their call sites when read."""
        if key in self._proxies:
            return self._proxies[key]
        function = self.context.functions.get(key)
        if function is None:
            return None
        params = {}
        for p in function.params:
            default = self._foreign(p.default, None, function.path) if p.default else None
            params[p.name] = Param(p.name, default, None, p.index >= 0, p.index)
        where = None if function.path == self.path else function.path
        proxy = ProxyFunction(f"{key[0]}.{key[1]}", function.name, function.class_name,
                              span(function.loc), params, where=where)
        self._proxies[key] = proxy
        calls = self.context.calls.get(key, ()) if depth > 0 else ()
        for call in calls:
            if call.caller is not None:
                self._proxy(call.caller, depth - 1)
        if calls:
            proxy.pending = lambda: [self._call_site(call, proxy, depth) for call in calls]
        return proxy


class ProxyFunction(FunctionInfo):
    """A caller in another file. Its own call sites (its callers, and theirs) are built when
    a rule first reads them: most callers of a widely used module are never asked about, and
    building every level of them was a third of the check of such a module."""

    pending: Callable[[], list[CallSite]] | None = None

    @property  # type: ignore[override]
    def call_sites(self) -> list[CallSite]:
        if self.pending is not None:
            build, self.pending = self.pending, None
            self._sites.extend(build())
        return self._sites

    @call_sites.setter
    def call_sites(self, sites: list[CallSite]) -> None:
        self._sites = sites


__all__ = ["FileContext", "FunctionSummary", "Marks", "ProjectView", "file_context"]
