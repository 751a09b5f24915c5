"""The open documents, analysed the way `bnfix check FILE` analyses their files: the
configuration found from each file's path, its per-file ignores and excludes (as with
`--force-exclude`), and the whole project around it — with the editor's texts standing in for
the files on disk, so that unsaved edits count in this document and in the documents that
depend on it. No pygls here: the server converts what this returns."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from bnfix.config import ConfigError, Settings
from bnfix.engine import Engine
from bnfix.findings import FileResult
from bnfix.lint import LintOptions, UsageError, findings_cache, prepare, walker
from bnfix.project.modules import project_root
from bnfix.project.runner import ProjectRunner
from bnfix.rulebook import RuleBook


@dataclass(frozen=True)
class Document:
    """An open document as the client sent it."""

    uri: str
    path: Path | None  # absolute, for a `file:` URI; None for a buffer that is no file
    text: str
    version: int | None = None


@dataclass
class Outcome:
    """One analysis of a set of documents."""

    results: dict[str, FileResult] = field(default_factory=dict)  # by URI (absent: not analysed)
    errors: list[str] = field(default_factory=list)  # configuration problems, one line each
    notes: list[str] = field(default_factory=list)  # what the run says besides findings
    book: RuleBook | None = None


@dataclass
class _Project:
    """Documents that share one configuration and one project root."""

    book: RuleBook
    settings: Settings
    engine: Engine
    root: Path
    documents: list[Document] = field(default_factory=list)


def analyse(documents: list[Document], *, cache: bool = True, fix_uri: str | None = None,
            unsafe: bool = False, overlay: list[Document] | None = None) -> Outcome:
    """Findings of `documents`. With `fix_uri`, that one document is fixed instead, like `bnfix
    fix` (with `--unsafe-fixes` when `unsafe`): its result holds the fixed text. `overlay`: the
    open documents whose texts stand in for their files (default: `documents`)."""
    outcome = Outcome()
    texts = {os.path.abspath(d.path): d.text for d in (overlay or documents) if d.path is not None}
    projects: dict[tuple[Path | None, Path], _Project] = {}
    for doc in documents:
        if doc.path is None:
            _analyse_buffer(doc, outcome, fixing=doc.uri == fix_uri, unsafe=unsafe)
            continue
        try:
            book, settings, engine = prepare(LintOptions(), doc.path.parent)
        except UsageError as exc:
            outcome.errors.append(str(exc))
            continue
        outcome.book = book
        root = project_root([doc.path], settings.root if settings.source is not None else None)
        if settings.source is None:
            settings.root = root  # no configuration: excludes and the cache are the project's
        key = (settings.source, root)
        project = projects.setdefault(key, _Project(book, settings, engine, root))
        project.documents.append(doc)
    for project in projects.values():
        try:
            _run(project, texts, outcome, cache, fix_uri, unsafe)
        except ConfigError as exc:  # a per-file-ignores entry that names no rule
            outcome.errors.append(str(exc))
    return outcome


def _analyse_buffer(doc: Document, outcome: Outcome, fixing: bool, unsafe: bool) -> None:
    """A buffer that is no file (`untitled:`): this text alone, with the configuration found
    from the working folder."""
    try:
        book, _, engine = prepare(LintOptions(), Path.cwd())
    except UsageError as exc:
        outcome.errors.append(str(exc))
        return
    outcome.book = book
    name = doc.uri.rsplit("/", 1)[-1] or "untitled.py"
    if fixing:
        outcome.results[doc.uri] = engine.fix_text(doc.text, name, unsafe)
    else:
        outcome.results[doc.uri] = FileResult(name, engine.diagnose(doc.text, name))


def _run(project: _Project, texts: dict[str, str], outcome: Outcome, use_cache: bool,
         fix_uri: str | None, unsafe: bool) -> None:
    settings, engine = project.settings, project.engine
    walk = walker(settings)
    by_path: dict[str, Document] = {}
    for doc in project.documents:
        assert doc.path is not None
        if fix_uri is not None and doc.uri != fix_uri:
            continue
        if not any(True for _ in walk([doc.path], force_exclude=True)):
            continue  # excluded by the configuration (or .gitignore): no findings, like CI
        by_path[str(doc.path)] = doc
    if not by_path:
        return
    reported = [(path, settings.ignored_for(Path(path), project.book)) for path in by_path]
    scope = [str(c.path) for c in walk([project.root])]
    # the cache `bnfix check` uses: the editor and the command line share it
    cache = findings_cache(engine, settings) if use_cache else None
    # one process: a server holds threads, and a warm cache leaves little work to share out
    runner = ProjectRunner(engine, cache=cache, fix=fix_uri is not None, unsafe=unsafe, jobs=1,
                           max_bytes=settings.max_bytes, overlay=texts)
    for result in runner.run(reported, scope, project.root):
        doc = by_path.get(result.path)
        if doc is not None:
            outcome.results[doc.uri] = result
        outcome.notes.extend(result.notes)
    outcome.notes.extend(runner.notes)
    if cache is not None:
        cache.save()
