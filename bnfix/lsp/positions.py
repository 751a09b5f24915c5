"""Positions between bnfix and an LSP client.

bnfix counts rows from 1 and columns in characters (code points); LSP counts lines from 0 and
columns in the code units of the negotiated encoding (UTF-16 unless the client offers another).
Both split lines at `\\n`, `\\r\\n` and `\\r` only — not at the form feeds and Unicode separators
that `str.splitlines` also splits at — so rows are taken from bnfix's own SourceText."""

from __future__ import annotations

from dataclasses import dataclass

from bnfix.findings import Pos, Span
from bnfix.source.text import SourceText

UTF8, UTF16, UTF32 = "utf-8", "utf-16", "utf-32"


def units(text: str, encoding: str) -> int:
    """How many code units `text` takes in the client's encoding."""
    if encoding == UTF32 or text.isascii():
        return len(text)
    if encoding == UTF8:
        return len(text.encode("utf-8", "surrogatepass"))
    return len(text) + sum(1 for c in text if ord(c) > 0xFFFF)


@dataclass(frozen=True)
class Point:
    """An LSP position: 0-based line, column in client code units."""

    line: int
    character: int


class Positions:
    """The rows of one text, converting positions both ways."""

    def __init__(self, text: str | SourceText, encoding: str = UTF16) -> None:
        self.source = text if isinstance(text, SourceText) else SourceText(text)
        self.encoding = encoding

    def to_client(self, pos: Pos) -> Point:
        if pos.row > self.source.row_count:  # past the end: the end of the text
            last = self.source.row_count
            return Point(last - 1, units(self.source.line(last), self.encoding))
        line = self.source.line(pos.row)
        return Point(pos.row - 1, units(line[: pos.col], self.encoding))

    def span_to_client(self, span: Span) -> tuple[Point, Point]:
        return self.to_client(span.start), self.to_client(span.end)

    def from_client(self, point: Point) -> Pos:
        """A client position as bnfix's; one past the end of a line (or of the text) is
        clamped to it, as LSP asks."""
        if point.line >= self.source.row_count:
            last = self.source.row_count
            return Pos(last, len(self.source.line(last)))
        row = max(point.line, 0) + 1
        line = self.source.line(row)
        if self.encoding == UTF32 or line.isascii():
            return Pos(row, min(max(point.character, 0), len(line)))
        counted = 0
        for col, char in enumerate(line):
            if counted >= point.character:
                return Pos(row, col)
            counted += units(char, self.encoding)
        return Pos(row, len(line))
