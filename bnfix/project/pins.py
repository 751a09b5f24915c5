"""The TensorFlow version a project pins (requirements*.txt, setup.py, setup.cfg,
pyproject.toml at its root): what BN007 checks deprecated APIs against when the configuration
does not say (`target-tensorflow`)."""

from __future__ import annotations

import re
from pathlib import Path

FILES = ("requirements*.txt", "requirements/*.txt", "setup.py", "setup.cfg", "pyproject.toml",
         "environment.yml")
_SPEC = re.compile(
    r"""(?<![\w.-])tensorflow(?:-gpu|-cpu|_gpu|_cpu)?\s*(?P<spec>(?:(?:==|>=|<=|~=|!=|<|>)\s*"""
    r"""[0-9][0-9.*]*\s*,?\s*)+)""", re.IGNORECASE)
_PART = re.compile(r"(==|>=|<=|~=|!=|<|>)\s*([0-9][0-9.]*)")
_NAMED = re.compile(r"(?<![\w.-])tensorflow(?:-gpu|-cpu|_gpu|_cpu)?(?![\w.-])", re.IGNORECASE)
UNVERSIONED = ()  # the folder requires TensorFlow without a version: it pins nothing, and
# hides the pins of the folders above it (`tf2/requirements.txt` beside a TF1 root)
MAX_BYTES = 1 << 20


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.strip(".").split(".") if p.isdigit())


def nearest_pin(folder: Path, root: Path, cache: dict[Path, tuple[int, ...] | None]
                ) -> tuple[int, ...] | None:
    """The pin of the folder closest to `folder` (itself, then its parents up to `root`) that
    names TensorFlow: a TF2 port in `tf2/` with its own requirements.txt is held to those, not
    to the TF1 pins at the repository root."""
    chain = []
    current = folder
    while True:
        if current in cache:
            found = cache[current]
            break
        chain.append(current)
        found = tensorflow_pin(current, unversioned=True)
        if found is not None or current == root or current.parent == current or \
                root not in current.parents:
            break
        current = current.parent
    for seen in chain:
        cache[seen] = found
    return found


def small_text(path: Path, limit: int) -> str | None:
    """A project file's text (a pin file, a README), or None when it is absent, unreadable,
    or larger than `limit` bytes (such a file is not what is looked for)."""
    try:
        if not path.is_file() or path.stat().st_size > limit:
            return None
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def _matching(folder: Path, pattern: str) -> list[Path]:
    """The folder's files that `pattern` matches, sorted; none when the folder cannot be
    listed (a folder whose path is at the system's length limit: nothing fits beside it)."""
    try:
        return sorted(folder.glob(pattern))
    except OSError:
        return []


def tensorflow_pin(root: Path, unversioned: bool = False) -> tuple[int, ...] | None:
    """The version the pins name: an exact or compatible-release pin, else (1, 15) for an
    upper bound below 2 (TF1 code); a lower bound alone pins nothing (any newer release may
    run the code). None when no file names TensorFlow with a version; with `unversioned`,
    UNVERSIONED when a file requires it without one."""
    found: list[tuple[str, tuple[int, ...]]] = []
    named = False
    for pattern in FILES:
        for path in _matching(root, pattern):
            text = small_text(path, MAX_BYTES)
            if text is None:
                continue
            for match in _SPEC.finditer(text):
                found.extend((op, _version(v)) for op, v in _PART.findall(match["spec"]))
            named = named or (path.suffix == ".txt" and _NAMED.search(text) is not None)
    for op, version in found:
        if op in ("==", "~=") and version:
            return version
    for op, version in found:
        if op in ("<", "<=") and version and version < (2,) or (op == "<" and version == (2,)):
            return (1, 15)
    return UNVERSIONED if unversioned and named else None
