"""The command line: parses arguments and calls one function per command."""

from __future__ import annotations

import argparse
import json
import signal
import sys

from bnfix import __version__

EPILOG = "Exit codes: 0 clean (or everything fixed), 1 findings remain, 2 usage or internal error."


def _codes(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def _size(value: str) -> int:
    """`1000`, `64K`, `256M`, `2G` -> bytes."""
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
        parser.add_argument("--fix", action="store_true", help="apply fixes (safe ones by default)")
    parser.add_argument("--unsafe-fixes", action="store_true",
                        help="also apply fixes that change behaviour on purpose")
    parser.add_argument("--diff", action="store_true",
                        help="print the fixes as a unified diff and write nothing")
    parser.add_argument("--select", type=_codes, default=None,
                        help="rules to enable: codes, prefixes (BN0), names or ALL (replaces config)")
    parser.add_argument("--ignore", type=_codes, default=[], action="extend",
                        help="rules to disable (added to the configuration's)")
    parser.add_argument("--extend-select", type=_codes, default=[], action="extend",
                        help="rules to enable on top of the selection")
    parser.add_argument("--output-format", default="full",
                        choices=("full", "concise", "json", "github", "sarif"))
    parser.add_argument("--statistics", action="store_true", help="count findings per rule")
    parser.add_argument("--exit-zero", action="store_true", help="exit 0 even with findings")
    parser.add_argument("--stdin-filename", help="the name of the file read from stdin")
    parser.add_argument("--config", help="a pyproject.toml to read [tool.bnfix] from")
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bnfix",
        description="Find and fix BatchNorm bugs in TensorFlow, Keras and PyTorch code.",
        epilog=EPILOG,
    )
    parser.add_argument("--version", action="version", version=f"bnfix {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    check = sub.add_parser("check", help="report BatchNorm bugs (static: never runs your code)",
                           epilog=EPILOG)
    _lint_arguments(check, fix_default=False)
    fix = sub.add_parser("fix", help="fix BatchNorm bugs in place (= check --fix)", epilog=EPILOG)
    _lint_arguments(fix, fix_default=True)
    rule = sub.add_parser("rule", help="print a rule's documentation")
    rule.add_argument("code", nargs="?", help="rule code or name, e.g. BN001")
    rule.add_argument("--all", action="store_true", help="every rule")
    rule.add_argument("--output-format", default="text", choices=("text", "json"))
    rules = sub.add_parser("rules", help="list the rules")
    rules.add_argument("--output-format", default="text", choices=("text", "json", "markdown"))
    convert = sub.add_parser(
        "convert", help="rewrite a model file's BN layers (Keras: sync|plain; ONNX: inference|folded)",
        epilog="Exit codes: 0 written, 1 the rewrite failed its check (nothing written), 2 usage.")
    convert.add_argument("model", help="MODEL.keras or MODEL.onnx")
    convert.add_argument("--to", required=True,
                         choices=("sync", "plain", "inference", "folded"),
                         help="sync|plain for .keras, inference|folded for .onnx")
    convert.add_argument("-o", "--output", required=True, help="where to write the result")
    convert.add_argument("--max-tensor-bytes", type=_size, default=None, metavar="BYTES",
                         help="refuse a model member that declares more (default 256 MiB; "
                              "suffixes K, M, G)")
    inspect = sub.add_parser(
        "inspect", help="find BN bugs' fingerprints in checkpoints, graphs and exported models",
        epilog=EPILOG)
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
    inspect.add_argument("--config", help="a pyproject.toml to read [tool.bnfix] from")
    inspect.add_argument("--max-tensor-bytes", type=_size, default=None, metavar="BYTES",
                         help="refuse (BN902) a tensor, config or pickle that declares more "
                              "(default 256 MiB; suffixes K, M, G), before reading it")
    from bnfix.validate.arguments import add_arguments

    add_arguments(sub.add_parser("validate", help="prove a BN rewrite by running both versions "
                                                  "(runs your code)"))
    return parser


def _cmd_lint(args: argparse.Namespace) -> int:
    from bnfix.lint import LintOptions, run

    options = LintOptions(
        paths=args.paths,
        fix=args.command == "fix" or getattr(args, "fix", False),
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
    )
    return run(options)


def _rule_record(rule) -> dict:  # type: ignore[no-untyped-def]
    return {"code": rule.code, "name": rule.name, "summary": rule.summary,
            "severity": rule.severity, "fix": rule.fix, "frameworks": list(rule.frameworks),
            "url": rule.url, "explanation": rule.markdown()}


def _cmd_rule(args: argparse.Namespace) -> int:
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

    return convert_file(args.model, args.to, args.output, args.max_tensor_bytes)


def _cmd_inspect(args: argparse.Namespace) -> int:
    from bnfix.artifacts.inspect import inspect_command
    from bnfix.artifacts.limits import DEFAULT_MAX_BYTES

    return inspect_command(args.paths, output_format=args.output_format, select=args.select,
                           ignore=args.ignore, plot=args.plot, allow_pickle=args.allow_pickle,
                           exit_zero=args.exit_zero, config=args.config,
                           max_tensor_bytes=args.max_tensor_bytes or DEFAULT_MAX_BYTES)


def _cmd_validate(args: argparse.Namespace) -> int:
    from bnfix.validate.command import run

    return run(args)


COMMANDS = {"check": _cmd_lint, "fix": _cmd_lint, "rule": _cmd_rule, "rules": _cmd_rules,
            "convert": _cmd_convert, "inspect": _cmd_inspect, "validate": _cmd_validate}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
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
    except KeyboardInterrupt:
        sys.stderr.write(f"bnfix: {INTERRUPTED}\n")
        return 130
    except Terminated:
        sys.stderr.write(f"bnfix: {INTERRUPTED}\n")
        return 143
    finally:
        signal.signal(signal.SIGTERM, previous)


# Commands whose front-ends need the optional frameworks, and the extra that brings each module.
EXTRAS_COMMANDS = frozenset({"convert", "inspect", "validate"})
EXTRAS = {"torch": "torch", "numpy": "torch", "tensorflow": "tf", "keras": "tf", "h5py": "tf",
          "onnx": "onnx", "onnxruntime": "onnx", "matplotlib": "plot"}

INTERRUPTED = ("interrupted: files already fixed are complete, the others are unchanged "
               "(every write is a whole-file rename)")


class Terminated(BaseException):
    """SIGTERM, raised like KeyboardInterrupt so that a write in progress is rolled back."""


def _terminated(_signum: int, _frame: object) -> None:
    raise Terminated()
