"""`bnfix check` / `bnfix fix`: discover files, run the engine over them (in worker processes
when the tree is large), write fixes atomically, report, and choose the exit code."""

from __future__ import annotations

import contextlib
import functools
import io
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple, TextIO

from bnfix.atomic import replace_text
from bnfix.cache import Cache, cache_folder, cache_key
from bnfix.config import ConfigError, Settings, check_selectors, load_settings
from bnfix.engine import Engine
from bnfix.files import Candidate, IgnoreFiles, discover
from bnfix.findings import Diagnostic, FileResult, Pos, Span
from bnfix.fixes import NotWritten, Writer
from bnfix.project.modules import project_root
from bnfix.project.pins import tensorflow_pin
from bnfix.project.runner import ProjectRunner
from bnfix.report import formats
from bnfix.rulebook import COMMANDS, RuleBook, RuleBookError, load_rulebook


class LintOptions(NamedTuple):
    """What `bnfix check`/`fix` were asked (the command line, or the Python API)."""

    paths: Sequence[str] = ()
    fix: bool = False
    unsafe_fixes: bool | None = None  # None: the configuration's `unsafe-fixes` (default off)
    diff: bool = False
    select: list[str] | None = None
    ignore: Sequence[str] = ()
    extend_select: Sequence[str] = ()
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
    command: str = "check"  # check | fix: what the hints tell the user to run
    exclude: list[str] | None = None  # replaces the configuration's `exclude`
    extend_exclude: Sequence[str] = ()
    quiet: bool = False  # findings only: no summary, hints or warnings
    silent: bool = False  # no output at all (the exit code still says)
    show_fixes: bool = False  # list what was fixed
    fix_only: bool = False  # fix, and report nothing that remains
    output_file: str | None = None  # the report goes there instead of stdout
    add_noqa: bool = False  # add a noqa directive (with the codes) on each finding's line
    show_settings: bool = False
    show_files: bool = False
    cache_dir: str | None = None  # None: BNFIX_CACHE_DIR, the configuration's, .bnfix_cache/
    isolated: bool = False  # read no configuration file
    target_version: tuple[int, ...] | None = None  # the TensorFlow target (`target-tensorflow`)
    max_file_size: int | None = None  # bytes (0: no limit); None: the configuration's
    verbose: bool = False  # print the traceback of an internal error


class UsageError(Exception):
    """A problem with how bnfix was called or configured (exit code 2)."""


class Outcome:
    """What a run found and did, for the report and the exit status (gathered as it goes)."""

    __slots__ = ("changed", "errors", "fixed", "internal", "remaining", "results", "warnings")

    def __init__(self) -> None:
        self.results: list[FileResult] = []
        self.remaining: list[Diagnostic] = []
        self.fixed = 0
        self.changed: list[FileResult] = []
        self.errors: list[str] = []
        self.warnings: list[str] = []  # shown unless --quiet
        self.internal: list[tuple[str, str]] = []  # (path, traceback)


def prepare(options: LintOptions, start: Path) -> tuple[RuleBook, Settings, Engine]:
    """Load the rule book and the configuration and build the engine they select."""
    try:
        settings = _load_settings(options, start)
        _command_line_settings(options, settings)
        book = load_rulebook(cache=cache_folder(settings) if options.cache else None)
        settings.check_codes(book)
        for flag, values in (("--select", options.select or []), ("--ignore", options.ignore),
                             ("--extend-select", options.extend_select)):
            check_selectors(book, values, flag)
    except (ConfigError, RuleBookError) as exc:
        raise UsageError(str(exc)) from exc
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
    if settings.target_origin != "configured":
        engine.pin_root = str(project_root([start], settings.root if settings.source is not None
                                           else None).resolve())
    return book, settings, engine


def _load_settings(options: LintOptions, start: Path) -> Settings:
    if options.isolated:  # the defaults, as if no configuration file existed
        return Settings(root=Path.cwd())
    return load_settings(Path(options.config) if options.config else None, start)


def _command_line_settings(options: LintOptions, settings: Settings) -> None:
    """What the command line overrides (ruff's precedence: the flag wins over the file)."""
    if options.exclude is not None:
        settings.exclude = options.exclude
    settings.extend_exclude = [*settings.extend_exclude, *options.extend_exclude]
    if options.unsafe_fixes is not None:
        settings.unsafe_fixes = options.unsafe_fixes
    cache_dir = options.cache_dir or os.environ.get("BNFIX_CACHE_DIR")
    if cache_dir:
        settings.cache_dir = Path(cache_dir).expanduser()
    if options.target_version is not None:  # as binding as `target-tensorflow`: pins yield
        settings.target_tensorflow, settings.target_origin = options.target_version, "configured"
    if options.max_file_size is not None:
        settings.max_file_size = options.max_file_size


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
    paths, missing = _existing(options)
    walk = walker(settings)
    outcome = Outcome()
    root = project_root(paths, settings.root if settings.source is not None else None) \
        if paths else Path.cwd()
    outside = _Outside(root)
    reported = []
    walked: list[Path] = []
    ignore_files = IgnoreFiles()  # read once for both walks
    for candidate in walk(paths, force_exclude=options.force_exclude, walked=walked,
                          ignore_files=ignore_files):
        if outside(candidate):
            outcome.errors.append(f"{candidate.path}: skipped: a symbolic link to a file outside "
                                  f"{root} (name it on the command line to check it)")
        else:
            reported.append((str(candidate.path), settings.ignored_for(candidate.path,
                                                                      engine.book)))
    for path in missing:  # reported like a file that cannot be read (ruff's E902)
        _missing_path(path, engine, settings, outcome)
    if paths and not reported:
        outcome.warnings.append("No Python files found under the given path(s)")
    if not paths:
        return outcome
    # the project's files: those of the walk of its root, unless that walk was the one above
    # (`bnfix check .`: the walk is a tenth of a warm run on a tree of 15,000 entries)
    covered = Path(os.path.abspath(root)) in walked
    scope = [str(c.path) for c in walk([root], ignore_files=ignore_files) if not outside(c)] \
        if options.project and not covered else []
    outcome.errors.extend(ignore_files.notes)
    show = options.progress if options.progress is not None else stderr.isatty()
    progress = _Progress(stderr, show)
    fixing = options.fix or options.diff
    cache = None
    if options.cache:
        cache = findings_cache(engine, settings, options.project)
    runner = ProjectRunner(engine, cache=cache, fix=fixing, unsafe=bool(settings.unsafe_fixes),
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


def _existing(options: LintOptions) -> tuple[list[Path], list[Path]]:
    """The paths to check, and those that do not exist (a broken symlink exists: it is
    reported as unreadable when it is read)."""
    given = [Path(p) for p in (options.paths or ["."])]
    missing = [p for p in given if not p.exists() and not p.is_symlink()]
    return [p for p in given if p not in missing], missing


def walker(settings: Settings) -> functools.partial:
    """`discover` with the configuration's excludes (check, stdin and the server walk alike)."""
    return functools.partial(discover, root=settings.root, exclude=settings.exclude,
                             extend_exclude=settings.extend_exclude,
                             respect_gitignore=settings.respect_gitignore)


def _missing_path(path: Path, engine: Engine, settings: Settings, outcome: Outcome) -> None:
    """A path that does not exist: a BN901 finding when BN901 is on (the rest of the run goes
    on), else a warning (as ruff reports E902, or warns when E902 is off)."""
    if "BN901" in engine.enabled and "BN901" not in settings.ignored_for(path, engine.book):
        rule = engine.book.rules["BN901"]
        outcome.remaining.append(Diagnostic(str(path), "BN901", rule.name, Span.at(Pos(1, 0)),
                                            "cannot read: No such file or directory", None,
                                            rule.url))
    else:
        outcome.warnings.append(f"Failed to lint {path}: No such file or directory")


def findings_cache(engine: Engine, settings: Settings, project: bool = True) -> Cache:
    """The findings cache of a run with this engine and these settings (`bnfix check`, stdin
    and `bnfix server` share it)."""
    key = cache_key(engine.book.digest, engine.enabled,
                    {**engine.targets, "all-syntax": (int(engine.all_syntax_errors),),
                     "project": (int(project),), "explicit": (int(engine.target_explicit),)})
    return Cache(settings.root, key, cache_folder(settings))


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
    _check_combination(options)
    if options.quiet or options.silent:
        options = options._replace(progress=False)
    use_stdin = list(options.paths) == ["-"] or (options.stdin_filename is not None and not options.paths)
    if use_stdin and options.add_noqa:
        raise UsageError("--add-noqa edits files: it cannot be used with stdin")
    start = Path(options.stdin_filename).parent if use_stdin and options.stdin_filename else Path(
        options.paths[0] if options.paths else ".")
    book, settings, engine = prepare(options, start)
    _check_selectors(options, book)
    if options.show_settings:
        from bnfix.report.settings import show_settings

        stdout.write(show_settings(settings, engine, start))
        return 0
    if options.show_files:
        paths, _ = _existing(options)
        found = walker(settings)(paths, force_exclude=options.force_exclude) if paths else ()
        stdout.writelines(f"{name}\n" for name in sorted(os.path.abspath(c.path) for c in found))
        return 0
    sink = io.StringIO()  # --silent: everything goes here and nowhere else
    out, log = (sink, sink) if options.silent else (stdout, stderr)
    captured = io.StringIO() if options.output_file and not options.silent else None
    if use_stdin:
        code = _run_stdin(options, book, settings, engine, stdin, out, captured, log)
    else:
        code = _run_paths(options, book, settings, engine, captured or out, log)
    if captured is not None and options.output_file:
        _write_output(Path(options.output_file), captured.getvalue())
    return code


def _check_selectors(options: LintOptions, book: RuleBook) -> None:
    """`--select BN201` on check: a usage error naming the command that runs those rules,
    rather than a run that selects nothing and says "All checks passed!"."""
    for flag, selectors in (("--select", options.select or []),
                            ("--extend-select", options.extend_select)):
        misplaced = book.misplaced(selectors, "source")
        if misplaced is not None:
            selector, target = misplaced
            raise UsageError(f"`{flag} {selector}` selects {target} rules only, which "
                             f"`{COMMANDS[target]}` runs (`bnfix {options.command}` runs the "
                             "source-code rules)")


def _check_combination(options: LintOptions) -> None:
    """Flags that contradict each other are a usage error (as in ruff)."""
    fix = "`bnfix fix`" if options.command == "fix" else "--fix"
    pairs = [("--add-noqa", options.add_noqa, "--diff", options.diff),
             ("--add-noqa", options.add_noqa, fix, options.fix),
             ("--diff", options.diff, "--show-fixes", options.show_fixes),
             ("--isolated", options.isolated, "--config", options.config is not None)]
    for first, a, second, b in pairs:
        if a and b:
            raise UsageError(f"{first} cannot be used with {second}")
    if options.statistics and options.output_format not in formats.STATISTICS_FORMATS:
        raise UsageError(f"--statistics cannot be written as {options.output_format} (use "
                         f"{', '.join(formats.STATISTICS_FORMATS)})")


def _write_output(path: Path, text: str) -> None:
    """-o/--output-file: the report replaces the file at once."""
    try:
        replace_text(path, text, f".{path.name}.", ".bnfix")
    except OSError as exc:
        raise UsageError(f"{path}: cannot write the output file ({exc.strerror or exc})") from exc


def _unsafe_flag(options: LintOptions) -> str:
    """How to ask for the held-back fixes with the command that ran."""
    return "--unsafe-fixes" if options.command == "fix" else "--fix --unsafe-fixes"


def _run_paths(options: LintOptions, book: RuleBook, settings: Settings, engine: Engine,
               out: TextIO, log: TextIO) -> int:
    """The report of a run over files; exit 2 when a file's analysis raised (a bnfix bug),
    whatever the findings."""
    outcome = lint_paths(options, engine, settings, log)
    log.writelines(f"bnfix: {line}\n" for line in outcome.errors)
    if not options.quiet:
        log.writelines(f"bnfix: warning: {line}\n" for line in outcome.warnings)
    code = _outcome_report(options, book, settings, outcome, out, log)
    if outcome.internal:
        _report_internal(outcome.internal, options.verbose, log)
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


def _outcome_report(options: LintOptions, book: RuleBook, settings: Settings, outcome: Outcome,
                    out: TextIO, log: TextIO) -> int:
    """Findings, diff, fix listing or noqa directives, as the options ask: the exit code."""
    hidden = formats.hidden_fixes(outcome.remaining, bool(settings.unsafe_fixes))
    if options.add_noqa:
        from bnfix.report.add_noqa import add_noqa

        added = add_noqa(outcome.remaining, settings.max_bytes)
        log.writelines(f"bnfix: {line}\n" for line in added.notes)
        if added.added and not options.quiet:
            log.write(f"Added {added.added} noqa directive{'s' if added.added != 1 else ''}.\n")
        return 0
    if options.diff:
        out.writelines(formats.unified_diff(result) for result in outcome.changed)
        if not options.quiet:
            out.write(formats.would_fix(sum(len(r.fixed) for r in outcome.changed), hidden))
        return 0 if options.exit_zero or not outcome.changed else 1
    listing = formats.fixes_listing(outcome.changed, book) if options.show_fixes else ""
    if options.fix_only:
        if not options.quiet:
            out.write(listing + formats.fixed_only(outcome.fixed, hidden))
        return 0
    _report(options, book, outcome.remaining, outcome.fixed, out, settings.unsafe_fixes, listing)
    return 0 if options.exit_zero or not outcome.remaining else 1


def _report(options: LintOptions, book: RuleBook, remaining: list[Diagnostic], fixed: int,
            stdout: TextIO, unsafe_fixes: bool | None, listing: str = "") -> None:
    """The findings, then (for people) the fixes listed and ruff's summary lines;
    `unsafe_fixes` as the settings say it (None: not set, held-back fixes are counted)."""
    human = options.output_format in ("full", "concise")
    unsafe = bool(unsafe_fixes)
    if options.statistics:
        stdout.write(formats.statistics(remaining, book, unsafe, options.output_format))
    else:
        stdout.write(formats.render(options.output_format, remaining, book, unsafe))
    if human and not options.quiet:
        if remaining and options.output_format == "full" and not options.statistics:
            stdout.write("\n")
        stdout.write(listing)
        stdout.write(formats.summary(remaining, fixed, unsafe, _unsafe_flag(options),
                                     hint=unsafe_fixes is None))


def _stdin_result(options: LintOptions, settings: Settings, engine: Engine, text: str,
                  fixing: bool) -> tuple[FileResult, list[tuple[str, str]]]:
    """The text on stdin as `bnfix check FILE` sees the file that --stdin-filename names: with
    the project around it (the text standing in for the file, so findings that depend on other
    files, and those of other files that depend on it, are as for the saved file). Without a
    file name, or with the project pass off, the text alone. Also the internal errors met (a
    bnfix bug in some file: reported, exit 2)."""
    name = options.stdin_filename
    unsafe = bool(settings.unsafe_fixes)
    ignored = settings.ignored_for(Path(name or "-"), engine.book)
    if name is None or not options.project:
        if fixing:
            return engine.fix_text(text, name or "-", unsafe, ignored), []
        return FileResult(name or "-", engine.diagnose(text, name or "-", ignored)), []
    root = project_root([Path(name)], settings.root if settings.source is not None else None)
    outside = _Outside(root)
    scope = [str(c.path) for c in walker(settings)([root]) if not outside(c)]
    cache = findings_cache(engine, settings) if options.cache else None
    runner = ProjectRunner(engine, cache=cache, fix=fixing, unsafe=unsafe,
                           jobs=default_jobs() if options.jobs is None else options.jobs,
                           max_bytes=settings.max_bytes, overlay={os.path.abspath(name): text})
    results = list(runner.run([(name, ignored)], scope, root))
    if cache is not None:
        cache.save()
    result = next((r for r in results if r.path == name), FileResult(name, ignored=ignored))
    result.notes = [*result.notes, *runner.notes]
    internal = [*runner.internal, *([(name, result.internal)] if result.internal else [])]
    return result, internal


def _run_stdin(options: LintOptions, book: RuleBook, settings: Settings, engine: Engine,
               stdin: TextIO, stdout: TextIO, captured: TextIO | None, log: TextIO) -> int:
    """The text on stdin: findings to stdout; with --fix the fixed text to stdout and the
    findings to stderr. `captured`: the --output-file, which takes the findings instead."""
    text = stdin.read()
    fixing = bool(options.fix or options.diff)
    result, internal = _stdin_result(options, settings, engine, text, fixing)
    code = _stdin_report(options, book, settings, result, text, stdout, captured, log)
    if internal:
        _report_internal(internal, options.verbose, log)
        return 2
    return code


def _stdin_report(options: LintOptions, book: RuleBook, settings: Settings, result: FileResult,
                  text: str, stdout: TextIO, captured: TextIO | None, log: TextIO) -> int:
    """Findings (or the fixed text, or the diff) of the text on stdin: the exit code."""
    unsafe = bool(settings.unsafe_fixes)
    log.writelines(f"bnfix: {line}\n" for line in result.notes)
    if not (options.fix or options.diff):
        _report(options, book, result.diagnostics, 0, captured or stdout, settings.unsafe_fixes)
        return 0 if options.exit_zero or not result.diagnostics else 1
    if options.diff:
        if result.changed:
            (captured or stdout).write(formats.unified_diff(result))
        return 0 if options.exit_zero or not result.changed else 1
    stdout.write(result.new_text if result.new_text is not None else text)
    report = captured or log
    if options.fix_only:
        if not options.quiet:
            hidden = formats.hidden_fixes(result.diagnostics, unsafe)
            report.write(formats.fixed_only(len(result.fixed), hidden))
        return 0
    listing = formats.fixes_listing([result], book) if options.show_fixes else ""
    _report(options, book, result.diagnostics, len(result.fixed), report, settings.unsafe_fixes,
            listing)
    return 0 if options.exit_zero or not result.diagnostics else 1
