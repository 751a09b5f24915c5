"""Where a call's pieces are in the text: the anchors edits attach to."""

from __future__ import annotations

import ast

from bnfix.findings import Pos, Span
from bnfix.ir import CallInfo
from bnfix.source.text import SourceText


def call_info(text: SourceText, call: ast.Call, align: bool = False) -> CallInfo:
    """Where a call's pieces are, for edits: span, callee, end of the last argument, ')', and
    (with `align`) the continuation rows indented to line up with the '('."""
    span = text.span(call)
    items: list[ast.AST] = [*call.args, *call.keywords]
    args_end: Pos | None = None
    if items:
        last = max(items, key=lambda n: (n.end_lineno, n.end_col_offset))  # type: ignore[attr-defined]
        args_end = text.pos(last.end_lineno, last.end_col_offset)  # type: ignore[attr-defined]
    close = Pos(span.end.row, span.end.col - 1)
    between = text.slice(Span(args_end, close)) if args_end else ""
    return CallInfo(
        span=span,
        callee=text.slice(text.span(call.func)),
        args_end=args_end,
        close_paren=close,
        trailing_comma="," in _strip_comments(between),
        multiline=span.start.row != span.end.row,
        aligned_rows=_aligned_rows(text, call, span) if align else (),
    )


def _aligned_rows(text: SourceText, call: ast.Call, span: Span) -> tuple[int, ...]:
    if span.start.row == span.end.row:
        return ()
    callee_end = text.span(call.func).end
    line = text.line(callee_end.row)
    paren = line.find("(", callee_end.col)
    if paren < 0 or line[callee_end.col:paren].strip():
        return ()
    rows = tuple(r for r in range(callee_end.row + 1, span.end.row + 1)
                 if text.line(r).strip() and len(text.indentation(r)) == paren + 1)
    if rows:  # a row that begins inside a multi-line string of the call is string content
        inside = {r for node in ast.walk(call)
                  if isinstance(node, (ast.Constant, ast.JoinedStr)) and node.end_lineno
                  and node.end_lineno > node.lineno
                  for r in range(node.lineno + 1, node.end_lineno + 1)}
        rows = tuple(r for r in rows if r not in inside)
    return rows


def _strip_comments(text: str) -> str:
    return "\n".join(line.split("#", 1)[0] for line in text.splitlines())


def unpacks(call: ast.Call) -> bool:
    """`*args` or `**kwargs` at the call: arguments not known one by one."""
    return any(isinstance(a, ast.Starred) for a in call.args) or \
        any(k.arg is None for k in call.keywords)
