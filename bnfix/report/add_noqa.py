"""`--add-noqa`: write `# noqa: CODE` on the line of each finding (ruff's --add-noqa), merged
into a noqa directive the line already has (its codes are kept), so that the next run reports
nothing and running it twice changes nothing the second time."""

from __future__ import annotations

import io
import re
import tokenize
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from bnfix.checks import ENGINE_CODES
from bnfix.findings import Diagnostic
from bnfix.fixes import NotWritten, Writer, digest
from bnfix.source.reader import Skipped, SourceError, decode, read_source

# The same directive bnfix's suppressions read (bnfix.source.noqa): `# noqa` alone silences
# every code on its line, `# noqa: A1, B2` the codes listed.
_DIRECTIVE = re.compile(r"#\s*noqa(?::\s*(?P<codes>[A-Z]+[0-9]+(?:[\s,]+[A-Z]+[0-9]+)*))?",
                        re.IGNORECASE)
_SPLIT = re.compile(r"[\s,]+")


@dataclass
class NoqaOutcome:
    added: int = 0  # directives written or extended (lines changed, as ruff counts)
    notes: list[str] = field(default_factory=list)  # findings that could not get a directive


def _comment_rows(lines: list[str]) -> dict[int, int | None]:
    """Rows whose end is code (not inside a string or a backslash continuation), each with the
    column of its comment (None: no comment)."""
    rows: dict[int, int | None] = {}
    for tok in tokenize.generate_tokens(iter(lines).__next__):
        if tok.type == tokenize.COMMENT:
            rows[tok.start[0]] = tok.start[1]
        elif tok.type in (tokenize.NEWLINE, tokenize.NL):
            rows.setdefault(tok.start[0], None)
    return rows


def _with_codes(line: str, comment_col: int | None, codes: set[str]) -> str:
    """`line` with `codes` in its noqa directive (unchanged when it has them already)."""
    body = line.rstrip("\r\n")
    ending = line[len(body):]
    if comment_col is not None:
        comment = body[comment_col:]
        match = _DIRECTIVE.search(comment)
        if match is not None:
            if not match.group("codes"):
                return line  # a bare `# noqa` silences every code already
            have = {c.upper() for c in _SPLIT.split(match.group("codes").strip()) if c}
            if codes <= have:
                return line
            directive = "# noqa: " + ", ".join(sorted(have | codes))
            comment = comment[:match.start()] + directive + comment[match.end():]
            return body[:comment_col] + comment + ending
    return f"{body.rstrip()}  # noqa: {', '.join(sorted(codes))}{ending}"


def add_noqa(diagnostics: Iterable[Diagnostic], max_bytes: int) -> NoqaOutcome:
    """Add the directives to the files the diagnostics are in; each file is rewritten at once
    (atomically), or left as it is when it cannot be read or tokenized."""
    by_file: dict[str, list[Diagnostic]] = defaultdict(list)
    for d in diagnostics:
        if d.code not in ENGINE_CODES:  # a file that does not parse cannot carry a directive
            by_file[d.path].append(d)
    outcome = NoqaOutcome()
    writer = Writer()
    for path, found in sorted(by_file.items()):
        try:
            data = read_source(path, max_bytes)
            decoded = decode(data)
            lines = io.StringIO(decoded.text, newline="").readlines()
            rows = _comment_rows(lines)
        except (SourceError, Skipped, tokenize.TokenError, SyntaxError) as exc:
            outcome.notes.append(f"{path}: cannot add noqa directives ({exc})")
            continue
        wanted: dict[int, set[str]] = defaultdict(set)
        for d in found:
            row = next((r for r in (d.span.start.row, d.span.end.row) if r in rows), None)
            if row is None:
                outcome.notes.append(f"{path}:{d.span.start.row}: cannot add `# noqa: {d.code}`: "
                                     "the finding's first and last lines end inside a string "
                                     "or a line continuation")
                continue
            wanted[row].add(d.code)
        added = 0
        for row, codes in sorted(wanted.items()):
            line = _with_codes(lines[row - 1], rows[row], codes)
            added += line != lines[row - 1]
            lines[row - 1] = line
        if not added:
            continue
        try:  # only over what was read: an edit saved meanwhile is never overwritten
            writer.write(Path(path), "".join(lines), decoded.encoding, digest(data))
        except (NotWritten, OSError, UnicodeEncodeError) as exc:
            outcome.notes.append(f"{path}: cannot write the noqa directives ({exc}); it is "
                                 "unchanged")
            continue
        outcome.added += added
    return outcome
