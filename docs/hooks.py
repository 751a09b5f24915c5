"""MkDocs hooks: the pages the site makes instead of copying them.

* `index.md` is README.md, its links rewritten for the site: `docs/X.md` becomes `X.md`, any
  other repository path a link to the repository (checked to exist), each rule code of the rule
  table a link to the rule's page.
* `rules/index.md` and one `rules/BNxxx.md` per rule file: the text of `bnfix rule CODE`
  (`Rule.markdown()`), from the checkout's rules/ folder.

A link to a page listed in `extra.pending_pages` (a page another branch adds) stays plain text
while the page is missing.
"""

from __future__ import annotations

import logging
import re
import sys
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

REPO = Path(__file__).resolve().parents[1]
LINK = re.compile(r"(!?)\[([^\]]*)\]\(([^)\s]+)\)")
RULE_ROW = re.compile(r"^\| (BN\d{3}) \|", re.MULTILINE)
log = logging.getLogger("mkdocs.hooks.bnfix")


def _rulebook():  # noqa: ANN202 - bnfix may be imported from the checkout
    try:
        import bnfix.rulebook as rulebook
    except ImportError:
        sys.path.insert(0, str(REPO))
        import bnfix.rulebook as rulebook
    return rulebook, rulebook.load_rulebook(REPO / "rules")


def on_files(files: Files, config: MkDocsConfig) -> Files:
    rulebook, book = _rulebook()
    for code, rule in sorted(book.rules.items()):
        files.append(File.generated(config, f"rules/{code}.md", content=rule.markdown()))
    files.append(File.generated(config, "rules/index.md", content=_rules_index(rulebook, book)))
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    present = {f.src_uri for f in files} | {"index.md"}
    pending = set(config.extra.get("pending_pages", ()))
    files.append(File.generated(config, "index.md",
                                content=site_readme(readme, present, pending, config.repo_url)))
    return files


def _rules_index(rulebook, book) -> str:  # noqa: ANN001
    table = RULE_ROW.sub(lambda m: f"| [{m[1]}]({m[1]}.md) |", rulebook.rules_table_markdown(book))
    return ("# All rules\n\nOne page per rule file (`rules/BNxxx.toml`), the same text as "
            "`bnfix rule CODE`. Source rules are run by `bnfix check`, BN2xx by `bnfix inspect`, "
            "BN3xx by `bnfix doctor`.\n\n" + table)


def site_readme(readme: str, present: set[str], pending: set[str], repo_url: str | None) -> str:
    """README.md as the site's front page."""

    def rewrite(match: re.Match[str]) -> str:
        bang, text, target = match.groups()
        path, _, anchor = target.partition("#")
        if not path or "://" in path or path.startswith("mailto:"):
            return match[0]
        if path.startswith("docs/"):
            page = path.removeprefix("docs/")
            if page not in present and page in pending:
                log.info("README links to %s, a page not in docs/ yet: kept as text", page)
                return text
            return f"{bang}[{text}]({page}{'#' + anchor if anchor else ''})"
        local = REPO / path
        if not local.exists():
            log.warning("README.md links to %s, which is not in the repository", path)
            return match[0]
        kind = "tree" if local.is_dir() else "blob"
        return f"{bang}[{text}]({repo_url.rstrip('/')}/{kind}/main/{path.rstrip('/')})"

    readme = LINK.sub(rewrite, readme)
    return RULE_ROW.sub(lambda m: f"| [{m[1]}](rules/{m[1]}.md) |", readme)
