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

Patterns with one or two `*` runs become regular expressions; a pattern with more
(`*a*a*a*b`) would make a backtracking regex take exponential time on a long name, a hang a
hostile `.gitignore` could cause, so it is matched by a glob matcher that takes each star's
shortest extension first and never returns to an earlier star (linear in the name's length,
as git's wildmatch is). Patterns without wildcards are looked up by what they match, and the
others are screened a chunk at a time by one joined regex per kind (see GitIgnore), compiled
when first needed: a long, generated ignore file loads in one pass over its lines.
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
CHUNK = 1024  # patterns per joined regex (see GitIgnore)
SCREEN_CHARS = 256  # of a pattern's regex in its chunk's joined regex, about


class Pattern(NamedTuple):
    test: Callable[[str], bool]  # whether the pattern matches a name, or a whole path
    negated: bool  # `!pattern`: a match re-includes
    folders_only: bool  # `pattern/`
    anchored: bool  # matched against the whole relative path, not the last name
    # a regex that whatever the pattern matches matches too: its own, or for a glob (or a
    # long pattern) its start followed by `.*` (see _screen: a screen, never the answer)
    screen: str
    literal: str | None = None  # the name or path it matches when it has no wildcard

    @property
    def regex(self) -> str | None:
        """Its regex, None when matched by a glob (more stars)."""
        return self.test.source if isinstance(self.test, _Regex) else None


class GitIgnore:
    """The patterns of one ignore file, for paths relative to its folder (`/`-separated).

    The last pattern that matches decides. Patterns without wildcards (most of a long,
    generated ignore file) are looked up by the name or path they match; the others are
    taken CHUNK at a time in file order, each chunk with one joined regex of their screens
    per kind (see Pattern) that answers "none of them can match" in one call, and searched
    from the last chunk back: a path costs a call or two per chunk, and the patterns of a
    chunk are tried one by one (their regexes compiled then) only when its screens matched
    (4 MB of generated paths took 14 s to load when every pattern was compiled at once)."""

    def __init__(self, patterns: list[Pattern]) -> None:
        self.patterns = patterns
        self._names: dict[str, list[int]] = {}  # literal patterns, by what they match
        self._paths: dict[str, list[int]] = {}
        others = []
        for index, pattern in enumerate(patterns):
            if pattern.literal is None:
                others.append(index)
            else:
                table = self._paths if pattern.anchored else self._names
                table.setdefault(pattern.literal, []).append(index)
        self._chunks = [_Chunk(patterns, others[i:i + CHUNK])
                        for i in range(0, len(others), CHUNK)]

    @classmethod
    def from_lines(cls, lines: Iterable[str]) -> GitIgnore:
        return cls([p for p in map(parse, lines) if p is not None])

    def match(self, rel: str, is_dir: bool) -> bool | None:
        """True: `rel` is ignored; False: re-included by a `!` pattern; None: no pattern
        matches it."""
        name = rel.rpartition("/")[2]
        best = -1  # the last pattern found to match
        for found in (self._names.get(name, ()), self._paths.get(rel, ())):
            best = max(best, next((i for i in reversed(found)
                                   if is_dir or not self.patterns[i].folders_only), -1))
        for chunk in reversed(self._chunks):
            if chunk.indices[-1] <= best:
                break  # every pattern further back comes before the one found
            if not chunk.may_match(name, rel):
                continue
            for index in reversed(chunk.indices):
                if index <= best:
                    break
                pattern = self.patterns[index]
                if (is_dir or not pattern.folders_only) and \
                        pattern.test(rel if pattern.anchored else name):
                    best = index
                    break
            else:
                continue
            break  # the chunks before this one hold earlier patterns only
        return None if best < 0 else not self.patterns[best].negated

    def covers(self, folder: str) -> bool:
        """Whether the folder `folder`, or one of its folders, is ignored (nothing below it
        can be re-included)."""
        parts = folder.split("/")
        return any(self.match("/".join(parts[:i]), True) for i in range(1, len(parts) + 1))


class _Chunk:
    """Consecutive patterns with wildcards (by index), and a joined regex per kind of their
    screens (see Pattern), compiled when first asked."""

    __slots__ = ("_names", "_paths", "_sources", "indices")

    def __init__(self, patterns: list[Pattern], indices: list[int]) -> None:
        self.indices = indices
        chosen = [patterns[i] for i in indices]
        self._sources: tuple[list[str], list[str]] | None = (
            [p.screen for p in chosen if not p.anchored], [p.screen for p in chosen if p.anchored])
        self._names: re.Pattern[str] | None = None
        self._paths: re.Pattern[str] | None = None

    def may_match(self, name: str, rel: str) -> bool:
        if self._sources is not None:  # not compiled yet
            self._names, self._paths = (_any(sources) for sources in self._sources)
            self._sources = None
        return (self._names is not None and self._names.fullmatch(name) is not None) or \
            (self._paths is not None and self._paths.fullmatch(rel) is not None)


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
        return Pattern(_Glob(tokens, anchored), negated, folders_only, anchored, _screen(tokens))
    source = "".join(t.regex for t in tokens)
    literal = "".join(t.text for t in tokens) \
        if all(t.kind in (LITERAL, SLASH) for t in tokens) else None
    screen = source if len(source) <= SCREEN_CHARS else _screen(tokens)
    return Pattern(_Regex(source), negated, folders_only, anchored, screen, literal)


def _screen(tokens: list[_Token]) -> str:
    """A linear regex that whatever `tokens` match matches too: their regex up to the second
    `*` run or about SCREEN_CHARS characters (a long literal cut there), then `.*`."""
    out: list[str] = []
    size = stars = 0
    for token in tokens:
        stars += token.kind in _STARS
        if stars == 2:
            break
        room = SCREEN_CHARS - size
        if token.kind == LITERAL and len(token.text) > room:
            out.append(re.escape(token.text[:room]))  # its start: nothing may follow it
            break
        out.append(token.regex)
        size += len(token.regex)
        if size >= SCREEN_CHARS:
            break
    return "".join(out) + ".*"


class _Regex:
    """A pattern's own regex, compiled when first asked: `GitIgnore.match` asks only when the
    joined regex of its kind matched (a path some pattern ignores: few), so a long ignore
    file costs one compile per kind, not one per line (a 1 MB file of patterns: 1.9 s)."""

    __slots__ = ("_match", "source")

    def __init__(self, source: str) -> None:
        self.source = source
        self._match: Callable[[str], re.Match[str] | None] | None = None

    def __call__(self, text: str) -> bool:
        if self._match is None:
            self._match = re.compile(self.source, re.DOTALL).fullmatch
        return self._match(text) is not None


def _any(sources: Iterable[str]) -> re.Pattern[str] | None:
    joined = "|".join(f"(?:{s})" for s in sources)
    return re.compile(joined, re.DOTALL) if joined else None


def _trim_trailing_spaces(line: str) -> str:
    """Trailing spaces go, unless a backslash quotes one (git's trim_trailing_spaces)."""
    if not line.endswith(" "):
        return line
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


CHAR, LITERAL, STAR, SLASH, FOLDERS, REST = "char", "literal", "star", "slash", "folders", "rest"
_STARS = (STAR, FOLDERS, REST)  # the kinds that are a `*` run


class _Token(NamedTuple):
    """One element of a wildmatch pattern (`WM_PATHNAME`): a one-character test (CHAR: `?` or a
    `[...]` class), characters that stand for themselves (LITERAL), a `*` run within a name
    (STAR), `/` (SLASH), a `**/` segment (FOLDERS: any number of folders, none included) or a
    final `**` segment (REST: everything)."""

    kind: str
    regex: str  # its part of the pattern's regex (for `fullmatch`)
    test: Callable[[str], bool] | None = None  # a CHAR's test of one character (a class's: None
    # until a glob needs it)
    text: str = ""  # a LITERAL's characters


# one scan per token, not per character (a 4 MB ignore file is ~4 million characters)
_SCAN = re.compile(r"(?P<stars>\*+)|(?P<literal>[^*?\[\\/]+)|(?P<slash>/)|(?P<any>\?)"
                   r"|(?P<quoted>\\.)|(?P<bracket>\[)|(?P<dangling>\\)", re.DOTALL)


def _lex(pattern: str) -> list[_Token] | None:
    """The pattern's tokens, read once for both matchers; None when it can never match."""
    out = []
    i, n = 0, len(pattern)
    while i < n:
        found = _SCAN.match(pattern, i)
        assert found is not None  # every character starts one of the alternatives
        kind, j = found.lastgroup, found.end()
        if kind == "stars":
            segment = j - i >= 2 and (i == 0 or pattern[i - 1] == "/") and \
                (j == n or pattern[j] == "/")
            if segment and j == n:
                out.append(_REST)  # `dir/**`: everything inside
            elif segment:
                out.append(_FOLDERS)
                j += 1  # its `/`
            else:
                out.append(_STAR)
        elif kind == "literal":
            text = found.group()
            out.append(_Token(LITERAL, re.escape(text), text=text))
        elif kind == "slash":
            out.append(_SLASH)
        elif kind == "any":
            out.append(_ANY)
        elif kind == "quoted":
            ch = found.group()[1]  # itself
            out.append(_SLASH if ch == "/" else _Token(LITERAL, re.escape(ch), text=ch))
        elif kind == "bracket":
            bracket = _bracket(pattern, j)
            if bracket is None:
                return None
            source, j = bracket
            out.append(_Token(CHAR, source))  # its test is compiled for a glob only
        else:
            return None  # a trailing `\`, quoting nothing
        i = j
    return out


def _any_char(ch: str) -> bool:
    return True  # within a name: never a `/`


_STAR, _SLASH = _Token(STAR, "[^/]*"), _Token(SLASH, "/", text="/")
_FOLDERS, _REST = _Token(FOLDERS, "(?:.*/)?"), _Token(REST, ".*")
_ANY = _Token(CHAR, "[^/]", _any_char)


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

    __slots__ = ("_anchored", "_parts", "_tokens")

    def __init__(self, tokens: list[_Token], anchored: bool) -> None:
        self._tokens, self._anchored = tokens, anchored  # parts made when first matched
        self._parts: list[list[_Token] | None] | None = None

    def __call__(self, path: str) -> bool:
        if self._parts is None:
            self._parts = self._split(self._tokens, self._anchored)
        return _sequence(self._parts, path.split("/"), _is_none,
                         lambda part, name: part is not None and _tokens_match(part, name))

    @staticmethod
    def _split(tokens: list[_Token], anchored: bool) -> list[list[_Token] | None]:
        parts: list[list[_Token] | None] = [[]]
        for token in tokens:
            last = parts[-1]
            if token.kind == LITERAL:  # one test per character
                assert last is not None
                last.extend(_Token(CHAR, "", ch.__eq__) for ch in token.text)
                continue
            if token.kind == CHAR and token.test is None:  # a `[...]` class
                token = token._replace(test=re.compile(token.regex, re.DOTALL).fullmatch)
            if not anchored:
                assert last is not None
                last.append(_STAR if token.kind == REST else token)  # `**` alone
            elif token.kind == SLASH:
                parts.append([])
            elif token.kind in (FOLDERS, REST):
                parts[-1] = None  # a whole component, at the start of one
                if token.kind == FOLDERS:
                    parts.append([])
                elif len(parts) > 1:
                    parts.append([_STAR])  # `dir/**`: one component at least
            else:
                assert last is not None
                last.append(token)
        return parts


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
