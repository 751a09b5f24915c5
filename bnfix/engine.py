"""The rule engine: for one file, a cheap text pre-filter, one lift into the IR, every enabled
rule over that IR, suppressions, and fix application (iterated until nothing more applies)."""

from __future__ import annotations

import hashlib
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from bnfix.checks import ENGINE_CODES, Check, registry
from bnfix.checks.names import is_test_module
from bnfix.config import CURRENT_TENSORFLOW
from bnfix.findings import Applicability, Diagnostic, FileResult, Pos, RelatedLocation, Span
from bnfix.rulebook import ApiSpec, RuleBook
from bnfix.source.reader import SourceError, decode

if TYPE_CHECKING:
    from bnfix.ir import Finding, ModuleIR
    from bnfix.project.session import FileProject
    from bnfix.project.summary import ModuleSummary
    from bnfix.source.imports import ModuleContext
    from bnfix.source.resolve import Resolver
    from bnfix.source.text import SourceText

MAX_FIX_PASSES = 10
# A rule trigger that stands for the BN API names of the catalogue (`@bn-apis:tensorflow`:
# those of one framework): a file that mentions none of them cannot hold a BN site.
BN_APIS = "@bn-apis"


SNIPPET_WIDTH = 200  # characters of a row shown around a finding (a minified row is not shown whole)
ELLIPSIS = "…"


def _snippet(source: SourceText, span: Span) -> tuple[tuple[tuple[int, str], ...],
                                                     tuple[int, ...]]:
    """The rows around `span` for display, and how far each was shifted: a row longer than
    SNIPPET_WIDTH is cut to a window around the span's start (marked with `…`), so a finding
    costs O(width), not O(row) — thousands of findings on one 2 MB row stay cheap."""
    first = max(1, span.start.row - 1)
    last = min(source.row_count, span.end.row + 1, first + 7)
    col = max(0, span.start.col - SNIPPET_WIDTH // 4)
    rows, shifts = [], []
    for row in range(first, last + 1):
        start, end = _row_bounds(source, row)
        if end - start <= SNIPPET_WIDTH:
            rows.append((row, source.text[start:end]))
            shifts.append(0)
            continue
        piece = source.text[start + col:min(end, start + col + SNIPPET_WIDTH)]
        cut_end = start + col + SNIPPET_WIDTH < end
        rows.append((row, (ELLIPSIS if col else "") + piece + (ELLIPSIS if cut_end else "")))
        shifts.append(col - 1 if col else 0)
    return tuple(rows), tuple(shifts) if any(shifts) else ()


def _row_bounds(source: SourceText, row: int) -> tuple[int, int]:
    """Offsets of `row`'s first character and of its end (its line ending excluded)."""
    start = source.offset(Pos(row, 0))
    end = source.offset(Pos(row + 1, 0)) if row < source.row_count else len(source.text)
    while end > start and source.text[end - 1] in "\r\n":
        end -= 1
    return start, end


class Triggers:
    """Which rules a text can concern, from one search per distinct trigger word: words that
    contain a shorter trigger word (`SyncBatchNorm` holds `BatchNorm`) are only searched in
    texts that hold the shorter one. A rule with required words (`requires`) concerns a text
    that holds one of its trigger words and one of those (BN005: a tower transposition, and a
    sum)."""

    def __init__(self, by_code: dict[str, tuple[str, ...]],
                 required: dict[str, tuple[str, ...]] | None = None) -> None:
        self.always = frozenset(code for code, words in by_code.items() if not words)
        self.required = {code: frozenset(words) for code, words in (required or {}).items()
                         if words and code in by_code}
        self.codes: dict[str, set[str]] = {}
        for code, words in by_code.items():
            for word in words:
                self.codes.setdefault(word, set()).add(code)
        for words in self.required.values():
            for word in words:
                self.codes.setdefault(word, set())
        ordered = sorted(self.codes, key=len)
        self.children: dict[str, list[str]] = {}
        self.roots: list[str] = []
        for word in ordered:
            parent = next((p for p in reversed(ordered[:ordered.index(word)]) if p in word), None)
            if parent is None:
                self.roots.append(word)
            else:
                self.children.setdefault(parent, []).append(word)

    def words(self, text: str) -> set[str]:
        found: set[str] = set()
        stack = [w for w in self.roots if w in text]
        while stack:
            word = stack.pop()
            found.add(word)
            stack.extend(w for w in self.children.get(word, ()) if w in text)
        return found

    def concerns(self, text: str) -> bool:
        """Some rule with trigger words concerns the text (its required words found too)."""
        found = self.words(text)
        return any(code not in self.required or self.required[code] & found
                   for word in found for code in self.codes[word])

    def relevant(self, text: str) -> set[str]:
        out = set(self.always)
        found = self.words(text)
        for word in found:
            out |= self.codes[word]
        return {code for code in out if code not in self.required or self.required[code] & found}


class Lifted(NamedTuple):
    """A parsed, walked and resolved module (kept between the project's two passes)."""

    source: SourceText
    module: ModuleIR
    resolver: Resolver
    text_digest: str


class Engine:
    def __init__(self, book: RuleBook, enabled: frozenset[str],
                 targets: dict[str, tuple[int, ...]] | None = None,
                 all_syntax_errors: bool = False) -> None:
        self.book = book
        self.enabled = enabled
        # parse every file for BN900, also those no rule needs to look at (slower)
        self.all_syntax_errors = all_syntax_errors
        self.targets = dict(targets) if targets else {"tensorflow": CURRENT_TENSORFLOW}
        self.target_explicit = False  # the target comes from configuration or the project's pins
        # the project root when no target is configured: a file's folder (or its parents up
        # to it) may pin TensorFlow on its own (a `tf2/requirements.txt` beside TF1 pins)
        self.pin_root: str | None = None
        self._pins: dict[Path, tuple[int, ...] | None] = {}
        self.not_in_tests = frozenset(c for c in enabled if not book.rules[c].in_tests)
        by_code = {code: tuple(sorted(set(self._words(book.rules[code].triggers))))
                   for code in sorted(enabled - ENGINE_CODES)}
        required = {code: rule.requires for code, rule in book.rules.items()}
        self.triggers = Triggers(by_code, required)
        # what makes a file worth summarising for the project: any source rule's words (the
        # rules enabled here may read what other files' code says), and the catalogue's list
        words = {"summary": tuple(book.catalogue.training.get("summary", {}).get("words", ()))}
        for code, rule in book.rules.items():
            if rule.target == "source" and code not in ENGINE_CODES:
                words[code] = tuple(self._words(rule.triggers))
        self.summary_triggers = Triggers(words, required)
        # rules that can fire on what other files of the project say (checked in a file that
        # calls or is called by BN code elsewhere, whatever its own words)
        self.project_codes = frozenset(c for c in enabled if book.rules[c].project)

    def _words(self, triggers: tuple[str, ...]) -> list[str]:
        """A rule's trigger words (`@bn-apis[:framework]` expands to the catalogue's BN names)."""
        words: list[str] = []
        for trigger in triggers:
            if trigger == BN_APIS or trigger.startswith(BN_APIS + ":"):
                framework = trigger.partition(":")[2] or None
                words.extend(self.book.catalogue.trigger_words(framework))
            else:
                words.append(trigger)
        return words

    @cached_property
    def catalogue_ids(self) -> dict[str, ApiSpec]:
        return {spec.id: spec for spec in self.book.catalogue.apis.values()}

    @cached_property
    def checks(self) -> dict[str, Check]:
        """The enabled rules' logic, imported on first use: a run served from the cache never
        loads the analysis."""
        checks = registry()
        return {code: checks[code] for code in sorted(self.enabled) if code in checks}

    # -- analysis --------------------------------------------------------------------------

    def relevant(self, text: str, path: str, ignored: frozenset[str] = frozenset()) -> set[str]:
        """The enabled rules this text can concern (by its words)."""
        if is_test_module(path):
            ignored = ignored | self.not_in_tests
        return self.triggers.relevant(text) - ignored - ENGINE_CODES

    def lift(self, text: str, path: str, context: ModuleContext | None = None) -> Lifted:
        """Parse, walk and resolve (raises SourceError for BN900)."""
        from bnfix.source import lift as lifting
        from bnfix.source.reader import parse
        from bnfix.source.text import SourceText

        tree = parse(text, path)
        source = SourceText(text)
        resolver, module = lifting.lift_with_resolver(source, tree, path, self.book.catalogue,
                                                      context)
        module.targets = self.targets
        module.target_explicit = self.target_explicit
        if self.pin_root is not None:
            from bnfix.project.pins import nearest_pin

            pinned = nearest_pin(Path(path).resolve().parent, Path(self.pin_root), self._pins)
            if pinned is not None:  # UNVERSIONED (()): required without a pin, as if unpinned
                module.targets = {**self.targets, "tensorflow": pinned or CURRENT_TENSORFLOW}
                module.target_explicit = bool(pinned)
        module.in_package = context is not None and (context.package or "." in context.import_name)
        return Lifted(source, module, resolver, hashlib.sha256(text.encode()).hexdigest())

    def diagnose(self, text: str, path: str, ignored: frozenset[str] = frozenset(),
                 project: FileProject | None = None, lifted: Lifted | None = None) -> list[Diagnostic]:
        """All diagnostics of one source text (no suppressed ones). With `project`, the
        file is seen as part of its project (what other files' summaries say about it)."""
        codes = self.relevant(text, path, ignored)
        if not codes and project is None and not self.all_syntax_errors:
            return []
        if lifted is None or lifted.text_digest != hashlib.sha256(text.encode()).hexdigest():
            try:
                lifted = self.lift(text, path, project.context if project else None)
            except SourceError as exc:
                return self._error(path, exc, ignored)
        module = lifted.module
        if project is not None and project.attach(lifted, self.catalogue_ids):
            extra = self.project_codes - ignored  # what other files say can make them fire here
            if is_test_module(path):
                extra -= self.not_in_tests
            codes |= extra
        if not codes:
            return []
        findings: list[Finding] = []
        for code in sorted(codes):
            check = self.checks.get(code)
            if check is not None:
                findings.extend(check(module))
        if not findings:
            return []
        from bnfix.source.noqa import Suppressions
        from bnfix.source.writer import buildable, lower

        source = lifted.source
        suppressions = Suppressions.scan(source)
        out = []
        for f in sorted(findings, key=lambda f: (f.span.start, f.code)):
            if suppressions.suppressed(f.code, f.span.start.row, f.span.end.row):
                continue
            fix = buildable(lower(f.fix, source)) if f.fix is not None else None
            rule = self.book.rules[f.code]
            related = tuple(RelatedLocation(r.path or path, r.span, r.message) for r in f.related)
            snippet, shifts = _snippet(source, f.span)
            out.append(Diagnostic(path, f.code, rule.name, f.span, f.message, fix, rule.url,
                                  snippet, related, shifts))
        return out

    def summarize(self, lifted: Lifted, module_id: str, import_name: str,
                  path: str) -> ModuleSummary:
        from bnfix.project.summarize import Summarizer

        return Summarizer(lifted.resolver, lifted.module, module_id, import_name, path).summary()

    def _error(self, path: str, exc: SourceError, ignored: frozenset[str]) -> list[Diagnostic]:
        if exc.code not in self.enabled or exc.code in ignored:
            return []
        rule = self.book.rules[exc.code]
        span = Span.at(Pos(exc.row, exc.col))
        return [Diagnostic(path, exc.code, rule.name, span, exc.message, None, rule.url)]

    # -- fixing ----------------------------------------------------------------------------

    def fix_text(self, text: str, path: str, unsafe: bool,
                 ignored: frozenset[str] = frozenset(), project: FileProject | None = None,
                 lifted: Lifted | None = None) -> FileResult:
        """Apply fixes until none applies; the result holds the remaining diagnostics."""
        from bnfix.source.text import SourceText
        from bnfix.source.writer import apply_fixes, final_check

        result = FileResult(path)
        diagnostics = self.diagnose(text, path, ignored, project, lifted)
        current = text
        for _ in range(MAX_FIX_PASSES):
            todo = [d for d in diagnostics if d.fixable and (
                unsafe or d.fix.applicability is Applicability.SAFE)]  # type: ignore[union-attr]
            if not todo:
                break
            applied = apply_fixes(SourceText(current), [d.fix for d in todo])  # type: ignore[misc]
            for index, why in applied.rejected.items():
                d = todo[index]
                note = (f"{path}:{d.span.start.row}: fix for {d.code} dropped: the result would "
                        f"not parse ({why})")
                if note not in result.notes:
                    result.notes.append(note)
            if not applied.applied:
                break
            result.fixed.extend(todo[i] for i in applied.applied)
            current = applied.text
            diagnostics = self.diagnose(current, path, ignored, project)
        if current != text:
            problem = final_check(current, text)
            if problem is not None:  # CPython accepted every pass; LibCST does not: write nothing
                result.notes.append(f"{path}: fixes dropped: LibCST cannot round-trip the result "
                                    f"({problem})")
                result.fixed = []
                current = text
                diagnostics = self.diagnose(text, path, ignored, project, lifted)
        result.diagnostics = diagnostics
        if current != text:
            result.original, result.new_text = text, current
        return result

    # -- files -----------------------------------------------------------------------------

    def run_file(self, path: Path, *, fix: bool, unsafe: bool,
                 ignored: frozenset[str] = frozenset(), known: str | None = None) -> FileResult:
        """Check (or fix) one file; with `known`, a file whose content has that digest is not
        analysed again (the caller has its findings)."""
        shown = str(path)
        try:
            data = path.read_bytes()
        except OSError as exc:
            reason = exc.strerror or str(exc)
            error = SourceError("BN901", f"cannot read: {reason}")
            return FileResult(shown, self._error(shown, error, ignored))
        data_digest = hashlib.sha256(data).hexdigest()
        if known is not None and data_digest == known:
            return FileResult(shown, digest=data_digest, unchanged=True)
        try:
            decoded = decode(data)
        except SourceError as exc:
            return FileResult(shown, self._error(shown, exc, ignored), digest=data_digest)
        if not fix:
            return FileResult(shown, self.diagnose(decoded.text, shown, ignored),
                              encoding=decoded.encoding, digest=data_digest)
        result = self.fix_text(decoded.text, shown, unsafe, ignored)
        result.encoding = decoded.encoding
        result.digest = data_digest
        return result
