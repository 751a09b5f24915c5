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

Patterns with one or two `*` runs become regular expressions (one alternation per kind answers
"no pattern matches", most paths, in one call); a pattern with more (`*a*a*a*b`) would make a
backtracking regex take exponential time on a long name, a hang a hostile `.gitignore` could
cause, so it is matched by a glob matcher that takes each star's shortest extension first and
never returns to an earlier star (linear in the name's length, as git's wildmatch is).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple, TypeVar

_CLASSES = {  # POSIX classes wildmatch knows, as the contents of a regex class
    "alnum": "a-zA-Z0-9", "alpha": "a-zA-Z", "blank": " \\t", "cntrl": "\\x00-\\x1f\\x7f",
    "digit": "0-9", "graph": "!-~", "lower": "a-z", "print": " -~",
    "punct": re.escape("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"), "space": " \\t\\n\\r\\f\\v",
    "upper": "A-Z", "xdigit": "0-9A-Fa-f",
}


MAX_REGEX_STARS = 2  # `*` runs (a `**` segment is one) a pattern's regex may hold


class Pattern(NamedTuple):
    test: Callable[[str], bool]  # whether the pattern matches a name, or a whole path
    negated: bool  # `!pattern`: a match re-includes
    folders_only: bool  # `pattern/`
    anchored: bool  # matched against the whole relative path, not the last name
    regex: str | None  # its regex, None when matched by a glob (more stars)


class GitIgnore:
    """The patterns of one ignore file, for paths relative to its folder (`/`-separated)."""

    def __init__(self, patterns: list[Pattern]) -> None:
        self.patterns = patterns
        # one regex per kind, to answer "no regex pattern matches" (most paths) in one call
        self._names = _any(p.regex for p in patterns if not p.anchored and p.regex is not None)
        self._paths = _any(p.regex for p in patterns if p.anchored and p.regex is not None)
        self._globs = [p for p in patterns if p.regex is None]

    @classmethod
    def from_lines(cls, lines: Iterable[str]) -> GitIgnore:
        return cls([p for p in map(parse, lines) if p is not None])

    def match(self, rel: str, is_dir: bool) -> bool | None:
        """True: `rel` is ignored; False: re-included by a `!` pattern; None: no pattern
        matches it."""
        name = rel.rpartition("/")[2]
        candidates = self.patterns
        if (self._names is None or self._names.fullmatch(name) is None) and \
                (self._paths is None or self._paths.fullmatch(rel) is None):
            candidates = self._globs  # no regex pattern matches: only a glob can
        for pattern in reversed(candidates):
            if pattern.folders_only and not is_dir:
                continue
            if pattern.test(rel if pattern.anchored else name):
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
    tokens = _lex(text)
    if tokens is None:
        return None
    if sum(t.kind in _STARS for t in tokens) > MAX_REGEX_STARS:
        return Pattern(_Glob(tokens, anchored).match, negated, folders_only, anchored, None)
    source = "".join(t.regex for t in tokens)
    return Pattern(re.compile(source, re.DOTALL).fullmatch, negated, folders_only, anchored,  # type: ignore[arg-type]
                   source)


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


CHAR, STAR, SLASH, FOLDERS, REST = "char", "star", "slash", "folders", "rest"
_STARS = (STAR, FOLDERS, REST)  # the kinds that are a `*` run


class _Token(NamedTuple):
    """One element of a wildmatch pattern (`WM_PATHNAME`): a character test (CHAR), a `*` run
    within a name (STAR), `/` (SLASH), a `**/` segment (FOLDERS: any number of folders, none
    included) or a final `**` segment (REST: everything)."""

    kind: str
    regex: str  # its part of the pattern's regex (for `fullmatch`)
    test: Callable[[str], bool] | None = None  # a CHAR's test of one character (a class's: None
    # until a glob needs it)


def _lex(pattern: str) -> list[_Token] | None:
    """The pattern's tokens, read once for both matchers; None when it can never match."""
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
                out.append(_Token(REST, ".*"))  # `dir/**`: everything inside
            elif segment:
                out.append(_Token(FOLDERS, "(?:.*/)?"))
                j += 1  # its `/`
            else:
                out.append(_Token(STAR, "[^/]*"))
            i = j
        elif ch == "[":
            found = _bracket(pattern, i + 1)
            if found is None:
                return None
            source, i = found
            out.append(_Token(CHAR, source))  # its test is compiled for a glob only
        elif ch == "\\" and i + 1 == n:
            return None
        else:
            quoted = ch == "\\"
            if quoted:
                i += 1
                ch = pattern[i]  # itself
            if ch == "/":
                out.append(_Token(SLASH, "/"))
            elif ch == "?" and not quoted:
                out.append(_Token(CHAR, "[^/]", _any_char))
            else:
                out.append(_Token(CHAR, re.escape(ch), ch.__eq__))
            i += 1
    return out


def _any_char(ch: str) -> bool:
    return True  # within a name: never a `/`


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


class _Glob:
    """A pattern matched without backtracking: its components (a list of tokens each, None
    for a `**` segment, which matches any number of path components). Each star first takes
    nothing and grows only while what follows fails, and a later star's success never sends
    the match back to an earlier one (the first fixed part that can follow a star is the best
    place for it), so a match costs at most the name's length times the pattern's."""

    def __init__(self, tokens: list[_Token], anchored: bool) -> None:
        self.parts: list[list[_Token] | None] = [[]]
        for token in tokens:
            if token.kind == CHAR and token.test is None:  # a `[...]` class
                token = token._replace(test=re.compile(token.regex, re.DOTALL).fullmatch)
            last = self.parts[-1]
            if not anchored:
                assert last is not None
                last.append(_Token(STAR, "") if token.kind == REST else token)  # `**` alone
            elif token.kind == SLASH:
                self.parts.append([])
            elif token.kind in (FOLDERS, REST):
                self.parts[-1] = None  # a whole component, at the start of one
                if token.kind == FOLDERS:
                    self.parts.append([])
                elif len(self.parts) > 1:
                    self.parts.append([_Token(STAR, "")])  # `dir/**`: one component at least
            else:
                assert last is not None
                last.append(token)

    def match(self, path: str) -> bool:
        return _sequence(self.parts, path.split("/"), _is_none,
                         lambda part, name: part is not None and _tokens_match(part, name))


def _is_none(part: list[_Token] | None) -> bool:
    return part is None


def _is_star(token: _Token) -> bool:
    return token.kind == STAR


def _tokens_match(tokens: list[_Token], name: str) -> bool:
    return _sequence(tokens, name, _is_star,
                     lambda token, ch: token.test is not None and token.test(ch))


Part = TypeVar("Part")
Item = TypeVar("Item")


def _sequence(pattern: Sequence[Part], items: Sequence[Item],
              is_star: Callable[[Part], bool], fits: Callable[[Part, Item], bool]) -> bool:
    """Whether `items` match `pattern`, whose star elements match any run of items and whose
    other elements one item each (`fits`): the two-index walk with the last star's restart."""
    p = i = 0
    star, resume = -1, 0
    while i < len(items):
        if p < len(pattern) and is_star(pattern[p]):
            star, resume = p, i
            p += 1
        elif p < len(pattern) and fits(pattern[p], items[i]):
            p += 1
            i += 1
        elif star >= 0:
            p, resume = star + 1, resume + 1
            i = resume
        else:
            return False
    while p < len(pattern) and is_star(pattern[p]):
        p += 1
    return p == len(pattern)


def _class_char(pattern: str, i: int) -> tuple[str | None, int]:
    if pattern[i] == "\\":
        return (pattern[i + 1], i + 2) if i + 1 < len(pattern) else (None, i + 1)
    return pattern[i], i + 1


def _in_class(ch: str) -> str:
    return "\\" + ch if ch in "\\]^-[" else ch


__all__ = ["GitIgnore", "Pattern", "parse"]
