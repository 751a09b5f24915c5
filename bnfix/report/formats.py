"""Rendering diagnostics. JSON records follow ruff's shape (1-based columns); SARIF is 2.1.0."""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from bnfix import __version__
from bnfix.findings import Applicability, Diagnostic, Edit, FileResult, Pos, shown_path
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


def _json_record(d: Diagnostic, book: RuleBook) -> dict:
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
        "severity": book.rules[d.code].severity,
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
        return json.dumps([_json_record(d, book) for d in diagnostics], indent=2) + "\n"
    if fmt == "sarif":
        return json.dumps(sarif(diagnostics, book), indent=2) + "\n"
    if fmt == "github":
        return "".join(_github(d) + "\n" for d in diagnostics)
    if fmt == "concise":
        return "".join(_concise(d, unsafe) + "\n" for d in diagnostics)
    return "\n".join(_full(d, unsafe) for d in diagnostics)


def statistics(diagnostics: Sequence[Diagnostic], book: RuleBook, unsafe: bool,
               fmt: str = "full") -> str:
    """Findings per rule, most frequent first: ruff's table (the `[*]` column only when some
    rule has an applicable fix), or its JSON records with `--output-format json`."""
    counts = Counter(d.code for d in diagnostics)
    fixable = Counter(d.code for d in diagnostics if _marker(d, unsafe))
    ordered = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    if fmt == "json":
        records = [{"code": code, "name": book.rules[code].name, "count": count,
                    "fixable": fixable[code] > 0, "fixable_count": fixable[code]}
                   for code, count in ordered]
        return json.dumps(records, indent=2) + "\n"
    width = len(str(max(counts.values()))) if counts else 1
    rows = []
    for code, count in ordered:
        mark = ("[*] " if fixable[code] else "[ ] ") if fixable else ""
        rows.append(f"{count:>{width}}\t{code}\t{mark}{book.rules[code].name}")
    return "\n".join(rows) + ("\n" if rows else "")


STATISTICS_FORMATS = ("full", "concise", "json")


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else ('es' if noun.endswith('x') else 's')}"


def hidden_fixes(remaining: Sequence[Diagnostic], unsafe: bool) -> int:
    """Remaining findings whose fix is unsafe and was held back (no `--unsafe-fixes`)."""
    if unsafe:
        return 0
    return sum(1 for d in remaining
               if d.fixable and d.fix.applicability is Applicability.UNSAFE)  # type: ignore[union-attr]


def summary(remaining: Sequence[Diagnostic], fixed: int, unsafe: bool,
            unsafe_flag: str = "--fix --unsafe-fixes", hint: bool = True) -> str:
    """ruff's closing lines: totals, then what `--fix` / `--unsafe-fixes` would do
    (`unsafe_flag`: how to apply the held-back fixes with the command that ran; `hint`
    False: unsafe fixes were turned off explicitly, and are not counted)."""
    total = len(remaining) + fixed
    if total == 0:
        return "All checks passed!\n"
    tail = f" ({fixed} fixed, {len(remaining)} remaining)." if fixed else "."
    lines = [f"Found {_plural(total, 'error')}{tail}"]
    applicable = sum(1 for d in remaining if _marker(d, unsafe))
    hidden = hidden_fixes(remaining, unsafe) if hint else 0
    held = f"{_plural(hidden, 'unsafe fix')} available with `{unsafe_flag}`"
    if applicable:
        lines.append(f"[*] {applicable} fixable with `--fix`" + (f" ({held})." if hidden else "."))
    elif hidden:
        lines.append(f"{held}.")
    return "\n".join(lines) + "\n"


def would_fix(fixes: int, hidden: int) -> str:
    """`--diff`'s closing line (ruff's words); empty when there is nothing to say."""
    if fixes:
        extra = f" ({_plural(hidden, 'additional fix')} available with `--unsafe-fixes`)" \
            if hidden else ""
        return f"Would fix {_plural(fixes, 'error')}{extra}.\n"
    if hidden:
        return f"No errors would be fixed ({_plural(hidden, 'fix')} available with " \
               "`--unsafe-fixes`).\n"
    return ""


def fixed_only(fixes: int, hidden: int) -> str:
    """`--fix-only`'s closing line (ruff's words); empty when there is nothing to say."""
    if fixes:
        extra = f" ({_plural(hidden, 'additional fix')} available with `--unsafe-fixes`)" \
            if hidden else ""
        return f"Fixed {_plural(fixes, 'error')}{extra}.\n"
    if hidden:
        return f"No errors fixed ({_plural(hidden, 'fix')} available with `--unsafe-fixes`).\n"
    return ""


def fixes_listing(results: Sequence[FileResult], book: RuleBook) -> str:
    """`--show-fixes`: what was fixed, per file and rule (ruff's layout)."""
    done = [r for r in results if r.fixed]
    if not done:
        return ""
    total = sum(len(r.fixed) for r in done)
    lines = ["", f"Fixed {_plural(total, 'error')}:"]
    for result in sorted(done, key=lambda r: r.path):
        lines.append(f"- {result.path}:")
        for code, count in sorted(Counter(d.code for d in result.fixed).items()):
            lines.append(f"    {count} × {code} ({book.rules[code].name})")
    return "\n".join(lines) + "\n\n"


def unified_diff(result: FileResult) -> str:
    import difflib

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
