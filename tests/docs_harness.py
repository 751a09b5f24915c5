"""Run the code blocks of Markdown files, doctest-style: the harness behind tests/test_docs.py
and scripts/newcomer, so that a command the documentation shows is a command that works.

What a fenced block is, by its language:

* ``console``: each ``$ command`` line (a trailing ``\\`` continues it on the next line) is run
  with bash; the lines after it, up to the next ``$``, are its expected output (stdout and
  stderr together). ``...`` alone on a line matches any number of lines, ``...`` inside a line
  any text; trailing spaces and blank lines do not count. The exit status is not compared (show
  it: ``; echo "exit $?"``).
* ``sh`` / ``bash`` / ``shell``: run with bash; must exit 0 (or the ``exit N`` directive's N).
* ``python``: run as a script of its own in the working folder; must exit 0.
* ``toml``: parsed; a ``[tool.bnfix]`` table is loaded by bnfix's configuration loader and its
  rule selectors expanded (unknown keys, codes or values fail).
* ``yaml`` and ``json``: parsed.
* ``text``: not code, never run (a ``$`` command line in it is an error: make it ``console``).

Any other language, a fence without one, or an indented code block is an error: every block
says what it is.

Directives, in an HTML comment on the line just above the fence (invisible once rendered),
several separated by ``;``::

    <!-- docs-test: skip (REASON) -->   not run; the test lists the reason (in parentheses)
    <!-- docs-test: newcomer -->        run only by scripts/newcomer (a fresh clone and venv)
    <!-- docs-test: project -->         runs in "your project" (see below), not the repository
    <!-- docs-test: file NAME -->       the block is written to NAME in its folder first
    <!-- docs-test: exit N -->          the sh block's expected exit status

Working folders: per Markdown file, one scratch copy of the repository (blocks run at its
root) and one project, a git repository made from ``fixtures/quickstart`` outside it (what the
README's quick start calls your own repository). A file's blocks share them in document order,
so what one block writes, the next one sees.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

RUN = {"console", "sh", "bash", "shell", "python"}
PARSE = {"toml", "yaml", "json"}
TEXT = {"text"}
_IGNORED_NAMES = shutil.ignore_patterns(
    ".git", "__pycache__", "*.pyc", ".bnfix_cache", ".pytest_cache", ".ruff_cache", "*.egg-info",
    "build", "dist", "site", ".venv",
)


def COPY_IGNORE(folder: str, names: list[str]) -> set[str]:  # noqa: N802 (shutil's callback)
    """What a scratch copy leaves out: tool output and caches, and any virtual environment
    whatever its name (a folder with `pyvenv.cfg`: a CI that makes its venv inside the
    checkout would otherwise be copied, gigabytes, for every workspace)."""
    skipped = set(_IGNORED_NAMES(folder, names))
    return skipped | {n for n in names if os.path.isfile(os.path.join(folder, n, "pyvenv.cfg"))}
DIRECTIVE = re.compile(r"^\s*<!--\s*docs-test:\s*(.*?)\s*-->\s*$")
COMMAND_TIMEOUT = 600


class DocsError(Exception):
    """A block that does not do what the documentation says (the message names file:line)."""


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # 1-based line of the opening fence
    lang: str
    text: str
    skip: str | None = None
    newcomer: bool = False
    project: bool = False
    file: str | None = None
    exit: int = 0

    @property
    def where(self) -> str:
        return f"{self.path.name}:{self.line}"

    @property
    def runs(self) -> bool:
        return self.lang in RUN | PARSE


def _directives(lines: list[str], fence_index: int) -> dict[str, str]:
    """The `docs-test:` comment on the line above the fence (0-based `fence_index`)."""
    if fence_index == 0:
        return {}
    match = DIRECTIVE.match(lines[fence_index - 1])
    if match is None:
        return {}
    out: dict[str, str] = {}
    body = match.group(1)
    reason = re.search(r"\bskip\s*\((.*)\)", body)  # a reason may hold `;`
    if reason is not None:
        out["skip"] = reason.group(1)
        body = body[:reason.start()] + body[reason.end():]
    for item in filter(None, (part.strip() for part in body.split(";"))):
        key, _, value = item.partition(" ")
        out[key] = value.strip()
    return out


def parse_blocks(path: Path) -> list[Block]:
    """Every code block of a Markdown file, with its directives (CommonMark, markdown-it)."""
    from markdown_it import MarkdownIt

    source = path.read_text(encoding="utf-8")
    lines = source.splitlines()
    blocks = []
    for token in MarkdownIt("commonmark").parse(source):
        if token.type not in ("fence", "code_block") or token.map is None:
            continue
        start = token.map[0]
        lang = token.info.split()[0] if token.type == "fence" and token.info.strip() else ""
        found = _directives(lines, start)
        unknown = set(found) - {"skip", "newcomer", "project", "file", "exit"}
        if unknown:
            raise DocsError(f"{path.name}:{start + 1}: unknown docs-test directive(s) "
                            f"{', '.join(sorted(unknown))}")
        skip = found.get("skip")
        if skip is not None:
            skip = skip.strip().removeprefix("(").removesuffix(")").strip()
            if not skip:
                raise DocsError(f"{path.name}:{start + 1}: `docs-test: skip` needs a reason")
        blocks.append(Block(
            path=path, line=start + 1, lang=lang if token.type == "fence" else "",
            text=token.content, skip=skip, newcomer="newcomer" in found,
            project="project" in found, file=found.get("file") or None,
            exit=int(found.get("exit", "0")),
        ))
    return blocks


def check_labels(blocks: list[Block]) -> None:
    """Every block says what it is; text blocks hold no commands."""
    for block in blocks:
        if block.lang == "":
            raise DocsError(f"{block.where}: a code block without a language: fence it with "
                            f"```console, ```sh, ```python, ```toml, ```yaml, ```json or ```text")
        if block.lang not in RUN | PARSE | TEXT and block.skip is None:
            raise DocsError(f"{block.where}: unknown block language `{block.lang}` (a block in "
                            "another language needs a skip marker saying what runs it)")
        if block.lang in RUN and block.skip is None and not block.newcomer and \
                re.search(r"\bpip3? install\b", block.text):
            raise DocsError(f"{block.where}: a block that runs `pip install` would install into "
                            "the environment running the tests: mark it `newcomer` (run in a "
                            "fresh venv by scripts/newcomer) or skip it with a reason")
        if block.lang in TEXT and any(line.startswith("$ ") for line in block.text.splitlines()):
            raise DocsError(f"{block.where}: a ```text block with `$ ` command lines: make it "
                            f"```console so that it runs (or mark it skipped with a reason)")


# -- matching expected output ------------------------------------------------------------------

def _line_pattern(expected: str) -> re.Pattern[str]:
    return re.compile(".*?".join(re.escape(part) for part in expected.split("...")))


def output_matches(expected: str, actual: str) -> bool:
    """`actual` fits `expected`, where a line `...` stands for any lines and `...` in a line for
    any text."""
    want = [line.rstrip() for line in expected.rstrip().splitlines()]
    got = [line.rstrip() for line in actual.rstrip().splitlines()]
    patterns = [None if line.strip() == "..." else _line_pattern(line) for line in want]
    memo: dict[tuple[int, int], bool] = {}

    def fits(i: int, j: int) -> bool:
        if (i, j) in memo:
            return memo[i, j]
        if i == len(patterns):
            result = j == len(got)
        elif patterns[i] is None:
            result = any(fits(i + 1, k) for k in range(j, len(got) + 1))
        else:
            result = j < len(got) and patterns[i].fullmatch(got[j]) is not None and fits(i + 1, j + 1)
        memo[i, j] = result
        return result

    return fits(0, 0)


def console_steps(text: str) -> list[tuple[str, str]]:
    """(command, expected output) pairs of a console block."""
    steps: list[tuple[str, list[str]]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("$ "):
            command = line[2:]
            while command.endswith("\\") and i + 1 < len(lines):
                i += 1
                command = command + "\n" + lines[i]
            steps.append((command, []))
        elif steps:
            steps[-1][1].append(line)
        elif line.strip():
            raise DocsError(f"console output before any `$ ` command: {line!r}")
        i += 1
    return [(command, "\n".join(out)) for command, out in steps]


# -- running -----------------------------------------------------------------------------------

@dataclass
class Workspace:
    """The folders a Markdown file's blocks run in, and how they run."""

    repo: Path  # the repository the blocks see (a scratch copy, or a fresh clone)
    project_source: Path  # fixtures/quickstart of that repository
    scratch: Path  # where the project and tool homes are made
    python: Path = field(default_factory=lambda: Path(sys.executable))
    run_newcomer: bool = False
    env_overrides: dict[str, str | None] = field(default_factory=dict)  # None: unset
    _project: Path | None = None

    @classmethod
    def copy_of(cls, repo: Path, scratch: Path, **kwargs: object) -> Workspace:
        """A workspace over a scratch copy of `repo` (nothing the blocks do touches `repo`)."""
        copy = scratch / "repo"
        shutil.copytree(repo, copy, ignore=COPY_IGNORE, symlinks=True)
        return cls(repo=copy, project_source=copy / "fixtures" / "quickstart", scratch=scratch,
                   **kwargs)  # type: ignore[arg-type]

    @property
    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != "PRE_COMMIT"}
        home = self.scratch / "home"
        home.mkdir(exist_ok=True)
        env.update({
            "PATH": f"{self.python.parent}{os.pathsep}{env.get('PATH', '')}",
            "PYTHONIOENCODING": "utf-8",
            "PRE_COMMIT_HOME": str(home / "pre-commit"),
            "GIT_AUTHOR_NAME": "docs test", "GIT_AUTHOR_EMAIL": "docs@example.invalid",
            "GIT_COMMITTER_NAME": "docs test", "GIT_COMMITTER_EMAIL": "docs@example.invalid",
            "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": str(home / "gitconfig"),
        })
        for key, value in self.env_overrides.items():
            if value is None:
                env.pop(key, None)
            else:
                env[key] = value
        return env

    @property
    def project(self) -> Path:
        """Your project: fixtures/quickstart copied out of the repository, a git repository
        with its files committed."""
        if self._project is None:
            project = self.scratch / "myproject"
            shutil.copytree(self.project_source, project, ignore=COPY_IGNORE)
            for args in (["init", "-q", "-b", "main"], ["add", "-A"],
                         ["commit", "-q", "-m", "my project"]):
                subprocess.run(["git", *args], cwd=project, env=self.env, check=True,
                               capture_output=True)
            self._project = project
        return self._project

    def folder(self, block: Block) -> Path:
        return self.project if block.project else self.repo

    def skip_reason(self, block: Block) -> str | None:
        if block.skip:
            return block.skip
        if block.newcomer and not self.run_newcomer:
            return "installs into a fresh virtual environment: scripts/newcomer runs it"
        return None

    def run(self, block: Block) -> None:
        """Run or parse one block; DocsError says how it differs from the documentation."""
        where = self.folder(block)
        if block.file:
            target = where / block.file
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(block.text, encoding="utf-8")
        if block.lang == "console":
            self._console(block, where)
        elif block.lang in ("sh", "bash", "shell"):
            proc = self._bash(block.text, where)
            if proc.returncode != block.exit:
                raise DocsError(f"{block.where}: exit {proc.returncode} (expected {block.exit})\n"
                                f"{_tail(proc.stdout)}")
        elif block.lang == "python":
            proc = subprocess.run([str(self.python), "-"], input=block.text, cwd=where,
                                  env=self.env, capture_output=True, text=True,
                                  timeout=COMMAND_TIMEOUT, check=False)
            if proc.returncode != 0:
                raise DocsError(f"{block.where}: the Python block exits {proc.returncode}\n"
                                f"{_tail(proc.stdout + proc.stderr)}")
        elif block.lang == "toml":
            check_toml(block)
        elif block.lang == "yaml":
            import yaml

            try:
                yaml.safe_load(block.text)
            except yaml.YAMLError as exc:
                raise DocsError(f"{block.where}: invalid YAML: {exc}") from exc
        elif block.lang == "json":
            try:
                json.loads(block.text)
            except json.JSONDecodeError as exc:
                raise DocsError(f"{block.where}: invalid JSON: {exc}") from exc

    def _bash(self, script: str, cwd: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", "-c", script], cwd=cwd, env=self.env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=COMMAND_TIMEOUT, check=False)

    def _console(self, block: Block, cwd: Path) -> None:
        try:
            steps = console_steps(block.text)
        except DocsError as exc:
            raise DocsError(f"{block.where}: {exc}") from exc
        if not steps:
            raise DocsError(f"{block.where}: a console block without a `$ ` command")
        for command, expected in steps:
            actual = self._bash(command, cwd).stdout
            if not output_matches(expected, actual):
                raise DocsError(f"{block.where}: `$ {command}` printed\n{actual.rstrip()}\n"
                                f"--- but the documentation says\n{expected.rstrip()}")


def check_toml(block: Block) -> None:
    """Parse a TOML block; a [tool.bnfix] table must load with bnfix's own loader."""
    try:
        data = tomllib.loads(block.text)
    except tomllib.TOMLDecodeError as exc:
        raise DocsError(f"{block.where}: invalid TOML: {exc}") from exc
    if "bnfix" not in data.get("tool", {}):
        return
    from bnfix.config import ConfigError, load_settings
    from bnfix.rulebook import RuleBookError, load_rulebook

    with tempfile.TemporaryDirectory() as folder:
        pyproject = Path(folder) / "pyproject.toml"
        pyproject.write_text(block.text, encoding="utf-8")
        try:
            settings = load_settings(pyproject, Path(folder))
            book = load_rulebook()
            settings.enabled(book)
            for codes in settings.per_file_ignores.values():
                book.expand(codes)
        except (ConfigError, RuleBookError) as exc:
            raise DocsError(f"{block.where}: bnfix rejects this [tool.bnfix]: {exc}") from exc


def _tail(text: str, lines: int = 30) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def section(blocks: list[Block], source: str, heading: str) -> list[Block]:
    """The blocks under a `## heading` of the Markdown source (up to the next `## `)."""
    lines = source.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == heading)
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")),
               len(lines))
    return [b for b in blocks if start < b.line <= end]
