"""The project index: every file's summary joined. It resolves a call's target across files
(imports, `__init__` re-exports, star imports, methods inherited from first-party bases), says
which BatchNorm a call reaches through wrappers of wrappers (to a fixed point, bounded, safe on
cycles) with each BN argument expressed in the caller's terms, and answers the reverse
question: who calls a function, from where, with what."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from bnfix.project.modules import ModuleMap
from bnfix.project.store import SummaryStore, outline
from bnfix.project.summary import (
    MODULE_SCOPE,
    UNKNOWN,
    CallRecord,
    ClassSummary,
    FunctionSummary,
    Loc,
    ModuleSummary,
    Ref,
)

MAX_DEPTH = 8  # re-exports / bases followed
# BN call sites reached from one function, counted per path: NASNet-A Large (264 BN layers)
# reaches 528 through the two branches of `if pretrained:` in `nasnetalarge()`
MAX_REACH = 4096
MAX_STEPS = 200_000  # reach computations per index: recomputation inside call cycles is bounded
CONSTRUCTION = ("__init__", "build")  # what building an instance of a class runs


Receiver = tuple[str, str]  # (module, class name): the class of the instance a method runs on


class Target(NamedTuple):
    """A function of the project (a class call runs its construction methods)."""

    module: str
    qualname: str
    bound: bool  # its first parameter (`self`) is not passed at the call
    # the class of the instance it runs on, when the call decides it (a construction, or a
    # method called on an instance whose class is known): `self.m()` inside dispatches there
    receiver: Receiver | None = None

    @property
    def key(self) -> tuple[str, str]:
        return (self.module, self.qualname)


@dataclass(frozen=True)
class Reach:
    """A BatchNorm that calling a function builds, possibly through other functions."""

    api: str
    qualname: str
    path: str  # the file of the BN call
    loc: Loc
    args: dict[str, Ref]  # in the terms of the function asked about (`p` = its parameters)
    via: tuple[tuple[str, Loc, str], ...]  # (file, call location, callee) from there down
    unpacked: bool = False
    settable: dict[str, str] = field(default_factory=dict)  # BN arg -> parameter that sets it
    opt_out: bool = False  # the BN's `if` builds a synchronized BN in its other branch


class Caller(NamedTuple):
    module: str
    function: str  # qualname in that module (`<module>` for top-level code)
    call: CallRecord


class ProjectIndex:
    def __init__(self, summaries: Mapping[str, ModuleSummary], modules: ModuleMap,
                 registers: Mapping[str, tuple[str, ...]] | None = None) -> None:
        self.summaries = summaries
        self.modules = modules
        # for each BN API id, the collections its statistics join (the catalogue's): fixed
        # while the index lives, as the view's memo of graph facts assumes
        self.registers: Mapping[str, tuple[str, ...]] = registers or {}
        self._reach: dict[tuple[str, str, Receiver | None], tuple[Reach, ...]] = {}
        self._busy: set[tuple[str, str, Receiver | None]] = set()
        self._cuts = 0  # times a recursion was cut (results computed meanwhile are partial)
        self._steps = 0
        self._targets: dict[tuple[str, str], tuple[Target, ...]] = {}
        self._instance: dict[tuple[Any, ...], tuple[Target, ...]] = {}
        self._names: dict[tuple[str, str], frozenset[str]] = {}
        self._overrides: dict[tuple[Receiver, Receiver], frozenset[str]] = {}
        self._mros: dict[Receiver, list[tuple[str, ClassSummary]]] = {}
        self._through: dict[tuple[str, str], tuple[tuple[Target, ...],
                                                   frozenset[tuple[str, str]]]] = {}
        # the calls of the modules read so far, by callee; `callers` reads the module asked
        # about and its direct dependents (every module without `dependents`)
        self._callers: dict[tuple[str, str], list[Caller]] = {}
        self._callers_read: set[str] = set()
        self._callers_ready: set[tuple[str, str]] = set()
        self._rank: dict[str, int] | None = None
        # module -> the modules that depend on it directly (imports, calls, bases), when the
        # project pass has them: `callers` then reads only the modules that can reach one
        self.dependents: Mapping[str, set[str]] | None = None
        # module -> the functions its calls resolve to (with `dependents`): `callers` reads
        # only the dependents that call the function asked about
        self.callees: Mapping[str, frozenset[tuple[str, str]]] | None = None
        self._facts: dict[tuple[str, str, Receiver | None], dict[str, list[tuple[str, Loc]]]] = {}
        self._facts_busy: set[tuple[str, str, Receiver | None]] = set()
        self._marks: dict[str, list[tuple[str, Loc, str | None]]] | None = None
        self._marked: set[str] = set()
        # weight loads the project's README shows (readme.py): `loads_weights` marks too
        self.documented: tuple[tuple[str, Loc], ...] = ()
        self._apis: set[str] | None = None
        self.gave_up: list[str] = []  # where resolution stopped (cycles, depth)
        # what the project view derives from the index, by the view's key (the index does not
        # change while it lives)
        self.memo: dict[tuple[str, ...], Any] = {}

    # -- resolution ------------------------------------------------------------------------

    def function(self, module: str, qualname: str) -> FunctionSummary | None:
        summary = self.summaries.get(module)
        return summary.functions.get(qualname) if summary else None

    def targets(self, module: str, target: str) -> tuple[Target, ...]:
        """The functions a call of `target` (as written in `module`) runs."""
        key = (module, target)
        if key not in self._targets:
            self._targets[key] = self._resolve_target(module, target)
        return self._targets[key]

    def _resolve_target(self, module: str, target: str) -> tuple[Target, ...]:
        if target.startswith("@"):
            return self._in_module(module, target[1:], bound=False, depth=0)
        summary = self.summaries.get(module)
        found = self._locate(target, summary.path if summary else None, 0)
        if found is None:
            return ()
        owner, rest = found
        return self._in_module(owner, rest, bound=False, depth=0) if rest else ()

    def _locate(self, dotted: str, importer: str | None, depth: int) -> tuple[str, str] | None:
        resolved = self.modules.resolve(dotted, importer)
        if resolved is None:
            return None
        record, rest = resolved
        return record.name, rest

    def _in_module(self, module: str, name: str, bound: bool, depth: int,
                   via: frozenset[tuple[str, str]] = frozenset()) -> tuple[Target, ...]:
        """`name` (`f`, `Class`, `Class.method`) looked up in `module`, through its imports
        (`via`: the lookups this one is part of; star imports that cycle end there)."""
        if (module, name) in via:
            return ()
        via = via | {(module, name)}
        summary = self.summaries.get(module)
        if summary is None or depth > MAX_DEPTH:
            if depth > MAX_DEPTH:
                self._gave_up_once(f"{module}.{name}: re-exports nested deeper than {MAX_DEPTH}")
            return ()
        head, _, tail = name.partition(".")
        if name in summary.functions:
            return (Target(module, name, bound),)
        if head in summary.classes:
            if not tail:
                return self._construction(module, head, depth)
            method = self._method(module, head, tail, depth)
            return (method._replace(bound=bound),) if method is not None else ()
        imported = summary.imports.get(head)
        if imported is not None:
            found = self._locate(imported, summary.path, depth + 1)
            if found is not None:
                owner, rest = found
                inner = ".".join(p for p in (rest, tail) if p)
                if (owner, inner) != (module, name) and inner:
                    return self._in_module(owner, inner, bound, depth + 1, via)
            return ()
        for star in summary.star_imports:
            found = self._locate(star, summary.path, depth + 1)
            if found is not None and not found[1] and found[0] != module:
                hit = self._in_module(found[0], name, bound, depth + 1, via)
                if hit:
                    return hit
        return ()

    def star_names(self, module: str) -> dict[str, dict[str, str]]:
        """For each first-party module `module` star-imports, the library names that import
        binds (its own library imports, and those of the modules it star-imports in turn)."""
        summary = self.summaries.get(module)
        out = {}
        for star in summary.star_imports if summary is not None else ():
            found = self._locate(star, summary.path, 0)  # type: ignore[union-attr]
            if found is not None and not found[1]:
                names = self._library_names(found[0], frozenset({module}), 0)
                if names:
                    out[star] = names
        return out

    def _library_names(self, module: str, via: frozenset[str], depth: int) -> dict[str, str]:
        summary = self.summaries.get(module)
        if summary is None or module in via or depth > MAX_DEPTH:
            return {}
        names: dict[str, str] = {}
        for star in summary.star_imports:  # bound first: the module's own imports come after
            found = self._locate(star, summary.path, depth + 1)
            if found is not None and not found[1]:
                names.update(self._library_names(found[0], via | {module}, depth + 1))
        names.update(summary.library_imports)
        return names

    def _construction(self, module: str, cls: str, depth: int) -> tuple[Target, ...]:
        out = []
        for name in CONSTRUCTION:
            method = self._method(module, cls, name, depth)
            if method is not None:
                out.append(method._replace(receiver=(module, cls)))
        return tuple(out)

    def call_targets(self, module: str, call: CallRecord, receiver: Receiver | None = None,
                     caller: FunctionSummary | None = None) -> tuple[Target, ...]:
        """The functions `call` (made in `module`, by `caller`) runs, binding as Python does:
        `self.m()`, `super().m()` and the fluent `self.a().m()` dispatch on the instance's
        class (`receiver`, the class of the instance `caller` runs on when a construction up
        the call chain decided it; else the caller's own class), and so does `Base.m(self)`;
        a method called through its class (`Base.m(obj)`) binds nothing, a classmethod binds
        its class, a staticmethod nothing."""
        if _on_self(call):
            return self._on_instance(module, call, receiver)
        targets, unbound = self._through_class(module, call.target)
        if receiver is None or not unbound or not _passes_self(call, caller):
            return targets
        return tuple(t._replace(receiver=receiver) if t.key in unbound else t for t in targets)

    def _through_class(self, module: str, target: str
                       ) -> tuple[tuple[Target, ...], frozenset[tuple[str, str]]]:
        key = (module, target)
        found = self._through.get(key)
        if found is None:
            found = self._through[key] = self._bind_through_class(module, target)
        return found

    def _bind_through_class(self, module: str, target: str
                            ) -> tuple[tuple[Target, ...], frozenset[tuple[str, str]]]:
        """A call's targets as named (not on the instance): a method called through its class
        binds only when it is a classmethod; also the plain methods among them (those that
        run on the instance passed first)."""
        out = []
        unbound = set()
        for found in self.targets(module, target):
            function = self.function(*found.key)
            if found.receiver is None and function is not None and _is_method(function):
                bound = "classmethod" in function.method
                if not bound and "staticmethod" not in function.method:
                    unbound.add(found.key)
                found = found._replace(bound=bound)
            out.append(found)
        return tuple(out), frozenset(unbound)

    def _receiver(self, function: FunctionSummary, module: str,
                  receiver: Receiver | None) -> Receiver | None:
        """The class of the instance a function runs on, as far as it changes what it runs:
        none for a function; for a method, `receiver` when that subclass overrides a method the
        method calls on its instance (directly or through such calls), else its own class
        (whose reach is then the same, and computed once)."""
        if not _is_method(function):
            return None
        assert function.class_name is not None
        static = (module, function.class_name)
        if receiver is None or receiver == static:
            return static
        key = (receiver, static)
        overridden = self._overrides.get(key)
        if overridden is None:
            classes = self._mro(receiver)
            keys = [(owner, klass.name) for owner, klass in classes]
            overridden = frozenset(name for _, klass in classes[:keys.index(static)]
                                   for name in klass.methods) if static in keys else frozenset()
            self._overrides[key] = overridden
        return receiver if overridden & self._self_names(module, function.qualname) else static

    def _self_names(self, module: str, qualname: str) -> frozenset[str]:
        """The methods a method calls on its own instance, directly or through the methods it
        so calls (and those it passes `self` to): what a subclass can change under it."""
        key = (module, qualname)
        found = self._names.get(key)
        if found is not None:
            return found
        names: set[str] = set()
        seen = {key}
        todo = [key]
        while todo and len(seen) <= MAX_REACH:
            owner, name = todo.pop()
            function = self.function(owner, name)
            if function is None or not _is_method(function):
                continue
            for call in function.calls:
                if _on_self(call):
                    names.add(call.target.rpartition(".")[2])
                    names.update(call.chain)
                    targets = self._on_instance(owner, call, None)
                elif _passes_self(call, function):
                    found, unbound = self._through_class(owner, call.target)
                    targets = tuple(t for t in found if t.key in unbound)
                else:
                    continue
                for target in targets:
                    if target.key not in seen:
                        seen.add(target.key)
                        todo.append(target.key)
        found = self._names[key] = frozenset(names)
        return found

    def _mro(self, receiver: Receiver) -> list[tuple[str, ClassSummary]]:
        found = self._mros.get(receiver)
        if found is None:
            found = self._mros[receiver] = self.mro(*receiver)
        return found

    def _on_instance(self, module: str, call: CallRecord,
                     receiver: Receiver | None) -> tuple[Target, ...]:
        """A method called on the caller's own instance (`@Class.method`, bound)."""
        key = (module, call.target, call.super_call, call.chain, receiver)
        found = self._instance.get(key)
        if found is None:
            found = self._instance[key] = self._dispatch(module, call, receiver)
        return found

    def _dispatch(self, module: str, call: CallRecord,
                  receiver: Receiver | None) -> tuple[Target, ...]:
        cls, _, name = call.target[1:].rpartition(".")
        static = (module, cls)
        classes = self._mro(receiver) if receiver is not None else []
        keys = [(owner, klass.name) for owner, klass in classes]
        if static not in keys:  # no receiver, or one that is no subclass: the caller's class
            receiver = None
            classes = self._mro(static)
            keys = [(owner, klass.name) for owner, klass in classes]
            if static not in keys:
                return ()
        if call.super_call:
            classes = classes[keys.index(static) + 1:]
        for link in call.chain:  # each must hand the instance back
            found = _find_method(classes, link)
            linked = self.function(*found) if found is not None else None
            if linked is None or "returns_self" not in linked.method:
                return ()
        found = _find_method(classes, name)
        function = self.function(*found) if found is not None else None
        if found is None or function is None:
            return ()
        bound = "staticmethod" not in function.method
        return (Target(found[0], found[1], bound, receiver if bound else None),)

    def _method(self, module: str, cls: str, name: str, depth: int) -> Target | None:
        """`cls.name` in `module`, or inherited from a first-party base class."""
        found = _find_method(self.mro(module, cls, depth), name)
        return Target(*found, True) if found is not None else None

    def class_summary(self, module: str, name: str, depth: int = 0) -> tuple[str, ClassSummary] | None:
        """A class by the name it has in `module` (defined there or imported)."""
        summary = self.summaries.get(module)
        if summary is None or depth > MAX_DEPTH:
            return None
        if name in summary.classes:
            return module, summary.classes[name]
        head, _, tail = name.partition(".")
        target = summary.imports.get(head)
        if target is None:
            return None
        found = self._locate(target, summary.path, depth + 1)
        if found is None:
            return None
        owner, rest = found
        inner = ".".join(p for p in (rest, tail) if p)
        if (owner, inner) == (module, name) or not inner:
            return None
        return self.class_summary(owner, inner, depth + 1)

    def resolve_class(self, module: str, target: str) -> tuple[str, ClassSummary] | None:
        """The class a dotted name (as written in `module`, or `@Local`) stands for."""
        if target.startswith("@"):
            return self.class_summary(module, target[1:])
        summary = self.summaries.get(module)
        found = self._locate(target, summary.path if summary else None, 0)
        if found is None or not found[1]:
            return None
        return self.class_summary(found[0], found[1])

    def mro(self, module: str, cls: str, depth: int = 0) -> list[tuple[str, ClassSummary]]:
        """The class and its first-party bases, depth first (cycles and depth bounded)."""
        out: list[tuple[str, ClassSummary]] = []
        seen: set[tuple[str, str]] = set()
        stack = [(module, cls, depth)]
        while stack:
            owner, name, level = stack.pop(0)
            if level > MAX_DEPTH or (owner, name) in seen:
                continue
            seen.add((owner, name))
            found = self.class_summary(owner, name)
            if found is None:
                continue
            where, klass = found
            out.append((where, klass))
            for base in klass.bases:
                resolved = self.resolve_class(where, base)
                if resolved is not None:
                    stack.append((resolved[0], resolved[1].name, level + 1))
        return out

    # -- BatchNorm reached through calls -----------------------------------------------------

    def reach(self, module: str, qualname: str,
              receiver: Receiver | None = None) -> tuple[Reach, ...]:
        """Every BN that calling `module.qualname` builds, its arguments in the function's
        terms; a method run on an instance of `receiver` (a subclass of its own class)
        dispatches its calls on `self` there. In a cycle, a function whose reach is being
        computed further up the stack contributes nothing there, and what was computed under
        that cut is not remembered (it is computed again, whole, when asked from outside the
        cycle)."""
        function = self.function(module, qualname)
        summary = self.summaries.get(module)
        if function is None or summary is None:
            return ()
        receiver = self._receiver(function, module, receiver)
        key = (module, qualname, receiver)
        if key in self._reach:
            return self._reach[key]
        if key in self._busy:
            self._cuts += 1
            return ()
        self._steps += 1
        if self._steps > MAX_STEPS:
            self._gave_up_once(f"{module}.{qualname}: more than {MAX_STEPS} reach steps "
                               "(call cycles)")
            return ()
        cuts = self._cuts
        self._busy.add(key)
        out: list[Reach] = []
        for build in function.bn:
            args = {name: value.at(summary.path) if value.kind not in ("p", "n") else value
                    for name, value in build.args.items()}
            out.append(Reach(build.api, build.qualname, summary.path, build.loc, args, (),
                             build.unpacked, opt_out=build.opt_out))
        for call in function.calls:
            for reached in self.reach_at(module, call, receiver, function):
                out.append(reached)
                if len(out) >= MAX_REACH:
                    break
            if len(out) >= MAX_REACH:
                self._gave_up_once(f"{module}.{qualname}: more than {MAX_REACH} BN reached")
                break
        self._busy.discard(key)
        result = tuple(out)
        if self._cuts == cuts or not self._busy:
            self._reach[key] = result
        return result

    def _gave_up_once(self, why: str) -> None:
        if why not in self.gave_up:
            self.gave_up.append(why)

    def reach_at(self, module: str, call: CallRecord, receiver: Receiver | None = None,
                 caller: FunctionSummary | None = None) -> list[Reach]:
        """The BN that one call (made in `module` by `caller`, run on an instance of
        `receiver`) reaches, in the caller's terms."""
        summary = self.summaries.get(module)
        if summary is None:
            return []
        out = []
        for target in self.call_targets(module, call, receiver, caller):
            callee = self.function(*target.key)
            callee_summary = self.summaries[target.module]
            if callee is None:
                continue
            for reached in self.reach(*target.key, target.receiver):
                args: dict[str, Ref] = {}
                settable: dict[str, str] = {}
                for name, value in reached.args.items():
                    if value.kind in ("p", "n"):
                        bound, passed = self.bind(callee, target.bound, call, value.value,
                                                  callee_summary.path, summary.path)
                        args[name] = bound.negated() if value.kind == "n" else bound
                        if not passed and callee.param(value.value) is not None:
                            settable[name] = value.value
                    else:
                        args[name] = value
                # the callee as written, or, on the instance, the method it runs
                hop = (summary.path, call.loc,
                       target.qualname if _on_self(call) else call.target.lstrip("@"))
                out.append(Reach(reached.api, reached.qualname, reached.path, reached.loc, args,
                                 (hop, *reached.via), reached.unpacked or call.star, settable,
                                 reached.opt_out))
        return out

    @staticmethod
    def bind(callee: FunctionSummary, bound: bool, call: CallRecord, param: str, callee_path: str,
             caller_path: str) -> tuple[Ref, bool]:
        """What `call` binds to `param` of `callee` (in the caller's terms), and whether the
        call passes it (else the default, written in the callee's file)."""
        spec = callee.param(param)
        if spec is None:
            return UNKNOWN, False
        if param in call.args:
            return _mark(call.args[param], caller_path), True
        if spec.index >= 0:
            index = spec.index - (1 if bound else 0)
            positional = call.args.get(f"#{index}")
            if positional is not None:
                return _mark(positional, caller_path), True
        if call.star:
            return Ref("u", "*args/**kwargs"), True
        if spec.default is not None:
            return spec.default.at(callee_path), False
        return UNKNOWN, False

    def facts_reached(self, module: str, qualname: str, receiver: Receiver | None = None
                      ) -> dict[str, list[tuple[str, Loc]]]:
        """The facts of every function that calling `module.qualname` (on an instance of
        `receiver`, see `reach`) runs, itself included, each with where that function is."""
        function = self.function(module, qualname)
        receiver = self._receiver(function, module, receiver) if function is not None else None
        key = (module, qualname, receiver)
        if key in self._facts:
            return self._facts[key]
        if key in self._facts_busy:
            self._cuts += 1
            return {}
        self._steps += 1
        if self._steps > MAX_STEPS:
            return {}
        cuts = self._cuts
        self._facts_busy.add(key)
        summary = self.summaries.get(module)
        out: dict[str, list[tuple[str, Loc]]] = {}
        if function is not None and summary is not None:
            for fact in function.facts:
                out.setdefault(fact, []).append((summary.path, function.loc))
            for call in function.calls:
                for fact, places in self.facts_at(module, call, receiver, function).items():
                    mine = out.setdefault(fact, [])
                    mine.extend(p for p in places if p not in mine)
        self._facts_busy.discard(key)
        if self._cuts == cuts or not self._facts_busy:
            self._facts[key] = out
        return out

    def facts_at(self, module: str, call: CallRecord, receiver: Receiver | None = None,
                 caller: FunctionSummary | None = None) -> dict[str, list[tuple[str, Loc]]]:
        out: dict[str, list[tuple[str, Loc]]] = {}
        for target in self.call_targets(module, call, receiver, caller):
            for fact, places in self.facts_reached(*target.key, target.receiver).items():
                out.setdefault(fact, []).extend(places)
        return out

    def project_marks(self) -> dict[str, list[tuple[str, Loc, str | None]]]:
        """Every module's marks by kind: (file, location, function)."""
        if self._marks is None:
            self._marks = {}
            self._apis = set()
            for name in list(self.summaries):
                found = self.summaries.outline(name) if isinstance(self.summaries, SummaryStore) \
                    else outline(self.summaries.get(name))
                if found is None:
                    continue
                path, marks, apis = found
                for kind, lc, function in marks:
                    self._marks.setdefault(kind, []).append((path, lc, function))
                    self._marked.add(path)
                self._apis.update(apis)
            for path, lc in self.documented:
                self._marks.setdefault("loads_weights", []).append((path, lc, None))
                self._marked.add(path)
            for places in self._marks.values():  # in file order, whatever order the
                places.sort(key=lambda place: (place[0], place[1]))  # summaries came in
            self._marks = dict(sorted(self._marks.items()))
        return self._marks

    def marked_files(self) -> set[str]:
        """The files that have marks."""
        self.project_marks()
        return self._marked

    def project_apis(self) -> frozenset[str]:
        """The BN API ids the project builds anywhere."""
        self.project_marks()
        return frozenset(self._apis or ())

    # -- who calls whom ----------------------------------------------------------------------

    def callers(self, module: str, qualname: str) -> list[Caller]:
        """The calls of `module.qualname` anywhere in the project, in the project's module
        order. With `dependents` known, only the modules among `module` and those that depend
        on it directly whose calls resolve to the function are read: a module's dependencies
        include the module of every function its calls resolve to (the project pass computes
        both again for every module whose calls may resolve elsewhere since the cache's)."""
        key = (module, qualname)
        if key not in self._callers_ready:
            if self.dependents is None:
                readers = list(self.summaries)
            else:
                readers = [name for name in (module, *self.dependents.get(module, ()))
                           if self.callees is None or key in self.callees.get(name, (key,))]
            for reader in readers:
                if reader not in self._callers_read:
                    self._callers_read.add(reader)
                    self._read_calls(reader)
            self._callers_ready.add(key)
        found = self._callers.get(key, [])
        if len(found) > 1:
            if self._rank is None:
                self._rank = {name: i for i, name in enumerate(self.summaries)}
            found.sort(key=lambda caller: self._rank.get(caller.module, -1))  # stable
        return list(found)

    def _read_calls(self, reader: str) -> None:
        summary = self.summaries.get(reader)
        if summary is None:
            return
        for function in summary.functions.values():
            for call in function.calls:
                for target in self.call_targets(reader, call, caller=function):
                    self._callers.setdefault(target.key, []).append(
                        Caller(reader, function.qualname, call))

    def module_of_path(self, path: str) -> str | None:
        record = self.modules.of(path)
        return record.name if record is not None else None


def _on_self(call: CallRecord) -> bool:
    """`self.m()`, `super().m()`, `self.a().m()`: a call of a method on the caller's own
    instance (recorded as `@Class.method`, bound)."""
    return call.bound and call.target.startswith("@")


def _is_method(function: FunctionSummary) -> bool:
    return function.class_name is not None and "<locals>" not in function.qualname


def _passes_self(call: CallRecord, caller: FunctionSummary | None) -> bool:
    """`Base.m(self, ...)` in a method: its first argument is the caller's instance."""
    first = call.args.get("#0")
    return caller is not None and first is not None and first.kind == "p" and \
        _is_method(caller) and bool(caller.params) and \
        first.value == caller.params[0].name and "staticmethod" not in caller.method


def _find_method(classes: list[tuple[str, ClassSummary]], name: str) -> tuple[str, str] | None:
    """The first class of an MRO that defines `name`: (its module, `Class.name`)."""
    for owner, klass in classes:
        if name in klass.methods:
            return owner, f"{klass.name}.{name}"
    return None


def _mark(value: Ref, path: str) -> Ref:
    return value if value.kind in ("p", "n") else value.at(path)


__all__ = ["MODULE_SCOPE", "Caller", "ProjectIndex", "Reach", "Target"]
