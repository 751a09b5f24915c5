"""Trained weights loaded where the analysis cannot parse: the project's README, and files
that do not parse.

A model file with no loading code of its own may still ship checkpoints: the README shows
`model.load_state_dict(torch.load('./rexnetv1_1.0.pth'))`. Such a call is evidence that
released weights hold the model's parameters as they are, exactly as the same line in a `.py`
file is (a `loads_weights` mark: BN104's fix, which drops a bias, is then display-only). A
training script that does not parse (Python 2, a syntax slip) resumes checkpoints all the same
(mean-teacher's `main.py`). Only the README files at the project's root, and the text of files
that do not parse, are read this way: as text, nothing is run.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import TYPE_CHECKING

from bnfix.project.pins import small_text

if TYPE_CHECKING:  # a warm run reads the README too, and must not import the analysis
    from bnfix.project.summary import Loc

NAMES = ("README.md", "README.rst", "README.txt", "README", "readme.md", "Readme.md")
MAX_BYTES = 512 * 1024  # a README larger than this is not read


def load_pattern(methods: tuple[str, ...], functions: tuple[str, ...]) -> re.Pattern[str] | None:
    """A call of a weight-loading method (`.load_state_dict(`) or function (`torch.hub.load(`,
    by its last two names)."""
    words = [rf"\.{re.escape(m)}\(" for m in methods]
    words += [rf"\b{re.escape('.'.join(f.split('.')[-2:]))}\(" for f in functions]
    return re.compile("|".join(words)) if words else None


def loads_in(text: str, pattern: re.Pattern[str]) -> list[Loc]:
    """Where `text` calls a weight loader (the callee's name, by line)."""
    found: list[Loc] = []
    for row, line in enumerate(text.splitlines(), 1):
        match = pattern.search(line)
        if match is not None:
            start = match.start() + (1 if match.group().startswith(".") else 0)
            found.append((row, start, row, match.end() - 1))
    return found


def documented_loads(root: Path, methods: tuple[str, ...], functions: tuple[str, ...]
                     ) -> tuple[str, tuple[tuple[str, Loc], ...]]:
    """The digest of the README files read, and where they call a weight loader."""
    pattern = load_pattern(methods, functions)
    if pattern is None:
        return "", ()
    found: list[tuple[str, Loc]] = []
    digest = hashlib.sha256()
    for name in NAMES:
        path = root / name
        text = small_text(path, MAX_BYTES)
        if text is None:
            continue
        digest.update(f"{name}\0{text}\0".encode())
        found.extend((str(path), loc) for loc in loads_in(text, pattern))
    return digest.hexdigest()[:20], tuple(found)
