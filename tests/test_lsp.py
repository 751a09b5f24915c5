"""`bnfix server`: real LSP sessions (pygls's client) against `python -m bnfix server` in a
subprocess — diagnostics, code actions whose edits equal `bnfix fix`, unsaved texts across
files, configuration, syntax errors, exit codes — and the pieces the server is made of."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import sys
import textwrap
from collections import defaultdict
from pathlib import Path

import pytest
from conftest import run_bnfix, write_tree

pytest.importorskip("pygls")

from lsprotocol import types  # noqa: E402
from pygls.lsp.client import LanguageClient  # noqa: E402

from bnfix.ir import Edit, Pos, Span  # noqa: E402
from bnfix.lsp.actions import noqa_edit  # noqa: E402
from bnfix.lsp.analysis import Document, analyse  # noqa: E402
from bnfix.lsp.positions import UTF8, UTF16, UTF32, Point, Positions  # noqa: E402
from bnfix.lsp.server import rewrite  # noqa: E402
from bnfix.rulebook import load_rulebook  # noqa: E402
from bnfix.source.text import SourceText  # noqa: E402

BOOK = load_rulebook()
BN001 = BOOK.rules["BN001"]
WAIT = 60  # seconds: only a guard against a hung server, never a measurement

# -- a real client ---------------------------------------------------------------------------


class Client(LanguageClient):
    """pygls's client, keeping what the server publishes and how its process ended."""

    def __init__(self) -> None:
        super().__init__("bnfix-test", "1")
        self.published: dict[str, list[types.PublishDiagnosticsParams]] = defaultdict(list)
        self.shown: list[str] = []
        self.registrations: list[types.Registration] = []
        self.returncode: int | None = None
        self.news = asyncio.Event()

        @self.feature(types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
        def diagnostics(_ls: Client, params: types.PublishDiagnosticsParams) -> None:
            self.published[params.uri].append(params)
            self.news.set()

        @self.feature(types.WINDOW_SHOW_MESSAGE)
        def show(_ls: Client, params: types.ShowMessageParams) -> None:
            self.shown.append(params.message)
            self.news.set()

        @self.feature(types.CLIENT_REGISTER_CAPABILITY)
        def register(_ls: Client, params: types.RegistrationParams) -> None:
            self.registrations.extend(params.registrations)

    async def server_exit(self, server: asyncio.subprocess.Process) -> None:
        self.returncode = server.returncode

    async def until(self, found):  # type: ignore[no-untyped-def]
        """Wait until `found()` returns something (what the server sent so far)."""
        async def poll():  # type: ignore[no-untyped-def]
            while (value := found()) is None:
                self.news.clear()
                await self.news.wait()
            return value
        return await asyncio.wait_for(poll(), WAIT)

    async def diagnostics(self, uri: str, version: int) -> list[types.Diagnostic]:
        """The diagnostics published for `version` of the document."""
        return await self.until(lambda: next(
            (list(p.diagnostics) for p in reversed(self.published[uri]) if p.version == version),
            None))

    def open(self, path: Path, text: str, version: int = 1) -> str:
        uri = path.as_uri()
        self.text_document_did_open(types.DidOpenTextDocumentParams(
            types.TextDocumentItem(uri, "python", version, text)))
        return uri

    def change(self, uri: str, version: int, text: str) -> None:
        self.text_document_did_change(types.DidChangeTextDocumentParams(
            types.VersionedTextDocumentIdentifier(version, uri),
            [types.TextDocumentContentChangeWholeDocument(text)]))

    async def actions(self, uri: str, diagnostic: types.Diagnostic) -> list[types.CodeAction]:
        found = await self.text_document_code_action_async(types.CodeActionParams(
            types.TextDocumentIdentifier(uri), diagnostic.range,
            types.CodeActionContext([diagnostic])))
        return list(found or [])


CAPABILITIES = types.ClientCapabilities(
    workspace=types.WorkspaceClientCapabilities(
        workspace_edit=types.WorkspaceEditClientCapabilities(document_changes=True),
        did_change_watched_files=types.DidChangeWatchedFilesClientCapabilities(
            dynamic_registration=True)),
    text_document=types.TextDocumentClientCapabilities(
        publish_diagnostics=types.PublishDiagnosticsClientCapabilities(
            related_information=True, version_support=True)),
    general=types.GeneralClientCapabilities(position_encodings=[types.PositionEncodingKind.Utf16]),
)


async def start(root: Path) -> Client:
    client = Client()
    await client.start_io(sys.executable, "-m", "bnfix", "server", cwd=str(root))
    result = await asyncio.wait_for(client.initialize_async(types.InitializeParams(
        capabilities=CAPABILITIES, process_id=None, root_uri=root.as_uri())), WAIT)
    assert result.server_info is not None and result.server_info.name == "bnfix"
    assert result.capabilities.position_encoding == types.PositionEncodingKind.Utf16
    client.initialized(types.InitializedParams())
    return client


async def stop(client: Client, *, shutdown: bool = True) -> int:
    if shutdown:
        await asyncio.wait_for(client.shutdown_async(None), WAIT)
    client.exit(None)
    await asyncio.wait_for(client.stop(), WAIT)
    assert client.returncode is not None
    return client.returncode


# -- applying LSP edits, written independently of bnfix's own position code -------------------


def _offset(text: str, position: types.Position) -> int:
    """A UTF-16 LSP position as an index into `text` (lines end at \\n, \\r\\n or \\r)."""
    starts = [0] + [m.end() for m in re.finditer(r"\r\n|\r|\n", text)]
    start = starts[position.line]
    end = starts[position.line + 1] if position.line + 1 < len(starts) else len(text)
    line = text[start:end].rstrip("\r\n")
    encoded = line.encode("utf-16-le")[: position.character * 2]
    return start + len(encoded.decode("utf-16-le"))


def apply_edit(text: str, uri: str, edit: types.WorkspaceEdit) -> str:
    if edit.document_changes is not None:
        (change,) = edit.document_changes
        assert isinstance(change, types.TextDocumentEdit) and change.text_document.uri == uri
        edits = list(change.edits)
    else:
        assert edit.changes is not None
        edits = list(edit.changes[uri])
    spans = sorted(((_offset(text, e.range.start), _offset(text, e.range.end), e.new_text)
                    for e in edits), reverse=True)
    for start, end, new in spans:
        text = text[:start] + new + text[end:]
    return text


def bnfix_fix(text: str, name: str, config: str) -> str:
    """What `bnfix fix --unsafe-fixes` makes of `text` as a file of its own project."""
    root = Path(tempfile_dir())
    write_tree(root, {"pyproject.toml": config})
    (root / name).write_text(text, encoding="utf-8")
    run = run_bnfix("fix", "--unsafe-fixes", "--no-cache", name, cwd=root)
    assert run.returncode in (0, 1), run.stderr
    return (root / name).read_text(encoding="utf-8")


_TEMP: list[Path] = []


def tempfile_dir() -> str:
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="bnfix-lsp-"))
    _TEMP.append(folder)
    return str(folder)


@pytest.fixture(autouse=True, scope="module")
def _clean_temporaries():  # type: ignore[no-untyped-def]
    yield
    for folder in _TEMP:
        shutil.rmtree(folder, ignore_errors=True)


CONFIG = "[tool.bnfix]\n"


def example_text(rule) -> str:  # type: ignore[no-untyped-def]
    return textwrap.dedent(rule.docs.example).lstrip("\n")


# -- sessions ----------------------------------------------------------------------------------


def test_session_diagnostics_code_actions_and_exit(tmp_path: Path) -> None:
    root = write_tree(tmp_path, {"pyproject.toml": CONFIG})
    text = example_text(BN001)
    path = root / "model.py"
    path.write_text(text, encoding="utf-8")
    expected = json.loads(run_bnfix("check", "--no-cache", "--output-format", "json", "model.py",
                                    cwd=root).stdout)
    assert [r["code"] for r in expected] == ["BN001"]

    async def session() -> int:
        client = await start(root)
        uri = client.open(path, text)
        (diagnostic,) = await client.diagnostics(uri, 1)
        assert diagnostic.code == "BN001" and diagnostic.source == "bnfix"
        assert diagnostic.severity == types.DiagnosticSeverity.Error
        assert diagnostic.code_description is not None
        assert diagnostic.code_description.href == BN001.url
        assert diagnostic.message == expected[0]["message"]
        location, end = expected[0]["location"], expected[0]["end_location"]
        assert (diagnostic.range.start.line + 1, diagnostic.range.start.character + 1) == \
            (location["row"], location["column"])
        assert (diagnostic.range.end.line + 1, diagnostic.range.end.character + 1) == \
            (end["row"], end["column"])

        actions = await client.actions(uri, diagnostic)
        by_title = {a.title: a for a in actions}
        fix = next(a for a in actions if a.title.startswith("Fix BN001"))
        assert fix.title.endswith("(unsafe fix)") and fix.is_preferred is False
        assert fix.kind == types.CodeActionKind.QuickFix and list(fix.diagnostics or ()) == [diagnostic]
        assert fix.edit is not None
        fixed = apply_edit(text, uri, fix.edit)
        assert fixed == bnfix_fix(text, "model.py", CONFIG) != text

        noqa = by_title["Disable BN001 for this line"]
        assert noqa.edit is not None
        silenced = apply_edit(text, uri, noqa.edit)
        assert "# noqa: BN001" in silenced.splitlines()[diagnostic.range.start.line]
        client.change(uri, 2, silenced)
        assert await client.diagnostics(uri, 2) == []

        client.change(uri, 3, text)  # the finding is back: the text, not the file, counts
        (again,) = await client.diagnostics(uri, 3)
        assert again.range == diagnostic.range

        client.change(uri, 4, fixed)  # a clean text clears the diagnostics
        assert await client.diagnostics(uri, 4) == []
        assert path.read_text(encoding="utf-8") == text  # the server never writes the file
        return await stop(client)

    assert asyncio.run(session()) == 0
