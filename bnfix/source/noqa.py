"""Suppression comments: `# noqa`, `# noqa: BN001,BN002` on a finding's first or last row,
and file-level `# bnfix: noqa` / `# bnfix: noqa: BN001` on a line of its own."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property

from bnfix.source.text import SourceText

_LINE = re.compile(r"#\s*noqa(?::\s*(?P<codes>[A-Z]+[0-9]+(?:[\s,]+[A-Z]+[0-9]+)*))?", re.IGNORECASE)
_FILE = re.compile(
    r"^\s*#\s*bnfix\s*:\s*noqa(?::\s*(?P<codes>[A-Z]+[0-9]+(?:[\s,]+[A-Z]+[0-9]+)*))?\s*$",
    re.IGNORECASE | re.MULTILINE,
)
_SPLIT = re.compile(r"[\s,]+")

ALL = frozenset({"*"})


def _codes(group: str | None) -> frozenset[str]:
    if not group:
        return ALL
    return frozenset(c.upper() for c in _SPLIT.split(group.strip()) if c)


@dataclass
class Suppressions:
    file_codes: frozenset[str]
    text: SourceText

    @cached_property
    def any_noqa(self) -> bool:
        return "noqa" in self.text.text

    @staticmethod
    def scan(text: SourceText) -> Suppressions:
        codes: set[str] = set()
        if "noqa" in text.text:
            for match in _FILE.finditer(text.text):
                codes |= _codes(match.group("codes"))
        return Suppressions(frozenset(codes), text)

    def suppressed(self, code: str, first_row: int, last_row: int) -> bool:
        if "*" in self.file_codes or code in self.file_codes:
            return True
        if not self.any_noqa:
            return False
        for row in {first_row, last_row}:
            comment = self.text.comments.get(row)
            if comment is None:
                continue
            match = _LINE.search(comment)
            if match is None:
                continue
            codes = _codes(match.group("codes"))
            if codes is ALL or code in codes:
                return True
        return False
