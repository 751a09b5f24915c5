"""`bnfix server`: real LSP sessions (pygls's client) against `python -m bnfix server` in a
subprocess — diagnostics, code actions whose edits equal `bnfix fix`, unsaved texts across
files, configuration, syntax errors, exit codes — and the pieces the server is made of."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from collections import defaultdict
from pathlib import Path

import pytest
from conftest import write_tree
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("pygls")

from lsprotocol import types
from pygls.lsp.client import LanguageClient

from bnfix.cli import main
from bnfix.findings import Pos, Span
from bnfix.lint import LintOptions, run
from bnfix.lsp.actions import noqa_edit
from bnfix.lsp.analysis import Document, analyse
from bnfix.lsp.positions import UTF8, UTF16, UTF32, Point, Positions
from bnfix.lsp.server import rewrite
from bnfix.rulebook import load_rulebook
from bnfix.source.text import SourceText

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
            self.news.set()

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

    async def next_diagnostics(self, uri: str, after: int) -> list[types.Diagnostic]:
        """The diagnostics the server publishes for `uri` after its `after` first ones."""
        return await self.until(lambda: list(self.published[uri][after].diagnostics)
                                if len(self.published[uri]) > after else None)

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


def _offset(text: str, position: types.Position, encoding: str = UTF16) -> int:
    """An LSP position as an index into `text` (lines end at \\n, \\r\\n or \\r; columns in
    code units of `encoding`)."""
    starts = [0] + [m.end() for m in re.finditer(r"\r\n|\r|\n", text)]
    start = starts[position.line]
    end = starts[position.line + 1] if position.line + 1 < len(starts) else len(text)
    line = text[start:end].rstrip("\r\n")
    codec, width = {UTF8: ("utf-8", 1), UTF16: ("utf-16-le", 2), UTF32: ("utf-32-le", 4)}[encoding]
    encoded = line.encode(codec, "surrogatepass")[: position.character * width]
    return start + len(encoded.decode(codec, "surrogatepass"))


def apply_edit(text: str, uri: str, edit: types.WorkspaceEdit, version: int | None = None) -> str:
    if edit.document_changes is not None:
        (change,) = edit.document_changes
        assert isinstance(change, types.TextDocumentEdit) and change.text_document.uri == uri
        assert version is None or change.text_document.version == version
        edits = list(change.edits)
    else:
        assert edit.changes is not None
        edits = list(edit.changes[uri])
    spans = sorted(((_offset(text, e.range.start), _offset(text, e.range.end), e.new_text)
                    for e in edits), reverse=True)
    for start, end, new in spans:
        text = text[:start] + new + text[end:]
    return text


def bnfix(*args: str, cwd: Path) -> int:
    """`bnfix ARGS` run in `cwd`, in this process (the CLI's own code, without a start-up)."""
    previous = os.getcwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            return main(list(args))
    finally:
        os.chdir(previous)


def check_json(cwd: Path, *paths: str) -> list[dict]:  # type: ignore[type-arg]
    """`bnfix check --output-format json PATHS` run in `cwd`."""
    out = io.StringIO()
    previous = os.getcwd()
    os.chdir(cwd)
    try:
        code = run(LintOptions(paths=list(paths), output_format="json", cache=False), stdout=out)
    finally:
        os.chdir(previous)
    assert code in (0, 1)
    return json.loads(out.getvalue())


def bnfix_fix(text: str, folder: Path) -> str:
    """What `bnfix fix --unsafe-fixes` makes of `text` as the file of a project of its own."""
    write_tree(folder, {"pyproject.toml": CONFIG})
    (folder / "model.py").write_text(text, encoding="utf-8")
    assert bnfix("fix", "--unsafe-fixes", "--no-cache", "model.py", cwd=folder) in (0, 1)
    return (folder / "model.py").read_text(encoding="utf-8")


CONFIG = "[tool.bnfix]\n"


def example_text(rule) -> str:  # type: ignore[no-untyped-def]
    return textwrap.dedent(rule.docs.example).lstrip("\n")


# -- sessions ----------------------------------------------------------------------------------


def test_session_diagnostics_code_actions_and_exit(tmp_path: Path) -> None:
    root = write_tree(tmp_path / "project", {"pyproject.toml": CONFIG})
    text = example_text(BN001)
    path = root / "model.py"
    path.write_text(text, encoding="utf-8")
    expected = check_json(root, "model.py")
    assert [r["code"] for r in expected] == ["BN001"]
    fixed_by_bnfix = bnfix_fix(text, tmp_path / "copy")

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
        fixed = apply_edit(text, uri, fix.edit, version=1)
        assert fixed == fixed_by_bnfix != text

        noqa = by_title["Disable BN001 for this line"]
        assert noqa.edit is not None
        silenced = apply_edit(text, uri, noqa.edit)
        assert "# noqa: BN001" in silenced.splitlines()[diagnostic.range.start.line]
        client.change(uri, 2, silenced)
        assert await client.diagnostics(uri, 2) == []

        client.change(uri, 3, text)  # the finding is back: the text, not the file, counts
        # asked at once (maybe before the pause after the edit is over): for the new text
        fix_again = next(a for a in await client.actions(uri, diagnostic)
                         if a.title.startswith("Fix BN001"))
        assert fix_again.edit is not None
        assert apply_edit(text, uri, fix_again.edit, version=3) == fixed
        (again,) = await client.diagnostics(uri, 3)
        assert again.range == diagnostic.range

        client.change(uri, 4, fixed)  # a clean text clears the diagnostics
        assert await client.diagnostics(uri, 4) == []

        # a client that sends ranges (incremental changes) is understood too
        line = next(i for i, row in enumerate(fixed.splitlines()) if "trainable=True" in row)
        column = fixed.splitlines()[line].index("trainable=True")
        client.text_document_did_change(types.DidChangeTextDocumentParams(
            types.VersionedTextDocumentIdentifier(5, uri),
            [types.TextDocumentContentChangePartial(
                types.Range(types.Position(line, column), types.Position(line, column + 14)),
                "trainable=False")]))
        assert await client.diagnostics(uri, 5) == [diagnostic]
        assert path.read_text(encoding="utf-8") == text  # the server never writes the file
        return await stop(client)

    assert asyncio.run(session()) == 0


SAFE_AND_UNSAFE = """
import tensorflow as tf

stem = tf.keras.layers.experimental.SyncBatchNormalization(momentum=0.9, name="stem_bn")
head = tf.keras.layers.experimental.SyncBatchNormalization(-1, momentum=0.9)

if __name__ == "__main__":  # a script: something runs it
    print(stem, head)
""".lstrip("\n")


def test_session_fix_all_applies_the_safe_fixes_as_bnfix_fix_does(tmp_path: Path) -> None:
    """`source.fixAll.bnfix`: BN007's named SyncBatchNormalization (an exact rewrite: a safe fix)
    is fixed, the unnamed one (its default name changes: unsafe) is left, as `bnfix fix`."""
    config = '[tool.bnfix]\ntarget-tensorflow = "2.21"\n'  # BN007 needs a target
    root = write_tree(tmp_path / "project", {"pyproject.toml": config})
    path = root / "model.py"
    path.write_text(SAFE_AND_UNSAFE, encoding="utf-8")
    copy = write_tree(tmp_path / "copy", {"pyproject.toml": config, "model.py": SAFE_AND_UNSAFE})
    assert bnfix("fix", "--no-cache", "model.py", cwd=copy) == 1  # the unsafe one remains
    fixed_by_bnfix = (copy / "model.py").read_text(encoding="utf-8")
    assert 'name="stem_bn", synchronized=True' in fixed_by_bnfix
    assert "experimental.SyncBatchNormalization(-1" in fixed_by_bnfix

    async def session() -> int:
        client = await start(root)
        uri = client.open(path, SAFE_AND_UNSAFE)
        diagnostics = await client.diagnostics(uri, 1)
        assert [d.code for d in diagnostics] == ["BN007", "BN007"]
        found = await client.text_document_code_action_async(types.CodeActionParams(
            types.TextDocumentIdentifier(uri), diagnostics[0].range,
            types.CodeActionContext(diagnostics, only=["source.fixAll.bnfix"])))
        (fix_all,) = list(found or [])
        assert fix_all.kind == "source.fixAll.bnfix" and fix_all.edit is not None
        assert apply_edit(SAFE_AND_UNSAFE, uri, fix_all.edit, version=1) == fixed_by_bnfix
        assert path.read_text(encoding="utf-8") == SAFE_AND_UNSAFE  # the server never writes
        return await stop(client)

    assert asyncio.run(session()) == 0


LAYERS = """
import tensorflow as tf


def batch_norm(x, is_training, trainable=False):
    return tf.compat.v1.layers.batch_normalization(x, training=is_training, trainable=trainable)
"""
TRAIN = """
from models.layers import batch_norm

net = batch_norm(images, is_training=True)
"""
# two characters outside the Basic Multilingual Plane before the finding: 2 UTF-16 units each
WIDE = """
import tensorflow as tf

note = "\U0001F600\U0001F600"; out = tf.compat.v1.layers.batch_normalization(x, training=True, trainable=False)
"""


def test_session_projects_unsaved_texts_configuration_and_syntax_errors(tmp_path: Path) -> None:
    """One server, two projects: each document is analysed in its own project, with its own
    configuration."""
    root = write_tree(tmp_path / "multi", {"pyproject.toml": CONFIG, "models/__init__.py": "",
                                           "models/layers.py": LAYERS, "train.py": TRAIN,
                                           "wide.py": WIDE})
    other = write_tree(tmp_path / "configured", {
        "pyproject.toml": '[tool.bnfix]\nignore = ["BN001"]\nextend-exclude = ["legacy"]\n',
        "model.py": example_text(BN001), "legacy/old.py": example_text(BN001)})
    layers, train, wide = root / "models/layers.py", root / "train.py", root / "wide.py"
    # from the server's working folder: messages name other files relative to it
    expected = {(r["filename"], r["code"]): r for r in check_json(tmp_path, "multi")}
    assert sorted(code for _, code in expected) == ["BN001", "BN001"]
    in_layers = expected[(str(layers), "BN001")]

    async def session() -> int:
        client = await start(tmp_path)
        await client.until(lambda: client.registrations or None)
        (registration,) = client.registrations
        assert registration.method == types.WORKSPACE_DID_CHANGE_WATCHED_FILES

        uri = client.open(layers, layers.read_text())
        (diagnostic,) = await client.diagnostics(uri, 1)
        assert diagnostic.message == in_layers["message"]  # as `bnfix check` sees the project
        assert diagnostic.range.start.line + 1 == in_layers["location"]["row"]
        (related,) = diagnostic.related_information or ()
        (want,) = in_layers["related"]
        assert related.location.uri == train.as_uri() and related.message == want["message"]
        assert (related.location.range.start.line + 1, related.location.range.start.character + 1,
                related.location.range.end.character + 1) == (
            want["location"]["row"], want["location"]["column"], want["end_location"]["column"])

        # an unsaved edit in another open file changes this file's findings
        seen = len(client.published[uri])
        train_uri = client.open(train, TRAIN.lstrip().replace("is_training=True",
                                                                "is_training=False"))
        assert await client.next_diagnostics(uri, seen) == []
        assert await client.diagnostics(train_uri, 1) == []

        # a syntax error is a BN900 diagnostic, and the server goes on
        client.change(train_uri, 2, "from models.layers import batch_norm\n\n"
                                    "net = batch_norm(images, is_training=True\n")
        (error,) = await client.diagnostics(train_uri, 2)
        assert error.code == "BN900" and "never closed" in error.message
        assert (error.range.start.line, error.range.start.character) == (2, 16)
        seen = len(client.published[uri])
        client.change(train_uri, 3, TRAIN.lstrip())
        assert await client.diagnostics(train_uri, 3) == []
        (back,) = await client.next_diagnostics(uri, seen)
        assert back == diagnostic

        # columns in UTF-16 code units (the negotiated encoding)
        wide_uri = client.open(wide, wide.read_text(encoding="utf-8"))
        (found,) = await client.diagnostics(wide_uri, 1)
        column = expected[(str(wide), "BN001")]["location"]["column"] - 1  # in characters
        assert found.range.start.character == column + 2

        # the other project's configuration: BN001 ignored, legacy/ excluded
        model_uri = client.open(other / "model.py", example_text(BN001))
        old_uri = client.open(other / "legacy/old.py", example_text(BN001))
        assert await client.diagnostics(model_uri, 1) == []
        assert await client.diagnostics(old_uri, 1) == []

        def saved(config: str) -> None:  # the file changes on disk, the client says so
            (other / "pyproject.toml").write_text(config)
            client.workspace_did_change_watched_files(types.DidChangeWatchedFilesParams(
                [types.FileEvent((other / "pyproject.toml").as_uri(),
                                 types.FileChangeType.Changed)]))

        seen = len(client.published[model_uri])
        saved('[tool.bnfix]\nextend-exclude = ["legacy"]\n')
        (enabled,) = await client.next_diagnostics(model_uri, seen)
        assert enabled.code == "BN001"
        assert await client.diagnostics(old_uri, 1) == []

        seen, seen_first = len(client.published[model_uri]), len(client.published[uri])
        saved('[tool.bnfix]\nselct = ["BN001"]\n')  # a configuration error: said in one line
        message = await client.until(lambda: next(iter(client.shown), None))
        assert str(other / "pyproject.toml") in message and "selct" in message
        assert "\n" not in message
        assert await client.next_diagnostics(model_uri, seen) == []  # nothing checked there
        assert len(client.published[uri]) == seen_first  # the first project is unaffected
        return await stop(client, shutdown=False)

    assert asyncio.run(session()) == 1  # exit without a shutdown request: 1, as LSP asks


# -- the pieces ----------------------------------------------------------------------------------


# line endings of all three kinds, a form feed and a line separator (no line break for LSP),
# characters of 1 to 4 UTF-8 bytes, some outside the Basic Multilingual Plane
TEXTS = st.lists(st.sampled_from(["a", " ", "\n", "\r", "\r\n", "\x0c", "\u2028", "é", "\u4e2d",
                                  "\U0001F600"]), max_size=40).map("".join)


@settings(max_examples=80, deadline=None)
@given(TEXTS, st.sampled_from([UTF8, UTF16, UTF32]))
def test_positions_match_lsp_lines_and_code_units(text: str, encoding: str) -> None:
    positions = Positions(text, encoding)
    source = positions.source
    for row in range(1, source.row_count + 1):
        for col in range(len(source.line(row)) + 1):
            point = positions.to_client(Pos(row, col))
            lsp = types.Position(point.line, point.character)
            assert _offset(text, lsp, encoding) == source.offset(Pos(row, col))
            assert positions.from_client(point) == Pos(row, col)
    end = Pos(source.row_count, len(source.line(source.row_count)))
    assert positions.from_client(Point(source.row_count + 3, 0)) == end  # past the end: clamped
    assert positions.from_client(Point(0, 10_000)).col == len(source.line(1))


@settings(max_examples=80, deadline=None)
@given(TEXTS, TEXTS)
def test_rewrite_is_one_edit_of_whole_rows(old: str, new: str) -> None:
    source = SourceText(old)
    edit = rewrite(source, new)
    start, end = source.offset(edit.span.start), source.offset(edit.span.end)
    assert old[:start] + edit.content + old[end:] == new
    assert edit.span.start.col == 0


def _noqa(text: str, span: Span, code: str = "BN001") -> str | None:
    source = SourceText(text)
    edit = noqa_edit(source, code, span)
    if edit is None:
        return None
    return text[: source.offset(edit.span.start)] + edit.content + text[source.offset(edit.span.end):]


def _row(row: int) -> Span:
    return Span(Pos(row, 4), Pos(row, 8))


@pytest.mark.parametrize(("text", "span", "expected"), [
    ("x = f(a)   \ny = 1\n", _row(1), "x = f(a)  # noqa: BN001\ny = 1\n"),
    ("x = f(a)  # noqa: BN004\n", _row(1), "x = f(a)  # noqa: BN004, BN001\n"),
    ("x = f(a)  # noqa:BN004,BN011 trailing words\n", _row(1),
     "x = f(a)  # noqa:BN004,BN011, BN001 trailing words\n"),
    ("x = f(a)  # keep this\n", _row(1), "x = f(a)  # keep this  # noqa: BN001\n"),
    ("x = f(a) + \\\n    g(b)\n", Span(Pos(1, 4), Pos(2, 8)),
     "x = f(a) + \\\n    g(b)  # noqa: BN001\n"),  # no comment after a backslash
    ('x = f("""a\nb""", c)\n', Span(Pos(1, 4), Pos(2, 9)),
     'x = f("""a\nb""", c)  # noqa: BN001\n'),  # the first row ends inside a string
    ("x = f(a) + \\\n    g(b)\n", _row(1), None),
    ("x = f(a)\r\ny = 2\r\n", _row(1), "x = f(a)  # noqa: BN001\r\ny = 2\r\n"),
])
def test_noqa_edit(text: str, span: Span, expected: str | None) -> None:
    assert _noqa(text, span) == expected


def test_noqa_edit_silences_the_real_finding(tmp_path: Path) -> None:
    from bnfix.api import check_source

    text = example_text(BN001)
    (finding,) = check_source(text, "model.py")
    silenced = _noqa(text, finding.span, finding.code)
    assert silenced is not None and check_source(silenced, "model.py") == []


def test_analyse_fixes_like_bnfix_fix(tmp_path: Path) -> None:
    root = write_tree(tmp_path, {"pyproject.toml": CONFIG, "models/__init__.py": "",
                                 "models/layers.py": LAYERS, "train.py": TRAIN})
    layers = root / "models/layers.py"
    doc = Document(layers.as_uri(), layers, layers.read_text())
    unsafe = analyse([doc], cache=False, fix_uri=doc.uri, unsafe=True).results[doc.uri]
    safe = analyse([doc], cache=False, fix_uri=doc.uri).results[doc.uri]
    assert not safe.changed  # BN001's fix changes behaviour: not in a safe fix-all
    assert bnfix("fix", "--unsafe-fixes", "--no-cache", ".", cwd=root) == 0
    assert unsafe.new_text == layers.read_text() != doc.text


def test_documents_that_are_no_files_are_analysed_alone() -> None:
    doc = Document("untitled:Untitled-1", None, example_text(BN001))
    outcome = analyse([doc], cache=False)
    assert [d.code for d in outcome.results[doc.uri].diagnostics] == ["BN001"]


SCRIPT_THAT_MUST_NOT_RUN = """
import pathlib
pathlib.Path(__file__).with_name("EXECUTED").write_text("user code ran")
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8))
dist.init_process_group("nccl")
model = DDP(model.cuda())
"""


def test_the_server_imports_no_framework_and_runs_no_user_code(tmp_path: Path) -> None:
    root = write_tree(tmp_path, {"pyproject.toml": CONFIG, "tf_model.py": example_text(BN001),
                                 "ddp.py": SCRIPT_THAT_MUST_NOT_RUN})
    probe = (
        "import sys\n"
        "from pathlib import Path\n"
        "from bnfix.lsp.analysis import Document, analyse\n"
        "from bnfix.lsp.server import create_server\n"
        "create_server()\n"
        "docs = [Document(p.as_uri(), p, p.read_text()) for p in sorted(Path.cwd().glob('*.py'))]\n"
        "outcome = analyse(docs)\n"
        "print('CODES', sorted(d.code for r in outcome.results.values() for d in r.diagnostics))\n"
        "print('HEAVY', sorted(m for m in sys.modules if m.split('.')[0] in {'tensorflow', "
        "'torch', 'keras', 'tf_keras', 'onnx', 'onnxruntime', 'jax', 'numpy', 'ddp', 'tf_model'}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", probe], cwd=root, capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "CODES ['BN001', 'BN006']" in proc.stdout, proc.stdout
    assert "HEAVY []" in proc.stdout, proc.stdout
    assert not (root / "EXECUTED").exists()


BLOCK_PYGLS = """
import sys
from importlib.abc import MetaPathFinder

class Missing(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("pygls", "lsprotocol"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

sys.meta_path.insert(0, Missing())
from bnfix.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_without_pygls_the_server_says_which_extra_to_install() -> None:
    proc = subprocess.run([sys.executable, "-c", BLOCK_PYGLS, "server"], capture_output=True,
                          text=True, timeout=120, check=False, stdin=subprocess.DEVNULL)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and 'pip install "bnfix[lsp]"' in proc.stderr


def test_server_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["server", "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "docs/editor.md" in out and "--no-cache" in out and "shutdown" in out  # exit codes
    with pytest.raises(SystemExit) as done:
        main(["server", "--debounce", "soon"])
    assert done.value.code == 2


NVIM_PROBE = """
vim.wait(60000, function() return #vim.diagnostic.get(0) > 0 end, 50)
local out = {}
local found = vim.diagnostic.get(0)
for _, d in ipairs(found) do
  table.insert(out, string.format("DIAGNOSTIC %s %d %d %s", d.code or "-", d.lnum, d.col, d.message))
end
if found[1] then
  vim.api.nvim_win_set_cursor(0, {found[1].lnum + 1, found[1].col})
  local params = vim.lsp.util.make_range_params()
  params.context = { diagnostics = vim.lsp.diagnostic.get_line_diagnostics() }
  for _, r in pairs(vim.lsp.buf_request_sync(0, "textDocument/codeAction", params, 60000) or {}) do
    for _, a in ipairs(r.result or {}) do table.insert(out, "ACTION " .. a.title) end
  end
end
vim.fn.writefile(out, "probe.out")
vim.lsp.stop_client(vim.lsp.get_active_clients())  -- shutdown, exit: quicker than at quit
vim.wait(60000, function() return #vim.lsp.get_active_clients() == 0 end, 20)
vim.cmd("qa!")
"""


@pytest.mark.skipif(shutil.which("nvim") is None, reason="needs Neovim")
def test_the_documented_neovim_snippet_works(tmp_path: Path) -> None:
    """docs/editor.md's Neovim 0.7-0.10 snippet, run in a headless Neovim."""
    doc = (Path(__file__).resolve().parents[1] / "docs" / "editor.md").read_text()
    (snippet,) = [b for b in re.findall(r"```lua\n(.*?)```", doc, re.DOTALL) if "start_client" in b]
    root = write_tree(tmp_path, {"pyproject.toml": CONFIG, "model.py": example_text(BN001),
                                 "init.lua": snippet, "probe.lua": NVIM_PROBE})
    (expected,) = check_json(root, "model.py")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "XDG_CONFIG_HOME": str(tmp_path / "config"), "XDG_DATA_HOME": str(tmp_path / "data"),
           "XDG_STATE_HOME": str(tmp_path / "state")}
    subprocess.run(["nvim", "--headless", "-u", "init.lua", "model.py", "-c", "luafile probe.lua"],
                   cwd=root, env=env, capture_output=True, timeout=120, check=False,
                   stdin=subprocess.DEVNULL)
    lines = (root / "probe.out").read_text().splitlines()
    assert lines[0] == (f"DIAGNOSTIC BN001 {expected['location']['row'] - 1} "
                        f"{expected['location']['column'] - 1} {expected['message']}")
    assert any(line.startswith("ACTION Fix BN001") and line.endswith("(unsafe fix)")
               for line in lines)
    assert "ACTION Disable BN001 for this line" in lines
