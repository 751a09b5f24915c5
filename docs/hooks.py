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


def _rule_pages() -> dict[str, str]:
    """{path: Markdown} of the rule pages, from the checkout's rule files (bnfix is imported
    from the checkout when it is not installed)."""
    try:
        from bnfix.rulebook import load_rulebook, rules_table_markdown
    except ImportError:
        sys.path.insert(0, str(REPO))
        from bnfix.rulebook import load_rulebook, rules_table_markdown
    book = load_rulebook(REPO / "rules")
    pages = {f"rules/{code}.md": rule.markdown() for code, rule in sorted(book.rules.items())}
    table = RULE_ROW.sub(lambda m: f"| [{m[1]}]({m[1]}.md) |", rules_table_markdown(book))
    pages["rules/index.md"] = (
        "# All rules\n\nOne page per rule file (`rules/BNxxx.toml`), the same text as "
        "`bnfix rule CODE`. Source rules are run by `bnfix check`, BN2xx by `bnfix inspect`, "
        "BN3xx by `bnfix doctor`.\n\n" + table)
    return pages


def on_files(files: Files, config: MkDocsConfig) -> Files:
    for path, content in _rule_pages().items():
        files.append(File.generated(config, path, content=content))
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    present = {f.src_uri for f in files} | {"index.md"}
    pending = set(config.extra.get("pending_pages", ()))
    files.append(File.generated(config, "index.md",
                                content=site_readme(readme, present, pending, config.repo_url)))
    return files


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
