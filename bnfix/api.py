"""The lint path as Python functions: the same engine, rules and fixes as the CLI."""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from pathlib import Path

from bnfix.engine import Engine
from bnfix.findings import Diagnostic, FileResult
from bnfix.lint import LintOptions, lint_paths, prepare


@dataclass
class FixResult:
    """The outcome of fixing one source text."""

    text: str
    fixed: list[Diagnostic]
    remaining: list[Diagnostic]
    notes: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.fixed)


@dataclass
class Report:
    """The outcome of checking (and maybe fixing) files."""

    results: list[FileResult]
    remaining: list[Diagnostic]
    fixed: int
    errors: list[str]


def _engine(select: list[str] | None, ignore: list[str] | None, start: Path) -> tuple[Engine, object]:
    options = LintOptions(select=select, ignore=list(ignore or ()))
    _, settings, engine = prepare(options, start)
    return engine, settings


def check_source(source: str, filename: str = "<string>", *, select: list[str] | None = None,
                 ignore: list[str] | None = None) -> list[Diagnostic]:
    """Diagnostics of one source text. Nothing is imported or executed."""
    engine, _ = _engine(select, ignore, Path.cwd())
    return engine.diagnose(source, filename)


def fix_source(source: str, filename: str = "<string>", *, unsafe_fixes: bool = False,
               select: list[str] | None = None, ignore: list[str] | None = None) -> FixResult:
    """Apply the fixes (safe ones, plus unsafe ones when asked) to one source text."""
    engine, _ = _engine(select, ignore, Path.cwd())
    result = engine.fix_text(source, filename, unsafe_fixes)
    text = result.new_text if result.new_text is not None else source
    return FixResult(text, result.fixed, result.diagnostics, result.notes)


def check_paths(paths: list[str | Path], *, fix: bool = False, unsafe_fixes: bool = False,
                diff: bool = False, select: list[str] | None = None,
                extend_select: list[str] | None = None, ignore: list[str] | None = None,
                config: str | None = None, jobs: int | None = 1,
                cache: bool = False) -> Report:
    """Check files and folders like `bnfix check`; with `fix=True` the files are rewritten
    (atomically), with `diff=True` nothing is written and the results hold both texts."""
    options = LintOptions(paths=[str(p) for p in paths], fix=fix, unsafe_fixes=unsafe_fixes,
                          diff=diff, select=select, extend_select=list(extend_select or ()),
                          ignore=list(ignore or ()), config=config,
                          jobs=jobs, progress=False, cache=cache)
    _, settings, engine = prepare(options, Path(options.paths[0]) if options.paths else Path.cwd())
    outcome = lint_paths(options, engine, settings, io.StringIO())
    return Report(outcome.results, outcome.remaining, outcome.fixed, outcome.errors)
