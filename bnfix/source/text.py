"""Source text with a row index: converts CPython `ast` positions (UTF-8 byte columns) into
character positions, and back into offsets for edits. Line endings are the file's own."""

from __future__ import annotations

import bisect
import re
from functools import cached_property

from bnfix.findings import Pos, Span

_NEWLINE = re.compile(r"\r\n|\r|\n")
_WIDE = re.compile(r"[^\x00-\x7f]")


class SourceText:
    def __init__(self, text: str) -> None:
        self.text = text
        starts = [0]
        starts.extend(m.end() for m in _NEWLINE.finditer(text))
        self._starts = starts
        self._wide_maps: dict[int, tuple[list[int], list[int]]] = {}

    @property
    def row_count(self) -> int:
        return len(self._starts)

    @cached_property
    def newline(self) -> str:
        match = _NEWLINE.search(self.text)
        return match.group(0) if match else "\n"

    def line(self, row: int) -> str:
        """Row `row` (1-based) without its line ending."""
        start = self._starts[row - 1]
        end = self._starts[row] if row < len(self._starts) else len(self.text)
        return self.text[start:end].rstrip("\r\n")

    def line_with_ending(self, row: int) -> str:
        start = self._starts[row - 1]
        end = self._starts[row] if row < len(self._starts) else len(self.text)
        return self.text[start:end]

    @cached_property
    def ascii(self) -> bool:
        return self.text.isascii()

    @cached_property
    def _wide_rows(self) -> frozenset[int]:
        """Rows holding a non-ASCII character (only there do byte and character columns
        differ)."""
        if self.ascii:
            return frozenset()
        starts = self._starts
        return frozenset(bisect.bisect_right(starts, m.start()) for m in _WIDE.finditer(self.text))

    def pos(self, lineno: int, byte_col: int) -> Pos:
        """An `ast` position (1-based line, UTF-8 byte column) as a character position."""
        if lineno not in self._wide_rows:
            return Pos(lineno, byte_col)
        starts, extras = self._wide_map(lineno)
        before = bisect.bisect_left(starts, byte_col)  # wide characters before the column
        return Pos(lineno, byte_col - (extras[before - 1] if before else 0))

    def _wide_map(self, row: int) -> tuple[list[int], list[int]]:
        """For a row with non-ASCII characters: the byte column of each, and the bytes beyond
        one per character up to and including it (built once per row: a position costs a
        bisection, not a re-encoding of a row that may be megabytes long)."""
        found = self._wide_maps.get(row)
        if found is None:
            starts: list[int] = []
            extras: list[int] = []
            extra = 0
            for match in _WIDE.finditer(self.line(row)):
                starts.append(match.start() + extra)
                extra += len(match.group().encode("utf-8")) - 1
                extras.append(extra)
            found = self._wide_maps[row] = (starts, extras)
        return found

    def span(self, node: object) -> Span:
        """The span of an `ast` node that has start and end positions."""
        wide = self._wide_rows
        if not wide or (node.lineno not in wide  # type: ignore[attr-defined]
                        and node.end_lineno not in wide):  # type: ignore[attr-defined]
            return Span(Pos(node.lineno, node.col_offset),  # type: ignore[attr-defined]
                        Pos(node.end_lineno, node.end_col_offset))  # type: ignore[attr-defined]
        return Span(
            self.pos(node.lineno, node.col_offset),  # type: ignore[attr-defined]
            self.pos(node.end_lineno, node.end_col_offset),  # type: ignore[attr-defined]
        )

    def offset(self, pos: Pos) -> int:
        return self._starts[pos.row - 1] + pos.col

    def slice(self, span: Span) -> str:
        return self.text[self.offset(span.start) : self.offset(span.end)]

    def indentation(self, row: int) -> str:
        line = self.line(row)
        return line[: len(line) - len(line.lstrip(" \t"))]

    def starts_row(self, pos: Pos) -> bool:
        """Only whitespace precedes `pos` on its row."""
        return not self.line(pos.row)[: pos.col].strip()

    def ends_row(self, pos: Pos) -> bool:
        """Only whitespace or a comment follows `pos` on its row."""
        rest = self.line(pos.row)[pos.col :].strip()
        return not rest or rest.startswith("#")

    @cached_property
    def indent_unit(self) -> str:
        """The file's indentation step: how much the first block (the row after a row that
        ends with `:`) is indented beyond its header — not a continuation line aligned with a
        bracket — else 4 spaces."""
        previous: tuple[str, str] | None = None  # (indentation, code) of the last code row
        for row in range(1, self.row_count + 1):
            line = self.line(row)
            code = line.split("#", 1)[0].rstrip()
            if not code.strip():
                continue
            indent = self.indentation(row)
            if previous is not None and previous[1].endswith(":") and \
                    len(indent) > len(previous[0]) and indent.startswith(previous[0]):
                step = indent[len(previous[0]):]
                return "\t" if step.startswith("\t") else step
            previous = (indent, code)
        return "    "

    @cached_property
    def comments(self) -> dict[int, str]:
        """Row -> the comment on it (tokenized once, only when a suppression check needs it)."""
        import io
        import tokenize

        out: dict[int, str] = {}
        for tok in tokenize.generate_tokens(io.StringIO(self.text, newline="").readline):
            if tok.type == tokenize.COMMENT:
                out[tok.start[0]] = tok.string
        return out

    @cached_property
    def rows_inside_strings(self) -> frozenset[int]:
        """Rows that begin inside a multi-line string: re-indenting them would change the
        string's value. Tokenizes the file once, only when a structural edit needs it."""
        import io
        import tokenize

        inside: set[int] = set()
        middle = getattr(tokenize, "FSTRING_MIDDLE", None)
        for tok in tokenize.generate_tokens(io.StringIO(self.text, newline="").readline):
            if tok.end[0] > tok.start[0] and (tok.type == tokenize.STRING or tok.type == middle):
                inside.update(range(tok.start[0] + 1, tok.end[0] + 1))
        return frozenset(inside)
