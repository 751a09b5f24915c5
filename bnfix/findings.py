"""What every command reports: positions, edits, fixes, and a finding bound to a file (a
diagnostic) with its plain-data form for the cache.

Kept apart from the lifted module's records and the rules' findings (`ir.py`) so that a run
whose findings all come from the cache never imports the analysis: these few records are all
it builds."""

from __future__ import annotations

import os
from enum import Enum
from typing import NamedTuple


class Pos(NamedTuple):
    """A position in a text: 1-based row, 0-based column counted in characters. (Tuples: made
    by the hundred thousand, compared and sorted constantly.)"""

    row: int
    col: int


class Span(NamedTuple):
    start: Pos
    end: Pos

    @staticmethod
    def at(pos: Pos) -> Span:
        return Span(pos, pos)


class Applicability(str, Enum):
    """How sure a fix is (ruff's terms): safe fixes keep the code's intent, unsafe ones may
    change behaviour on purpose (that is the bug fix), display-only ones are advice."""

    SAFE = "safe"
    UNSAFE = "unsafe"
    DISPLAY_ONLY = "display-only"


class Edit(NamedTuple):
    """Replace the text in `span` with `content` (an insertion when the span is empty)."""

    span: Span
    content: str


class WrapStatements(NamedTuple):
    """Wrap whole source rows `first_row..last_row` in a block opened by `header`.

    A structural edit: the writer lowers it to text, re-indenting the rows (never the inside
    of a multi-line string) with the file's own indentation unit."""

    first_row: int
    last_row: int
    header: str


class InsertRows(NamedTuple):
    """Insert whole rows before row `at_row` (one past the last row appends), each indented by
    `indent` plus `level` steps of the file's indentation unit."""

    at_row: int
    indent: str
    lines: tuple[tuple[int, str], ...]  # (level, text)


class DeleteRows(NamedTuple):
    """Delete rows `first_row..last_row` entirely, line endings included."""

    first_row: int
    last_row: int


class TryFinally(NamedTuple):
    """Run `before` rows, then rows `first_row..last_row` inside `try:`, with `finally` rows
    in a `finally:` clause (all at the indentation of `first_row`)."""

    first_row: int
    last_row: int
    before: tuple[str, ...]
    finally_: tuple[str, ...]


EditOp = Edit | WrapStatements | InsertRows | DeleteRows | TryFinally


class Fix(NamedTuple):
    """A rule's proposed change: how sure it is, what it says, and its edits."""

    applicability: Applicability
    message: str
    edits: tuple[EditOp, ...] = ()


def shown_path(path: str) -> str:
    """A path as messages show it: relative to the working folder when it is below it."""
    if not os.path.isabs(path):
        return path
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


# ---------------------------------------------------------------------------------------------
# Diagnostics: findings bound to a file


class RelatedLocation(NamedTuple):
    """Another place a diagnostic depends on (a wrapper's definition, the call that runs it)."""

    path: str
    span: Span
    message: str


class Diagnostic(NamedTuple):
    """A finding bound to a file, with its fix lowered to text edits."""

    path: str
    code: str
    name: str
    span: Span
    message: str
    fix: Fix | None
    url: str
    snippet: tuple[tuple[int, str], ...] = ()  # (row, text) around the span, for display
    related: tuple[RelatedLocation, ...] = ()
    # per snippet row, how far it was shifted when cut to a window around the span (a long
    # row): the column shown first, less one for the `…` that marks the cut; () when none was
    snippet_shift: tuple[int, ...] = ()

    @property
    def fixable(self) -> bool:
        return self.fix is not None and bool(self.fix.edits) and \
            self.fix.applicability is not Applicability.DISPLAY_ONLY


class FileResult:
    """What checking one file gave: its diagnostics, the fixed text if any, and why fixes were
    dropped. (A plain class, as the other records a run builds before any analysis: a
    dataclass costs its module `dataclasses` and `inspect`, a quarter of bnfix's start-up.)"""

    __slots__ = (
        "diagnostics",
        "digest",
        "encoding",
        "fixed",
        "ignored",
        "internal",
        "new_text",
        "notes",
        "original",
        "path",
        "unchanged",
    )

    def __init__(self, path: str, diagnostics: list[Diagnostic] | None = None, *,
                 fixed: list[Diagnostic] | None = None, original: str | None = None,
                 new_text: str | None = None, encoding: str = "utf-8",
                 notes: list[str] | None = None, digest: str | None = None,
                 unchanged: bool = False, ignored: frozenset[str] = frozenset(),
                 internal: str | None = None) -> None:
        self.path = path
        self.diagnostics = [] if diagnostics is None else diagnostics  # what remains
        self.fixed = [] if fixed is None else fixed  # what the fixes removed
        self.original = original  # the text as read, when fixes changed it
        self.new_text = new_text  # the fixed text (not yet written)
        self.encoding = encoding
        self.notes = [] if notes is None else notes  # fixes dropped, and why
        self.digest = digest  # of the bytes read
        self.unchanged = unchanged  # the content matched the cached digest: not analysed again
        self.ignored = ignored  # the per-file ignores it was checked with
        self.internal = internal  # an unexpected exception (a bnfix bug): its traceback

    def __repr__(self) -> str:
        return f"FileResult({self.path!r}, {len(self.diagnostics)} diagnostics)"

    @property
    def changed(self) -> bool:
        return self.new_text is not None and self.new_text != self.original



def diagnostic_to_dict(d: Diagnostic) -> dict:
    """A diagnostic as plain data (for the cache)."""
    fix = None
    if d.fix is not None:
        fix = {"a": d.fix.applicability.value, "m": d.fix.message,
               "e": [[*_span(e.span), e.content] for e in d.fix.edits if isinstance(e, Edit)]}
    return {"c": d.code, "n": d.name, "s": _span(d.span), "m": d.message, "f": fix, "u": d.url,
            "x": [list(row) for row in d.snippet], "o": list(d.snippet_shift),
            "r": [[r.path, *_span(r.span), r.message] for r in d.related]}


def diagnostic_from_dict(data: dict, path: str) -> Diagnostic:
    fix = None
    if data["f"] is not None:
        f = data["f"]
        edits = tuple(Edit(_unspan(e[:4]), e[4]) for e in f["e"])
        fix = Fix(Applicability(f["a"]), f["m"], edits)
    return Diagnostic(path, data["c"], data["n"], _unspan(data["s"]), data["m"], fix, data["u"],
                      tuple((row, text) for row, text in data["x"]),
                      tuple(RelatedLocation(r[0], _unspan(r[1:5]), r[5]) for r in data["r"]),
                      tuple(int(shift) for shift in data.get("o", ())))


def _span(span: Span) -> list[int]:
    return [span.start.row, span.start.col, span.end.row, span.end.col]


def _unspan(values: list[int]) -> Span:
    return Span(Pos(values[0], values[1]), Pos(values[2], values[3]))
