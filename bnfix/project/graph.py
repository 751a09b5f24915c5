"""The project's module graph, as the cache keeps it: which modules a module depends on,
which reach it, and the digest of a set of summaries (what a file's findings were checked
against). Plain data over module names: a warm run uses these without importing the analysis."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bnfix.project.index import ProjectIndex

CALLER_LEVELS = 4  # the view attaches callers and their callers (view.CALLER_DEPTH + 1)


def module_edges(index: ProjectIndex, module: str) -> list[str]:
    """The modules `module` depends on directly: those its imports, calls and bases name."""
    return module_links(index, module)[0]


def module_links(index: ProjectIndex, module: str) -> tuple[list[str], list[list[str]]]:
    """`module_edges`, and the functions (module, qualname) the module's calls resolve to."""
    summary = index.summaries.get(module)
    if summary is None:
        return [], []
    targets: set[str] = set()
    for dotted in [*summary.imports.values(), *summary.star_imports]:
        found = index.modules.resolve(dotted, summary.path)
        if found is not None:
            targets.add(found[0].name)
    callees: set[tuple[str, str]] = set()
    for function in summary.functions.values():
        for call in function.calls:
            callees.update(t.key for t in index.targets(module, call.target))
    targets.update(m for m, _ in callees)
    targets.discard(module)
    return sorted(targets), [list(key) for key in sorted(callees)]


def dependency_cone(forward: dict[str, list[str]], importers: dict[str, set[str]],
                    callers: dict[str, set[str]], module: str) -> set[str]:
    """The modules whose summaries can change what this module's check finds: those it
    reaches (imports and calls, transitively), those that import it (whether anything does),
    and those whose calls resolve into it (callers of callers, CALLER_LEVELS deep: what the
    view attaches). A module that only imports one that imports this one is not in it."""
    cone = {module}
    for graph, depth in ((forward, None), (callers, CALLER_LEVELS)):
        frontier = {module}
        level = 0
        while frontier and (depth is None or level < depth):
            frontier = {n for m in frontier for n in graph.get(m, ())} - cone
            cone |= frontier
            level += 1
    return cone | importers.get(module, set())


def reaching(modules: set[str], forward: Mapping[str, Iterable[str]]) -> set[str]:
    """`modules` and every module that reaches one of them over `forward`."""
    backward = reverse(forward)
    out, frontier = set(modules), list(modules)
    while frontier:
        for user in backward.get(frontier.pop(), ()):
            if user not in out:
                out.add(user)
                frontier.append(user)
    return out


def reverse(forward: Mapping[str, Iterable[str]]) -> dict[str, set[str]]:
    """Each module's predecessors over `forward`."""
    backward: dict[str, set[str]] = {}
    for name, targets in forward.items():
        for target in targets:
            backward.setdefault(target, set()).add(name)
    return backward


def digest_of(digests: dict[str, str], modules: set[str], extra: str = "") -> str:
    """One digest of the summaries of `modules` (what a file's findings were checked against),
    and of `extra` (what it read of every module)."""
    h = hashlib.sha256(extra.encode())
    for name in sorted(modules):
        h.update(f"{name}={digests.get(name, '-')};".encode())
    return h.hexdigest()[:24]
