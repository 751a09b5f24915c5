"""The project's module graph, as the cache keeps it: which modules a module depends on,
which reach it, and the digest of a set of summaries (what a file's findings were checked
against). Plain data over module names: a warm run uses these without importing the analysis."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
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
            callees.update(t.key for t in index.call_targets(module, call, caller=function))
    targets.update(m for m, _ in callees)
    targets.discard(module)
    return sorted(targets), [list(key) for key in sorted(callees)]


def cone_keys(forward: Mapping[str, Sequence[str]], callers: Mapping[str, Iterable[str]],
              digests: Mapping[str, str], extras: Mapping[str, str]) -> dict[str, str]:
    """For each module `m` of `extras`, the digest (`digest_of`, with `extras[m]`) of its
    dependency cone: the modules whose summaries can change what its check finds. Those are
    the modules it reaches (imports and calls, transitively), those that depend on it directly
    (whether anything imports it), and those whose calls resolve into it (callers of callers,
    CALLER_LEVELS deep, not through a module it reaches: what the view attaches); a module
    that only imports one that imports `m` is not in it.

    The work is shared: the forward closure is computed once per strongly connected component
    (the union of its successors' closures) instead of one search per module, and kept only
    until the last component that needs it has its own. Modules are numbered in name order,
    so a cone is sorted as integers and digested from tokens made once."""
    names = sorted({*forward, *extras, *(t for ts in forward.values() for t in ts)})
    rank = {name: i for i, name in enumerate(names)}
    tokens = [f"{name}={digests.get(name, '-')};".encode() for name in names]
    succ = [[rank[t] for t in forward.get(name, ())] for name in names]
    up = [set() for _ in names]  # direct importers (reverse of forward)
    for i, targets in enumerate(succ):
        for t in targets:
            up[t].add(i)
    calls: dict[int, set[int]] = {rank[m]: {rank[c] for c in cs if c in rank}
                                  for m, cs in callers.items() if m in rank}
    keys: dict[str, str] = {}
    components, component_of = _components(succ)
    needed = [0] * len(components)  # how many other components still need one's closure
    outgoing = [{component_of[t] for i in members for t in succ[i]} - {c}
                for c, members in enumerate(components)]
    for targets in outgoing:
        for t in targets:
            needed[t] += 1
    closures: dict[int, frozenset[int]] = {}
    for c, members in enumerate(components):  # successors come first (Tarjan's order)
        closure = set(members)
        for t in outgoing[c]:
            closure |= closures[t]
            needed[t] -= 1
            if not needed[t]:
                del closures[t]
        for i in members:
            extra = extras.get(names[i])
            if extra is None:
                continue
            cone = set(closure)
            frontier = {i}
            for _ in range(CALLER_LEVELS):
                frontier = {n for m in frontier for n in calls.get(m, ())} - cone
                if not frontier:
                    break
                cone |= frontier
            cone |= up[i]
            h = hashlib.sha256(extra.encode())
            h.update(b"".join([tokens[n] for n in sorted(cone)]))
            keys[names[i]] = h.hexdigest()[:24]
        if needed[c]:
            closures[c] = frozenset(closure)
    return keys


def _components(succ: list[list[int]]) -> tuple[list[list[int]], list[int]]:
    """The strongly connected components of a graph over 0..n-1 (Tarjan's algorithm, without
    recursion: a 5,000-module import chain must not overflow the stack), each listed after
    every component it reaches; and each node's component."""
    n = len(succ)
    index, low, component_of = [-1] * n, [0] * n, [-1] * n
    stack: list[int] = []
    components: list[list[int]] = []
    counter = 0
    for root in range(n):
        if index[root] != -1:
            continue
        work = [(root, 0)]
        while work:
            node, edge = work.pop()
            if edge == 0:
                index[node] = low[node] = counter
                counter += 1
                stack.append(node)
            targets = succ[node]
            while edge < len(targets):
                target = targets[edge]
                edge += 1
                if index[target] == -1:
                    work.append((node, edge))
                    work.append((target, 0))
                    break
                if component_of[target] == -1:  # on the stack
                    low[node] = min(low[node], index[target])
            else:
                if low[node] == index[node]:
                    members = []
                    while True:
                        member = stack.pop()
                        component_of[member] = len(components)
                        members.append(member)
                        if member == node:
                            break
                    components.append(members)
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
    return components, component_of


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
