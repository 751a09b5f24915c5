"""Configuration: `.bnfix.toml` or `bnfix.toml` (the keys at the top level, like ruff.toml) or
`[tool.bnfix]` in pyproject.toml, merged with command-line options the way ruff merges them (the
command line wins; extend-* adds)."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bnfix.rulebook import RuleBook, RuleBookError, tomllib
from bnfix.source.reader import DEFAULT_MAX_FILE_BYTES

KNOWN_KEYS = {
    "select", "ignore", "extend-select", "per-file-ignores", "exclude", "extend-exclude",
    "respect-gitignore", "target-tensorflow", "report-all-syntax-errors", "unsafe-fixes",
    "cache-dir",
}
# In one folder the first of these that exists is the configuration (ruff's order:
# .ruff.toml, ruff.toml, pyproject.toml); a pyproject.toml counts only with a [tool.bnfix] table.
CONFIG_FILES = (".bnfix.toml", "bnfix.toml", "pyproject.toml")
# The TensorFlow release code is assumed to run on unless `target-tensorflow` says otherwise:
# the newest one bnfix's rules are checked against.
CURRENT_TENSORFLOW = (2, 21)


class ConfigError(Exception):
    """Bad configuration: the message names the file and the key."""


@dataclass
class Settings:
    root: Path
    source: Path | None = None  # the configuration file it came from
    select: list[str] | None = None
    ignore: list[str] = field(default_factory=list)
    extend_select: list[str] = field(default_factory=list)
    per_file_ignores: dict[str, list[str]] = field(default_factory=dict)
    exclude: list[str] | None = None
    extend_exclude: list[str] = field(default_factory=list)
    respect_gitignore: bool = True
    target_tensorflow: tuple[int, ...] = CURRENT_TENSORFLOW
    target_origin: str = "default"  # default | configured | pinned (the project's requirements)
    all_syntax_errors: bool = False
    max_file_size: int = DEFAULT_MAX_FILE_BYTES
    # `unsafe-fixes`: apply unsafe fixes too; None when not set (ruff's "hint": the summary
    # counts the unsafe fixes held back; an explicit false drops that line, as in ruff)
    unsafe_fixes: bool | None = None
    cache_dir: Path | None = None  # None: .bnfix_cache/ in the root

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

    def ignored_for(self, path: Path, book: RuleBook) -> frozenset[str]:
        """Codes that `per-file-ignores` switches off for `path`."""
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
                    out |= book.expand(codes)
                except RuleBookError as exc:
                    raise ConfigError(f"per-file-ignores `{pattern}`: {exc}") from exc
        return frozenset(out)


def _list(data: dict[str, Any], key: str, path: Path) -> list[str] | None:
    if key not in data:
        return None
    value = data[key]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{path}: [tool.bnfix] `{key}` must be a list of strings")
    return value


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from exc


def _table(data: dict[str, Any], path: Path) -> dict[str, Any]:
    """The bnfix settings of a configuration file: `[tool.bnfix]` in a pyproject.toml, the
    top level in any other file (`bnfix.toml`, `.bnfix.toml`, or one named with --config)."""
    if path.name == "pyproject.toml":
        return data.get("tool", {}).get("bnfix", {})
    return data


def find_config(start: Path) -> Path | None:
    """The nearest configuration file from `start` upwards (CONFIG_FILES, in that order)."""
    here = start.resolve()
    if here.is_file():
        here = here.parent
    for folder in (here, *here.parents):
        for name in CONFIG_FILES:
            candidate = folder / name
            if not candidate.is_file():
                continue
            if name != "pyproject.toml" or "bnfix" in _read_toml(candidate).get("tool", {}):
                return candidate
    return None


def load_settings(config: Path | None, start: Path) -> Settings:
    """Settings from `config` (an explicit configuration file) or the nearest one above
    `start`."""
    path = config if config is not None else find_config(start)
    if path is None:
        return Settings(root=Path.cwd())
    table = _table(_read_toml(path), path)
    unknown = set(table) - KNOWN_KEYS
    if unknown:
        raise ConfigError(
            f"{path}: unknown key(s) in [tool.bnfix]: {', '.join(sorted(unknown))} "
            f"(known: {', '.join(sorted(KNOWN_KEYS))})"
        )
    pfi = table.get("per-file-ignores", {})
    if not isinstance(pfi, dict) or not all(
        isinstance(v, list) and all(isinstance(c, str) for c in v) for v in pfi.values()
    ):
        raise ConfigError(f"{path}: [tool.bnfix] `per-file-ignores` must map globs to lists of codes")
    target = table.get("target-tensorflow")
    target_tf = CURRENT_TENSORFLOW if target is None else parse_version(str(target), path)
    respect = table.get("respect-gitignore", True)
    all_syntax = table.get("report-all-syntax-errors", False)
    unsafe = table.get("unsafe-fixes")
    for key, flag in (("respect-gitignore", respect), ("report-all-syntax-errors", all_syntax),
                      ("unsafe-fixes", False if unsafe is None else unsafe)):
        if not isinstance(flag, bool):
            raise ConfigError(f"{path}: [tool.bnfix] `{key}` must be true or false")
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
        unsafe_fixes=unsafe,
        cache_dir=_cache_dir(table, path),
    )


def _cache_dir(table: dict[str, Any], path: Path) -> Path | None:
    """`cache-dir`, relative to the configuration file's folder (as ruff resolves it)."""
    value = table.get("cache-dir")
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{path}: [tool.bnfix] `cache-dir` must be a folder path")
    return path.parent / Path(value).expanduser()


def parse_version(text: str, path: Path) -> tuple[int, ...]:
    """`"2.15"` -> (2, 15)."""
    try:
        parts = tuple(int(p) for p in text.strip().split("."))
    except ValueError:
        parts = ()
    if not parts:
        raise ConfigError(f"{path}: [tool.bnfix] `target-tensorflow` must be a version like \"2.15\", "
                          f"not `{text}`")
    return parts
