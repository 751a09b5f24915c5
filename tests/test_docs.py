"""The documentation works verbatim: every code block of README.md and docs/*.md runs (or is
parsed) the way tests/docs_harness.py describes, a block that cannot run here says why, and the
MkDocs site builds with `--strict` (broken links and anchors fail)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO
from docs_harness import Block, DocsError, Workspace, check_labels, output_matches, parse_blocks

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
BLOCKS = {page: parse_blocks(page) for page in PAGES}


def _block_id(item: tuple[Path, int]) -> str:
    page, index = item
    block = BLOCKS[page][index]
    return f"{page.relative_to(REPO)}:{block.line}-{block.lang}"


ITEMS = [(page, i) for page in PAGES for i, b in enumerate(BLOCKS[page]) if b.runs]


class Replay:
    """Per page, one workspace; a block first replays the page's earlier blocks it has not seen
    (so `-k` on one block still runs it after what it builds on)."""

    def __init__(self, scratch: pytest.TempPathFactory) -> None:
        self.scratch = scratch
        self.spaces: dict[Path, Workspace] = {}
        self.done: dict[Path, int] = {}

    def run(self, page: Path, index: int) -> None:
        if page not in self.spaces:
            folder = self.scratch.mktemp(page.stem)
            self.spaces[page] = Workspace.copy_of(REPO, folder)
            self.done[page] = 0
        space = self.spaces[page]
        for earlier in range(self.done[page], index):
            block = BLOCKS[page][earlier]
            if block.runs and space.skip_reason(block) is None:
                try:
                    space.run(block)
                except DocsError as exc:
                    raise DocsError(f"while replaying an earlier block: {exc}") from exc
        self.done[page] = index + 1
        block = BLOCKS[page][index]
        reason = space.skip_reason(block)
        if reason is not None:
            pytest.skip(f"{block.where}: {reason}")
        space.run(block)


@pytest.fixture(scope="module")
def replay(tmp_path_factory: pytest.TempPathFactory) -> Replay:
    return Replay(tmp_path_factory)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_block_says_what_it_is(page: Path):
    check_labels(BLOCKS[page])


@pytest.mark.parametrize("item", ITEMS, ids=_block_id)
def test_block(item: tuple[Path, int], replay: Replay):
    page, index = item
    try:
        replay.run(page, index)
    except DocsError as exc:
        pytest.fail(str(exc), pytrace=False)


def test_site_builds_strict(tmp_path: Path):
    missing = [m for m in ("mkdocs", "material") if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"{' and '.join(missing)} not installed (the `dev` extra has them)")
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(REPO / "mkdocs.yml"),
         "-d", str(tmp_path / "site")],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert build.returncode == 0, build.stderr[-4000:]
    site = tmp_path / "site"
    from bnfix.rulebook import load_rulebook

    for code, rule in load_rulebook(REPO / "rules").rules.items():
        page = (site / "rules" / code / "index.html").read_text(encoding="utf-8")
        assert rule.name in page and "Why is this bad?" in page
    front = (site / "index.html").read_text(encoding="utf-8")
    assert "Quick start" in front and 'href="rules/BN001/"' in front


# -- the harness itself ------------------------------------------------------------------------

def test_ellipsis_matching():
    assert output_matches("a\n...\nd", "a\nb\nc\nd")
    assert output_matches("a\n...\nd", "a\nd")
    assert output_matches("took ... s", "took 1.25 s")
    assert not output_matches("a\n...\nd", "a\nb\nc")
    assert not output_matches("took ... s", "took 1.25 ms\n")
    assert not output_matches("Found 4 errors.", "Found 5 errors.")
    assert output_matches("x  \n\n", "x")


def test_harness_rejects_what_does_not_hold(tmp_path: Path):
    page = tmp_path / "page.md"
    page.write_text(
        "<!-- docs-test: skip -->\n```python\npass\n```\n", encoding="utf-8")
    with pytest.raises(DocsError, match="needs a reason"):
        parse_blocks(page)
    page.write_text(
        "```\nbnfix check .\n```\n\n    indented\n\n```text\n$ bnfix check .\n```\n"
        "```toml\n[tool.bnfix]\nselect = [\"BN999\"]\n```\n"
        "```console\n$ echo hello\nbye\n```\n```python\nprint(source)\n```\n",
        encoding="utf-8")
    blocks = parse_blocks(page)
    for bad in blocks[:3]:
        with pytest.raises(DocsError):
            check_labels([bad])
    space = Workspace.copy_of(REPO / "fixtures" / "quickstart", tmp_path / "scratch")
    for block, message in zip(blocks[3:], ["BN999", "printed\nhello", "NameError"], strict=True):
        with pytest.raises(DocsError, match=message):
            space.run(block)
    ok = Block(path=page, line=1, lang="console", text="$ echo hello\nhello\n")
    space.run(ok)
