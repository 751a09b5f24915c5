"""Every example in every rule file runs here: invalid examples must be flagged on exactly the
listed rows, valid ones must not be, fix examples must produce `fixed` (and fixing that again
must change nothing). The docs' Example / Use instead pair is checked the same way.

Artifact rules (`target = "artifact"`, BN2xx and BN902) state their examples as an artifact
(the IR as data) or as a file's bytes; they must flag exactly the listed layers."""

from __future__ import annotations

import pytest

from bnfix import check_source, fix_source, load_rulebook
from bnfix.checks import ENGINE_CODES

BOOK = load_rulebook()
SOURCE_RULES = {code: rule for code, rule in BOOK.rules.items() if rule.target == "source"}
ARTIFACT_RULES = {code: rule for code, rule in BOOK.rules.items() if rule.target == "artifact"}
CASES = [
    pytest.param(rule, example, id=f"{code}-{example.kind}-{example.name}")
    for code, rule in sorted(SOURCE_RULES.items())
    for example in rule.examples
]
ARTIFACT_CASES = [
    pytest.param(rule, example, id=f"{code}-{example.kind}-{example.name}")
    for code, rule in sorted(ARTIFACT_RULES.items())
    for example in rule.examples
]


def _rows(code: str, source: str) -> list[int]:
    return sorted(d.span.start.row for d in check_source(source, "example.py") if d.code == code)


@pytest.mark.parametrize(("rule", "example"), CASES)
def test_example(rule, example):
    rows = _rows(rule.code, example.source)
    if example.kind == "valid":
        assert rows == [], f"{rule.code} flagged a valid example at rows {rows}"
        return
    assert rows == sorted(example.lines)
    if example.kind == "fix":
        result = fix_source(example.source, "example.py", unsafe_fixes=True)
        assert result.text == example.fixed
        assert _rows(rule.code, result.text) == []
        again = fix_source(result.text, "example.py", unsafe_fixes=True)
        assert again.text == result.text, "fixing twice must equal fixing once"


@pytest.mark.parametrize("code", sorted(set(SOURCE_RULES) - {"BN901"}))
def test_docs_example_pair(code):
    rule = BOOK.rules[code]
    assert _rows(code, rule.docs.example), f"{code}: the docs Example is not flagged"
    assert _rows(code, rule.docs.use_instead) == [], f"{code}: the docs Use instead is flagged"


@pytest.mark.parametrize("code", sorted(set(BOOK.rules) - ENGINE_CODES))
def test_every_rule_has_invalid_valid_and_fix_examples(code):
    kinds = {e.kind for e in BOOK.rules[code].examples}
    assert {"valid", "invalid"} <= kinds | ({"invalid"} if "fix" in kinds else set())
    if BOOK.rules[code].fix in ("safe", "unsafe"):
        assert "fix" in kinds, f"{code} has a fix but no fix example"


def _flagged_layers(rule, example, tmp_path) -> list[str]:
    from bnfix.artifacts.inspect import inspect_paths
    from bnfix.artifacts.literal import artifact_from_data
    from bnfix.checks.artifacts import run_checks

    if example.artifact is not None:
        findings = run_checks(artifact_from_data(example.artifact), {rule.code})
    else:
        path = tmp_path / example.file["name"]
        if "hex" in example.file:
            path.write_bytes(bytes.fromhex(example.file["hex"]))
        else:
            path.write_text(example.file["text"], encoding="utf-8")
        findings = inspect_paths([str(path)], select=[rule.code]).findings
    assert all(f.code == rule.code for f in findings)
    return sorted(f.layer for f in findings)


@pytest.mark.parametrize(("rule", "example"), ARTIFACT_CASES)
def test_artifact_example(rule, example, tmp_path):
    layers = _flagged_layers(rule, example, tmp_path)
    if example.kind == "valid":
        assert layers == [], f"{rule.code} flagged a valid example: {layers}"
    else:
        assert layers == sorted(example.flagged)


@pytest.mark.parametrize("code", sorted(ARTIFACT_RULES))
def test_artifact_rule_docs_are_python(code):
    """An artifact rule's docs show the training/export code behind the fingerprint."""
    rule = ARTIFACT_RULES[code]
    for text in (rule.docs.example, rule.docs.use_instead):
        compile(text, f"{code}.toml", "exec")
