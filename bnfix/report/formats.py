"""Rendering diagnostics. JSON records follow ruff's shape (1-based columns); SARIF is 2.1.0."""

from __future__ import annotations

import difflib
import json
import os
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from bnfix import __version__
from bnfix.engine import Diagnostic, FileResult
from bnfix.ir import Applicability, Edit, Pos, shown_path
from bnfix.rulebook import RuleBook

FORMATS = ("full", "concise", "json", "github", "sarif")
SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"


def _location(pos: Pos) -> dict[str, int]:
    return {"row": pos.row, "column": pos.col + 1}


def _marker(d: Diagnostic, unsafe: bool) -> str:
    if d.fixable and (unsafe or d.fix.applicability is Applicability.SAFE):  # type: ignore[union-attr]
        return "[*] "
    return ""


def _concise(d: Diagnostic, unsafe: bool) -> str:
    return f"{d.path}:{d.span.start.row}:{d.span.start.col + 1}: {d.code} {_marker(d, unsafe)}{d.message}"


def _full(d: Diagnostic, unsafe: bool) -> str:
    lines = [_concise(d, unsafe)]
    if d.snippet:
        width = len(str(d.snippet[-1][0]))
        pad = " " * width
        lines.append(f"{pad} |")
        for i, (row, text) in enumerate(d.snippet):
            lines.append(f"{row:>{width}} | {text}")
            if d.span.start.row <= row <= d.span.end.row:
                shift = d.snippet_shift[i] if i < len(d.snippet_shift) else 0
                start = d.span.start.col - shift if row == d.span.start.row else \
                    len(text) - len(text.lstrip())
                end = d.span.end.col - shift if row == d.span.end.row else len(text)
                start, end = max(0, min(start, len(text))), max(0, min(end, len(text)))
                if end > start:
                    lines.append(f"{pad} | {' ' * start}{'^' * (end - start)}")
        lines.append(f"{pad} |")
    for related in d.related:
        start = related.span.start
        lines.append(f"  = note: {shown_path(related.path)}:{start.row}:{start.col + 1}: "
                     f"{related.message}")
    if d.fix is not None:
        kind = d.fix.applicability.value
        lines.append(f"  = help: {d.fix.message} ({kind} fix)")
    return "\n".join(lines) + "\n"


def _json_record(d: Diagnostic) -> dict:
    fix = None
    if d.fix is not None:
        fix = {
            "applicability": d.fix.applicability.value,
            "message": d.fix.message,
            "edits": [
                {"content": e.content, "location": _location(e.span.start),
                 "end_location": _location(e.span.end)}
                for e in d.fix.edits if isinstance(e, Edit)
            ],
        }
    return {
        "code": d.code,
        "name": d.name,
        "filename": os.path.abspath(d.path),
        "location": _location(d.span.start),
        "end_location": _location(d.span.end),
        "message": d.message,
        "noqa_row": d.span.start.row,
        "url": d.url,
        "fix": fix,
        "related": [{"filename": os.path.abspath(r.path), "location": _location(r.span.start),
                     "end_location": _location(r.span.end), "message": r.message}
                    for r in d.related],
    }


def _github(d: Diagnostic) -> str:
    s, e = d.span.start, d.span.end
    message = d.message.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    return (f"::error title=bnfix ({d.code}),file={d.path},line={s.row},col={s.col + 1},"
            f"endLine={e.row},endColumn={e.col + 1}::{d.path}:{s.row}:{s.col + 1}: {d.code} {message}")


def _sarif_region(start: Pos, end: Pos) -> dict[str, int]:
    return {"startLine": start.row, "startColumn": start.col + 1,
            "endLine": end.row, "endColumn": end.col + 1}


def _uri(path: str) -> str:
    rel = os.path.relpath(os.path.abspath(path))
    return Path(rel).as_posix() if not rel.startswith("..") else Path(os.path.abspath(path)).as_uri()


def sarif(diagnostics: Sequence[Diagnostic], book: RuleBook) -> dict:
    codes = sorted(book.rules)
    index = {code: i for i, code in enumerate(codes)}
    rules = []
    for code in codes:
        rule = book.rules[code]
        rules.append({
            "id": code,
            "name": rule.name,
            "shortDescription": {"text": rule.summary},
            "fullDescription": {"text": rule.docs.what.strip()},
            "help": {"text": rule.docs.why.strip(), "markdown": rule.markdown()},
            "helpUri": rule.url,
            "defaultConfiguration": {"level": "error" if rule.severity == "error" else "warning"},
            "properties": {"fix": rule.fix, "frameworks": list(rule.frameworks)},
        })
    results = []
    for d in diagnostics:
        rule = book.rules[d.code]
        location = {"artifactLocation": {"uri": _uri(d.path), "uriBaseId": "%SRCROOT%"}}
        result: dict = {
            "ruleId": d.code,
            "ruleIndex": index[d.code],
            "level": "error" if rule.severity == "error" else "warning",
            "message": {"text": d.message},
            "locations": [{"physicalLocation": {**location,
                                                "region": _sarif_region(d.span.start, d.span.end)}}],
        }
        if d.related:
            result["relatedLocations"] = [{
                "id": i,
                "physicalLocation": {
                    "artifactLocation": {"uri": _uri(r.path), "uriBaseId": "%SRCROOT%"},
                    "region": _sarif_region(r.span.start, r.span.end)},
                "message": {"text": r.message},
            } for i, r in enumerate(d.related)]
        if d.fix is not None and d.fixable:
            result["fixes"] = [{
                "description": {"text": f"{d.fix.message} ({d.fix.applicability.value})"},
                "artifactChanges": [{
                    "artifactLocation": location["artifactLocation"],
                    "replacements": [
                        {"deletedRegion": _sarif_region(e.span.start, e.span.end),
                         "insertedContent": {"text": e.content}}
                        for e in d.fix.edits if isinstance(e, Edit)
                    ],
                }],
            }]
        results.append(result)
    return {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {
                "name": "bnfix",
                "version": __version__,
                "informationUri": "https://github.com/bnfix/bnfix",
                "rules": rules,
            }},
            "originalUriBaseIds": {"%SRCROOT%": {"uri": Path(os.getcwd()).as_uri() + "/"}},
            "results": results,
        }],
    }


def render(fmt: str, diagnostics: Sequence[Diagnostic], book: RuleBook, unsafe: bool) -> str:
    if fmt == "json":
        return json.dumps([_json_record(d) for d in diagnostics], indent=2) + "\n"
    if fmt == "sarif":
        return json.dumps(sarif(diagnostics, book), indent=2) + "\n"
    if fmt == "github":
        return "".join(_github(d) + "\n" for d in diagnostics)
    if fmt == "concise":
        return "".join(_concise(d, unsafe) + "\n" for d in diagnostics)
    return "\n".join(_full(d, unsafe) for d in diagnostics)


def statistics(diagnostics: Sequence[Diagnostic], book: RuleBook, unsafe: bool) -> str:
    counts = Counter(d.code for d in diagnostics)
    fixable = {d.code for d in diagnostics if _marker(d, unsafe)}
    width = len(str(max(counts.values()))) if counts else 1
    rows = []
    for code, count in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        mark = "[*]" if code in fixable else "[ ]"
        rows.append(f"{count:>{width}}\t{code}\t{mark} {book.rules[code].name}")
    return "\n".join(rows) + ("\n" if rows else "")


def summary(remaining: Sequence[Diagnostic], fixed: int, unsafe: bool) -> str:
    """ruff-style closing lines: totals, then what `--fix` / `--unsafe-fixes` would do."""
    total = len(remaining) + fixed
    if total == 0:
        return "All checks passed!\n"
    noun = "error" if total == 1 else "errors"
    tail = f" ({fixed} fixed, {len(remaining)} remaining)." if fixed else "."
    lines = [f"Found {total} {noun}{tail}"]
    kinds = Counter(d.fix.applicability for d in remaining if d.fixable)  # type: ignore[union-attr]
    applicable = kinds[Applicability.SAFE] + (kinds[Applicability.UNSAFE] if unsafe else 0)
    hidden = 0 if unsafe else kinds[Applicability.UNSAFE]
    hint = f" ({hidden} hidden fixes can be enabled with the `--unsafe-fixes` option)" if hidden else ""
    if applicable:
        lines.append(f"[*] {applicable} fixable with the `--fix` option{hint}.")
    elif hidden:
        lines.append(f"No fixes available{hint}.")
    return "\n".join(lines) + "\n"


def unified_diff(result: FileResult) -> str:
    assert result.original is not None and result.new_text is not None
    relative = not os.path.isabs(result.path)
    diff = difflib.unified_diff(
        result.original.splitlines(keepends=True),
        result.new_text.splitlines(keepends=True),
        fromfile=f"a/{result.path}" if relative else result.path,
        tofile=f"b/{result.path}" if relative else result.path,
    )
    text = "".join(line if line.endswith(("\n", "\r")) else line + "\n\\ No newline at end of file\n"
                   for line in diff)
    return text
