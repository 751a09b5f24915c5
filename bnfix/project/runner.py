"""Running the project pass over files: the cache, the two steps, the workers (see session.py
for what the steps are).

A warm run reads only the cache file: entries whose size and mtime match keep their summary
(as JSON text, not parsed), the list of modules it depends on (valid while the project's set
of files is the same) and their findings, which stand while the digest of their dependency
cone is the same. Summaries are parsed, and the index built, only for what must be checked
again."""

from __future__ import annotations

import functools
import gc
import hashlib
import heapq
import io
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import TYPE_CHECKING

from bnfix.cache import Cache, Entry
from bnfix.engine import Engine
from bnfix.findings import Applicability, Diagnostic, FileResult
from bnfix.project.graph import (
    CALLER_LEVELS,
    cone_keys,
    digest_of,
    module_edges,
    module_links,
    reaching,
    reverse,
)
from bnfix.project.modules import ModuleMap, ModuleRef
from bnfix.project.readme import documented_loads
from bnfix.project.store import (
    SummaryStore,
    added_functions,
    called_by,
    outline,
    outline_digest,
    resolution_face,
    summary_text,
)
from bnfix.project.workers import InProcess, Processes
from bnfix.rulebook import load_rulebook
from bnfix.source.reader import Skipped, SourceError, decode, read_source

if TYPE_CHECKING:  # the analysis (the index, lifting, the view) is imported only when needed
    from bnfix.project import names as name_search
    from bnfix.project.index import ProjectIndex
    from bnfix.project.session import Summarised, Worker
    from bnfix.project.view import FileContext

EXPANSION_ROUNDS = 8  # rounds of summarising files that name first-party BN builders
CONFLICTS_SHOWN = 3  # module names claimed by several files (and their files) named in notes
PARALLEL_THRESHOLD = 32  # files to lift below which one process is faster than starting workers


def make_worker(enabled: frozenset[str], targets: dict[str, tuple[int, ...]], all_syntax: bool,
                explicit: bool, max_bytes: int, pin_root: str | None = None,
                overlay: dict[str, str] | None = None) -> Worker:
    from bnfix.project.session import Worker

    engine = Engine(load_rulebook(), enabled, targets, all_syntax)
    engine.target_explicit = explicit
    engine.pin_root = pin_root
    return Worker(engine, max_bytes, overlay=dict(overlay or {}))


class Plan:
    """One file of the project scope (what the run learns of it is filled in as it goes)."""

    __slots__ = (
        "absolute",
        "context",
        "done",
        "entry",
        "ignored",
        "previous",
        "ref",
        "reported",
        "shown",
        "summarised",
        "worker",
    )

    def __init__(self, shown: str, absolute: str, ref: ModuleRef, reported: bool,
                 ignored: frozenset[str], context: str, worker: int,
                 entry: Entry | None = None) -> None:
        self.shown = shown  # the path as reported (the user's spelling for files asked about)
        self.absolute = absolute
        self.ref = ref
        self.reported = reported
        self.ignored = ignored
        # digest of the file's place in the project (its summary depends on it)
        self.context = context
        self.worker = worker
        self.entry = entry  # the cache's entry, when still fresh
        self.done: Summarised | None = None
        self.summarised = False  # it has a summary (in the store)
        self.previous: Entry | None = None  # the cache's entry this run's summary replaced


class ProjectRunner:
    def __init__(self, engine: Engine, *, cache: Cache | None, fix: bool, unsafe: bool,
                 jobs: int, max_bytes: int, overlay: dict[str, str] | None = None) -> None:
        """`overlay`: texts that stand in for files, by absolute path (an editor's unsaved
        buffers); the cache is neither read nor written for them."""
        self.engine = engine
        self.overlay = dict(overlay or {})
        self.cache = cache
        self.fix = fix
        self.unsafe = unsafe
        self.jobs = jobs
        self.max_bytes = max_bytes
        self.notes: list[str] = []
        self.internal: list[tuple[str, str]] = []  # files not asked about that crashed: traceback
        self.store = SummaryStore()
        self._mentioned: set[str] = set()  # unparsable files that use first-party BN code
        self._bn_names: Names | None = None  # the name search's names, grouped
        # each module's part of the name search, for the summaries in the store (see names.py)
        self._parts: dict[str, name_search.Contribution] | None = None
        self._scope = ""  # digest of the project's files and their module names
        self._registers = {spec.id: spec.registers for spec in engine.catalogue_ids.values()
                           if spec.registers}
        self._pool: InProcess | Processes | None = None
        self._modules: ModuleMap | None = None
        # each summarised module's outline digest (marks and BN APIs, see outline_digest)
        self._outlines: dict[str, str] = {}
        # the index of the store as it is (built on first need, dropped when summaries are
        # added: the name search's and the checking step's are one when none came between)
        self._index: ProjectIndex | None = None
        # the README's weight loads (readme.py) and a digest of the README files read
        self._readme = ""
        self._documented: tuple[tuple[str, tuple[int, int, int, int]], ...] = ()
        # `added_functions` of a module's cached and new summary texts (the name search and
        # the checking step both ask; each parses the two texts)
        self._added: dict[str, tuple[str, str, list[str] | None]] = {}

    # -- planning ----------------------------------------------------------------------------

    def _plans(self, reported: list[tuple[str, frozenset[str]]], scope: list[str],
               modules: ModuleMap) -> list[Plan]:
        # every file's context digest covers the first-party names; hashed once (the torch
        # tree has 1,746 of them, 24 kB: hashing them per file took 45 ms of a 0.6 s warm run)
        tops = hashlib.sha256(",".join(sorted(modules.first_party_tops())).encode()).hexdigest()
        shown = {os.path.abspath(p): (p, ignored) for p, ignored in reported}
        plans = []
        for absolute in sorted({*map(os.path.abspath, scope), *shown}):
            record = modules.by_path.get(absolute)  # absolute already: no `of` (abspath)
            ref = ModuleRef(record.name, record.import_name, record.package) if record else \
                ModuleRef(absolute, "", False)
            context = hashlib.sha256(f"{ref}\n{tops}".encode()).hexdigest()[:20]
            path, ignored = shown.get(absolute, (absolute, frozenset()))
            plan = Plan(path, absolute, ref, absolute in shown, ignored, context,
                        _worker(absolute, max(1, min(self.jobs, 8))))
            if self.cache is not None and absolute not in self.overlay:
                plan.entry = self.cache.fresh(absolute, context)
                if plan.entry is not None and plan.entry.summary is not None:
                    assert plan.entry.summary_digest is not None
                    self.store.add_text(ref.module_id, plan.entry.summary,
                                        plan.entry.summary_digest)
                    if plan.entry.outline is not None:
                        self._outlines[ref.module_id] = plan.entry.outline
                    plan.summarised = True
            plans.append(plan)
        return plans

    def _workers(self, count: int) -> InProcess | Processes:
        """The pool, started on first need, sized by the work there is."""
        if self._pool is None:
            size = max(1, min(self.jobs, 8)) if count >= PARALLEL_THRESHOLD else 1
            factory = functools.partial(make_worker, self.engine.enabled, self.engine.targets,
                                        self.engine.all_syntax_errors,
                                        self.engine.target_explicit, self.max_bytes,
                                        self.engine.pin_root, self.overlay)
            if size > 1:  # imported before the processes fork: they share it rather than
                # each importing it (~80 ms), and this process builds the index with it
                import bnfix.project.session  # noqa: F401
            self._pool = Processes(size, factory) if size > 1 else InProcess(factory)
            assert self._modules is not None
            tops = self._modules.first_party_tops()
            list(self._pool.run("set_project", [(i, (tops,)) for i in range(self._pool.size)]))
        return self._pool

    # -- the run -----------------------------------------------------------------------------

    def run(self, reported: list[tuple[str, frozenset[str]]], scope: list[str],
            root: Path) -> Iterator[FileResult]:
        modules = ModuleMap.build([*scope, *(p for p, _ in reported)], root)
        self._modules = modules
        restores = self.engine.book.catalogue.training.get("restores", {})
        self._readme, self._documented = documented_loads(
            root, tuple(restores.get("weight_methods", ())),
            tuple(restores.get("weight_functions", ())))
        plans = self._plans(reported, scope, modules)
        scope_digest = hashlib.sha256("\n".join(
            f"{p.ref.module_id}:{p.absolute}" for p in plans).encode()).hexdigest()[:20]
        self._scope = scope_digest
        finished = False
        # The cyclic garbage collector pauses while the run lasts (the workers' too): a run
        # makes millions of small objects that live until it ends (syntax trees, the IR,
        # summaries) and almost no cycles, and CPython's collector scanned them again and
        # again: 44% of a cold run on timm, 48% on the torch tree, same peak memory without.
        collecting = gc.isenabled()
        gc.disable()
        try:
            self._summaries(plans)
            yield from self._check(plans, scope_digest)
            if self._index is not None:
                self.notes.extend(f"project analysis gave up: {why}"
                                  for why in dict.fromkeys(self._index.gave_up))
            self.notes.extend(_conflict_notes(modules.conflicts()))
            finished = True
        finally:
            if collecting:
                gc.enable()
            if self._pool is not None:
                if finished:
                    self._pool.close()
                else:  # interrupted: stop the workers now (they never write files)
                    self._pool.terminate()
            if self.cache is not None and finished:
                self.cache.meta["scope"] = scope_digest

    def _summaries(self, plans: list[Plan]) -> None:
        """Step 2: summaries from the cache, or from the files, then the expansion rounds."""
        todo = [p for p in plans if p.entry is None]
        if todo:
            pool = self._workers(len(todo))
            _balance(todo, pool.size)
            jobs = []
            for plan in todo:
                stale = self.cache.get(plan.absolute) \
                    if self.cache is not None and plan.absolute not in self.overlay else None
                known = stale.digest if stale is not None and stale.context == plan.context else None
                # an `__init__.py` is always summarised: its re-exports are how imports resolve
                jobs.append((plan.worker, (plan.absolute, plan.ref, plan.ref.package,
                                           plan.reported, known)))
            self._collect(pool.run("summarise_file", jobs),
                          {p.absolute: p for p in todo})
        by_path = {p.absolute: p for p in plans}
        self._summarise_callees(plans, by_path)
        project = digest_of(self.store.digests, set(self.store.digests))
        for _ in range(EXPANSION_ROUNDS):
            if all(p.summarised or p.absolute in self._mentioned for p in plans):
                break  # no file left that a name could add
            names = self._names(project, plans)
            if not names:
                break
            checked = hashlib.sha256(" ".join(f"{t}.{n}" for n, tails in names for t in tails)
                                     .encode()).hexdigest()[:20]
            candidates = [p for p in plans if not p.summarised and p.absolute not in self._mentioned
                          and not (p.entry is not None and p.entry.checked == checked)]
            if not candidates:
                break
            found = []
            pool = self._workers(len(candidates))
            for path, hit in pool.run("mentions", [(p.worker, (p.absolute, names))
                                                   for p in candidates]):
                plan = by_path[path]
                if hit and _failed(plan):
                    if self._uses_bn_code(path):
                        self._mentioned.add(path)  # does not parse: BN900 is worth reporting
                elif hit:
                    found.append(plan)
                elif self.cache is not None and plan.entry is not None:
                    plan.entry.checked = checked
                    self.cache.put(plan.absolute, plan.entry)
            if not found:
                break
            self._collect(pool.run("summarise_file", [
                (p.worker, (p.absolute, p.ref, True, p.reported, None)) for p in found]), by_path)
            self._summarise_callees(plans, by_path)
            project = digest_of(self.store.digests, set(self.store.digests))
        else:  # each round found files: there may be more behind them
            self.notes.append(
                f"project analysis gave up: BN code reached through more than {EXPANSION_ROUNDS} "
                "files in a row (each calling a function of the next, or importing it from a "
                "module that imports it); files that reach it only further away were not read")

    def _summarise_callees(self, plans: list[Plan], by_path: dict[str, Plan]) -> None:
        """Summarise the modules of first-party code that BN-building functions call and that
        hold no BN word themselves: a conv wrapper class (`Conv2dStaticSamePadding` next to a
        BN, BN104) is known only from its module's summary. The callers read are the modules
        summarised in this run (a cached one's callees were summarised when it was, and stay
        so: a file without BN words that had a summary is summarised again when it changes).
        One level: what those modules call is not followed (a wrapper is recognised within its
        own file). The first-party modules a summarised file star-imports too: the library
        names they bind are that file's (tsai's `from ..imports import *`, which binds `nn`)."""
        assert self._modules is not None
        wanted: dict[str, Plan] = {}
        for plan in plans:
            done = plan.done
            if done is None or plan.summarised or _failed(plan):
                continue
            previous = plan.previous
            if previous is not None and previous.summary is not None and not previous.relevant:
                wanted[plan.absolute] = plan  # no BN word, and summarised before without one
        for plan in plans:
            summary = plan.done.summary if plan.done is not None else None
            if summary is None:
                continue
            for star in summary.star_imports:
                found = self._modules.resolve(star, plan.absolute)
                module = by_path.get(os.path.abspath(found[0].path)) if found and not found[1] \
                    else None
                if module is not None and not module.summarised and not _failed(module):
                    wanted.setdefault(module.absolute, module)
            for function in summary.functions.values():
                if not function.bn:
                    continue
                for call in function.calls:
                    if call.target.startswith("@"):
                        continue
                    found = self._modules.resolve(call.target, plan.absolute)
                    callee = by_path.get(os.path.abspath(found[0].path)) if found else None
                    if callee is not None and not callee.summarised and not _failed(callee):
                        wanted.setdefault(callee.absolute, callee)
        if wanted:
            todo = sorted(wanted.values(), key=lambda p: p.absolute)
            self._collect(self._workers(len(todo)).run("summarise_file", [
                (p.worker, (p.absolute, p.ref, True, p.reported, None)) for p in todo]), by_path)

    def _uses_bn_code(self, path: str) -> bool:
        """Whether a file that does not parse names first-party BN code with its module
        (`resnet` and `inference`): the rules would read it, so BN900 is worth reporting."""
        if self._bn_names is None:
            assert self._modules is not None
            from bnfix.project import names as name_search

            self._bn_names = _grouped(name_search.interesting_pairs(self._current_index()))
        text = self.overlay.get(path)
        if text is None:
            try:
                text = decode(read_source(path, self.max_bytes)).text
            except (Skipped, SourceError):
                return False
        return mentioned(_code_names(text), self._bn_names)

    def _names(self, project: str, plans: list[Plan]) -> Names:
        """The names that make a file worth summarising, each with the modules whose name a
        file must mention with it (cached per set of summaries; when summaries changed, only
        the parts of the modules that reach a changed one are computed again)."""
        meta = self.cache.meta if self.cache is not None else {}
        if meta.get("names_for") == project and "names" in meta:
            return _grouped(tuple(p.split(".", 1)) for p in meta["names"].split() if "." in p)
        from bnfix.project import names as name_search

        index = self._current_index()
        known = self._parts
        if known is None and meta.get("names_scope") == self._scope:
            known = name_search.from_text(meta.get("name_parts", ""))
        forward = self._known_edges(plans, index) if known else None
        if forward is None or known is None:
            redo = set(self.store)
        else:  # a module that only gained functions nothing names: its users' parts stand
            added = self._additions(plans, forward) or {}
            redo = name_search.stale(self.store.digests, known, forward, {
                p.ref.module_id for p in plans if p.ref.module_id in added and
                p.previous is not None and (part := known.get(p.ref.module_id)) is not None
                and part.digest == p.previous.summary_digest})
        kept = {m: c for m, c in (known or {}).items() if m not in redo and m in self.store}
        parts = {**kept, **name_search.contributions(index, sorted(redo), self.store.digests,
                                                     kept)}
        self._parts = parts
        pairs = {pair for part in parts.values() for pair in part.pairs}
        names = self._bn_names = _grouped(pairs)
        if self.cache is not None:
            self.cache.meta.update(names_for=project,
                                   names=" ".join(f"{t}.{n}" for t, n in sorted(pairs)),
                                   names_scope=self._scope,
                                   name_parts=name_search.to_text(parts))
        return names

    def _current_index(self) -> ProjectIndex:
        """An index of the summaries in the store now (imported here: a run whose findings
        all come from the cache never builds one)."""
        if self._index is None:
            from bnfix.project.index import ProjectIndex

            assert self._modules is not None
            self._index = ProjectIndex(self.store, self._modules, self._registers)
            self._index.documented = self._documented
        return self._index

    def _known_edges(self, plans: list[Plan], index: ProjectIndex) -> dict[str, list[str]] | None:
        """Each summarised module's direct dependencies as the cache has them (computed for
        the modules summarised in this run). When the project's files changed (the cached
        ones are then void) or there is no cache: None for the first round of the name search
        (computing them all costs more than it saves), all of them computed for the later
        rounds (the parts of the round before stand for the modules that reach none of the
        files it added: tf-models-official's rounds after the first, 410 of 557 ms, now 270)."""
        void = self.cache is None or self.cache.meta.get("scope") != self._scope
        if void and self._parts is None:
            return None
        forward: dict[str, list[str]] = {}
        for plan in plans:
            if not plan.summarised:
                continue
            edges = plan.entry.edges if not void and plan.entry is not None and \
                plan.done is None else None
            forward[plan.ref.module_id] = edges if edges is not None else \
                module_edges(index, plan.ref.module_id)
        return forward

    def _collect(self, results: Iterator[Summarised], by_path: dict[str, Plan]) -> None:
        self._index = None  # the store changes
        for done in results:
            plan = by_path[done.path]
            if done.internal is not None and not plan.reported:
                self.internal.append((plan.shown, done.internal))
            stale = self.cache.get(done.path) if self.cache is not None else None
            if done.reused and stale is not None and done.stat is not None:
                plan.entry = Entry(done.stat[0], done.stat[1], stale.digest, plan.context,
                                   stale.relevant, stale.summary, stale.summary_digest,
                                   stale.edges, stale.checked, stale.findings, stale.callees,
                                   stale.outline)
                if stale.summary is not None:
                    self.store.add_text(plan.ref.module_id, stale.summary,
                                        stale.summary_digest or "")
                    if stale.outline is not None:
                        self._outlines[plan.ref.module_id] = stale.outline
                    plan.summarised = True
                if self.cache is not None:
                    self.cache.put(done.path, plan.entry)
                continue
            plan.done = done
            plan.previous = stale
            if done.summary is not None:
                self.store.add(done.summary)
                self._outlines[done.summary.module] = outline_digest(outline(done.summary))
                plan.summarised = True
            if self.cache is not None and done.stat is not None and done.digest is not None \
                    and done.error is None:
                text = summary_text(done.summary) if done.summary is not None else None
                plan.entry = Entry(done.stat[0], done.stat[1], done.digest, plan.context,
                                   done.relevant, text,
                                   done.summary.digest if done.summary is not None else None,
                                   None, None, None,
                                   outline=self._outlines[done.summary.module]
                                   if done.summary is not None else None)
                self.cache.put(done.path, plan.entry)

    # -- step 4 --------------------------------------------------------------------------------

    def _edges(self, plans: list[Plan], scope: str) -> tuple[dict[str, list[str]],
                                                             dict[str, frozenset[tuple[str, str]]]]:
        """Each summarised module's direct dependencies (and the functions its calls resolve
        to, which the index's `callers` reads), exact for the summaries of this run:
        from the cache while the project's files are the same, computed for the modules
        summarised in this run and for every module that reaches one of them over the cached
        edges (a call resolved through a changed module's re-exports may now lead elsewhere;
        the first changed module on its way is one the caller reached before). A module
        whose summary resolves names as before but for functions added or removed (a new
        helper or function: the common edit) changes a call elsewhere only if that call names
        one, so the modules that reach it keep their cached edges unless a summary among them
        mentions such a name (anywhere in its text: a superset)."""
        valid = self.cache is not None and self.cache.meta.get("scope") == scope
        cached: dict[str, tuple[list[str], list[list[str]]]] = {}
        for plan in plans:
            entry = plan.entry
            if plan.summarised and valid and entry is not None and plan.done is None \
                    and entry.edges is not None and entry.callees is not None:
                cached[plan.ref.module_id] = (entry.edges, entry.callees)
        changed = {p.ref.module_id for p in plans if p.done is not None or
                   (p.summarised and p.ref.module_id not in cached)}
        known = {m: edges for m, (edges, _) in cached.items()}
        renamed = self._renamed(plans)
        stale = reaching(changed - renamed.keys(), known)
        if renamed and _named_by_users(plans, renamed, known, stale):
            stale |= reaching(set(renamed), known)
        forward: dict[str, list[str]] = {}
        callees: dict[str, frozenset[tuple[str, str]]] = {}
        for plan in plans:
            if not plan.summarised:
                continue
            module = plan.ref.module_id
            links = cached.get(module) if module not in stale else None
            if links is None:
                links = module_links(self._current_index(), module)
                if self.cache is not None and plan.entry is not None:
                    plan.entry.edges, plan.entry.callees = links
                    self.cache.put(plan.absolute, plan.entry)
            forward[module] = links[0]
            callees[module] = frozenset((m, q) for m, q in links[1])
        return forward, callees

    def _additions(self, plans: list[Plan], forward: dict[str, list[str]]
                   ) -> dict[str, list[str]] | None:
        """When every module whose summary's digest changed in this run only gained functions
        that nothing names (`added_functions`, and no module that reaches it mentions one),
        those functions by module; else None. Such functions change no other module's
        resolution, reach or name search: only what their own calls attach as callers."""
        found: dict[str, list[str]] = {}
        for plan in plans:
            previous, entry = plan.previous, plan.entry
            if plan.done is None or not plan.summarised or (
                    previous is not None and entry is not None
                    and previous.summary_digest == entry.summary_digest):
                continue  # not summarised again, or to the same digest
            if previous is None or previous.summary is None or entry is None or \
                    entry.summary is None:
                return None
            known = self._added.get(plan.ref.module_id)
            if known is None or known[0] is not previous.summary or known[1] is not entry.summary:
                known = self._added[plan.ref.module_id] = (
                    previous.summary, entry.summary,
                    added_functions(previous.summary, entry.summary))
            added = known[2]
            if added is None:
                return None
            found[plan.ref.module_id] = added
        named = {module: called_by(added) for module, added in found.items()}
        return None if _named_by_users(plans, named, forward, set()) else found

    def _earlier_keys(self, plans: list[Plan], forward: dict[str, list[str]],
                      callers: dict[str, set[str]], extras: dict[str, str]) -> dict[str, str]:
        """The keys that files a change in this run cannot reach had before it, by module.
        When every changed summary only gained functions that nothing names (`_additions`),
        another file's project context changes only where the new functions' calls attach
        callers: the modules of the functions they call, and of those these call
        (CALLER_LEVELS deep). Any other file whose key, with the summaries as they were,
        is the one its findings were stored under was checked against a context that is
        still its own."""
        added = self._additions(plans, forward)
        if not added:
            return {}
        index = self._current_index()
        frontier = {(m, q) for m, qualnames in added.items() for q in qualnames}
        seen = set(frontier)
        for _ in range(CALLER_LEVELS):  # the functions the new ones call, and those call...
            called: set[tuple[str, str]] = set()
            for module, qualname in frontier:
                function = index.function(module, qualname)
                if function is not None:
                    called.update(t.key for call in function.calls
                                  for t in index.call_targets(module, call, caller=function))
            frontier = called - seen
            seen |= frontier
        reached = {m for m, _ in seen}
        digests = dict(self.store.digests)
        for plan in plans:
            if plan.ref.module_id in added and plan.previous is not None and \
                    plan.previous.summary_digest is not None:
                digests[plan.ref.module_id] = plan.previous.summary_digest
        return cone_keys(forward, callers, digests,
                         {m: extra for m, extra in extras.items() if m not in reached})

    @staticmethod
    def _renamed(plans: list[Plan]) -> dict[str, set[str]]:
        """The modules summarised again in this run that resolve names as their cached summary
        did but for functions added or removed (a new helper, a new function calling others),
        with the names those functions are called by (each part of their qualnames)."""
        found: dict[str, set[str]] = {}
        for plan in plans:
            previous, entry = plan.previous, plan.entry
            if plan.done is None or previous is None or previous.summary is None or \
                    entry is None or entry.summary is None:
                continue
            before, after = resolution_face(previous.summary), resolution_face(entry.summary)
            if before is None or after is None or before[0] != after[0]:
                continue
            old, new = before[1], after[1]
            if all(old[q] == new[q] for q in old.keys() & new.keys()):
                found[plan.ref.module_id] = called_by(old.keys() ^ new.keys())
        return found

    def _check(self, plans: list[Plan], scope: str) -> Iterator[FileResult]:
        """Step 4: findings of the files asked about."""
        forward, callees = self._edges(plans, scope)
        backward = reverse(forward)
        callers = reverse({module: sorted({m for m, _ in callees.get(module, ())})
                           for module in forward})
        everywhere = self._project_facts()
        extras = {p.ref.module_id: everywhere + _callees_text(callees, p.ref.module_id)
                  for p in plans if p.reported and p.summarised}
        keys = cone_keys(forward, callers, self.store.digests, extras)
        earlier: dict[str, str] | None = None  # computed when a file's key changed
        waiting: dict[str, tuple[Plan, str]] = {}
        for plan in (p for p in plans if p.reported):
            if plan.done is not None and plan.done.note:
                yield FileResult(plan.shown, notes=[f"{plan.shown}: {plan.done.note}"],
                                 ignored=plan.ignored)
                continue
            if plan.done is not None and plan.done.internal is not None:
                yield FileResult(plan.shown, ignored=plan.ignored, internal=plan.done.internal)
                continue
            if plan.done is not None and plan.done.error is not None:
                error = plan.done.error
                if plan.done.relevant or self.engine.all_syntax_errors or \
                        plan.absolute in self._mentioned or \
                        any(d.code == "BN901" for d in error.diagnostics):
                    yield self._error(plan)  # BN901 always; BN900 where a rule reads the file
                else:  # summarised only because it names a first-party BN builder
                    yield FileResult(plan.shown, ignored=plan.ignored, digest=plan.done.digest)
                continue
            # the file's own resolved callees too: a call that now resolves to a function
            # whose module's digest leaves it out (a silent function) is a change
            consulted = keys[plan.ref.module_id] if plan.summarised else ""
            cached = self._cached(plan, consulted)
            if cached is not None:
                yield cached
                continue
            relevant = plan.entry.relevant if plan.entry is not None else (
                plan.done.relevant if plan.done is not None else True)
            if not plan.summarised and not relevant and not self.engine.all_syntax_errors:
                digest = plan.entry.digest if plan.entry is not None else None
                yield self._store(plan, FileResult(plan.shown, ignored=plan.ignored,
                                                   digest=digest), consulted)
                continue
            waiting[plan.absolute] = (plan, consulted)
        if not waiting:
            return
        from bnfix.project.view import file_context

        index = self._current_index()
        index.callees, index.dependents = callees, backward
        contexts: dict[str, tuple[FileContext | None, str]] = {}

        def context(plan: Plan) -> tuple[FileContext | None, str]:
            """The file's project context (what its check reads of other files) and its
            digest (kept with the findings: without a cache, none)."""
            found = contexts.get(plan.absolute)
            if found is None:
                known = file_context(index, plan.ref.module_id) \
                    if plan.summarised else None
                if known is not None:
                    known.imported = plan.ref.module_id in backward
                digest = known.digest() if known is not None and self.cache is not None else ""
                found = contexts[plan.absolute] = (known, digest)
            return found

        # The cone's digest changed, but an edit elsewhere seldom changes what a file's check
        # reads: findings made against the same context stand (taken here, before the workers
        # are sized, for the files whose cached findings could stand).
        for plan, consulted in list(waiting.values()):
            if plan.summarised and plan.entry is not None and plan.entry.findings is not None \
                    and plan.entry.findings.context:
                if earlier is None:
                    earlier = self._earlier_keys(plans, forward, callers, extras)
                # a file the change cannot reach keeps the context it was checked against
                same = earlier.get(plan.ref.module_id) == plan.entry.findings.consulted
                cached = self._cached(plan, consulted, plan.entry.findings.context if same
                                      else context(plan)[1])
                if cached is not None:
                    del waiting[plan.absolute]
                    yield cached
        if not waiting:
            return

        def jobs() -> Iterator[tuple[int, tuple[object, ...]]]:
            """Each file's job, its project context computed here when a worker is about to
            need it (the workers check the files before while this process builds it)."""
            for plan, _ in waiting.values():
                known, digest = context(plan)
                contexts[plan.absolute] = (None, digest)  # sent: only its digest is kept
                if known is not None and pool.remote:
                    known.marks = None  # the worker has them
                yield plan.worker, (plan.absolute, plan.ref if plan.summarised else None,
                                    known, plan.ignored, self.fix, self.unsafe)

        pool = self._workers(len(waiting))
        if pool.remote:
            # every context holds the project's marks (timm: 48 KB a file, two thirds of what
            # was sent to the workers): each worker gets them once
            marks = index.project_marks()
            list(pool.run("set_marks", [(i, (marks,)) for i in range(pool.size)]))
        for result in pool.run("check_file", jobs()):
            plan, consulted = waiting[result.path]
            result.path = plan.shown
            result.notes = [plan.shown + note[len(plan.absolute):]
                            if note.startswith(plan.absolute + ":") else note
                            for note in result.notes]  # as the user named the file
            result.diagnostics = [d._replace(path=plan.shown) for d in result.diagnostics]
            result.fixed = [d._replace(path=plan.shown) for d in result.fixed]
            yield self._store(plan, result, consulted, context(plan)[1])

    def _project_facts(self) -> str:
        """A digest of what every file's check reads of every module (marks and BN APIs) and
        of the README's weight loads: a `load_state_dict` added anywhere changes a BN104 fix in
        a file that imports nothing of it, so it is part of every file's cached-findings key."""
        parts = [f"README={self._readme}"] if self._documented else []
        for module in sorted(self.store):
            found = self._outlines.get(module)
            if found is None:
                found = self._outlines[module] = outline_digest(self.store.outline(module))
            if found:  # a module with no marks and no BN changes nothing there
                parts.append(f"{module}={found}")
        return hashlib.sha256(";".join(parts).encode()).hexdigest()[:20]

    def _error(self, plan: Plan) -> FileResult:
        assert plan.done is not None and plan.done.error is not None
        error = plan.done.error
        kept = [d._replace(path=plan.shown) for d in error.diagnostics
                if d.code not in plan.ignored]
        return FileResult(plan.shown, kept, digest=error.digest, ignored=plan.ignored)

    def _cached(self, plan: Plan, consulted: str, context: str | None = None
                ) -> FileResult | None:
        """The cached findings, when they were made against the same summaries (`consulted`)
        or, given `context`, against the same project context (then they are kept under the
        new `consulted`, for the next run)."""
        entry = plan.entry
        if entry is None or entry.findings is None:
            return None
        findings = entry.findings
        if findings.ignored != tuple(sorted(plan.ignored)):
            return None
        if findings.consulted != consulted and (context is None or findings.context != context):
            return None
        diagnostics = Cache.diagnostics(findings, plan.shown)
        if diagnostics is None or (self.fix and _has_fixes(diagnostics, self.unsafe)):
            return None  # there is something to fix: run it
        if findings.consulted != consulted and self.cache is not None:
            entry.findings = findings._replace(consulted=consulted)
            self.cache.put(plan.absolute, entry)
        return FileResult(plan.shown, diagnostics, ignored=plan.ignored, unchanged=True,
                          digest=entry.digest)

    def _store(self, plan: Plan, result: FileResult, consulted: str, context: str = ""
               ) -> FileResult:
        """Remember the findings (of the content step 2 read: a file edited between the two
        steps is not stored, so the next run sees the change)."""
        entry = plan.entry
        if self.cache is None or entry is None or result.changed or result.internal or \
                (result.digest is not None and result.digest != entry.digest):
            return result
        entry.findings = Cache.findings(plan.ignored, consulted, result.diagnostics, context)
        self.cache.put(plan.absolute, entry)
        return result


def _has_fixes(diagnostics: list[Diagnostic], unsafe: bool) -> bool:
    return any(d.fixable and (unsafe or d.fix.applicability is Applicability.SAFE)  # type: ignore[union-attr]
               for d in diagnostics)


Names = tuple[tuple[str, tuple[str, ...]], ...]  # (name, the module tails that give it)


def _grouped(pairs: Iterable[Sequence[str]]) -> Names:
    """(module tail, name) pairs as each name with its tails, sorted."""
    tails: dict[str, set[str]] = {}
    for tail, name in pairs:
        tails.setdefault(name, set()).add(tail)
    return tuple((name, tuple(sorted(found))) for name, found in sorted(tails.items()))


def mentioned(words: AbstractSet[str], names: Names) -> bool:
    """Whether `words` hold one of the names and the last part of a module that gives it."""
    return any(name in words and not words.isdisjoint(tails) for name, tails in names)


def _code_names(text: str) -> set[str]:
    """The names written in code (not in strings or comments); Python 2 sources tokenize
    too, mostly: what follows a token error is read as plain words (only files that do not
    parse are read so: tokenize is imported here)."""
    import tokenize

    names: set[str] = set()
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type == tokenize.NAME:
                names.add(token.string)
    except (tokenize.TokenError, SyntaxError, IndentationError) as exc:
        row = getattr(exc, "lineno", None) or (exc.args[1][0] if len(exc.args) > 1 else 0)
        rest = "\n".join(text.splitlines()[max(row - 1, 0):])
        names.update(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", rest))
    return names


def _failed(plan: Plan) -> bool:
    return plan.done is not None and (plan.done.error is not None or plan.done.note is not None
                                      or plan.done.internal is not None)


def _named_by_users(plans: list[Plan], changed: dict[str, set[str]],
                    forward: dict[str, list[str]], redone: set[str]) -> bool:
    """Whether a module that reaches one of `changed` (modules, and the names of functions
    they gained or lost) and is not in `redone` may name one of those functions: its summary's
    text holds the name (a superset of the calls and imports naming it), or it has no text."""
    names = set().union(*changed.values())
    if not names:
        return False
    texts = {p.ref.module_id: p.entry.summary for p in plans
             if p.entry is not None and p.entry.summary is not None}
    users = reaching(set(changed), forward) - redone - changed.keys()
    return any(texts.get(m) is None or any(n in texts[m] for n in names) for m in users)


def _callees_text(callees: dict[str, frozenset[tuple[str, str]]], module: str) -> str:
    """The functions `module`'s calls resolve to, as one line for its findings' key."""
    found = callees.get(module, frozenset())
    return ";" + ",".join(f"{m}:{q}" for m, q in sorted(found))


def _balance(plans: list[Plan], size: int) -> None:
    """Each file to the worker with the fewest bytes so far, largest first. A worker keeps
    what it lifted for the file's check, so the files stay where they were summarised; by a
    hash of their paths, one of timm's two workers had 35% more to do than the other (2.21 s
    against 1.64 s of CPU) and the run waited for it."""
    if size < 2:
        return
    loads = [(0, i) for i in range(size)]  # a heap of (bytes, worker)
    for nbytes, plan in sorted(((_size(p.absolute), p) for p in plans),
                               key=lambda pair: (-pair[0], pair[1].absolute)):
        load, worker = heapq.heappop(loads)
        plan.worker = worker
        heapq.heappush(loads, (load + nbytes, worker))


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0  # gone or unreadable: the worker reports it


def _worker(path: str, size: int) -> int:
    return int(hashlib.md5(path.encode(), usedforsecurity=False).hexdigest()[:8], 16) % size


def _conflict_notes(conflicts: list[tuple[str, list[str]]]) -> list[str]:
    """A line per module name that several files claim; past CONFLICTS_SHOWN names, one line
    for all (a repository holding two copies of its examples claims dozens: 32 lines before
    the findings in TensorFlow-Examples). A name's files are named up to CONFLICTS_SHOWN."""
    rule = "resolved from each importer's own folder first"
    if len(conflicts) <= CONFLICTS_SHOWN:
        return [f"{_count(len(paths))} files are module `{name}` ({_some(paths)}): "
                f"imports of it are {rule}" for name, paths in conflicts]
    shown = "; ".join(f"`{name}`: {_some(paths)}" for name, paths in conflicts[:CONFLICTS_SHOWN])
    return [f"{len(conflicts)} module names are each claimed by several files ({shown}; and "
            f"{len(conflicts) - CONFLICTS_SHOWN} more): imports of them are {rule}"]


def _some(paths: list[str]) -> str:
    if len(paths) <= CONFLICTS_SHOWN:
        return ", ".join(paths)
    return f"{', '.join(paths[:CONFLICTS_SHOWN])} and {len(paths) - CONFLICTS_SHOWN} more"


def _count(n: int) -> str:
    """`two`, `three` ... for a note about a few files; digits beyond."""
    words = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
    return words[n] if n < len(words) else str(n)
