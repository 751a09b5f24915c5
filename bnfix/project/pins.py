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
MAX_BYTES = 1 << 20


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.strip(".").split(".") if p.isdigit())


def tensorflow_pin(root: Path) -> tuple[int, ...] | None:
    """The version the pins name: an exact or compatible-release pin, else (1, 15) for an
    upper bound below 2 (TF1 code); a lower bound alone pins nothing (any newer release may
    run the code). None when no file names TensorFlow with a version."""
    found: list[tuple[str, tuple[int, ...]]] = []
    for pattern in FILES:
        for path in sorted(root.glob(pattern)):
            try:
                if not path.is_file() or path.stat().st_size > MAX_BYTES:
                    continue
                text = path.read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue
            for match in _SPEC.finditer(text):
                found.extend((op, _version(v)) for op, v in _PART.findall(match["spec"]))
    for op, version in found:
        if op in ("==", "~=") and version:
            return version
    for op, version in found:
        if op in ("<", "<=") and version and version < (2,) or (op == "<" and version == (2,)):
            return (1, 15)
    return None
