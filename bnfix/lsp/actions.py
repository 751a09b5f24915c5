"""The edits behind the code actions: one finding's fix (offered only when the result parses,
as `bnfix fix` checks it), and the `# noqa: CODE` comment that silences a finding on its line."""

from __future__ import annotations

import ast
import re

from bnfix.findings import Diagnostic, Edit, Pos, Span
from bnfix.source.noqa import Suppressions
from bnfix.source.text import SourceText
from bnfix.source.writer import apply_fixes, final_check

# a `# noqa: A1, B2` list in a comment (the shape bnfix.source.noqa reads), up to its last code
_NOQA_CODES = re.compile(r"#\s*noqa:\s*[A-Z]+[0-9]+(?:[\s,]+[A-Z]+[0-9]+)*", re.IGNORECASE)


def fix_edits(source: SourceText, diagnostic: Diagnostic) -> tuple[Edit, ...] | None:
    """The text edits of the finding's fix, or None when it has none that applies (display
    only, or the fixed text would not parse or round-trip)."""
    if not diagnostic.fixable:
        return None
    assert diagnostic.fix is not None
    applied = apply_fixes(source, [diagnostic.fix])
    if not applied.applied or final_check(applied.text) is not None:
        return None
    return tuple(e for e in diagnostic.fix.edits if isinstance(e, Edit))


def noqa_edit(source: SourceText, code: str, span: Span) -> Edit | None:
    """The edit that suppresses `code` for the finding at `span`: the code added to the `#
    noqa:` list of its first row, else `  # noqa: CODE` at that row's end — or the last row's,
    where the first ends inside a string or in a backslash continuation. None when no row can
    take it (then the edit is checked: the result must parse and silence the finding)."""
    for row in dict.fromkeys((span.start.row, span.end.row)):
        edit = _row_edit(source, code, row)
        if edit is None:
            continue
        text = _apply(source, edit)
        try:
            ast.parse(text)
        except (SyntaxError, ValueError):
            continue
        if Suppressions.scan(SourceText(text)).suppressed(code, span.start.row, span.end.row):
            return edit
    return None


def _row_edit(source: SourceText, code: str, row: int) -> Edit | None:
    if row + 1 in source.rows_inside_strings:
        return None  # the row ends inside a multi-line string: a `#` there is text
    line = source.line(row)
    comment = source.comments.get(row)
    if comment is not None and line.endswith(comment):
        found = _NOQA_CODES.search(comment)
        if found is not None:
            at = Pos(row, len(line) - len(comment) + found.end())
            return Edit(Span.at(at), f", {code}")
    elif line.rstrip().endswith("\\"):
        return None  # a continuation: nothing may follow the backslash
    end = len(line.rstrip())
    return Edit(Span(Pos(row, end), Pos(row, len(line))), f"  # noqa: {code}")


def _apply(source: SourceText, edit: Edit) -> str:
    text = source.text
    return text[: source.offset(edit.span.start)] + edit.content + text[source.offset(edit.span.end):]
