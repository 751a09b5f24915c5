"""The rule book is data: its files are complete and consistent with the checks, the CLI
prints exactly their documentation, and the README's rule table is generated from them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import REPO, run_bnfix

from bnfix.checks import ENGINE_CODES, registry
from bnfix.rulebook import RuleBookError, load_rulebook, rules_table_markdown

BOOK = load_rulebook()


def test_every_rule_file_has_a_check_and_every_check_a_rule_file():
    from bnfix.checks.artifacts import ARTIFACT_CHECKS, ARTIFACT_ENGINE_CODES
    from bnfix.doctor.diagnose import runtime_codes

    source = {code for code, rule in BOOK.rules.items() if rule.target == "source"}
    artifact = {code for code, rule in BOOK.rules.items() if rule.target == "artifact"}
    runtime = set(BOOK.rules) - source - artifact
    assert set(registry()) | ENGINE_CODES == source
    assert set(ARTIFACT_CHECKS) | ARTIFACT_ENGINE_CODES == artifact
    assert runtime_codes() == runtime


@pytest.mark.parametrize("code", sorted(BOOK.rules))
def test_rule_file_shape(code):
    rule = BOOK.rules[code]
    assert re.fullmatch(r"BN\d{3}", rule.code)
    assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", rule.name), "names are kebab-case"
    assert rule.summary and rule.docs.what.strip() and rule.docs.why.strip()
    assert rule.docs.fix_safety.strip()
    assert rule.severity in ("error", "warning")


def test_names_are_unique():
    names = [r.name for r in BOOK.rules.values()]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("code", ["BN001", "BN004", "BN900"])
def test_rule_command_prints_the_rule_file(code):
    run = run_bnfix("rule", code)
    assert run.returncode == 0
    assert run.stdout == BOOK.rules[code].markdown()
    for heading in ("## What it does", "## Why is this bad?", "## Example", "## Use instead",
                    "## Fix safety"):
        assert heading in run.stdout


def test_rule_by_name_and_unknown_rule():
    assert run_bnfix("rule", "double-ema-of-bn-stats").stdout == BOOK.rules["BN004"].markdown()
    bad = run_bnfix("rule", "BN999")
    assert bad.returncode == 2 and "no rule `BN999`" in bad.stderr


def test_rules_command_lists_every_rule():
    run = run_bnfix("rules")
    assert run.returncode == 0
    for code, rule in BOOK.rules.items():
        assert f"{code}  {rule.name}" in run.stdout


def test_readme_rule_table_is_generated_from_the_rule_files():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    start, end = "<!-- rules:start -->\n", "<!-- rules:end -->"
    table = readme[readme.index(start) + len(start): readme.index(end)]
    assert table == rules_table_markdown(BOOK), "run `bnfix rules --output-format markdown`"


def test_catalogue_entries_are_consistent():
    vocabulary = {"training", "trainable", "momentum", "epsilon", "center", "scale", "affine",
                  "track_running_stats", "synchronized"}
    for name, spec in BOOK.catalogue.apis.items():
        assert BOOK.catalogue.normalize(name) == name, f"{name} is shadowed by an alias"
        params = set(spec.params) | set(spec.call_params)
        for written in spec.canonical:
            assert written in params, f"{spec.id}: canonical maps unknown parameter {written}"
        canon = {spec.canonical_name(p) for p in params}
        for key in spec.defaults:
            assert key in canon or key in vocabulary, f"{spec.id}: default for unknown {key}"
        assert spec.momentum_convention in ("tf", "torch", "none")
        assert spec.updates in ("update_ops", "layer", "module", "manual", "inline")


def test_malformed_rule_file_is_reported_with_its_path(tmp_path: Path):
    (tmp_path / "catalogue").mkdir()
    (tmp_path / "BN001.toml").write_text('code = "BN001"\nname = "x"\n', encoding="utf-8")
    with pytest.raises(RuleBookError, match=r"BN001.toml: missing required key `summary`|docs"):
        load_rulebook(tmp_path)
    (tmp_path / "BN001.toml").write_text("code = [", encoding="utf-8")
    with pytest.raises(RuleBookError, match="BN001.toml: cannot read rule data"):
        load_rulebook(tmp_path)


def test_a_typo_in_a_catalogue_table_name_is_an_error(tmp_path: Path):
    import shutil

    from bnfix.rulebook import rules_root

    root = tmp_path / "rules"
    shutil.copytree(rules_root(), root, ignore=shutil.ignore_patterns("__pycache__", "*.py"))
    catalogue = root / "catalogue" / "tf1_training.toml"
    catalogue.write_text(catalogue.read_text().replace("[restores]", "[restore]", 1))
    with pytest.raises(RuleBookError, match="tf1_training.toml: unknown catalogue table `restore`"):
        load_rulebook(root)


def test_a_typo_in_a_rule_docs_key_is_an_error_and_known_problems_are_printed(tmp_path: Path):
    import shutil

    from bnfix.rulebook import rules_root

    assert "## Known problems\nWhen the model is built by code the analysis cannot follow" in \
        load_rulebook().rules["BN004"].markdown()
    root = tmp_path / "rules"
    shutil.copytree(rules_root(), root, ignore=shutil.ignore_patterns("__pycache__", "*.py"))
    rule = root / "BN004.toml"
    rule.write_text(rule.read_text().replace("known_problems = ", "known_problem = ", 1))
    with pytest.raises(RuleBookError, match="BN004.toml: unknown key `docs.known_problem`"):
        load_rulebook(root)


def test_the_parsed_rule_book_is_kept_in_the_cache_folder_and_checked_at_every_load(
        tmp_path: Path, monkeypatch):
    """With a cache folder the rule files' parse is kept as JSON (named by a digest of the
    files): the next load reads it instead of parsing TOML and makes the same book; an edited
    rule file is parsed again, a typo in it is still an error at load, a corrupt or planted
    parse is ignored, and a read-only folder only costs the parse."""
    import shutil

    import bnfix.rulebook as rulebook
    from bnfix.rulebook import rules_root

    def same(a, b) -> bool:
        # the catalogue compares by identity; the rules as written (an artifact example's
        # statistics hold NaN, which == never matches)
        return repr(a.rules) == repr(b.rules) and all(
            getattr(a.catalogue, f) == getattr(b.catalogue, f)
            for f in ("apis", "aliases", "training", "layers"))

    root, cache = tmp_path / "rules", tmp_path / "cache"
    shutil.copytree(rules_root(), root, ignore=shutil.ignore_patterns("__pycache__", "*.py"))
    first = load_rulebook(root, cache)
    (parsed,) = cache.glob("rulebook-*.parsed")
    assert (cache / ".gitignore").exists()
    parses: list[str] = []  # TOML texts parsed from here on
    toml = rulebook.toml_module()
    loads = toml.loads
    monkeypatch.setattr(toml, "loads", lambda text: parses.append(text) or loads(text))
    assert same(load_rulebook(root, cache), first) and parses == []
    assert same(load_rulebook(root), first)
    rule = root / "BN008.toml"
    rule.write_text(rule.read_text().replace("\nfix = ", "\nfixx = ", 1))  # a typo
    with pytest.raises(RuleBookError, match="BN008.toml: unknown key `fixx`"):
        load_rulebook(root, cache)
    rule.write_text(rule.read_text().replace("\nfixx = ", "\nrequires = [\"x\"]\nfix = ", 1))
    assert load_rulebook(root, cache).rules["BN008"].requires == ("x",)  # a known key
    rule.write_text(rule.read_text().replace("\nrequires = [\"x\"]\n", "\n", 1))
    rule.write_text(rule.read_text().replace("\nfix = ", "\n# fix = ", 1))
    with pytest.raises(RuleBookError, match="BN008.toml: missing required key `fix`"):
        load_rulebook(root, cache)
    rule.write_text(rule.read_text().replace("\n# fix = ", "\nfix = ", 1))
    parses.clear()
    again = load_rulebook(root, cache)
    assert same(again, first)
    assert len(parses) == len(list(root.rglob("*.toml")))
    # the book's digest (part of the findings cache's key) follows its files, cache or not
    assert again.digest != first.digest and load_rulebook(root).digest == again.digest
    (parsed,) = cache.glob("rulebook-*.parsed")  # the other rule book's was removed
    parsed.write_text('{"BN001.toml": {"code": "BN999"}}')  # not the files' parse
    parses.clear()
    assert same(load_rulebook(root, cache), first) and parses
    parses.clear()
    assert same(load_rulebook(root, cache), first) and parses == []  # rewritten
    (tmp_path / "a-file").write_text("")  # a cache folder that cannot be made
    assert same(load_rulebook(root, tmp_path / "a-file" / "cache"), first)


def test_docs_and_examples_are_read_from_the_cache_folder_only_when_asked_for(tmp_path: Path):
    """A load from the cache folder reads the rules without their docs and examples (86% of
    the data); `bnfix rule`, SARIF and the example tests read them on first use, from the
    file kept beside, or from the rule file when that one is damaged or planted."""
    import shutil

    from bnfix.engine import Engine
    from bnfix.rulebook import rules_root

    root, cache = tmp_path / "rules", tmp_path / "cache"
    shutil.copytree(rules_root(), root, ignore=shutil.ignore_patterns("__pycache__", "*.py"))
    first = load_rulebook(root, cache)
    (details,) = cache.glob("rulebook-*.details")
    (parsed,) = cache.glob("rulebook-*.parsed")
    assert "examples" not in parsed.read_text() and "use_instead" in details.read_text()
    kept = load_rulebook(root, cache)
    Engine(kept, frozenset(kept.rules))  # what a check builds
    assert all(rule.details._value is None for rule in kept.rules.values())  # nothing read
    assert kept.rules["BN004"].docs == first.rules["BN004"].docs
    assert repr(kept.rules) == repr(first.rules)
    for planted in ("not json", '{"BN004.toml": {"docs": {"what": "planted"}}}', "[]"):
        details.write_text(planted)
        again = load_rulebook(root, cache)
        assert again.rules["BN004"].docs == first.rules["BN004"].docs
        assert again.rules["BN004"].examples == first.rules["BN004"].examples
