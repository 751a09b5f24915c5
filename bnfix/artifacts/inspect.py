"""`bnfix inspect`: read each artifact into the IR, run the artifact rules, report.

Reading is per artifact and never stops the run: an artifact that cannot be read (truncated,
corrupt, not what its extension says, a refused pickle) is reported as BN902 with the reason.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TextIO

from bnfix.artifacts.discover import discover
from bnfix.artifacts.model import Artifact, ArtifactError, ArtifactFinding
from bnfix.artifacts.read import read_artifact
from bnfix.checks.artifacts import run_checks
from bnfix.rulebook import RuleBook, RuleBookError, load_rulebook

UNREADABLE = "BN902"


@dataclass
class InspectResult:
    artifacts: list[Artifact] = field(default_factory=list)
    findings: list[ArtifactFinding] = field(default_factory=list)  # BN902 included
    empty: list[str] = field(default_factory=list)  # folders that held no artifact


def enabled_codes(book: RuleBook, select: Sequence[str] | None = None,
                  ignore: Sequence[str] = ()) -> frozenset[str]:
    """The artifact rules a selection turns on (default: all); RuleBookError if unknown."""
    codes = book.expand(list(select) if select is not None else ["ALL"], target="artifact")
    return frozenset(codes - book.expand(list(ignore), target="artifact"))


def inspect_paths(paths: Sequence[str], *, select: Sequence[str] | None = None,
                  ignore: Sequence[str] = (), allow_pickle: bool = False) -> InspectResult:
    """Read every artifact under `paths` and run the enabled artifact rules on it."""
    enabled = enabled_codes(load_rulebook(), select, ignore)
    candidates, empty = discover(list(paths))
    result = InspectResult(empty=empty)
    for candidate in candidates:
        try:
            artifact = read_artifact(candidate, allow_pickle)
        except ArtifactError as exc:
            if UNREADABLE in enabled:
                result.findings.append(ArtifactFinding(UNREADABLE, candidate.path, "", str(exc)))
            continue
        result.artifacts.append(artifact)
        result.findings.extend(run_checks(artifact, enabled))
    return result


def inspect_command(paths: Sequence[str], *, output_format: str = "full",
                    select: Sequence[str] | None = None, ignore: Sequence[str] = (),
                    plot: str | None = None, allow_pickle: bool = False,
                    exit_zero: bool = False, stdout: TextIO | None = None,
                    stderr: TextIO | None = None) -> int:
    """The CLI command: exit 0 clean, 1 findings (unreadable artifacts included), 2 usage."""
    out, err = stdout or sys.stdout, stderr or sys.stderr
    book = load_rulebook()
    try:
        enabled_codes(book, select, ignore)
    except RuleBookError as exc:
        err.write(f"bnfix: {exc}\n")
        return 2
    if plot:
        from bnfix.artifacts.plot import require_matplotlib

        try:
            require_matplotlib()
        except ImportError:
            err.write("bnfix: --plot needs matplotlib (pip install matplotlib)\n")
            return 2
    result = inspect_paths(paths, select=select, ignore=ignore, allow_pickle=allow_pickle)
    for folder in result.empty:
        err.write(f"bnfix: warning: no artifacts found under {folder}\n")
    out.write(render(output_format, result, book))
    if plot:
        from bnfix.artifacts.plot import plot_artifacts

        shown = plot_artifacts(result.artifacts, result.findings, plot)
        err.write(f"bnfix: wrote {plot} ({shown} artifact{'s' if shown != 1 else ''})\n")
    return 0 if exit_zero or not result.findings else 1


def render(fmt: str, result: InspectResult, book: RuleBook) -> str:
    """Findings in `check`'s formats (artifacts have no rows: location 1:1, plus a `layer` in
    JSON); `full` puts a table per artifact first."""
    from bnfix.report import formats

    diagnostics = [_diagnostic(f, book) for f in result.findings]
    if fmt == "json":
        records = json.loads(formats.render("json", diagnostics, book, False))
        for record, finding in zip(records, result.findings):
            record["layer"] = finding.layer
        return json.dumps(records, indent=2) + "\n"
    if fmt != "full":
        text = formats.render(fmt, diagnostics, book, False)
        return text + (formats.summary(diagnostics, 0, False) if fmt == "concise" else "")
    from bnfix.artifacts.table import render_table

    parts = [render_table(a, result.findings) for a in result.artifacts]
    if diagnostics:
        parts.append(formats.render("full", diagnostics, book, False))
    parts.append(formats.summary(diagnostics, 0, False))
    return "\n".join(parts)


def _diagnostic(finding: ArtifactFinding, book: RuleBook):  # type: ignore[no-untyped-def]
    from bnfix.engine import Diagnostic
    from bnfix.ir import Pos, Span

    rule = book.rules[finding.code]
    return Diagnostic(finding.path, finding.code, rule.name, Span.at(Pos(1, 0)), finding.message,
                      None, rule.url)
