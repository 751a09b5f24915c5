"""The names that make a file worth summarising: those through which it can reach the
project's BN code (module-level functions and classes whose call builds BN or that carry
facts, and the other names modules give them), each with the last part of its module's name.

Each module contributes its part, which depends only on the summaries of the modules it
reaches (its imports, calls and bases, transitively). A warm run keeps the parts of the
modules that reach no changed summary and computes the others: after an edit of one model
file, the modules that import it, not the whole project."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import NamedTuple

from bnfix.project.graph import reaching
from bnfix.project.index import ProjectIndex
from bnfix.project.summary import MODULE_SCOPE, SIGNATURE


class Contribution(NamedTuple):
    """One module's part of the search: the summary digest it was computed from, and the
    (module tail, name) pairs a user file mentions: the module's functions and classes that
    build BN or carry facts, and those of other modules it gives on (imports, star imports)."""

    digest: str
    pairs: frozenset[tuple[str, str]]


def contributions(index: ProjectIndex, modules: Iterable[str], digests: Mapping[str, str],
                  known: Mapping[str, Contribution]) -> dict[str, Contribution]:
    """The contributions of `modules`, computed from the index; `known` holds those of the
    other modules (whose names `modules` may give on)."""
    pairs: dict[str, set[tuple[str, str]]] = {}
    todo = [m for m in modules if index.summaries.get(m) is not None]
    for module in todo:
        summary = index.summaries[module]
        tail = module.rsplit(".", 1)[-1]
        found = pairs[module] = set()
        defined = set()
        for function in summary.functions.values():
            if function.qualname == MODULE_SCOPE or "<locals>" in function.qualname:
                continue
            if function.facts or index.reach(module, function.qualname):
                found.add((tail, function.class_name or function.name))
                defined.add(function.class_name or function.qualname)
        for klass in summary.classes.values():
            if any(not f.startswith(SIGNATURE) for f in klass.facts) or \
                    klass.name not in defined and any(
                    index.reach(t.module, t.qualname, t.receiver)
                    for t in index.targets(module, "@" + klass.name)):
                # its construction builds BN, also through an inherited `__init__`
                found.add((tail, klass.name))
                defined.add(klass.name)
    _given_on(index, todo, pairs, known)
    return {m: Contribution(digests.get(m, ""),
                            frozenset((t, n) for t, n in pairs[m] if n.isidentifier()))
            for m in todo}


def _given_on(index: ProjectIndex, todo: list[str], pairs: dict[str, set[tuple[str, str]]],
              known: Mapping[str, Contribution]) -> None:
    """The modules that give the names on, and under which name: an import (`from .blocks
    import conv_bn`, or `... as cb`, in a package's `__init__`: `from models import cb` names
    neither `blocks` nor `conv_bn`) or a star import (`from .resnet import *`: `from models
    import ResNet` never names `resnet`), through chains of them: one hop at a time, to a
    fixed point (each round adds pairs, and there are finitely many)."""
    hops: dict[str, list[tuple[str, str, str]]] = {}  # module: (local name, source, its name)
    for module in todo:
        summary = index.summaries[module]
        found = hops[module] = []
        for local, dotted in summary.imports.items():
            target = index.modules.resolve(dotted, summary.path)
            if target is not None and target[1]:
                found.append((local, target[0].name, target[1].split(".", 1)[0]))
        for star in summary.star_imports:
            target = index.modules.resolve(star, summary.path)
            if target is not None and not target[1] and target[0].name != module:
                found.append(("*", target[0].name, "*"))

    def given(source: str) -> set[str]:
        """The names `source` gives (defines or gives on), by its own module name."""
        own = source.rsplit(".", 1)[-1]
        found = pairs.get(source)
        if found is None:
            found = set(known[source].pairs) if source in known else set()
        return {n for t, n in found if t == own}

    changed = True
    while changed:
        changed = False
        for module, found in hops.items():
            tail = module.rsplit(".", 1)[-1]
            for local, source, name in found:
                names = given(source)
                new = {(tail, n) for n in names} if name == "*" else \
                    {(tail, local)} if name in names else set()
                if not new <= pairs[module]:
                    pairs[module] |= new
                    changed = True


def interesting_pairs(index: ProjectIndex) -> set[tuple[str, str]]:
    """Every module's pairs, computed whole."""
    found = contributions(index, list(index.summaries), {}, {})
    return {pair for part in found.values() for pair in part.pairs}


def stale(digests: Mapping[str, str], known: Mapping[str, Contribution],
          forward: Mapping[str, Iterable[str]], kept: Iterable[str] = ()) -> set[str]:
    """The modules whose known contribution may be out of date: those whose summary is new,
    changed or gone, and every module that reaches one of them (over `forward`, each
    module's direct dependencies) but for `kept`: changed modules whose change no other
    module's contribution can see (functions added that nothing names)."""
    changed = {m for m, d in digests.items() if m not in known or known[m].digest != d}
    changed |= {m for m in known if m not in digests}
    return reaching(changed - set(kept), forward) | changed


def to_text(parts: Mapping[str, Contribution]) -> str:
    return json.dumps({m: [c.digest, sorted(c.pairs)]
                       for m, c in sorted(parts.items())}, separators=(",", ":"))


def from_text(text: str) -> dict[str, Contribution]:
    """Contributions stored by `to_text`; a malformed text (a hostile or corrupt cache) is
    none at all."""
    try:
        data = json.loads(text)
        out = {}
        for module, (digest, pairs) in data.items():
            if not (isinstance(module, str) and isinstance(digest, str)
                    and isinstance(pairs, list)
                    and all(isinstance(t, str) and isinstance(n, str) for t, n in pairs)):
                return {}
            out[module] = Contribution(digest, frozenset((t, n) for t, n in pairs))
        return out
    except (ValueError, TypeError, AttributeError):
        return {}


__all__ = ["Contribution", "contributions", "from_text", "interesting_pairs", "stale",
           "to_text"]
