"""`bnfix inspect`: read each artifact into the IR, run the artifact rules, report.

Reading is per artifact and never stops the run: an artifact that cannot be read (truncated,
corrupt, forged sizes, not what its extension says, a refused pickle) is reported as BN902 with
the reason; a bug of bnfix's own on one artifact is reported as an internal error naming it
(exit 2 at the end), and the others are still inspected. Framework log lines are kept out of
the output (`bnfix.artifacts.quiet`).

The project's `[tool.bnfix]` applies as it does to `check`: `ignore`, `per-file-ignores` and
`exclude`/`extend-exclude` as written; `select`/`extend-select` restrict the artifact rules
when they name any (a `select` naming only source rules was written for `check`, and leaves
inspect's rules alone). `--select` on the command line must name artifact rules.

The command keeps a cache beside `check`'s (`bnfix.artifacts.cache`): an artifact whose files
are unchanged is reported from it without being read.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from bnfix.artifacts.cache import InspectCache, cache_folder, cache_key
from bnfix.artifacts.discover import discover
from bnfix.artifacts.limits import DEFAULT_MAX_BYTES, limited
from bnfix.artifacts.model import Artifact, ArtifactError, ArtifactFinding
from bnfix.artifacts.parts import snapshot
from bnfix.artifacts.quiet import silenced_stderr
from bnfix.artifacts.read import read_artifact
from bnfix.artifacts.table import Table, table_of
from bnfix.checks.artifacts import run_checks
from bnfix.config import ConfigError, Settings, load_settings
from bnfix.rulebook import RuleBook, RuleBookError, load_rulebook

UNREADABLE = "BN902"
TARGET = "artifact"


class InspectUsageError(Exception):
    """A selection or configuration inspect cannot honour: one line, exit 2."""


@dataclass
class InspectResult:
    artifacts: list[Artifact] = field(default_factory=list)  # those read in this run
    tables: list[Table] = field(default_factory=list)  # every artifact's, cached ones included
    cached: list[str] = field(default_factory=list)  # the artifacts reported from the cache
    findings: list[ArtifactFinding] = field(default_factory=list)  # BN902 included
    empty: list[str] = field(default_factory=list)  # folders that held no artifact
    internal: list[str] = field(default_factory=list)  # bnfix's own errors, one per artifact


def check_selection(book: RuleBook, select: Sequence[str]) -> None:
    """InspectUsageError for a command-line selector that names no artifact rule (a source
    rule such as BN001 would otherwise select nothing, silently)."""
    for selector in select:
        try:
            codes = book.expand([selector], target=None)
        except RuleBookError as exc:
            raise InspectUsageError(str(exc)) from None
        if codes and not {c for c in codes if book.rules[c].target == TARGET}:
            shown = ", ".join(sorted(codes)[:4]) + (", …" if len(codes) > 4 else "")
            kind = "is a source rule" if len(codes) == 1 else "are source rules"
            raise InspectUsageError(
                f"--select {selector}: {shown} {kind} (run by `bnfix check`); inspect runs the "
                "artifact rules "
                f"{', '.join(sorted(book.expand(['ALL'], target=TARGET)))}")


def enabled_codes(book: RuleBook, select: Sequence[str] | None = None,
                  ignore: Sequence[str] = (), settings: Settings | None = None) -> frozenset[str]:
    """The artifact rules a selection turns on (default: all); RuleBookError if unknown."""
    if select is not None:
        codes = book.expand(list(select), target=TARGET)
    else:
        codes = book.expand(["ALL"], target=TARGET)
        if settings is not None:
            chosen = book.expand(list(settings.select or []) + list(settings.extend_select),
                                 target=TARGET)
            if chosen:
                codes = chosen
    ignored = list(ignore) + list(settings.ignore if settings is not None else [])
    return frozenset(codes - book.expand(ignored, target=TARGET))


def ignored_for(settings: Settings, path: Path, book: RuleBook) -> frozenset[str]:
    """Artifact codes `per-file-ignores` switches off for `path` (a code that names no rule is
    a usage error of inspect's)."""
    try:
        return settings.ignored_for(path, book, target=TARGET)
    except ConfigError as exc:
        raise InspectUsageError(f"{settings.source}: {exc}") from None


def _excluder(settings: Settings) -> Callable[[Path], bool] | None:
    patterns = list(settings.exclude or []) + list(settings.extend_exclude)
    if not patterns:
        return None
    from bnfix.files import _Exclude  # ruff's exclude semantics, as `check` applies them

    return _Exclude(patterns, settings.root.resolve())


def project_settings(paths: Sequence[str], config: str | None = None) -> Settings:
    """`[tool.bnfix]` of the project the first path is in (or of `config`)."""
    start = Path(paths[0]) if paths else Path.cwd()
    try:
        return load_settings(Path(config) if config else None, start)
    except ConfigError as exc:
        raise InspectUsageError(str(exc)) from None


def inspect_paths(paths: Sequence[str], *, select: Sequence[str] | None = None,
                  ignore: Sequence[str] = (), allow_pickle: bool = False,
                  settings: Settings | None = None,
                  max_tensor_bytes: int = DEFAULT_MAX_BYTES, cache_dir: Path | None = None,
                  read_cache: bool = True) -> InspectResult:
    """Read every artifact under `paths` and run the enabled artifact rules on it. With
    `cache_dir`, an artifact whose files are unchanged since a run with the same key is taken
    from the cache there (unless not `read_cache`), and what is read is stored."""
    book = load_rulebook()
    enabled = enabled_codes(book, select, ignore, settings)
    excluded = _excluder(settings) if settings is not None else None
    candidates, empty = discover(list(paths), excluded)
    result = InspectResult(empty=empty)
    cache = None if cache_dir is None else InspectCache(
        cache_dir, cache_key(enabled, allow_pickle, max_tensor_bytes), read=read_cache)
    for candidate in candidates:
        codes = enabled - (ignored_for(settings, Path(candidate.path), book)
                           if settings is not None else frozenset())
        entry = cache.lookup(candidate, codes) if cache is not None else None
        if entry is not None:
            result.cached.append(candidate.path)
            result.tables.append(entry.table)
            result.findings.extend(entry.findings)
            continue
        cacheable = cache is not None and candidate.reader not in ("missing", "unknown")
        try:
            with limited(max_tensor_bytes), silenced_stderr(expected=(ArtifactError,)):
                before = snapshot(candidate) if cacheable else {}
                artifact = _read(candidate, allow_pickle)
                findings = run_checks(artifact, codes)
                table = table_of(artifact)
        except ArtifactError as exc:  # BN902: never cached (bnfix.artifacts.cache says why)
            if UNREADABLE in codes:
                result.findings.append(ArtifactFinding(UNREADABLE, candidate.path, "", str(exc)))
            continue
        except Exception as exc:  # noqa: BLE001 - bnfix's bug: reported, the run goes on
            result.internal.append(f"{candidate.path}: internal error while inspecting it: "
                                   f"{type(exc).__name__}: {_first_line(exc)}")
            continue
        result.artifacts.append(artifact)
        result.tables.append(table)
        result.findings.extend(findings)
        if cache is not None and cacheable:
            cache.store(candidate, codes, before, findings, table)
    if cache is not None:
        cache.save()
    return result


def _read(candidate, allow_pickle: bool) -> Artifact:  # type: ignore[no-untyped-def]
    """The reader, with the failures of malformed input that libraries raise as generic
    errors turned into BN902 reasons."""
    try:
        return read_artifact(candidate, allow_pickle)
    except RecursionError:
        raise ArtifactError("nested too deeply to read (a malformed or hostile file)") from None
    except MemoryError:
        raise ArtifactError("reading it needs more memory than this machine gives: refused "
                            "(lower what it declares, or raise --max-tensor-bytes)") from None
    except UnicodeDecodeError as exc:
        raise ArtifactError(f"malformed: undecodable text ({exc.reason})") from None


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else "no detail"


def inspect_command(paths: Sequence[str], *, output_format: str = "full",
                    select: Sequence[str] | None = None, ignore: Sequence[str] = (),
                    plot: str | None = None, allow_pickle: bool = False,
                    exit_zero: bool = False, config: str | None = None,
                    max_tensor_bytes: int = DEFAULT_MAX_BYTES, cache: bool = True,
                    stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    """The CLI command: exit 0 clean, 1 findings (unreadable artifacts included), 2 usage or an
    internal error on some artifact (reported after the findings of the others). `--plot` needs
    every artifact's values: it reads them all (and still writes the cache)."""
    out, err = stdout or sys.stdout, stderr or sys.stderr
    book = load_rulebook()
    try:
        if select is not None:
            check_selection(book, select)
        if max_tensor_bytes <= 0:
            raise InspectUsageError(f"--max-tensor-bytes must be positive, not {max_tensor_bytes}")
        settings = project_settings(paths, config)
        enabled_codes(book, select, ignore, settings)
        for pattern, codes in settings.per_file_ignores.items():
            try:
                book.expand(codes, target=None)
            except RuleBookError as exc:
                raise InspectUsageError(f"{settings.source}: per-file-ignores `{pattern}`: "
                                        f"{exc}") from None
    except (InspectUsageError, RuleBookError, ConfigError) as exc:
        err.write(f"bnfix: {exc}\n")
        return 2
    if plot:
        from bnfix.artifacts.plot import require_matplotlib

        try:
            require_matplotlib()
        except ImportError:
            err.write("bnfix: --plot needs matplotlib (pip install matplotlib)\n")
            return 2
    try:
        result = inspect_paths(paths, select=select, ignore=ignore, allow_pickle=allow_pickle,
                               settings=settings, max_tensor_bytes=max_tensor_bytes,
                               cache_dir=cache_folder(settings.root, settings.cache_dir)
                               if cache else None, read_cache=not plot)
    except InspectUsageError as exc:
        err.write(f"bnfix: {exc}\n")
        return 2
    for folder in result.empty:
        err.write(f"bnfix: warning: no artifacts found under {folder}\n")
    out.write(render(output_format, result, book))
    if plot:
        from bnfix.artifacts.plot import plot_artifacts

        shown = plot_artifacts(result.artifacts, result.findings, plot)
        err.write(f"bnfix: wrote {plot} ({shown} artifact{'s' if shown != 1 else ''})\n")
    for line in result.internal:
        err.write(f"bnfix: {line} (a bug in bnfix: please report it)\n")
    if result.internal:
        return 2
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

    parts = [render_table(t, result.findings) for t in result.tables]
    if diagnostics:
        parts.append(formats.render("full", diagnostics, book, False))
    parts.append(formats.summary(diagnostics, 0, False))
    return "\n".join(parts)


def _diagnostic(finding: ArtifactFinding, book: RuleBook):  # type: ignore[no-untyped-def]
    from bnfix.findings import Diagnostic, Pos, Span

    rule = book.rules[finding.code]
    return Diagnostic(finding.path, finding.code, rule.name, Span.at(Pos(1, 0)), finding.message,
                      None, rule.url)
