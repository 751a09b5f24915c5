"""Lowering fixes to text edits and applying them.

Rules emit edits against the IR's spans; structural edits (wrap rows in a block) are lowered
here, with the file's own indentation and line endings. Application merges the fixes whose
edits do not overlap, in one pass, and re-parses the result with CPython: a fix that would not
parse is dropped and reported, never written. The final text of a file must also be parsed
and reproduced byte for byte by LibCST before it is written (`final_check`).
"""

from __future__ import annotations

import ast
import bisect
import itertools
import re

from bnfix.findings import (
    Applicability,
    DeleteRows,
    Edit,
    EditOp,
    Fix,
    InsertRows,
    Pos,
    Span,
    TryFinally,
    WrapStatements,
)
from bnfix.source.text import SourceText


def lower(fix: Fix, text: SourceText) -> Fix:
    """`fix` with every structural edit turned into plain text edits. A one-row edit inside
    rows that the same fix wraps in a block is made inside the wrapped text (one edit, not two
    that overlap)."""
    if all(isinstance(e, Edit) for e in fix.edits):
        return fix
    wraps = [op for op in fix.edits if isinstance(op, WrapStatements)]
    inner: dict[int, list[Edit]] = {id(w): [] for w in wraps}
    rest: list[EditOp] = []
    for op in fix.edits:
        home = next((w for w in wraps if isinstance(op, Edit) and _within_rows(op, w)), None)
        if home is not None:
            inner[id(home)].append(op)  # type: ignore[arg-type]
        else:
            rest.append(op)
    return fix._replace(edits=tuple(
        _wrap(op, text, inner[id(op)]) if isinstance(op, WrapStatements) else _lower_op(op, text)
        for op in rest))


def _within_rows(edit: Edit, wrap: WrapStatements) -> bool:
    """A one-row edit of a row the wrap moves (its text has no line break)."""
    row = edit.span.start.row
    return (edit.span.end.row == row and wrap.first_row <= row <= wrap.last_row
            and "\n" not in edit.content and "\r" not in edit.content)


def _lower_op(op: EditOp, text: SourceText) -> Edit:
    if isinstance(op, Edit):
        return op
    if isinstance(op, WrapStatements):
        return _wrap(op, text)
    if isinstance(op, InsertRows):
        return _insert_rows(op, text)
    if isinstance(op, DeleteRows):
        return _delete_rows(op, text)
    return _try_finally(op, text)


def _row_start(text: SourceText, row: int) -> Pos:
    """The start of `row`, or the end of the text for the row after the last one."""
    if row <= text.row_count:
        return Pos(row, 0)
    last = text.row_count
    return Pos(last, len(text.line_with_ending(last)))


def _insert_rows(op: InsertRows, text: SourceText) -> Edit:
    nl, unit = text.newline, text.indent_unit
    body = "".join(op.indent + unit * level + line + nl for level, line in op.lines)
    at = _row_start(text, op.at_row)
    if op.at_row > text.row_count and not text.line_with_ending(text.row_count).endswith(("\n", "\r")):
        body = nl + body  # the file does not end with a newline
    return Edit(Span.at(at), body)


def _delete_rows(op: DeleteRows, text: SourceText) -> Edit:
    return Edit(Span(Pos(op.first_row, 0), _row_start(text, op.last_row + 1)), "")


def _try_finally(op: TryFinally, text: SourceText) -> Edit:
    indent = text.indentation(op.first_row)
    lines = [indent + line for line in op.before] + [indent + "try:"]
    lines += _deeper(text, op.first_row, op.last_row)
    lines.append(indent + "finally:")
    lines += [indent + text.indent_unit + line for line in op.finally_]
    end = Pos(op.last_row, len(text.line(op.last_row)))
    return Edit(Span(Pos(op.first_row, 0), end), text.newline.join(lines))


def _wrap(op: WrapStatements, text: SourceText, inner: list[Edit] | None = None) -> Edit:
    """Replace rows first..last with a header at their indentation and the rows one level
    deeper (rows that begin inside a multi-line string keep their text), with the one-row
    `inner` edits made in them first."""
    indent = text.indentation(op.first_row)
    lines = [indent + op.header, *_deeper(text, op.first_row, op.last_row, inner or [])]
    end = Pos(op.last_row, len(text.line(op.last_row)))
    return Edit(Span(Pos(op.first_row, 0), end), text.newline.join(lines))


def _deeper(text: SourceText, first_row: int, last_row: int,
            inner: list[Edit] | None = None) -> list[str]:
    """Rows first..last one indentation step deeper (rows inside a string keep their text)."""
    unit, inside = text.indent_unit, text.rows_inside_strings
    out = []
    for row in range(first_row, last_row + 1):
        line = text.line(row)
        here = [(i, e) for i, e in enumerate(inner or ()) if e.span.start.row == row]
        for _, e in sorted(here, key=lambda p: (p[1].span.start.col, p[1].span.end.col, p[0]),
                           reverse=True):  # right to left; at one column, the first ends first
            line = line[:e.span.start.col] + e.content + line[e.span.end.col:]
        out.append(line if row in inside or not line.strip() else unit + line)
    return out


class Applied:
    """A text with fixes applied: which were, and why the others were not."""

    __slots__ = ("applied", "rejected", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        self.applied: list[int] = []  # indices of applied fixes
        self.rejected: dict[int, str] = {}  # index -> why


def _overlaps(a: Edit, b: Edit) -> bool:
    if a.span.start == a.span.end and b.span.start == b.span.end:
        return a.span.start == b.span.start
    return a.span.start < b.span.end and b.span.start < a.span.end


class _Taken:
    """Accepted edits kept sorted by start, so a new edit is compared with its neighbours only
    (a file with thousands of fixes stays linear-ish, not quadratic)."""

    def __init__(self) -> None:
        self.starts: list[Pos] = []
        self.edits: list[Edit] = []

    def clashes(self, edit: Edit) -> bool:
        i = bisect.bisect_left(self.starts, edit.span.start)
        return any(_overlaps(edit, self.edits[j]) for j in range(max(0, i - 1), min(len(self.edits), i + 2)))

    def add(self, edit: Edit) -> None:
        i = bisect.bisect_left(self.starts, edit.span.start)
        self.starts.insert(i, edit.span.start)
        self.edits.insert(i, edit)


def _render(text: SourceText, edits: list[Edit]) -> str:
    """The text with `edits` (non-overlapping) applied, in one pass."""
    pieces: list[str] = []
    at = 0
    for edit in sorted(edits, key=lambda e: (e.span.start, e.span.end)):
        start, end = text.offset(edit.span.start), text.offset(edit.span.end)
        pieces.append(text.text[at:start])
        pieces.append(edit.content)
        at = end
    pieces.append(text.text[at:])
    return "".join(pieces)


def parse_error(source: str) -> str | None:
    """Why CPython would not accept `source` (None when it parses). Checked after every pass."""
    try:
        ast.parse(source)
    except (SyntaxError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def final_check(source: str, original: str | None = None) -> str | None:
    """Why LibCST would not accept the final fixed text: it must parse it and reproduce it byte
    for byte (checked once per file, after the last pass). With `original`, only the top-level
    statements the fixes changed are given to LibCST — the rest is byte for byte what the file
    held — so a fix in a 2 MB file costs a LibCST parse of the statement it touches, not of
    2 MB (LibCST builds ~5 Python objects per token: minutes and gigabytes at that size).
    Bare CR line endings are read as LF for the check: LibCST does not reproduce them, CPython
    (which accepted the text) does, and the line-ending style is not what is checked."""
    chunk = source if original is None else changed_statements(original, source)
    if not chunk:
        return None
    chunk = _BARE_CR.sub("\n", chunk)
    import libcst  # imported only when a fix is applied: it costs ~0.3 s to import

    try:
        module = libcst.parse_module(chunk)
        code = module.code
    except libcst.ParserSyntaxError as exc:
        return f"LibCST: {exc.message} (line {exc.raw_line})"
    except RecursionError:
        return "LibCST: nested too deeply for its parser"
    if code != chunk:
        return "LibCST does not round-trip the result"
    return None


UNBUILDABLE = "bnfix could not build this fix's edits (they overlap); please report it"


def buildable(fix: Fix) -> Fix:
    """A lowered fix as offered: one whose own edits overlap could never be applied, so it is
    shown, not counted as fixable (it would keep `bnfix fix` failing forever)."""
    edits = [e for e in fix.edits if isinstance(e, Edit)]
    if not any(_overlaps(a, b) for a, b in itertools.combinations(edits, 2)):
        return fix
    return Fix(Applicability.DISPLAY_ONLY, f"{fix.message} ({UNBUILDABLE})", ())


_BARE_CR = re.compile(r"\r(?!\n)")


def changed_statements(original: str, source: str) -> str:
    """The rows of `source` that hold the top-level statements differing from `original`
    (with the rows between them): "" when nothing differs."""
    old, new = SourceText(original), SourceText(source)
    old_rows = [old.line_with_ending(r) for r in range(1, old.row_count + 1)]
    new_rows = [new.line_with_ending(r) for r in range(1, new.row_count + 1)]
    if old_rows == new_rows:
        return ""
    same = min(len(old_rows), len(new_rows))
    head = next((i for i in range(same) if old_rows[i] != new_rows[i]), same)
    tail = 0
    while tail < same - head and old_rows[-1 - tail] == new_rows[-1 - tail]:
        tail += 1
    first, last = head + 1, max(head + 1, len(new_rows) - tail)  # rows (1-based) that changed
    spans = [(min([s.lineno, *(d.lineno for d in getattr(s, "decorator_list", ()))]),
              s.end_lineno or s.lineno) for s in ast.parse(source).body]
    grown = True
    while grown:  # statements can share a row (`a = f(\n); b = 1`): grow until none is cut
        grown = False
        for start, end in spans:
            if start <= last and end >= first and (start < first or end > last):
                first, last, grown = min(first, start), max(last, end), True
    last = min(last, len(new_rows))
    return "".join(new_rows[first - 1:last])


def apply_fixes(text: SourceText, fixes: list[Fix]) -> Applied:
    """Apply every (lowered) fix whose edits do not overlap an already accepted one, in order
    of position, then check the result parses; a fix that breaks it is dropped."""
    plain = [[e for e in fix.edits if isinstance(e, Edit)] for fix in fixes]
    order = sorted(range(len(fixes)), key=lambda i: min(
        (e.span.start for e in fixes[i].edits if isinstance(e, Edit)), default=Pos(0, 0)))
    accepted: list[int] = []
    taken: list[Edit] = []
    index = _Taken()
    for i in order:
        edits = plain[i]
        if not edits or any(index.clashes(e) for e in edits) or any(
                _overlaps(a, b) for a, b in itertools.combinations(edits, 2)):
            continue
        accepted.append(i)
        taken.extend(edits)
        for edit in edits:
            index.add(edit)
    result = Applied(text.text)
    if not accepted:
        return result
    candidate = _render(text, taken)
    if parse_error(candidate) is None:
        result.text, result.applied = candidate, accepted
        return result
    # Something breaks the file: keep each fix only if it parses alone and together.
    good: list[int] = []
    good_edits: list[Edit] = []
    for i in accepted:
        edits = plain[i]
        error = parse_error(_render(text, good_edits + edits))
        if error is None:
            good.append(i)
            good_edits.extend(edits)
        else:
            result.rejected[i] = error
    result.text = _render(text, good_edits) if good else text.text
    result.applied = good
    return result
