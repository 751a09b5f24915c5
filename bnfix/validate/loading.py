"""Import the user's `MODULE:FACTORY` (validate is the one command that runs user code).

MODULE is a dotted module importable from the working directory (`models.resnet:build`) or a
path to a `.py` file (`nets/resnet.py:build`). Every failure is a `ValidateUsageError` with one
line: the command cannot go on without the user's model, and a traceback of bnfix would hide
what the user has to fix.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from bnfix.validate.errors import ValidateUsageError


def split_spec(spec: str) -> tuple[str, str]:
    """`MODULE:NAME` -> (MODULE, NAME); the last colon splits (a path may hold a drive colon)."""
    module, sep, name = spec.rpartition(":")
    if not sep or not module or not name.isidentifier():
        raise ValidateUsageError(f"`{spec}` is not MODULE:FACTORY (e.g. models.py:build or "
                                 "pkg.models:build)")
    return module, name


def _import(module: str, cwd: Path) -> ModuleType:
    path = (cwd / module) if not Path(module).is_absolute() else Path(module)
    if module.endswith(".py"):
        if not path.is_file():
            raise ValidateUsageError(f"{module}: no such file")
        name = f"bnfix_user_{path.stem}_{abs(hash(str(path.resolve())))}"
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise ValidateUsageError(f"{module}: cannot be imported as a Python module")
        loaded = importlib.util.module_from_spec(spec)
        sys.modules[name] = loaded
        sys.path.insert(0, str(path.resolve().parent))  # the file's own sibling imports
        spec.loader.exec_module(loaded)
        return loaded
    sys.path.insert(0, str(cwd))
    return importlib.import_module(module)


def load_callable(spec: str, cwd: Path) -> Callable[..., Any]:
    """The function named by `spec`, imported with `cwd` (the user's directory) on sys.path."""
    module, name = split_spec(spec)
    try:
        loaded = _import(module, cwd)
    except (ValidateUsageError, KeyboardInterrupt):
        raise
    except ModuleNotFoundError as exc:
        raise ValidateUsageError(f"{spec}: cannot import {module}: {exc}") from None
    except BaseException as exc:  # noqa: BLE001 - the user's module failed (SystemExit too)
        raise ValidateUsageError(f"{spec}: importing {module} raised "
                                 f"{type(exc).__name__}: {exc}") from None
    factory = getattr(loaded, name, None)
    if not callable(factory):
        raise ValidateUsageError(f"{spec}: {module} has no function `{name}`")
    return factory


def call_user(spec: str, factory: Callable[..., Any], *args: Any) -> Any:
    """Call the user's factory; whatever it raises becomes a one-line usage error."""
    try:
        return factory(*args)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - the user's factory failed (SystemExit too)
        raise ValidateUsageError(f"{spec} raised {type(exc).__name__}: {exc}") from None
