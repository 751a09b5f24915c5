"""`bnfix check` / `bnfix fix`: discover files, run the engine over them (in worker processes
when the tree is large), write fixes atomically, report, and choose the exit code."""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from bnfix.cache import Cache, cache_key, rules_digest
from bnfix.config import ConfigError, Settings, check_selectors, load_settings
from bnfix.engine import Diagnostic, Engine, FileResult
from bnfix.files import Candidate, discover
from bnfix.fixes import NotWritten, Writer
from bnfix.project.pins import tensorflow_pin
from bnfix.project.runner import ProjectRunner
from bnfix.project.session import project_root
from bnfix.report import formats
from bnfix.rulebook import RuleBook, RuleBookError, load_rulebook, rules_root


@dataclass
class LintOptions:
    paths: list[str] = field(default_factory=list)
    fix: bool = False
    unsafe_fixes: bool = False
    diff: bool = False
    select: list[str] | None = None
    ignore: list[str] = field(default_factory=list)
    extend_select: list[str] = field(default_factory=list)
    output_format: str = "full"
    statistics: bool = False
    exit_zero: bool = False
    stdin_filename: str | None = None
    config: str | None = None
    jobs: int | None = None  # None = automatic
    force_exclude: bool = False
    respect_gitignore: bool | None = None
    progress: bool | None = None  # None = when stderr is a terminal
    cache: bool = True  # read and write .bnfix_cache/
    all_syntax_errors: bool = False  # parse every file for BN900, not only those rules read
    project: bool = True  # analyse the whole project (else only the files given)
    max_file_size: int | None = None  # bytes (0: no limit); None: the configuration's
    verbose: bool = False  # print the traceback of an internal error


class UsageError(Exception):
    """A problem with how bnfix was called or configured (exit code 2)."""


@dataclass
class Outcome:
    results: list[FileResult]
    remaining: list[Diagnostic]
    fixed: int
    changed: list[FileResult]
    errors: list[str]
    internal: list[tuple[str, str]] = field(default_factory=list)  # (path, traceback)


def prepare(options: LintOptions, start: Path) -> tuple[RuleBook, Settings, Engine]:
    """Load the rule book and the configuration and build the engine they select."""
    try:
        book = load_rulebook()
        settings = load_settings(Path(options.config) if options.config else None, start)
        settings.check_codes(book)
        for flag, values in (("--select", options.select or []), ("--ignore", options.ignore),
                             ("--extend-select", options.extend_select)):
            check_selectors(book, values, flag)
    except (ConfigError, RuleBookError) as exc:
        raise UsageError(str(exc)) from exc
    if options.max_file_size is not None:
        settings.max_file_size = options.max_file_size
    if options.select is not None:
        settings.select = options.select
    settings.ignore = [*settings.ignore, *options.ignore]
    settings.extend_select = [*settings.extend_select, *options.extend_select]
    if options.respect_gitignore is not None:
        settings.respect_gitignore = options.respect_gitignore
    if settings.target_origin == "default":
        root = project_root([start], settings.root if settings.source is not None else None)
        pinned = tensorflow_pin(root)
        if pinned is not None:
            settings.target_tensorflow, settings.target_origin = pinned, "pinned"
    try:
        enabled = settings.enabled(book)
    except ConfigError as exc:
        raise UsageError(str(exc)) from exc
    engine = Engine(book, enabled, settings.targets,
                    options.all_syntax_errors or settings.all_syntax_errors)
    engine.target_explicit = settings.target_origin != "default"
    return book, settings, engine


# -- running over files -------------------------------------------------------------------


def default_jobs() -> int:
    """Processes to use: one under pre-commit (it runs hooks in parallel itself)."""
    if os.environ.get("PRE_COMMIT") == "1":
        return 1
    return max(1, min(os.cpu_count() or 1, 8))


class _Progress:
    def __init__(self, stream: TextIO, enabled: bool) -> None:
        self.stream, self.enabled, self.count, self.last = stream, enabled, 0, 0.0

    def tick(self) -> None:
        self.count += 1
        now = time.monotonic()
        if self.enabled and now - self.last > 0.2:
            self.last = now
            self.stream.write(f"\rbnfix: {self.count} files checked")
            self.stream.flush()

    def done(self) -> None:
        if self.enabled and self.last:
            self.stream.write("\r\033[K")
            self.stream.flush()


def lint_paths(options: LintOptions, engine: Engine, settings: Settings,
               stderr: TextIO | None = None) -> Outcome:
    """Run over the paths: results, remaining diagnostics, fixes written (unless --diff)."""
    stderr = sys.stderr if stderr is None else stderr
    paths = [Path(p) for p in (options.paths or ["."])]
    for path in paths:
        if not path.exists() and not path.is_symlink():
            raise UsageError(f"{path}: no such file or directory")
    walk = functools.partial(discover, root=settings.root, exclude=settings.exclude,
                             extend_exclude=settings.extend_exclude,
                             respect_gitignore=settings.respect_gitignore)
    outcome = Outcome([], [], 0, [], [])
    root = project_root(paths, settings.root if settings.source is not None else None)
    outside = _Outside(root)
    reported = []
    for candidate in walk(paths, force_exclude=options.force_exclude):
        if outside(candidate):
            outcome.errors.append(f"{candidate.path}: skipped: a symbolic link to a file outside "
                                  f"{root} (name it on the command line to check it)")
        else:
            reported.append((str(candidate.path), settings.ignored_for(candidate.path,
                                                                      engine.book)))
    scope = [str(c.path) for c in walk([root]) if not outside(c)] if options.project else []
    show = options.progress if options.progress is not None else stderr.isatty()
    progress = _Progress(stderr, show)
    fixing = options.fix or options.diff
    cache = None
    if options.cache:
        key = cache_key(rules_digest(rules_root()), engine.enabled,
                        {**engine.targets, "all-syntax": (int(engine.all_syntax_errors),),
                         "project": (int(options.project),),
                         "explicit": (int(engine.target_explicit),)})
        cache = Cache(settings.root, key)
    runner = ProjectRunner(engine, cache=cache, fix=fixing, unsafe=options.unsafe_fixes,
                           jobs=default_jobs() if options.jobs is None else options.jobs,
                           max_bytes=settings.max_bytes)
    writer = Writer()
    stream = runner.run(reported, scope, root)
    with contextlib.closing(stream):  # closed at once on Ctrl-C: the workers stop with it
        for result in stream:
            progress.tick()
            outcome.errors.extend(result.notes)
            if result.internal is not None:
                outcome.internal.append((result.path, result.internal))
            written = None
            if result.changed:
                if options.diff:
                    outcome.changed.append(result)
                else:
                    written = _write(writer, result, outcome)
            if cache is not None and written is not None:
                cache.forget(result.path)  # its summary was of the text before the fixes
            outcome.fixed += len(result.fixed)
            outcome.remaining.extend(result.diagnostics)
            if result.diagnostics or result.changed:
                # keep what reporting needs, not every file's text
                result.original = result.original if options.diff else None
                result.new_text = result.new_text if options.diff else None
                outcome.results.append(result)
    progress.done()
    outcome.errors.extend(runner.notes)
    outcome.internal.extend(runner.internal)
    if cache is not None:
        cache.save()
    outcome.remaining.sort(key=lambda d: (d.path, d.span.start, d.code))
    return outcome


class _Outside:
    """Whether a file met in the walk is a symbolic link to a file outside the project: it is
    not read (neither its findings nor a syntax error may print what such a file holds, and a
    fix must not write there). A file named on the command line is always checked."""

    def __init__(self, root: Path) -> None:
        self.root = os.path.realpath(root)

    def __call__(self, candidate: Candidate) -> bool:
        if not candidate.link or candidate.explicit:
            return False
        target = os.path.realpath(candidate.path)
        return os.path.commonpath([self.root, target]) != self.root


def _write(writer: Writer, result: FileResult, outcome: Outcome) -> str | None:
    """Write one fixed file; when it cannot be written, its fixes go back to the findings
    (they were not applied) with one line that says why."""
    try:
        if result.digest is None:
            raise NotWritten("bnfix does not know what it read")
        written = writer.write(Path(result.path), result.new_text or "", result.encoding,
                               result.digest)
    except (NotWritten, OSError, UnicodeEncodeError) as exc:
        count = len(result.fixed)
        why = str(exc) if isinstance(exc, NotWritten) else f"cannot write the fixed file ({exc})"
        outcome.errors.append(f"{result.path}: not fixed, {count} fix{'es' if count != 1 else ''} "
                              f"not applied: {why}")
        result.diagnostics = result.fixed + result.diagnostics
        result.fixed = []
        result.new_text = None
        return None
    outcome.changed.append(result)
    return written


# -- the commands ---------------------------------------------------------------------------


def run(options: LintOptions, stdin: TextIO | None = None, stdout: TextIO | None = None,
        stderr: TextIO | None = None) -> int:
    """`bnfix check`: returns the exit code (0 clean, 1 findings remain, 2 usage error or an
    internal error). The streams default to sys's at the time of the call."""
    stdin = sys.stdin if stdin is None else stdin
    stdout = sys.stdout if stdout is None else stdout
    stderr = sys.stderr if stderr is None else stderr
    if options.output_format not in formats.FORMATS:
        raise UsageError(f"unknown output format `{options.output_format}` "
                         f"(one of {', '.join(formats.FORMATS)})")
    use_stdin = options.paths == ["-"] or (options.stdin_filename is not None and not options.paths)
    start = Path(options.stdin_filename).parent if use_stdin and options.stdin_filename else Path(
        options.paths[0] if options.paths else ".")
    book, settings, engine = prepare(options, start)
    if use_stdin:
        return _run_stdin(options, book, settings, engine, stdin, stdout, stderr)
    outcome = lint_paths(options, engine, settings, stderr)
    stderr.writelines(f"bnfix: {line}\n" for line in outcome.errors)
    if options.diff:
        stdout.writelines(formats.unified_diff(result) for result in outcome.changed)
        fixes = sum(len(r.fixed) for r in outcome.changed)
        stderr.write(f"Would fix {fixes} error{'s' if fixes != 1 else ''}.\n" if fixes
                     else "No errors would be fixed.\n")
        code = 0 if options.exit_zero or not outcome.changed else 1
    else:
        _report(options, book, outcome.remaining, outcome.fixed, stdout)
        code = 0 if options.exit_zero or not outcome.remaining else 1
    if outcome.internal:
        _report_internal(outcome.internal, options.verbose, stderr)
        return 2
    return code


ISSUES = "https://github.com/bnfix/bnfix/issues"


def _report_internal(crashes: list[tuple[str, str]], verbose: bool, stderr: TextIO) -> None:
    """One line per file whose analysis raised (a bnfix bug); the tracebacks with --verbose or
    BNFIX_TRACEBACK=1."""
    verbose = verbose or os.environ.get("BNFIX_TRACEBACK") == "1"
    for path, trace in crashes:
        last = trace.strip().splitlines()[-1] if trace.strip() else "unknown error"
        stderr.write(f"bnfix: {path}: internal error: {last}; the other files were checked. "
                     f"Please report it at {ISSUES} with the file (or a reduced copy)"
                     f"{'' if verbose else '; --verbose prints the traceback'}\n")
        if verbose:
            stderr.write(trace if trace.endswith("\n") else trace + "\n")


def _report(options: LintOptions, book: RuleBook, remaining: list[Diagnostic], fixed: int,
            stdout: TextIO) -> None:
    human = options.output_format in ("full", "concise")
    if options.statistics:
        stdout.write(formats.statistics(remaining, book, options.unsafe_fixes))
    else:
        stdout.write(formats.render(options.output_format, remaining, book, options.unsafe_fixes))
    if human:
        if remaining and options.output_format == "full" and not options.statistics:
            stdout.write("\n")
        stdout.write(formats.summary(remaining, fixed, options.unsafe_fixes))


def _run_stdin(options: LintOptions, book: RuleBook, settings: Settings, engine: Engine,
               stdin: TextIO, stdout: TextIO, stderr: TextIO) -> int:
    name = options.stdin_filename or "-"
    text = stdin.read()
    ignored = settings.ignored_for(Path(name), book)
    if not (options.fix or options.diff):
        remaining = engine.diagnose(text, name, ignored)
        _report(options, book, remaining, 0, stdout)
        return 0 if options.exit_zero or not remaining else 1
    result = engine.fix_text(text, name, options.unsafe_fixes, ignored)
    stderr.writelines(f"bnfix: {line}\n" for line in result.notes)
    if options.diff:
        if result.changed:
            stdout.write(formats.unified_diff(result))
        return 0 if options.exit_zero or not result.changed else 1
    stdout.write(result.new_text if result.new_text is not None else text)
    _report(options, book, result.diagnostics, len(result.fixed), stderr)
    return 0 if options.exit_zero or not result.diagnostics else 1
