"""The Language Server over stdio (pygls).

The client sends whole texts (full document sync: pygls's incremental sync splits lines with
`str.splitlines`, which LSP does not). Every edit schedules one analysis of all open documents
after a short pause (the latest edit wins); analyses run one at a time in a worker thread, so
the server keeps answering meanwhile, and a result is published only while its document still
has the text it was found in. Code actions come from the findings of the document's current
text (analysed on the spot when the last analysis is older)."""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from lsprotocol import types
from pygls.lsp.server import LanguageServer
from pygls.uris import from_fs_path, to_fs_path

from bnfix import __version__
from bnfix.checks import ENGINE_CODES
from bnfix.files import PYTHON_SUFFIXES
from bnfix.findings import Applicability, Diagnostic, Edit, FileResult, Pos, Span
from bnfix.lsp.actions import fix_edits, noqa_edit
from bnfix.lsp.analysis import Document, Outcome, analyse
from bnfix.lsp.positions import UTF16, Point, Positions
from bnfix.rulebook import load_rulebook
from bnfix.source.reader import Skipped, SourceError, decode, read_source
from bnfix.source.text import SourceText

log = logging.getLogger("bnfix.lsp")

SOURCE = "bnfix"
FIX_ALL = f"{types.CodeActionKind.SourceFixAll.value}.bnfix"
DEBOUNCE_SECONDS = 0.15
# what changes findings besides the open documents: the project's files and its configuration
WATCHED = ("**/*.py", "**/*.pyi", "**/pyproject.toml", "**/bnfix.toml", "**/.bnfix.toml",
           "**/.gitignore")
SEVERITY = {"error": types.DiagnosticSeverity.Error, "warning": types.DiagnosticSeverity.Warning}


@dataclass(frozen=True)
class Analysed:
    """A document's findings and the text (and version) they were found in."""

    document: Document
    result: FileResult


class BnfixServer(LanguageServer):
    def __init__(self, *, cache: bool = True, debounce: float = DEBOUNCE_SECONDS) -> None:
        super().__init__("bnfix", __version__,
                         text_document_sync_kind=types.TextDocumentSyncKind.Full)
        self.use_cache = cache
        self.debounce = debounce
        self.documents: dict[str, Document] = {}  # open Python documents by the client's URI
        self.analysed: dict[str, Analysed] = {}
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bnfix-analysis")
        self.book = load_rulebook()
        self.shutdown_requested = False
        self._generation = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._errors: set[str] = set()  # configuration errors shown to the user (until fixed)
        self._notes: set[str] = set()
        self._published: dict[str, tuple[int | None, list[types.Diagnostic]]] = {}

    # -- documents ------------------------------------------------------------------------

    def open(self, item: types.TextDocumentItem) -> None:
        path = to_fs_path(item.uri) if item.uri.startswith("file:") else None
        if item.language_id != "python" and not (path or item.uri).endswith(PYTHON_SUFFIXES):
            return
        self.documents[item.uri] = Document(item.uri, Path(os.path.abspath(path)) if path else
                                            None, item.text, item.version)
        self.changed()

    def change(self, params: types.DidChangeTextDocumentParams) -> None:
        doc = self.documents.get(params.text_document.uri)
        if doc is None:
            return
        text = doc.text
        for change in params.content_changes:
            if isinstance(change, types.TextDocumentContentChangePartial):
                positions = Positions(text, self.encoding)
                source = positions.source
                start = source.offset(positions.from_client(_point(change.range.start)))
                end = source.offset(positions.from_client(_point(change.range.end)))
                text = text[:start] + change.text + text[end:]
            else:
                text = change.text
        self.documents[doc.uri] = Document(doc.uri, doc.path, text, params.text_document.version)
        self.changed()

    def close(self, uri: str) -> None:
        if self.documents.pop(uri, None) is None:
            return
        self.analysed.pop(uri, None)
        self._published.pop(uri, None)
        self.text_document_publish_diagnostics(types.PublishDiagnosticsParams(uri, []))
        self.changed()  # documents that depend on its unsaved text see the file again

    # -- analysis -------------------------------------------------------------------------

    def changed(self) -> None:
        """Analyse the open documents once no change has come for `debounce` seconds."""
        self._generation += 1
        task = asyncio.ensure_future(self._after_pause(self._generation))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _after_pause(self, generation: int) -> None:
        await asyncio.sleep(self.debounce)
        if generation == self._generation:
            await self.refresh()

    async def refresh(self) -> None:
        """Analyse every open document and publish what is still current."""
        snapshot = list(self.documents.values())
        if not snapshot:
            return
        outcome = await self._in_worker(analyse, snapshot, cache=self.use_cache)
        if outcome is None:
            return
        self._report(outcome)
        for doc in snapshot:
            if self.documents.get(doc.uri) != doc:
                continue  # edited or closed since: a later analysis publishes
            # a document not analysed (excluded, or a configuration error) has no findings
            result = outcome.results.get(doc.uri) or FileResult(str(doc.path or doc.uri))
            self.analysed[doc.uri] = Analysed(doc, result)
            self.publish(doc, result)

    async def _in_worker(self, function, *args, **kwargs) -> Outcome | None:  # type: ignore[no-untyped-def]
        """Run an analysis in the worker thread; None when it failed (said to the user) or the
        server is shutting down."""
        if self.shutdown_requested:
            return None
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self.executor,
                                              functools.partial(function, *args, **kwargs))
        except Exception as exc:  # a bnfix bug must not end the editor's session: say it, go on
            log.error("bnfix: the analysis failed", exc_info=exc)
            self.window_show_message(types.ShowMessageParams(
                types.MessageType.Error,
                f"bnfix: the analysis failed ({type(exc).__name__}: {exc}); the server's log "
                "(stderr) has the traceback: please report it"))
            return None

    async def current(self, uri: str) -> Analysed | None:
        """The findings of the document's current text (analysed now if they are older)."""
        doc = self.documents.get(uri)
        if doc is None:
            return None
        done = self.analysed.get(uri)
        if done is None or done.document != doc:
            await self.refresh()
            done = self.analysed.get(uri)
        return done if done is not None and done.document == self.documents.get(uri) else None

    def _report(self, outcome: Outcome) -> None:
        for error in outcome.errors:
            if error not in self._errors:
                self.window_show_message(types.ShowMessageParams(types.MessageType.Error,
                                                                 f"bnfix: {error}"))
        self._errors = set(outcome.errors)
        for note in outcome.notes:
            if note not in self._notes:
                self.window_log_message(types.LogMessageParams(types.MessageType.Info,
                                                               f"bnfix: {note}"))
        self._notes = set(outcome.notes)

    # -- diagnostics ----------------------------------------------------------------------

    @property
    def encoding(self) -> str:
        chosen = self.server_capabilities.position_encoding  # negotiated at `initialize`
        return str(getattr(chosen, "value", chosen) or UTF16)

    def publish(self, doc: Document, result: FileResult) -> None:
        positions = Positions(doc.text, self.encoding)
        others: dict[str, Positions | None] = {}
        diagnostics = [self.to_lsp(d, doc, positions, others) for d in result.diagnostics]
        if self._published.get(doc.uri) == (doc.version, diagnostics):
            return  # every open document is analysed again after each edit: say only news
        self._published[doc.uri] = (doc.version, diagnostics)
        self.text_document_publish_diagnostics(types.PublishDiagnosticsParams(
            doc.uri, diagnostics, doc.version))

    def to_lsp(self, d: Diagnostic, doc: Document, positions: Positions,
               others: dict[str, Positions | None]) -> types.Diagnostic:
        rule = self.book.rules.get(d.code)
        related = []
        for r in d.related:
            path = os.path.abspath(r.path)
            if doc.path is not None and path == str(doc.path):
                uri, where = doc.uri, positions
            else:
                uri = from_fs_path(path) or path
                if path not in others:
                    others[path] = self._positions_of(path)
                where = others[path]
            related.append(types.DiagnosticRelatedInformation(
                types.Location(uri, _range(where, r.span)), r.message))
        return types.Diagnostic(
            range=_range(positions, d.span),
            message=d.message,
            severity=SEVERITY.get(rule.severity if rule else "", types.DiagnosticSeverity.Warning),
            code=d.code,
            code_description=types.CodeDescription(href=d.url) if d.url else None,
            source=SOURCE,
            related_information=related or None,
        )

    def _positions_of(self, path: str) -> Positions | None:
        """The rows of another file: its open document's text, else the file's."""
        for doc in self.documents.values():
            if doc.path is not None and str(doc.path) == path:
                return Positions(doc.text, self.encoding)
        try:
            return Positions(decode(read_source(path)).text, self.encoding)
        except (SourceError, Skipped):
            return None  # gone or unreadable: columns are sent as counted

    # -- code actions ---------------------------------------------------------------------

    async def code_actions(self, params: types.CodeActionParams) -> list[types.CodeAction] | None:
        done = await self.current(params.text_document.uri)
        if done is None:
            return None
        doc, positions = done.document, Positions(done.document.text, self.encoding)
        low = positions.from_client(_point(params.range.start))
        high = positions.from_client(_point(params.range.end))
        only = params.context.only
        actions: list[types.CodeAction] = []
        others: dict[str, Positions | None] = {}
        if _wanted(types.CodeActionKind.QuickFix.value, only):
            for d in done.result.diagnostics:
                if d.span.start > high or low > d.span.end:
                    continue
                diagnostic = self.to_lsp(d, doc, positions, others)
                edits = fix_edits(positions.source, d)
                if edits is not None:
                    assert d.fix is not None
                    unsafe = d.fix.applicability is Applicability.UNSAFE
                    actions.append(types.CodeAction(
                        title=f"Fix {d.code}: {d.fix.message}" + (" (unsafe fix)" if unsafe else ""),
                        kind=types.CodeActionKind.QuickFix, diagnostics=[diagnostic],
                        is_preferred=not unsafe, edit=self._edit(doc, positions, edits)))
                noqa = noqa_edit(positions.source, d.code, d.span) \
                    if d.code not in ENGINE_CODES else None
                if noqa is not None:
                    actions.append(types.CodeAction(
                        title=f"Disable {d.code} for this line",
                        kind=types.CodeActionKind.QuickFix, diagnostics=[diagnostic],
                        edit=self._edit(doc, positions, (noqa,))))
        if _wanted(FIX_ALL, only) and any(
                d.fixable and d.fix.applicability is Applicability.SAFE  # type: ignore[union-attr]
                for d in done.result.diagnostics):
            fixed = await self._in_worker(analyse, [doc], cache=self.use_cache, fix_uri=doc.uri,
                                          overlay=list(self.documents.values()))
            result = fixed.results.get(doc.uri) if fixed is not None else None
            if result is not None and result.changed and self.documents.get(doc.uri) == doc:
                assert result.new_text is not None
                actions.append(types.CodeAction(
                    title="Fix all safely fixable bnfix findings", kind=FIX_ALL,
                    edit=self._edit(doc, positions, (rewrite(positions.source, result.new_text),))))
        return actions

    def _edit(self, doc: Document, positions: Positions,
              edits: tuple[Edit, ...]) -> types.WorkspaceEdit:
        text_edits = [types.TextEdit(_range(positions, e.span), e.content) for e in edits]
        capabilities = self.client_capabilities.workspace
        versioned = capabilities is not None and capabilities.workspace_edit is not None and \
            bool(capabilities.workspace_edit.document_changes)
        if versioned:  # the client refuses the edit if the document changed meanwhile
            return types.WorkspaceEdit(document_changes=[types.TextDocumentEdit(
                types.OptionalVersionedTextDocumentIdentifier(doc.uri, doc.version),
                text_edits)])
        return types.WorkspaceEdit(changes={doc.uri: text_edits})

    # -- file watching --------------------------------------------------------------------

    def watch_files(self) -> None:
        """Ask the client to say when the project's files or configuration change on disk."""
        workspace = self.client_capabilities.workspace
        watched = workspace.did_change_watched_files if workspace is not None else None
        if watched is None or not watched.dynamic_registration:
            return
        options = types.DidChangeWatchedFilesRegistrationOptions(
            [types.FileSystemWatcher(glob_pattern=pattern) for pattern in WATCHED])
        self.client_register_capability(types.RegistrationParams([types.Registration(
            "bnfix-watched-files", types.WORKSPACE_DID_CHANGE_WATCHED_FILES, options)]))


def rewrite(source: SourceText, new: str) -> Edit:
    """One edit that turns `source` into `new`: the rows between their common first and last
    rows (whole rows, so that no position falls inside a line ending)."""
    old_rows = [source.line_with_ending(r) for r in range(1, source.row_count + 1)]
    new_source = SourceText(new)
    new_rows = [new_source.line_with_ending(r) for r in range(1, new_source.row_count + 1)]
    head = 0  # common rows before the edit (never the last row: the edit starts at a row)
    while head < min(len(old_rows), len(new_rows)) - 1 and old_rows[head] == new_rows[head]:
        head += 1
    tail = 0
    while tail < min(len(old_rows), len(new_rows)) - head and \
            old_rows[-1 - tail] == new_rows[-1 - tail]:
        tail += 1
    last = len(old_rows)
    end = Pos(last - tail + 1, 0) if tail else Pos(last, len(old_rows[-1]))
    return Edit(Span(Pos(head + 1, 0), end), "".join(new_rows[head:len(new_rows) - tail]))


def _wanted(kind: str, only: list[str] | None) -> bool:
    """Whether the client asks for actions of `kind` (`only` lists kinds or their parents)."""
    if not only:
        return True
    return any(kind == str(w) or kind.startswith(f"{w}.") for w in
               (getattr(w, "value", w) for w in only))


def _point(position: types.Position) -> Point:
    return Point(position.line, position.character)


def _range(positions: Positions | None, span: Span) -> types.Range:
    if positions is None:
        start, end = Point(span.start.row - 1, span.start.col), Point(span.end.row - 1, span.end.col)
    else:
        start, end = positions.span_to_client(span)
    return types.Range(types.Position(start.line, start.character),
                       types.Position(end.line, end.character))


def create_server(*, cache: bool = True, debounce: float = DEBOUNCE_SECONDS) -> BnfixServer:
    server = BnfixServer(cache=cache, debounce=debounce)

    @server.feature(types.INITIALIZED)
    def initialized(ls: BnfixServer, _params: types.InitializedParams) -> None:
        ls.watch_files()

    @server.feature(types.TEXT_DOCUMENT_DID_OPEN)
    def did_open(ls: BnfixServer, params: types.DidOpenTextDocumentParams) -> None:
        ls.open(params.text_document)

    @server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
    def did_change(ls: BnfixServer, params: types.DidChangeTextDocumentParams) -> None:
        ls.change(params)

    @server.feature(types.TEXT_DOCUMENT_DID_SAVE)
    def did_save(ls: BnfixServer, _params: types.DidSaveTextDocumentParams) -> None:
        ls.changed()

    @server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
    def did_close(ls: BnfixServer, params: types.DidCloseTextDocumentParams) -> None:
        ls.close(params.text_document.uri)

    @server.feature(types.WORKSPACE_DID_CHANGE_WATCHED_FILES)
    def watched_files(ls: BnfixServer, _params: types.DidChangeWatchedFilesParams) -> None:
        ls.changed()

    @server.feature(types.TEXT_DOCUMENT_CODE_ACTION, types.CodeActionOptions(
        code_action_kinds=[types.CodeActionKind.QuickFix, FIX_ALL]))
    async def code_action(ls: BnfixServer,
                          params: types.CodeActionParams) -> list[types.CodeAction] | None:
        return await ls.code_actions(params)

    @server.feature(types.SHUTDOWN)
    def shutdown(ls: BnfixServer, _params: None) -> None:
        ls.shutdown_requested = True
        ls.executor.shutdown(wait=False, cancel_futures=True)

    return server


def serve(*, cache: bool = True, debounce: float = DEBOUNCE_SECONDS) -> int:
    """Run the server on stdin/stdout until the client exits: 0 after a `shutdown` request,
    1 when the client exits (or its pipe closes) without one, as LSP asks."""
    server = create_server(cache=cache, debounce=debounce)
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    previous, sys.stdout = sys.stdout, sys.stderr  # only the protocol may reach the client's pipe
    try:
        server.start_io(stdin, stdout)
    finally:
        sys.stdout = previous
        server.executor.shutdown(wait=False, cancel_futures=True)
    return 0 if server.shutdown_requested else 1


__all__ = ["BnfixServer", "create_server", "rewrite", "serve"]
