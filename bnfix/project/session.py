"""The project pass of `bnfix check` / `bnfix fix`: the unit of analysis is the project.

1. Scope: every Python file of the project (the configuration's root, else the git root, else
   the common folder of the given paths), each mapped to its module (`modules.py`).
2. Summaries: each file that mentions what a rule looks for is lifted once and summarised; then
   files that mention a first-party name which builds BN (a wrapper of a wrapper, a script that
   only calls `Net(...)`) are summarised too, for a few rounds. Summaries come from the cache
   when the file is unchanged.
3. The index joins the summaries.
4. Findings for the files asked about: each file is checked with the index attached (the lifted
   module of step 2 is reused), unless its cached findings are still valid: same content, and
   the same digests of every summary in its dependency cone (the modules it reaches and the
   modules that reach it) or, when the cone changed, the same project context (what the check
   reads of the index: computed, digested and compared before the file is sent to a worker).

Work is spread over worker processes that keep what they lifted between steps 2 and 4 (a file
goes to the same worker both times)."""

from __future__ import annotations

import hashlib
import io
import os
import re
import sys
import tokenize
import traceback
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from bnfix.engine import Engine, Lifted
from bnfix.findings import FileResult
from bnfix.project.modules import ModuleRef
from bnfix.project.readme import load_pattern, loads_in
from bnfix.project.runner import mentioned
from bnfix.project.summary import ModuleSummary
from bnfix.project.view import FileContext, Marks, ProjectView
from bnfix.source.imports import ModuleContext
from bnfix.source.reader import DEFAULT_MAX_FILE_BYTES, Skipped, SourceError, decode, read_source

if TYPE_CHECKING:
    from bnfix.project.runner import Names

# A module nested deeper than Python's recursion limit allows the analysis (an `elif` chain
# of thousands of branches, an expression nested hundreds deep): one BN900, the run goes on.
TOO_DEEP = SourceError("BN900", "cannot analyse: nested too deeply for bnfix (Python's recursion "
                                "limit); simplify the nesting or exclude the file")


@dataclass
class FileProject:
    """One file as part of its project: its module, and (in the checking step) what the
    project knows about it."""

    path: str
    module_id: str
    context: ModuleContext
    known: FileContext | None = None

    def attach(self, lifted: Lifted, catalogue_ids: dict) -> bool:  # type: ignore[type-arg]
        """Attach what the project knows to the lifted module (once); whether there was
        anything to attach."""
        if self.known is None or self.known.empty:
            return False
        if not getattr(lifted.module, "_project_attached", False):
            view = ProjectView(self.known, self.module_id, catalogue_ids)
            view.attach(lifted.resolver, lifted.module)
            lifted.module._project_attached = True  # type: ignore[attr-defined]
        return True


@dataclass
class Summarised:
    """What step 2 learnt of one file."""

    path: str
    digest: str | None  # of the bytes read (None: unreadable)
    summary: ModuleSummary | None
    relevant: bool  # mentions a rule's trigger words
    error: FileResult | None = None  # BN900/BN901 (reported if the file is asked about)
    note: str | None = None  # skipped, with why
    internal: str | None = None  # an unexpected exception (a bnfix bug): its traceback
    stat: tuple[int, int] | None = None  # (mtime_ns, size) taken before the file was read
    reused: bool = False  # the content had the cached digest: the cached summary stands


@dataclass
class Worker:
    """The per-process state: an engine, the modules it lifted (by path), and the index."""

    engine: Engine
    max_bytes: int = DEFAULT_MAX_FILE_BYTES
    lifted: dict[str, tuple[str, str, Lifted]] = field(default_factory=dict)  # path -> digest, encoding, lifted
    first_party: frozenset[str] = frozenset()
    # texts that stand in for files, by absolute path (an editor's unsaved buffers)
    overlay: dict[str, str] = field(default_factory=dict)
    # the words of files searched by `mentions` (the next expansion round searches them again
    # for more names: one read and one split per file, not one per round)
    words: dict[str, frozenset[str]] = field(default_factory=dict)
    # the weight-loader calls looked for in files that do not parse (False: none to look for)
    _loads: re.Pattern[str] | bool | None = None

    # the project's marks, which every file's context holds (sent once per run)
    marks: Marks = field(default_factory=dict)

    def set_project(self, first_party: frozenset[str]) -> None:
        self.first_party = first_party

    def set_marks(self, marks: Marks) -> None:
        self.marks = marks

    def read(self, path: str) -> bytes:
        """The file's bytes; for a path in the overlay, its text encoded as its coding
        declaration says (what saving it would write), so that decode() gives the text back."""
        text = self.overlay.get(path)
        if text is None:
            return read_source(path, self.max_bytes)
        return encode_source(text)

    def summarise_file(self, path: str, module: ModuleRef, force: bool, keep: bool,
                       known: str | None) -> Summarised:
        try:
            return self.summarise(path, module.module_id, module.import_name,
                                  module.context(self.first_party), force, keep, known)
        except Exception:  # noqa: BLE001 - a bnfix bug: reported for this file, the others go on
            self.lifted.pop(path, None)
            return Summarised(path, None, None, False, internal=traceback.format_exc())

    def check_file(self, path: str, module: ModuleRef | None, known: FileContext | None,
                   ignored: frozenset[str], fix: bool, unsafe: bool) -> FileResult:
        project = None
        try:
            if module is not None:
                context = module.context(self.first_party)
                if known is not None and known.star_names:
                    context = context._replace(star_names=known.star_names)
                if known is not None and known.marks is None:
                    known = replace(known, marks=self.marks)
                project = FileProject(path, module.module_id, context, known)
            return self.check(path, project, fix=fix, unsafe=unsafe, ignored=ignored, known=None)
        except Exception:  # noqa: BLE001 - a bnfix bug: reported for this file, the others go on
            return FileResult(path, ignored=ignored, internal=traceback.format_exc())

    def summarise(self, path: str, module_id: str, import_name: str, context: ModuleContext,
                  force: bool, keep: bool, known: str | None = None) -> Summarised:
        """Read and (if it mentions a rule's words, or `force`) lift and summarise one file;
        with `known`, content with that digest is not lifted again (the cache has it)."""
        before = None
        if path not in self.overlay:  # an overlay's summary is not the file's: never cached
            try:
                st = os.stat(path)
                before = (st.st_mtime_ns, st.st_size)
            except OSError:
                pass
        try:
            data = self.read(path)
        except Skipped as exc:
            return Summarised(path, None, None, False, note=str(exc))
        except SourceError as exc:
            return Summarised(path, None, None, False,
                              error=FileResult(path, self.engine._error(path, exc, frozenset())))
        digest = hashlib.sha256(data).hexdigest()
        if known is not None and digest == known:
            return Summarised(path, digest, None, False, stat=before, reused=True)
        try:
            decoded = decode(data)
        except SourceError as exc:
            return Summarised(path, digest, None, False,
                              error=FileResult(path, self.engine._error(path, exc, frozenset()),
                                               digest=digest))
        relevant = self.engine.summary_triggers.concerns(decoded.text)
        if not (relevant or force):
            return Summarised(path, digest, None, False, stat=before)
        try:
            lifted = self.engine.lift(decoded.text, path, context)
            summary = self.engine.summarize(lifted, module_id, import_name, path)
        except (SourceError, RecursionError) as exc:
            error = exc if isinstance(exc, SourceError) else TOO_DEEP
            return Summarised(path, digest, self._unparsed(decoded.text, module_id, import_name,
                                                           path), relevant, stat=before,
                              error=FileResult(path, self.engine._error(path, error, frozenset()),
                                               digest=digest))
        summary.digest  # noqa: B018  (computed here, in the worker; it travels with the summary)
        if keep:
            self.lifted[path] = (digest, decoded.encoding, lifted)
        return Summarised(path, digest, summary, relevant, stat=before)

    def _unparsed(self, text: str, module_id: str, import_name: str, path: str
                  ) -> ModuleSummary | None:
        """What the project can still learn of a file that does not parse: where its text
        loads trained weights (readme.py), as the marks of an otherwise empty summary."""
        if self._loads is None:
            restores = self.engine.book.catalogue.training.get("restores", {})
            self._loads = load_pattern(tuple(restores.get("weight_methods", ())),
                                       tuple(restores.get("weight_functions", ()))) or False
        found = loads_in(text, self._loads) if self._loads else []
        if not found:
            return None
        summary = ModuleSummary(module_id, import_name, path,
                                marks=tuple(("loads_weights", loc, None) for loc in found))
        summary.digest  # noqa: B018  (computed in the worker, as for a parsed file)
        return summary

    def mentions(self, path: str, names: Names) -> tuple[str, bool]:
        """Whether the file's text holds one of the names and the name of a module that gives
        it (as words: a file can call `build_model` of `models/factory.py` only through an
        import that names `factory`, or a module that gives it on, see names.py)."""
        words = self.words.get(path)
        if words is None:
            try:
                text = decode(self.read(path)).text
            except (Skipped, SourceError):
                return path, False
            # the text's words (a regex alternation of hundreds of names cost ~6 ms a file)
            words = self.words[path] = frozenset(map(sys.intern, _WORD.findall(text)))
        return path, mentioned(words, names)

    def check(self, path: str, project: FileProject | None, *, fix: bool, unsafe: bool,
              ignored: frozenset[str], known: str | None) -> FileResult:
        kept = self.lifted.pop(path, None)
        try:
            data = self.read(path)
        except Skipped as exc:
            return FileResult(path, notes=[f"{path}: {exc}"], ignored=ignored)
        except SourceError as exc:
            return FileResult(path, self.engine._error(path, exc, ignored), ignored=ignored)
        digest = hashlib.sha256(data).hexdigest()
        if known is not None and digest == known:
            return FileResult(path, digest=digest, unchanged=True, ignored=ignored)
        try:
            decoded = decode(data)
        except SourceError as exc:
            return FileResult(path, self.engine._error(path, exc, ignored), digest=digest,
                              ignored=ignored)
        lifted = kept[2] if kept is not None and kept[0] == digest else None
        if lifted is not None and project is not None and project.context.star_names:
            own = lifted.resolver.w.imports.bindings()
            if any(name not in own for names in project.context.star_names.values()
                   for name in names):
                lifted = None  # lifted without names its star imports bind: lift it again
        try:
            if fix:
                result = self.engine.fix_text(decoded.text, path, unsafe, ignored, project, lifted)
            else:
                result = FileResult(path, self.engine.diagnose(decoded.text, path, ignored,
                                                               project, lifted))
        except RecursionError:
            return FileResult(path, self.engine._error(path, TOO_DEEP, ignored), digest=digest,
                              ignored=ignored)
        result.encoding = decoded.encoding
        result.digest = digest
        result.ignored = ignored
        return result


def encode_source(text: str) -> bytes:
    """`text` as the bytes of a file: in the encoding its PEP 263 cookie declares (UTF-8 by
    default); raises SourceError (BN901) when the text cannot be written in it."""
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(text.encode("utf-8")).readline)
    except SyntaxError:
        encoding = "utf-8"  # an unknown codec is declared: decode() reports it
    if encoding == "utf-8-sig":  # the text holds its byte-order mark
        encoding = "utf-8"
    try:
        return text.encode(encoding)
    except UnicodeEncodeError as exc:
        raise SourceError("BN901", f"cannot be written as {encoding}, the encoding it declares "
                                   f"({exc.reason} at character {exc.start}); declare another "
                                   "one or remove the character") from exc


_WORD = re.compile(r"\w+")  # a name is a whole word, as `\bname\b` matches it


__all__ = ["FileProject", "Summarised", "Worker"]
