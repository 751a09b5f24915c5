"""The command line: parses arguments and calls one function per command.

Nothing but `sys` is imported when this module loads: everything else is imported inside
`main`, where a Ctrl-C that lands while modules are still loading is caught (exit 130, one
line) like one that lands later."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable

EPILOG = "Exit codes: 0 clean (or everything fixed), 1 findings remain, 2 usage or internal error."


def _codes(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def _tf_version(value: str) -> tuple[int, ...]:
    """`--target-version 2.15` (or `tf2.15`): the TensorFlow release the code targets."""
    import argparse

    text = value.strip().lower().removeprefix("tf")
    parts = text.split(".")
    if not all(p.isdigit() for p in parts):
        raise argparse.ArgumentTypeError(f"`{value}` is not a TensorFlow version like 2.15")
    return tuple(int(p) for p in parts)


def _size(value: str) -> int:
    import argparse

    from bnfix.config import ConfigError, parse_size

    try:
        return parse_size(value, "--max-file-size")
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _tensor_bytes(value: str) -> int:
    """`1000`, `64K`, `256M`, `2G` -> bytes (convert's and inspect's --max-tensor-bytes)."""
    import argparse

    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(value[-1:].upper(), 1)
    try:
        size = int(value[:-1] if scale > 1 else value) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"`{value}` is not a size like 256M") from None
    if size <= 0:
        raise argparse.ArgumentTypeError(f"`{value}`: the size must be positive")
    return size


def _lint_arguments(parser: argparse.ArgumentParser, fix_default: bool) -> None:
    parser.add_argument("paths", nargs="*", help="files or folders (default: .); `-` reads stdin")
    if not fix_default:
        parser.add_argument("--fix", action="store_true", default=None,
                            help="apply fixes (safe ones by default)")
        parser.add_argument("--no-fix", dest="fix", action="store_false",
                            help="do not apply fixes (overrides --fix)")
    parser.add_argument("--unsafe-fixes", action="store_true", default=None,
                        help="also apply fixes that change behaviour on purpose (configuration: "
                             "`unsafe-fixes = true`)")
    parser.add_argument("--no-unsafe-fixes", dest="unsafe_fixes", action="store_false",
                        help="apply safe fixes only, whatever the configuration says")
    parser.add_argument("--fix-only", action="store_true",
                        help="apply fixes and report nothing that remains (exit 0)")
    parser.add_argument("--show-fixes", action="store_true", help="list the fixes applied")
    parser.add_argument("--diff", action="store_true",
                        help="print the fixes as a unified diff and write nothing")
    parser.add_argument("--add-noqa", action="store_true",
                        help="write `# noqa: CODE` on the line of each finding")
    parser.add_argument("--select", type=_codes, default=None,
                        help="rules to enable: codes, prefixes (BN0), names or ALL (replaces config)")
    parser.add_argument("--ignore", type=_codes, default=[], action="extend",
                        help="rules to disable (added to the configuration's)")
    parser.add_argument("--extend-select", type=_codes, default=[], action="extend",
                        help="rules to enable on top of the selection")
    parser.add_argument("--output-format", default="full",
                        choices=("full", "concise", "json", "github", "sarif"))
    parser.add_argument("-o", "--output-file", help="write the report to this file, not stdout")
    parser.add_argument("--statistics", action="store_true", help="count findings per rule")
    parser.add_argument("--exit-zero", action="store_true", help="exit 0 even with findings")
    parser.add_argument("-q", "--quiet", action="store_true",
                        help="print the findings only (no summary, hints or warnings)")
    parser.add_argument("-s", "--silent", action="store_true",
                        help="print nothing (the exit code still says whether findings remain)")
    parser.add_argument("--stdin-filename", help="the name of the file read from stdin")
    parser.add_argument("--config", help="the configuration file: a pyproject.toml ([tool.bnfix]) "
                                         "or a bnfix.toml")
    parser.add_argument("--isolated", action="store_true", help="read no configuration file")
    parser.add_argument("--show-settings", action="store_true",
                        help="print the resolved settings and exit")
    parser.add_argument("--show-files", action="store_true",
                        help="print the files that would be checked and exit")
    parser.add_argument("--exclude", type=_codes, default=None, action="extend",
                        help="file patterns to skip (replaces the configuration's `exclude`)")
    parser.add_argument("--extend-exclude", type=_codes, default=[], action="extend",
                        help="file patterns to skip on top of `exclude`")
    parser.add_argument("--target-version", type=_tf_version, metavar="TF_VERSION",
                        help="the TensorFlow release the code runs on, e.g. 2.15 (overrides "
                             "`target-tensorflow` and the project's pins)")
    parser.add_argument("--cache-dir", help="where to keep the cache (default: .bnfix_cache/; "
                                            "env BNFIX_CACHE_DIR)")
    parser.add_argument("-j", "--jobs", type=int, default=None,
                        help="worker processes (default: cores, 1 under pre-commit)")
    parser.add_argument("--force-exclude", action="store_true",
                        help="apply excludes also to files named on the command line")
    parser.add_argument("--no-respect-gitignore", dest="respect_gitignore", action="store_false",
                        default=None, help="check files that .gitignore excludes")
    parser.add_argument("--no-progress", dest="progress", action="store_false", default=None,
                        help="no progress line on a terminal")
    parser.add_argument("--no-cache", dest="cache", action="store_false",
                        help="do not read or write .bnfix_cache/")
    parser.add_argument("--report-all-syntax-errors", action="store_true",
                        help="parse every file and report any syntax error as BN900 (by default "
                             "only files a rule reads are parsed)")
    parser.add_argument("--max-file-size", type=_size, default=None, metavar="SIZE",
                        help="skip (with one line) files larger than this: bytes, or with a k/M "
                             "suffix (default 2M; 0: no limit)")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="print the traceback of an internal error")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """bnfix's parser. `command`: the one subcommand it is built for (argparse builds a help
    formatter for every option and looks up translations for every parser: building them all
    cost more than the rest of an empty run); None, or a word that is no command, builds
    every command (for `bnfix --help` and the "did you mean" of a mistyped one)."""
    from bnfix import __version__
    from bnfix.parser import Parser

    parser = Parser(
        prog="bnfix",
        description="Find and fix BatchNorm bugs in TensorFlow, Keras and PyTorch code.",
        epilog=EPILOG,
    )
    parser.add_argument("--version", action="version", version=f"bnfix {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (settings, add) in _COMMAND_PARSERS.items():
        if command in _COMMAND_PARSERS and command != name:
            continue
        add(sub.add_parser(name, **settings))
    parser.commands = dict(sub.choices)
    for made in parser.commands.values():
        if isinstance(made, Parser):
            made.top = parser
    return parser


def _rule_arguments(rule: argparse.ArgumentParser) -> None:
    rule.add_argument("code", nargs="?", help="rule code or name, e.g. BN001")
    rule.add_argument("--all", action="store_true", help="every rule")
    rule.add_argument("--output-format", default="text", choices=("text", "json"))


def _rules_arguments(rules: argparse.ArgumentParser) -> None:
    rules.add_argument("--output-format", default="text", choices=("text", "json", "markdown"))


def _convert_arguments(convert: argparse.ArgumentParser) -> None:
    convert.add_argument("model", help="MODEL.keras or MODEL.onnx")
    convert.add_argument("--to", required=True,
                         choices=("sync", "plain", "groupnorm", "inference", "folded"),
                         help="sync|plain|groupnorm for .keras, inference|folded for .onnx")
    convert.add_argument("-o", "--output", required=True, help="where to write the result")
    convert.add_argument("--groups", type=int, default=32,
                         help="--to groupnorm: groups per layer (default 32; a divisor of the "
                              "channels is used where 32 does not divide them)")
    convert.add_argument("--max-tensor-bytes", type=_tensor_bytes, default=None, metavar="BYTES",
                         help="refuse a model member that declares more (default 256 MiB; "
                              "suffixes K, M, G)")


def _inspect_arguments(inspect: argparse.ArgumentParser) -> None:
    inspect.add_argument("paths", nargs="+", help="checkpoints, graphs, model files or folders")
    inspect.add_argument("--output-format", default="full",
                         choices=("full", "concise", "json", "github", "sarif"))
    inspect.add_argument("--select", type=_codes, default=None, help="rules to enable")
    inspect.add_argument("--ignore", type=_codes, default=[], action="extend",
                         help="rules to disable")
    inspect.add_argument("--plot", help="write a PNG of per-layer BN statistics here")
    inspect.add_argument("--allow-pickle", action="store_true",
                         help="load full pickled torch models (runs code from the file: only for "
                              "files you trust)")
    inspect.add_argument("--exit-zero", action="store_true", help="exit 0 even with findings")
    inspect.add_argument("--config", help="the configuration file: a pyproject.toml ([tool.bnfix]) "
                                         "or a bnfix.toml")
    inspect.add_argument("--max-tensor-bytes", type=_tensor_bytes, default=None, metavar="BYTES",
                         help="refuse (BN902) a tensor, config or pickle that declares more "
                              "(default 256 MiB; suffixes K, M, G), before reading it")
    inspect.add_argument("--no-cache", action="store_true",
                         help="read every artifact; neither read nor write the cache")


def _validate_arguments(validate: argparse.ArgumentParser) -> None:
    from bnfix.validate.arguments import add_arguments

    add_arguments(validate)


def _doctor_arguments(doctor: argparse.ArgumentParser) -> None:
    from bnfix.doctor.arguments import add_arguments

    add_arguments(doctor)


def _server_arguments(server: argparse.ArgumentParser) -> None:
    server.add_argument("--no-cache", dest="cache", action="store_false",
                        help="do not read or write .bnfix_cache/")
    server.add_argument("--debounce", type=_seconds, default=None, metavar="SECONDS",
                        help="wait this long after an edit before analysing (default 0.15)")


def _version_arguments(version: argparse.ArgumentParser) -> None:
    version.add_argument("--output-format", default="text", choices=("text", "json"))


# Each command: what `add_parser` is given, and what adds its options.
_COMMAND_PARSERS: dict[str, tuple[dict[str, str], Callable[[argparse.ArgumentParser], None]]] = {
    "check": ({"help": "report BatchNorm bugs (static: never runs your code)",
               "epilog": EPILOG, "usage": "%(prog)s [OPTIONS] [PATHS ...]"},
              lambda check: _lint_arguments(check, fix_default=False)),
    "fix": ({"help": "fix BatchNorm bugs in place (= check --fix)",
             "epilog": EPILOG, "usage": "%(prog)s [OPTIONS] [PATHS ...]"},
            lambda fix: _lint_arguments(fix, fix_default=True)),
    "rule": ({"help": "print a rule's documentation"}, _rule_arguments),
    "rules": ({"help": "list the rules"}, _rules_arguments),
    "convert": ({"help": "rewrite a model file's BN layers (Keras: sync|plain|groupnorm; ONNX: "
                         "inference|folded)",
                 "epilog": "Exit codes: 0 written, 1 the rewrite failed its check (nothing "
                           "written), 2 usage."},
                _convert_arguments),
    "inspect": ({"help": "find BN bugs' fingerprints in checkpoints, graphs and exported models",
                 "epilog": EPILOG},
                _inspect_arguments),
    "validate": ({"help": "prove a BN rewrite by running both versions (runs your code)"},
                 _validate_arguments),
    "doctor": ({"help": "run a training command with BN monitors and diagnose BN (runs your "
                        "code)",
                "epilog": "Exit codes: 0 no finding, 1 findings, 2 usage error or the command "
                          "failed."},
               _doctor_arguments),
    "server": ({"help": "run the language server for editors (LSP over stdin/stdout)",
                "description": "A Language Server for editors (LSP over stdin/stdout): "
                               "diagnostics for open Python files — with their unsaved text, the "
                               "project's [tool.bnfix] configuration and the project around "
                               "them, as `bnfix check` reports them — and code actions: each "
                               "finding's fix (unsafe ones labelled), `# noqa` for its line, and "
                               "all safe fixes (source.fixAll.bnfix). See docs/editor.md.",
                "epilog": "Exit codes: 0 after the client's shutdown request, 1 when the client "
                          "exits without one, 2 usage (the server needs pygls: pip install "
                          "\"bnfix[lsp]\")."},
               _server_arguments),
    "version": ({"help": "print bnfix's version"}, _version_arguments),
}


def _seconds(value: str) -> float:
    import argparse

    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds <= 60:
        raise argparse.ArgumentTypeError(f"`{value}` is not a number of seconds from 0 to 60")
    return seconds


def _cmd_lint(args: argparse.Namespace) -> int:
    from bnfix.lint import LintOptions, run

    asked = getattr(args, "fix", None)  # check: --fix / --no-fix (the last one given wins)
    options = LintOptions(
        paths=args.paths,
        fix=args.fix_only or (args.command == "fix" if asked is None else asked),
        unsafe_fixes=args.unsafe_fixes,
        diff=args.diff,
        select=args.select,
        ignore=args.ignore,
        extend_select=args.extend_select,
        output_format=args.output_format,
        statistics=args.statistics,
        exit_zero=args.exit_zero,
        stdin_filename=args.stdin_filename,
        config=args.config,
        jobs=args.jobs,
        force_exclude=args.force_exclude,
        respect_gitignore=args.respect_gitignore,
        progress=args.progress,
        cache=args.cache,
        all_syntax_errors=args.report_all_syntax_errors,
        command=args.command,
        exclude=args.exclude,
        extend_exclude=args.extend_exclude,
        quiet=args.quiet,
        silent=args.silent,
        show_fixes=args.show_fixes,
        fix_only=args.fix_only,
        output_file=args.output_file,
        add_noqa=args.add_noqa,
        show_settings=args.show_settings,
        show_files=args.show_files,
        cache_dir=args.cache_dir,
        isolated=args.isolated,
        target_version=args.target_version,
        max_file_size=args.max_file_size,
        verbose=args.verbose,
    )
    return run(options)


def _cmd_version(args: argparse.Namespace) -> int:
    import json

    from bnfix import __version__

    if args.output_format == "json":
        sys.stdout.write(json.dumps({"version": __version__}, indent=2) + "\n")
    else:
        sys.stdout.write(f"bnfix {__version__}\n")
    return 0


def _rule_record(rule) -> dict:  # type: ignore[no-untyped-def]
    return {"code": rule.code, "name": rule.name, "summary": rule.summary,
            "severity": rule.severity, "fix": rule.fix, "default": rule.default,
            "frameworks": list(rule.frameworks),
            "url": rule.url, "explanation": rule.markdown()}


def _cmd_rule(args: argparse.Namespace) -> int:
    import json

    from bnfix.rulebook import load_rulebook

    book = load_rulebook()
    if args.all:
        chosen = [book.rules[c] for c in sorted(book.rules)]
    elif args.code:
        rule = book.get(args.code) or book.by_name(args.code)
        if rule is None:
            sys.stderr.write(f"bnfix: no rule `{args.code}` (see `bnfix rules`)\n")
            return 2
        chosen = [rule]
    else:
        sys.stderr.write("bnfix: give a rule code (e.g. `bnfix rule BN001`) or --all\n")
        return 2
    if args.output_format == "json":
        records = [_rule_record(r) for r in chosen]
        sys.stdout.write(json.dumps(records if args.all else records[0], indent=2) + "\n")
    else:
        sys.stdout.write("\n".join(r.markdown() for r in chosen))
    return 0


def _cmd_rules(args: argparse.Namespace) -> int:
    import json

    from bnfix.rulebook import load_rulebook, rules_table_markdown

    book = load_rulebook()
    rules = [book.rules[c] for c in sorted(book.rules)]
    if args.output_format == "json":
        sys.stdout.write(json.dumps([_rule_record(r) for r in rules], indent=2) + "\n")
    elif args.output_format == "markdown":
        sys.stdout.write(rules_table_markdown(book))
    else:
        width = max(len(r.name) for r in rules)
        for r in rules:
            sys.stdout.write(f"{r.code}  {r.name:<{width}}  {r.fix:<12}  {r.summary}\n")
    return 0


def _cmd_convert(args: argparse.Namespace) -> int:
    from bnfix.convert import convert_file

    return convert_file(args.model, args.to, args.output, args.groups, args.max_tensor_bytes)


def _cmd_inspect(args: argparse.Namespace) -> int:
    from bnfix.artifacts.inspect import inspect_command
    from bnfix.artifacts.limits import DEFAULT_MAX_BYTES

    return inspect_command(args.paths, output_format=args.output_format, select=args.select,
                           ignore=args.ignore, plot=args.plot, allow_pickle=args.allow_pickle,
                           exit_zero=args.exit_zero, config=args.config,
                           max_tensor_bytes=args.max_tensor_bytes or DEFAULT_MAX_BYTES,
                           cache=not args.no_cache)


def _cmd_validate(args: argparse.Namespace) -> int:
    from bnfix.validate.command import run

    return run(args)


def _cmd_doctor(args: argparse.Namespace) -> int:
    from bnfix.doctor.command import run

    return run(args)


def _cmd_server(args: argparse.Namespace) -> int:
    from bnfix.lsp.server import DEBOUNCE_SECONDS, serve

    return serve(cache=args.cache,
                 debounce=DEBOUNCE_SECONDS if args.debounce is None else args.debounce)


COMMANDS = {"check": _cmd_lint, "fix": _cmd_lint, "rule": _cmd_rule, "rules": _cmd_rules,
            "convert": _cmd_convert, "inspect": _cmd_inspect, "validate": _cmd_validate,
            "doctor": _cmd_doctor, "server": _cmd_server, "version": _cmd_version}


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except KeyboardInterrupt:  # also while bnfix's modules are still being imported
        sys.stderr.write(f"bnfix: {INTERRUPTED}\n")
        return 130


QUICK_EXIT = frozenset({"check", "fix"})  # commands that leave nothing for the teardown to do


def run() -> int:
    """The `bnfix` command: `main()`, and after `check` or `fix` an exit without the
    interpreter's teardown (every module and object freed one by one: 15-25 ms, a fifth of the
    check of an unchanged tree), once the output is flushed. Their workers are joined and their
    files written and closed before `main()` returns; the other commands (servers, training
    runs, temporary folders) exit as usual."""
    code = main()
    if _command_word(sys.argv[1:]) not in QUICK_EXIT:
        return code
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BrokenPipeError:  # the reader went away: as `main()` reports it
        code = 1
    except OSError:
        code = 2
    os._exit(code)


def _command_word(argv: list[str]) -> str | None:
    """The command: the first word (`bnfix` itself has no option that takes a value)."""
    return next((a for a in argv if not a.startswith("-")), None)


def _main(argv: list[str] | None) -> int:
    import signal

    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(_command_word(argv))
    args, extra = parser.parse_known_args(argv)
    if extra:  # reported with the usage of the command they were given to
        command = parser.commands.get(args.command or "", parser)
        command.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command is None:
        parser.print_help()
        return 2
    from bnfix.lint import UsageError

    previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        return COMMANDS[args.command](args)
    except UsageError as exc:
        sys.stderr.write(f"bnfix: {exc}\n")
        return 2
    except ModuleNotFoundError as exc:
        if args.command not in EXTRAS_COMMANDS or exc.name is None:
            raise
        extra = EXTRAS.get(exc.name.partition(".")[0], "all")
        sys.stderr.write(f"bnfix {args.command}: needs `{exc.name}`, which is not installed: "
                         f"pip install \"bnfix[{extra}]\" (check and fix need none of it)\n")
        return 2
    except BrokenPipeError:
        return 1
    except Terminated:
        sys.stderr.write(f"bnfix: {INTERRUPTED}\n")
        return 143
    finally:
        signal.signal(signal.SIGTERM, previous)


# Commands whose front-ends need the optional frameworks, and the extra that brings each module.
EXTRAS_COMMANDS = frozenset({"convert", "inspect", "validate", "doctor", "server"})
EXTRAS = {"torch": "torch", "numpy": "torch", "tensorflow": "tf", "keras": "tf", "h5py": "tf",
          "onnx": "onnx", "onnxruntime": "onnx", "matplotlib": "plot", "pygls": "lsp",
          "lsprotocol": "lsp"}

INTERRUPTED = ("interrupted: files already fixed are complete, the others are unchanged "
               "(no file is ever half-written)")


class Terminated(BaseException):
    """SIGTERM, raised like KeyboardInterrupt so that a write in progress is rolled back."""


def _terminated(_signum: int, _frame: object) -> None:
    raise Terminated()
