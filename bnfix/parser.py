"""bnfix's argument parser: argparse with ruff's manners on a bad command line (imported by
`bnfix.cli` inside `main`, so that a Ctrl-C while it loads is handled)."""

from __future__ import annotations

import argparse
import os
import re
import sys
from typing import NoReturn


class Parser(argparse.ArgumentParser):
    """argparse with ruff's manners on a bad command line: the usage of the command that was
    run, and the nearest valid option or command when one was mistyped."""

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        self.width: int | None = None  # what help is wrapped to (read at the first formatter)
        super().__init__(*args, **kwargs)
        self.commands: dict[str, argparse.ArgumentParser] = {}
        self.top: argparse.ArgumentParser | None = None  # the bnfix parser, for a subcommand's

    def _get_formatter(self) -> argparse.HelpFormatter:
        # argparse makes a formatter for each option it adds, each asking shutil for the
        # terminal's width: importing shutil (it imports the compression modules) and those
        # ~40 lookups were a tenth of an empty run
        if self.width is None:
            self.width = _width()
        return self.formatter_class(prog=self.prog, width=self.width)

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}{self._hint(message)}\n"
                     f"For more information, try `{self.prog} --help`.\n")

    def _hint(self, message: str) -> str:
        choice = re.search(r"invalid choice: '?([^' ]*)'? \(choose from (.*)\)", message)
        if choice is not None:
            options = [c.strip(" '\"") for c in choice.group(2).split(",")]
            return _suggest(choice.group(1), options)
        unknown = re.match(r"unrecognized arguments: (.*)", message)
        if unknown is None:
            return ""
        for token in unknown.group(1).split():
            if not token.startswith("-"):
                continue
            flag = token.split("=", 1)[0]
            if self.top is not None and flag in self.top._option_string_actions:
                return f" (`{flag}` is an option of `bnfix` itself: `bnfix {flag}`)"
            return _suggest(flag, list(self._option_string_actions))
        return ""


def _width() -> int:
    """The width argparse wraps help to: the terminal's columns as `shutil.get_terminal_size`
    reads them (COLUMNS, else the terminal of stdout, else 80), less argparse's margin of 2."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns
        except (AttributeError, ValueError, OSError):
            columns = 0
    return (columns or 80) - 2


def _suggest(word: str, options: list[str]) -> str:
    import difflib

    match = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    return f" (did you mean `{match[0]}`?)" if match else ""
