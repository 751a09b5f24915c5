"""`--show-settings`: the settings a run resolves (configuration file, command line, the
project's pins), in the configuration's own key names, as ruff prints its resolved settings."""

from __future__ import annotations

import json
import os
from pathlib import Path

from bnfix.cache import CACHE_DIR
from bnfix.config import Settings
from bnfix.engine import Engine
from bnfix.files import DEFAULT_EXCLUDE

ORIGINS = {"default": "the newest release bnfix checks against",
           "configured": "--target-version, or target-tensorflow in the configuration",
           "pinned": "the version the project's requirements pin"}


def _value(value: object) -> str:
    return json.dumps(value)


def show_settings(settings: Settings, engine: Engine, start: Path) -> str:
    source = f'"{settings.source}"' if settings.source is not None else \
        "none (no configuration file: the defaults)"
    exclude = list(DEFAULT_EXCLUDE) if settings.exclude is None else settings.exclude
    target = ".".join(map(str, settings.target_tensorflow))
    cache = settings.cache_dir if settings.cache_dir is not None else settings.root / CACHE_DIR
    lines = [
        f'Resolved settings for: "{os.path.abspath(start)}"',
        f"Settings path: {source}",
        "",
        f"root = {_value(str(settings.root))}",
        f"select = {_value(settings.select) if settings.select is not None else 'default'}",
        f"extend-select = {_value(settings.extend_select)}",
        f"ignore = {_value(settings.ignore)}",
        f"per-file-ignores = {_value(settings.per_file_ignores)}",
        f"exclude = {_value(exclude)}",
        f"extend-exclude = {_value(settings.extend_exclude)}",
        f"respect-gitignore = {_value(settings.respect_gitignore)}",
        f"target-tensorflow = {_value(target)}  # {ORIGINS[settings.target_origin]}",
        f"unsafe-fixes = {'hint' if settings.unsafe_fixes is None else _value(settings.unsafe_fixes)}"
        + ("  # not set: unsafe fixes are held back and counted" if settings.unsafe_fixes is None
           else ""),
        f"report-all-syntax-errors = {_value(settings.all_syntax_errors)}",
        f"max-file-size = {settings.max_file_size}",
        f"cache-dir = {_value(str(cache))}",
        "enabled = [",
        *(f"\t{engine.book.rules[code].name} ({code})," for code in sorted(engine.enabled)),
        "]",
    ]
    return "\n".join(lines) + "\n"
