"""Configuration: `.bnfix.toml` or `bnfix.toml` (the keys at the top level, like ruff.toml) or
`[tool.bnfix]` in pyproject.toml, merged with command-line options the way ruff merges them (the
command line wins; extend-* adds). Every mistake in it is one line that names the file, the key
and the value (a usage error, exit 2), never a traceback."""

from __future__ import annotations

import fnmatch
import json
import os
import re
from pathlib import Path
from typing import Any

from bnfix.rulebook import RuleBook, RuleBookError, toml_module
from bnfix.source.reader import DEFAULT_MAX_FILE_BYTES, UNLIMITED, Skipped, SourceError, read_source

KNOWN_KEYS = {
    "select", "ignore", "extend-select", "per-file-ignores", "exclude", "extend-exclude",
    "respect-gitignore", "target-tensorflow", "report-all-syntax-errors", "max-file-size",
    "unsafe-fixes", "cache-dir",
}
# In one folder the first of these that exists is the configuration (ruff's order:
# .ruff.toml, ruff.toml, pyproject.toml); a pyproject.toml counts only with a [tool.bnfix] table.
CONFIG_FILES = (".bnfix.toml", "bnfix.toml", "pyproject.toml")
SELECTOR_KEYS = ("select", "ignore", "extend-select")
MAX_CONFIG_BYTES = 4 * 1024 * 1024  # a pyproject.toml larger than this is not a configuration
_SIZE = re.compile(r"(\d+)\s*([kmg]?)(?:i?b)?", re.IGNORECASE)
_UNITS = {"": 1, "k": 1024, "m": 1024 ** 2, "g": 1024 ** 3}
# The TensorFlow release code is assumed to run on unless `target-tensorflow` says otherwise:
# the newest one bnfix's rules are checked against.
CURRENT_TENSORFLOW = (2, 21)


class ConfigError(Exception):
    """Bad configuration: the message names the file and the key."""


class Settings:
    """The configuration that applies (`[tool.bnfix]`, `bnfix.toml` or the defaults), which the
    command line then amends. (A plain class, see `bnfix.findings.FileResult`.)"""

    __slots__ = (
        "all_syntax_errors",
        "cache_dir",
        "exclude",
        "extend_exclude",
        "extend_select",
        "ignore",
        "max_file_size",
        "per_file_ignores",
        "respect_gitignore",
        "root",
        "select",
        "source",
        "target_origin",
        "target_tensorflow",
        "unsafe_fixes",
    )

    def __init__(self, root: Path, *, source: Path | None = None,
                 select: list[str] | None = None, ignore: list[str] | None = None,
                 extend_select: list[str] | None = None,
                 per_file_ignores: dict[str, list[str]] | None = None,
                 exclude: list[str] | None = None, extend_exclude: list[str] | None = None,
                 respect_gitignore: bool = True,
                 target_tensorflow: tuple[int, ...] = CURRENT_TENSORFLOW,
                 target_origin: str = "default", all_syntax_errors: bool = False,
                 max_file_size: int = DEFAULT_MAX_FILE_BYTES, unsafe_fixes: bool | None = None,
                 cache_dir: Path | None = None) -> None:
        self.root = root
        self.source = source  # the configuration file it came from
        self.select = select
        self.ignore = [] if ignore is None else ignore
        self.extend_select = [] if extend_select is None else extend_select
        self.per_file_ignores = {} if per_file_ignores is None else per_file_ignores
        self.exclude = exclude
        self.extend_exclude = [] if extend_exclude is None else extend_exclude
        self.respect_gitignore = respect_gitignore
        self.target_tensorflow = target_tensorflow
        # default | configured | pinned (the project's requirements)
        self.target_origin = target_origin
        self.all_syntax_errors = all_syntax_errors
        self.max_file_size = max_file_size  # 0: no limit
        # `unsafe-fixes`: apply unsafe fixes too; None when not set (ruff's "hint": the
        # summary counts the unsafe fixes held back; an explicit false drops that line, as in
        # ruff)
        self.unsafe_fixes = unsafe_fixes
        self.cache_dir = cache_dir  # None: .bnfix_cache/ in the root

    @property
    def max_bytes(self) -> int:
        """The size above which a file is skipped (read_source's cap)."""
        return self.max_file_size or UNLIMITED

    @property
    def targets(self) -> dict[str, tuple[int, ...]]:
        return {"tensorflow": self.target_tensorflow}

    def enabled(self, book: RuleBook) -> frozenset[str]:
        """The rule codes this configuration turns on (by default: the rules that report
        bugs; style and cost rules such as BN104 are opt-in, `ALL` or `extend-select`)."""
        try:
            if self.select is not None:
                codes = book.expand(self.select)
            else:
                codes = {c for c in book.expand(["ALL"]) if book.rules[c].default}
            codes |= book.expand(self.extend_select)
            codes -= book.expand(self.ignore)
        except RuleBookError as exc:
            raise ConfigError(str(exc)) from exc
        return frozenset(codes)

    def check_codes(self, book: RuleBook) -> None:
        """Every rule selector of the configuration names a rule (else: one line naming the
        file, the key and the selector)."""
        where = _at(self.source).rstrip() if self.source is not None else "configuration:"
        for key, values in (("select", self.select or []), ("ignore", self.ignore),
                            ("extend-select", self.extend_select)):
            check_selectors(book, values, f"{where} `{key}`")
        for pattern, codes in self.per_file_ignores.items():
            check_selectors(book, codes, f"{where} `per-file-ignores` {_show(pattern)}")

    def ignored_for(self, path: Path, book: RuleBook,
                    target: str | None = "source") -> frozenset[str]:
        """Codes of `target`'s rules (source for check, artifact for inspect) that
        `per-file-ignores` switches off for `path`."""
        if not self.per_file_ignores:
            return frozenset()
        try:
            rel = path.resolve().relative_to(self.root.resolve()).as_posix()
        except ValueError:
            rel = path.as_posix()
        out: set[str] = set()
        for pattern, codes in self.per_file_ignores.items():
            if fnmatch.fnmatch(rel, pattern) or fnmatch.fnmatch(path.name, pattern) or \
                    rel.startswith(pattern.rstrip("/") + "/"):
                try:
                    out |= book.expand(codes, target=target)
                except RuleBookError as exc:
                    raise ConfigError(f"per-file-ignores `{pattern}`: {exc}") from exc
        return frozenset(out)


def check_selectors(book: RuleBook, selectors: list[str], where: str) -> None:
    """Raise ConfigError naming `where` and the first selector that matches no rule."""
    for selector in selectors:
        try:
            book.expand([selector], target=None)
        except RuleBookError as exc:
            import difflib

            names = [*book.rules, *(r.name for r in book.rules.values())]
            close = difflib.get_close_matches(selector.strip().upper(), book.rules, n=1) or \
                difflib.get_close_matches(selector.strip(), names, n=1)
            hint = f" (did you mean `{close[0]}`?)" if close else " (see `bnfix rules`)"
            raise ConfigError(f"{where}: unknown rule selector `{selector}`{hint}") from exc


def parse_size(value: object, where: str) -> int:
    """`max-file-size`: bytes as an integer, or a string with a k/M/G suffix (binary: 1k =
    1024 bytes); 0 turns the limit off."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str):
        match = _SIZE.fullmatch(value.strip())
        if match is not None:
            return int(match[1]) * _UNITS[match[2].lower()]
    raise ConfigError(f"{where} must be a size in bytes like 2097152, \"512k\" or \"2M\" "
                      f"(0: no limit), not {_show(value)}")


def _show(value: object) -> str:
    """A configuration value as TOML-ish text, short enough for one line."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = str(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _at(path: Path) -> str:
    """Where a setting lives, as an error line starts: the file, and the table in a
    pyproject.toml (the keys of `bnfix.toml` are at its top level)."""
    return f"{path}: [tool.bnfix] " if path.name == "pyproject.toml" else f"{path}: "


def _list(data: dict[str, Any], key: str, path: Path) -> list[str] | None:
    if key not in data:
        return None
    value = data[key]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{_at(path)}`{key}` must be a list of strings, "
                          f"not {_show(value)}")
    return value


def _read_toml(path: Path) -> dict[str, Any]:
    """A TOML file's data; only a regular file is read (a FIFO or device never blocks)."""
    tomllib = toml_module()
    try:
        text = read_source(path, MAX_CONFIG_BYTES).decode("utf-8")
        return tomllib.loads(text)
    except SourceError as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    except Skipped as exc:
        raise ConfigError(f"{path}: cannot read: larger than {MAX_CONFIG_BYTES} bytes") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: cannot read: not UTF-8 ({exc.reason} at byte "
                          f"{exc.start})") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from exc


def _bnfix_table(data: dict[str, Any], path: Path) -> dict[str, Any] | None:
    """[tool.bnfix], None when absent; anything but a table there is an error."""
    tool = data.get("tool")
    if tool is None:
        return None
    if not isinstance(tool, dict):
        raise ConfigError(f"{path}: `tool` must be a table, not {_show(tool)}")
    table = tool.get("bnfix")
    if table is not None and not isinstance(table, dict):
        raise ConfigError(f"{path}: `tool.bnfix` must be a table ([tool.bnfix]), not {_show(table)}")
    return table


def _unknown_key(key: str) -> str:
    """`key` is not a setting: the one-line reason, with the closest known key."""
    import difflib

    close = [key.replace("_", "-")] if key.replace("_", "-") in KNOWN_KEYS else \
        difflib.get_close_matches(key, sorted(KNOWN_KEYS), n=1)
    hint = f"did you mean `{close[0]}`?" if close else f"known: {', '.join(sorted(KNOWN_KEYS))}"
    return f"unknown key `{key}` ({hint})"


def _table(data: dict[str, Any], path: Path) -> dict[str, Any]:
    """The bnfix settings of a configuration file: `[tool.bnfix]` in a pyproject.toml, the
    top level in any other file (`bnfix.toml`, `.bnfix.toml`, or one named with --config)."""
    if path.name == "pyproject.toml":
        return _bnfix_table(data, path) or {}
    return data


def find_config(start: Path) -> Path | None:
    """The nearest configuration file from `start` upwards (CONFIG_FILES, in that order)."""
    here = start.resolve()
    if os.path.isfile(here):  # os.path: False, not an error, for a path over the length limit
        here = here.parent
    for folder in (here, *here.parents):
        for name in CONFIG_FILES:
            candidate = folder / name
            if not os.path.isfile(candidate):
                continue
            if name != "pyproject.toml" or _bnfix_table(_read_toml(candidate),
                                                        candidate) is not None:
                return candidate
    return None


def load_settings(config: Path | None, start: Path) -> Settings:
    """Settings from `config` (an explicit configuration file) or the nearest one above
    `start`."""
    path = config if config is not None else find_config(start)
    if path is None:
        return Settings(root=Path.cwd())
    table = _table(_read_toml(path), path)
    unknown = sorted(set(table) - KNOWN_KEYS)
    if unknown:
        raise ConfigError(f"{_at(path)}{_unknown_key(unknown[0])}")
    pfi = table.get("per-file-ignores", {})
    if not isinstance(pfi, dict):
        raise ConfigError(f"{_at(path)}`per-file-ignores` must map globs to lists of "
                          f"codes, not {_show(pfi)}")
    for pattern, codes in pfi.items():
        if not isinstance(codes, list) or not all(isinstance(c, str) for c in codes):
            raise ConfigError(f"{_at(path)}`per-file-ignores` {_show(pattern)} must be "
                              f"a list of codes, not {_show(codes)}")
    target = table.get("target-tensorflow")
    target_tf = CURRENT_TENSORFLOW if target is None else parse_version(str(target), path)
    respect = table.get("respect-gitignore", True)
    all_syntax = table.get("report-all-syntax-errors", False)
    unsafe = table.get("unsafe-fixes")
    for key, flag in (("respect-gitignore", respect), ("report-all-syntax-errors", all_syntax),
                      ("unsafe-fixes", False if unsafe is None else unsafe)):
        if not isinstance(flag, bool):
            raise ConfigError(f"{_at(path)}`{key}` must be true or false, "
                              f"not {_show(flag)}")
    size = table.get("max-file-size")
    max_size = DEFAULT_MAX_FILE_BYTES if size is None else \
        parse_size(size, f"{_at(path)}`max-file-size`")
    return Settings(
        root=path.parent,
        source=path,
        select=_list(table, "select", path),
        ignore=_list(table, "ignore", path) or [],
        extend_select=_list(table, "extend-select", path) or [],
        per_file_ignores=dict(pfi),
        exclude=_list(table, "exclude", path),
        extend_exclude=_list(table, "extend-exclude", path) or [],
        respect_gitignore=respect,
        target_tensorflow=target_tf,
        target_origin="default" if target is None else "configured",
        all_syntax_errors=all_syntax,
        max_file_size=max_size,
        unsafe_fixes=unsafe,
        cache_dir=_cache_dir(table, path),
    )


def _cache_dir(table: dict[str, Any], path: Path) -> Path | None:
    """`cache-dir`, relative to the configuration file's folder (as ruff resolves it)."""
    value = table.get("cache-dir")
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{_at(path)}`cache-dir` must be a folder path, not {_show(value)}")
    return path.parent / Path(value).expanduser()


def parse_version(text: str, path: Path) -> tuple[int, ...]:
    """`"2.15"` -> (2, 15)."""
    try:
        parts = tuple(int(p) for p in text.strip().split("."))
    except ValueError:
        parts = ()
    if not parts:
        raise ConfigError(f"{_at(path)}`target-tensorflow` must be a version like \"2.15\", "
                          f"not `{text}`")
    return parts
