"""bnfix.gitignore against git itself: the files a walk keeps are the files git does not
ignore (`git ls-files --others --exclude-standard`), on generated trees and ignore files."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
from pathlib import Path

import pytest

from bnfix.files import discover
from bnfix.gitignore import GitIgnore, parse

GIT = shutil.which("git")
CASES = 160
NAMES = ["a", "b", "ab", "c", "x.py", "t_x.py"]
FILES = ["x.py", "y.py", "a.py", "ab.py", "t_x.py", "b.pyi", "c.txt", "[a].py", "#a.py", "!x.py"]
SEGMENTS = ["a", "b", "ab", "x.py", "*", "*.py", "a*", "?.py", "[ab]", "[!a]*", "t_*", "**",
            "*.pyi", "[a-b]*.py", "\\[a].py", "\\#a.py", "x.[!t]y", "[[:alpha:]].py", "[]a].py"]


@pytest.mark.parametrize(("line", "path", "is_dir", "expected"), [
    ("*.py", "a/x.py", False, True),  # no slash: any depth, the name
    ("/x.py", "a/x.py", False, None),  # anchored to the file's folder
    ("a/x.py", "a/x.py", False, True),
    ("build/", "build", False, None),  # folders only
    ("build/", "src/build", True, True),
    ("a/**/b", "a/b", True, True),  # any number of folders, none included
    ("a/**/b", "a/x/y/b", True, True),
    ("a/**", "a", True, None),  # everything inside, not the folder
    ("**/x.py", "p/q/x.py", False, True),
    ("a?.py", "a/.py", False, None),  # never `/`
    ("[!a].py", "/.py", False, None),
    ("x.py\\ ", "x.py ", False, True),  # a quoted trailing space stays
    ("x.py  ", "x.py", False, True),  # unquoted ones go
    ("\\!x.py", "!x.py", False, True),
    ("!x.py", "x.py", False, False),  # re-included
    ("[a", "[a", False, None),  # unclosed: git never matches it
    ("[[:nope:]]", "a", False, None),
    ("[b-a]x", "ax", False, None),  # a reversed range matches nothing
    ("a//", "a", True, None),  # one `/` is the folder mark: `a/` is left, anchored
])
def test_a_line_matches_as_git_documents(line: str, path: str, is_dir: bool,
                                         expected: bool | None) -> None:
    assert GitIgnore.from_lines([line]).match(path, is_dir) is expected


def test_comments_blank_lines_and_lone_markers_are_no_patterns() -> None:
    assert [parse(line) for line in ["", "   ", "# a", "!", "/", "!/"]] == [None] * 6


def test_the_last_matching_pattern_decides_and_covers_sees_the_folders_above() -> None:
    spec = GitIgnore.from_lines(["*", "!*/", "!*.py", "_logs"])  # audioset_tagging_cnn's
    assert spec.match("pytorch", True) is False and spec.match("pytorch/main.py", False) is False
    assert spec.match("data.csv", False) is True and spec.match("_logs", True) is True
    assert spec.covers("_logs/run1") and not spec.covers("pytorch/utils")


def _pattern(rng: random.Random) -> str:
    if rng.random() < 0.05:
        return rng.choice(["", "# comment", "   ", "!"])
    segments = [rng.choice(SEGMENTS) for _ in range(rng.choice([1, 1, 2, 3]))]
    text = "/".join(segments)
    if rng.random() < 0.2:
        text = "/" + text
    if rng.random() < 0.25:
        text += "/"
    if rng.random() < 0.25:
        text = "!" + text
    if rng.random() < 0.05:
        text += "  "
    return text


def _tree(rng: random.Random, root: Path, depth: int = 0) -> list[Path]:
    folders = [root]
    for name in rng.sample(FILES, rng.randint(1, 5)):
        (root / name).write_text("x = 1\n", encoding="utf-8")
    if depth < 3:
        for name in rng.sample(NAMES, rng.randint(0, 3)):
            sub = root / name
            if sub.exists():  # a file took the name
                continue
            sub.mkdir()
            folders += _tree(rng, sub, depth + 1)
    return folders


@pytest.mark.skipif(GIT is None, reason="needs git: the reference this matcher is held to")
def test_a_walk_keeps_the_files_git_does_not_ignore(tmp_path: Path) -> None:
    env = {**os.environ, "HOME": str(tmp_path), "GIT_CONFIG_NOSYSTEM": "1",
           "GIT_CONFIG_GLOBAL": os.devnull, "XDG_CONFIG_HOME": str(tmp_path)}
    rng = random.Random(20261207)
    for case in range(CASES):
        root = tmp_path / f"case{case}"
        root.mkdir()
        subprocess.run([GIT, "init", "-q", str(root)], check=True, env=env)
        folders = _tree(rng, root)
        lines = {}
        for folder in rng.sample(folders, min(len(folders), rng.randint(1, 3))):
            lines[folder] = [_pattern(rng) for _ in range(rng.randint(1, 6))]
            (folder / ".gitignore").write_text("\n".join(lines[folder]) + "\n", encoding="utf-8")
        if rng.random() < 0.3:
            lines[root / ".git"] = [_pattern(rng) for _ in range(2)]
            (root / ".git" / "info" / "exclude").write_text("\n".join(lines[root / ".git"]) + "\n",
                                                            encoding="utf-8")
        listed = subprocess.run([GIT, "ls-files", "--others", "--exclude-standard", "-z"],
                                cwd=root, env=env, capture_output=True, check=True).stdout
        expected = sorted(p for p in listed.decode().split("\0") if p.endswith((".py", ".pyi")))
        found = sorted(c.path.relative_to(root).as_posix()
                       for c in discover([root], root=root, exclude=[], extend_exclude=[]))
        assert found == expected, (case, {str(k.relative_to(root)): v for k, v in lines.items()})


def test_patterns_with_many_stars_are_matched_in_linear_time_as_regexes_would_match_them():
    """`*a*a*...*b` as a backtracking regex takes exponential time on a long name of `a`s (a
    hang a hostile .gitignore could cause; git answers at once): such a pattern is a glob,
    and globs and regexes agree wherever both can be used."""
    import re

    from bnfix import gitignore

    hostile = GitIgnore.from_lines(["*a" * 20 + "*b", "!" + "*a" * 20 + "*a/"])
    assert hostile.patterns[0].regex is None  # more stars than a regex may hold
    assert hostile.match("a" * 5000, False) is None and hostile.match("a" * 5000, True) is False
    assert hostile.match("a" * 25 + "b", False) is True
    # a star after a quoted backslash is a star all the same (once counted as quoted: a
    # regex, 0.3 s on 26 backslashes and ten times more for every four)
    quoted = GitIgnore.from_lines(["*\\\\" * 12 + "*b"])
    assert quoted.patterns[0].regex is None
    assert quoted.match("\\" * 5000, False) is None
    assert quoted.match("\\" * 13 + "b", False) is True
    rng = random.Random(7)
    pieces = ["a", "b", "*", "?", "[ab]", "[!a]", "\\*", ".", "**", "/", "[a-b]", "\\?", "[]a]",
              "\\\\", "\\/", "[/a]", "q" * 300]
    names = ["a", "b", "ab", "ba", "aab", "x.a", "*", "?", "]", "a/b", "a/a/b", "b/a", "aa/bb/ab",
             "\\", "a\\b", "q" * 300, "q" * 300 + "b", "aq" + "q" * 300, "q" * 600]
    for _ in range(3000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 6))).strip("/") or "a"
        anchored = "/" in text
        tokens = gitignore._lex(text)
        if tokens is None:
            continue
        regex = re.compile("".join(t.regex for t in tokens), re.DOTALL)
        glob = gitignore._Glob(tokens, anchored)
        pattern = parse(text)
        assert pattern is not None
        screen = re.compile(pattern.screen, re.DOTALL)  # what a chunk's joined regex holds
        for name in names if anchored else [n for n in names if "/" not in n]:
            assert bool(regex.fullmatch(name)) == glob(name), (text, name)
            assert not glob(name) or screen.fullmatch(name), (text, name, pattern.screen)


def test_long_ignore_files_decide_as_their_patterns_one_by_one(monkeypatch) -> None:
    """Literal patterns looked up by name or path, the others in chunks searched from the last:
    the answer is the last pattern's that matches, as when every pattern is tried in turn
    (chunks of three here, so that most lists span many)."""
    from bnfix import gitignore

    monkeypatch.setattr(gitignore, "CHUNK", 3)
    rng = random.Random(11)
    lines = ["a", "b", "x.py", "a/b", "/a", "a/", "!a", "!x.py", "*.py", "!*.py", "a*", "[ab]",
             "**/b", "a/**", "*a*a*", "!b/", "t_*", "?", "/x.py", "!/a/b"]
    paths = ["a", "b", "x.py", "a/b", "a/x.py", "b/a", "ab", "t_x.py", "a/a/b", "ba"]
    for _ in range(300):
        spec = GitIgnore.from_lines(rng.choice(lines) for _ in range(rng.randint(1, 30)))
        for path in paths:
            name = path.rpartition("/")[2]
            for is_dir in (False, True):
                expected = next((not p.negated for p in reversed(spec.patterns)
                                 if (is_dir or not p.folders_only)
                                 and p.test(path if p.anchored else name)), None)
                assert spec.match(path, is_dir) is expected, (path, is_dir, spec.patterns)


def test_a_long_generated_ignore_file_loads_in_linear_time() -> None:
    """40,000 literal paths (a generated ignore file) and 20,000 patterns with wildcards: each
    line is read once; no pattern's regex is compiled before a path needs it."""
    from bnfix import gitignore

    spec = GitIgnore.from_lines([f"build/out_{i}/f_{i}.o" for i in range(40000)] +
                                [f"*.tmp{i}" for i in range(20000)] + ["!build/out_7/f_7.o"])
    assert spec.match("build/out_7/f_7.o", False) is False
    assert spec.match("build/out_8/f_8.o", False) is True
    assert spec.match("x.tmp19999", False) is True and spec.match("x.py", False) is None
    compiled = [p for p in spec.patterns if isinstance(p.test, gitignore._Regex)
                and p.test._match is not None]
    assert len(compiled) <= gitignore.CHUNK  # one chunk searched one by one, at most
    # a 100,000-character pattern: its screen is its start, and the answers stay exact
    long = GitIgnore.from_lines(["ab" * 50000 + "*", "x" * 300 + "?" + "y" * 300 + "*z*"])
    assert all(len(p.screen) < 2 * gitignore.SCREEN_CHARS for p in long.patterns)
    assert long.match("ab" * 50000 + ".py", False) is True
    assert long.match("ab" * 49999 + "a.py", False) is None
    assert long.match("x" * 300 + "-" + "y" * 300 + "_z_", False) is True
    assert long.match("x" * 300 + "-" + "y" * 299 + "_z_", False) is None
