"""`.gitignore` patterns, matched as git matches them.

git's rules (gitignore(5)) with its wildmatch: the last pattern that matches a path decides;
`!` re-includes; a trailing `/` matches folders only; a pattern with a `/` before its end is
anchored to the file's folder, one without matches a name at any depth; `*`, `?` and `[...]`
never match `/`; `**` as a whole segment matches any number of folders. Deciding about a
folder's contents is the walk's business: it does not enter a folder that is ignored, and a
file below one cannot be re-included.

Written here rather than imported: pathspec took 30-40 ms to import (its matching backends),
more than the rest of bnfix's start-up, in every run of a repository with a `.gitignore`.
Tests compare it with git itself on generated trees.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import NamedTuple

_CLASSES = {  # POSIX classes wildmatch knows, as the contents of a regex class
    "alnum": "a-zA-Z0-9", "alpha": "a-zA-Z", "blank": " \\t", "cntrl": "\\x00-\\x1f\\x7f",
    "digit": "0-9", "graph": "!-~", "lower": "a-z", "print": " -~",
    "punct": re.escape("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"), "space": " \\t\\n\\r\\f\\v",
    "upper": "A-Z", "xdigit": "0-9A-Fa-f",
}


class Pattern(NamedTuple):
    regex: re.Pattern[str]
    negated: bool  # `!pattern`: a match re-includes
    folders_only: bool  # `pattern/`
    anchored: bool  # matched against the whole relative path, not the last name


class GitIgnore:
    """The patterns of one ignore file, for paths relative to its folder (`/`-separated)."""

    def __init__(self, patterns: list[Pattern]) -> None:
        self.patterns = patterns
        # one regex per kind, to answer "no pattern matches" (most paths) in one C call
        self._names = _any(p.regex.pattern for p in patterns if not p.anchored)
        self._paths = _any(p.regex.pattern for p in patterns if p.anchored)

    @classmethod
    def from_lines(cls, lines: Iterable[str]) -> GitIgnore:
        return cls([p for p in map(parse, lines) if p is not None])

    def match(self, rel: str, is_dir: bool) -> bool | None:
        """True: `rel` is ignored; False: re-included by a `!` pattern; None: no pattern
        matches it."""
        name = rel.rpartition("/")[2]
        if (self._names is None or self._names.fullmatch(name) is None) and \
                (self._paths is None or self._paths.fullmatch(rel) is None):
            return None
        for pattern in reversed(self.patterns):
            if pattern.folders_only and not is_dir:
                continue
            if pattern.regex.fullmatch(rel if pattern.anchored else name) is not None:
                return not pattern.negated
        return None

    def covers(self, folder: str) -> bool:
        """Whether the folder `folder`, or one of its folders, is ignored (nothing below it
        can be re-included)."""
        parts = folder.split("/")
        return any(self.match("/".join(parts[:i]), True) for i in range(1, len(parts) + 1))


def parse(line: str) -> Pattern | None:
    """One line of an ignore file; None for a blank line, a comment, or a pattern git could
    never match (an unclosed `[`, a trailing `\\`, an unknown `[:class:]`)."""
    text = _trim_trailing_spaces(line)
    if not text or text.startswith("#"):
        return None
    negated = text.startswith("!")
    if negated:
        text = text[1:]
    folders_only = text.endswith("/")
    text = text[:-1] if folders_only else text  # one `/`, as git strips it
    anchored = "/" in text
    text = text.removeprefix("/")
    if not text:
        return None
    source = _translate(text)
    if source is None:
        return None
    return Pattern(re.compile(source, re.DOTALL), negated, folders_only, anchored)


def _any(sources: Iterable[str]) -> re.Pattern[str] | None:
    joined = "|".join(f"(?:{s})" for s in sources)
    return re.compile(joined, re.DOTALL) if joined else None


def _trim_trailing_spaces(line: str) -> str:
    """Trailing spaces go, unless a backslash quotes one (git's trim_trailing_spaces)."""
    end = len(line)
    last_space = None
    i = 0
    while i < end:
        ch = line[i]
        if ch == " ":
            if last_space is None:
                last_space = i
        else:
            if ch == "\\":
                i += 1
                if i == end:
                    return line
            last_space = None
        i += 1
    return line if last_space is None else line[:last_space]


def _translate(pattern: str) -> str | None:
    """A wildmatch pattern (`WM_PATHNAME`) as a regex for `fullmatch`."""
    out = []
    i, n = 0, len(pattern)
    while i < n:
        ch = pattern[i]
        if ch == "*":
            j = i
            while j < n and pattern[j] == "*":
                j += 1
            segment = j - i >= 2 and (i == 0 or pattern[i - 1] == "/") and \
                (j == n or pattern[j] == "/")
            if segment and j == n:
                out.append(".*")  # `dir/**`: everything inside
            elif segment:
                out.append("(?:.*/)?")  # `**/`: any number of folders, none included
                j += 1
            else:
                out.append("[^/]*")
            i = j
        elif ch == "?":
            out.append("[^/]")
            i += 1
        elif ch == "[":
            found = _bracket(pattern, i + 1)
            if found is None:
                return None
            source, i = found
            out.append(source)
        elif ch == "\\":
            if i + 1 == n:
                return None
            out.append(re.escape(pattern[i + 1]))
            i += 2
        else:
            out.append(re.escape(ch))
            i += 1
    return "".join(out)


def _bracket(pattern: str, i: int) -> tuple[str, int] | None:
    """The class that starts after the `[` before `i`: (regex, index after its `]`)."""
    n = len(pattern)
    negated = i < n and pattern[i] in "!^"
    if negated:
        i += 1
    items: list[str] = []
    first = True
    while i < n and (first or pattern[i] != "]"):
        first = False
        if pattern.startswith("[:", i):
            end = pattern.find(":]", i + 2)
            if end < 0:
                return None
            contents = _CLASSES.get(pattern[i + 2:end])
            if contents is None:
                return None
            items.append(contents)
            i = end + 2
            continue
        low, i = _class_char(pattern, i)
        if low is None:
            return None
        if i + 1 < n and pattern[i] == "-" and pattern[i + 1] != "]":
            high, i = _class_char(pattern, i + 1)
            if high is None:
                return None
            if low <= high:  # a reversed range matches nothing
                items.append(f"{_in_class(low)}-{_in_class(high)}")
            continue
        items.append(_in_class(low))
    if i >= n:
        return None  # unclosed: git's wildmatch matches nothing with it
    body = "".join(items)
    if negated:
        return f"[^/{body}]", i + 1
    return (f"(?!/)[{body}]" if body else "(?!)"), i + 1


def _class_char(pattern: str, i: int) -> tuple[str | None, int]:
    if pattern[i] == "\\":
        return (pattern[i + 1], i + 2) if i + 1 < len(pattern) else (None, i + 1)
    return pattern[i], i + 1


def _in_class(ch: str) -> str:
    return "\\" + ch if ch in "\\]^-[" else ch


__all__ = ["GitIgnore", "Pattern", "parse"]
