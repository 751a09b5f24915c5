"""Per-file summaries: what other files need to know about a module, as plain records keyed by
qualified names (never object identity), so they can be cached as JSON and shared between
processes.

A summary says, for each function and method: its parameters and defaults, the BatchNorm it
builds directly (with each BN argument as a literal, one of its parameters, or unknown), the
first-party calls it makes (with what it passes), and facts about it (it collects UPDATE_OPS
without a scope, it is an evaluation helper ...); for each class: its bases and facts (a BN
freeze method, a freeze at construction, a `train()` that re-freezes); for the module: its
import bindings and facts. The project index (`bnfix.project.index`) joins them."""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, NamedTuple

FORMAT = 4
Loc = tuple[int, int, int, int]  # start row, start column, end row, end column (0-based cols)
MODULE_SCOPE = "<module>"  # the pseudo-function holding a module's top-level code
# a class fact that states its Keras `call` signature (BN012), not anything about BN: it does
# not make the class worth following from other files
SIGNATURE = "call_params:"


class Ref(NamedTuple):
    """What is statically known of a value: a literal (`c`), a parameter of the function the
    record belongs to (`p`, by name), or something unknown (`u`, its source text). `loc` is
    where it is written; `path` is set once the value has been carried into another module's
    context (the file `loc` is in)."""

    kind: str  # c | p | u, and `nc` / `n`: a literal / parameter reached through `not`
    value: Any = None
    loc: Loc | None = None
    path: str | None = None

    def negated(self) -> Ref:
        """`not` of this value: a literal flipped (its written text is then the negation:
        kind `nc`), a parameter marked `n`, anything else unknown."""
        flip = {"c": "nc", "nc": "c", "p": "n", "n": "p"}
        if self.kind in ("c", "nc"):
            return Ref(flip[self.kind], not self.value, self.loc, self.path)
        if self.kind in ("p", "n"):
            return Ref(flip[self.kind], self.value, self.loc, self.path)
        return Ref("u", f"not ({self.value})", self.loc, self.path)

    def at(self, path: str) -> Ref:
        """The same value, marked as written in `path` (when it is not marked yet)."""
        return self if self.path is not None or self.kind in ("p", "n") else Ref(self.kind, self.value,
                                                                          self.loc, path)

    def to_data(self) -> list[Any]:
        return [self.kind, self.value, list(self.loc) if self.loc else None, self.path]

    @staticmethod
    def from_data(data: list[Any]) -> Ref:
        kind, value, loc, path = data
        return Ref(kind, value, tuple(loc) if loc else None, path)  # type: ignore[arg-type]


UNKNOWN = Ref("u", "?")


class ParamSpec(NamedTuple):
    name: str
    index: int  # position (-1 for keyword-only)
    default: Ref | None


class BNBuild(NamedTuple):
    """A BN construction or call in the function, resolved against the catalogue."""

    api: str  # catalogue API id
    qualname: str  # the normalized qualified name called
    loc: Loc
    args: dict[str, Ref]  # by canonical BN parameter name
    unpacked: bool = False  # *args / **kwargs at the call
    opt_out: bool = False  # the other branch of its `if` builds a synchronized BN


class CallRecord(NamedTuple):
    """A call of first-party code (a function or class of the project, or a method of the
    enclosing class)."""

    target: str  # absolute dotted name as imported (`models.net.Net`, `pkg.mod.Class.method`)
    loc: Loc
    args: dict[str, Ref]  # keyword name, or `#i` for the i-th positional argument
    star: bool = False  # *args / **kwargs passed: more is passed than is known
    bound: bool = False  # called on an instance or `self`: the first parameter is implicit
    tags: tuple[str, ...] = ()  # lexical context: `tower`, `strategy`, `no_grad`, `prepared:<arg>`
    texts: tuple[tuple[str, str], ...] = ()  # (arg key as in `args`, its source text)
    assigned: str | None = None  # the name the result is assigned to (`model = build()`)
    # the instance's own methods reached through a call: `super().m()` (`super_call`: the
    # next class in the instance's MRO after the caller's) and `self.a(x).m()` (`chain`: the
    # methods called on the way, each of which must return `self`)
    super_call: bool = False
    chain: tuple[str, ...] = ()


class FunctionSummary(NamedTuple):
    qualname: str  # within the module: `conv_bn`, `Net.__init__`, `f.<locals>.g`
    name: str
    class_name: str | None
    loc: Loc
    params: tuple[ParamSpec, ...]
    bn: tuple[BNBuild, ...] = ()
    calls: tuple[CallRecord, ...] = ()
    facts: tuple[str, ...] = ()
    returns: tuple[str, ...] = ()  # absolute names of what its return values are built by
    # a method's binding and return, for dispatch on the instance (not facts: nothing about
    # BN): `staticmethod`, `classmethod`, `returns_self`
    method: tuple[str, ...] = ()

    def param(self, name: str) -> ParamSpec | None:
        return next((p for p in self.params if p.name == name), None)

    def passed(self, call: CallRecord, name: str, bound: bool) -> str | None:
        """The source text `call` passes for parameter `name` of this function."""
        texts = dict(call.texts)
        if name in texts:
            return texts[name]
        spec = self.param(name)
        if spec is None or spec.index < 0:
            return None
        return texts.get(f"#{spec.index - (1 if bound else 0)}")


class ClassSummary(NamedTuple):
    name: str
    loc: Loc
    bases: tuple[str, ...]  # absolute dotted names as imported
    methods: tuple[str, ...]
    facts: tuple[str, ...] = ()


@dataclass(frozen=True)
class ModuleSummary:
    module: str  # module id (dotted path from the project root)
    import_name: str  # its name from its package root
    path: str
    imports: dict[str, str] = field(default_factory=dict)  # local name -> absolute dotted target
    star_imports: tuple[str, ...] = ()
    # library names it binds (`nn` -> `torch.nn`): what `from this import *` binds elsewhere
    library_imports: dict[str, str] = field(default_factory=dict)
    functions: dict[str, FunctionSummary] = field(default_factory=dict)
    classes: dict[str, ClassSummary] = field(default_factory=dict)
    constants: dict[str, Ref] = field(default_factory=dict)
    facts: tuple[str, ...] = ()
    marks: tuple[tuple[str, Loc, str | None], ...] = ()  # (kind, where, function qualname)

    # -- serialisation -------------------------------------------------------------------------

    def to_data(self) -> dict[str, Any]:
        return {"format": FORMAT, "digest": self.digest, **self._content()}

    def _content(self) -> dict[str, Any]:
        return {
            "module": self.module, "import_name": self.import_name,
            "path": self.path, "imports": dict(sorted(self.imports.items())),
            "star": list(self.star_imports), "facts": list(self.facts),
            "library": dict(sorted(self.library_imports.items())),
            "marks": [[k, list(lc), f] for k, lc, f in self.marks],
            "constants": {k: v.to_data() for k, v in sorted(self.constants.items())},
            "functions": [_function_data(f) for f in self.functions.values()],
            "classes": [[c.name, list(c.loc), list(c.bases), list(c.methods), list(c.facts)]
                        for c in self.classes.values()],
        }

    @staticmethod
    def from_data(data: dict[str, Any]) -> ModuleSummary:
        if data.get("format") != FORMAT:
            raise ValueError("summary format")
        functions = {}
        for item in data["functions"]:
            function = _function_from(item)
            functions[function.qualname] = function
        classes = {c[0]: ClassSummary(c[0], tuple(c[1]), tuple(c[2]), tuple(c[3]), tuple(c[4]))
                   for c in data["classes"]}
        summary = ModuleSummary(
            module=data["module"], import_name=data["import_name"], path=data["path"],
            imports=dict(data["imports"]), star_imports=tuple(data["star"]),
            library_imports=dict(data["library"]), functions=functions, classes=classes,
            constants={k: Ref.from_data(v) for k, v in data["constants"].items()},
            facts=tuple(data["facts"]),
            marks=tuple((k, tuple(lc), f) for k, lc, f in data["marks"]),  # type: ignore[misc]
        )
        if not isinstance(data["digest"], str):
            raise TypeError("summary digest")
        summary.__dict__["digest"] = data["digest"]  # as made: a reload must not change it
        return summary

    @functools.cached_property
    def digest(self) -> str:
        """What dependents' cached findings are keyed by: a change that leaves the summary the
        same (a comment, a line that says nothing about BN) does not re-check them, and nor
        does a silent function (see `silent_functions`) added or removed. Taken once, when the
        summary is made (the cache stores it with the summary)."""
        content = self._content()
        silent = self.silent_functions()
        if silent:
            content["functions"] = [_function_data(f) for f in self.functions.values()
                                    if f.qualname not in silent]
        text = json.dumps(content, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:20]

    def silent_functions(self) -> frozenset[str]:
        """Top-level functions that tell another module's check nothing: no BN built, no
        first-party call, no fact, no known return value, no mark, and a name nothing else in
        the module binds (so it shadows no import). Another file can only see one by calling
        it, and a call that resolves differently is in the calling file's own key (its
        resolved callees), so adding a helper to a shared module re-checks that module alone."""
        bound = {*self.imports, *self.classes, *self.constants}
        marked = {function for _, _, function in self.marks}
        return frozenset(
            f.qualname for f in self.functions.values()
            if f.class_name is None and f.qualname == f.name != MODULE_SCOPE
            and f.name not in bound and f.qualname not in marked
            and not (f.bn or f.calls or f.facts or f.returns))


def _refs(args: dict[str, Ref]) -> dict[str, Any]:
    return {k: v.to_data() for k, v in args.items()}


def _unrefs(data: dict[str, Any]) -> dict[str, Ref]:
    return {k: Ref.from_data(v) for k, v in data.items()}


def _function_data(f: FunctionSummary) -> list[Any]:
    return [
        f.qualname, f.name, f.class_name, list(f.loc),
        [[p.name, p.index, p.default.to_data() if p.default else None] for p in f.params],
        [[b.api, b.qualname, list(b.loc), _refs(b.args), b.unpacked, b.opt_out] for b in f.bn],
        [[c.target, list(c.loc), _refs(c.args), c.star, c.bound, list(c.tags), list(c.texts),
          c.assigned, c.super_call, list(c.chain)] for c in f.calls],
        list(f.facts), list(f.returns), list(f.method),
    ]


def _function_from(item: list[Any]) -> FunctionSummary:
    qualname, name, class_name, loc, params, bn, calls, facts, returns, method = item
    return FunctionSummary(
        qualname=qualname, name=name, class_name=class_name, loc=tuple(loc),  # type: ignore[arg-type]
        params=tuple(ParamSpec(n, i, Ref.from_data(d) if d else None) for n, i, d in params),
        bn=tuple(BNBuild(a, q, tuple(lc), _unrefs(args), u, o)  # type: ignore[arg-type]
                 for a, q, lc, args, u, o in bn),
        calls=tuple(CallRecord(t, tuple(lc), _unrefs(args), s, b, tuple(tags),  # type: ignore[arg-type]
                               tuple(tuple(x) for x in texts), asg, sup, tuple(chain))
                    for t, lc, args, s, b, tags, texts, asg, sup, chain in calls),
        facts=tuple(facts), returns=tuple(returns), method=tuple(method),
    )
