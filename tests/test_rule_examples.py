"""Every example in every rule file runs here: invalid examples must be flagged on exactly the
listed rows, valid ones must not be, fix examples must produce `fixed` (and fixing that again
must change nothing). The docs' Example / Use instead pair is checked the same way.

Artifact rules (`target = "artifact"`, BN2xx and BN902) state their examples as an artifact
(the IR as data) or as a file's bytes; they must flag exactly the listed layers."""

from __future__ import annotations

from pathlib import Path

import pytest

from bnfix import check_paths, check_source, fix_source, load_rulebook
from bnfix.checks import ENGINE_CODES

BOOK = load_rulebook()
SOURCE_RULES = {code: rule for code, rule in BOOK.rules.items() if rule.target == "source"}
ARTIFACT_RULES = {code: rule for code, rule in BOOK.rules.items() if rule.target == "artifact"}
CASES = [
    pytest.param(rule, example, id=f"{code}-{example.kind}-{example.name}")
    for code, rule in sorted(SOURCE_RULES.items())
    for example in rule.examples if example.files is None
]
PROJECT_CASES = [
    pytest.param(rule, example, id=f"{code}-{example.kind}-{example.name}")
    for code, rule in sorted(SOURCE_RULES.items())
    for example in rule.examples if example.files is not None
]
ARTIFACT_CASES = [
    pytest.param(rule, example, id=f"{code}-{example.kind}-{example.name}")
    for code, rule in sorted(ARTIFACT_RULES.items())
    for example in rule.examples
]


def _rows(code: str, source: str) -> list[int]:
    """The rows `code` flags (the rule is selected: opt-in rules are tested like the others)."""
    selected = ["ALL"] if code in ENGINE_CODES else [code]  # BN900 alone would parse nothing
    return sorted(d.span.start.row for d in check_source(source, "example.py", select=selected)
                  if d.code == code)


@pytest.mark.parametrize(("rule", "example"), CASES)
def test_example(rule, example):
    rows = _rows(rule.code, example.source)
    if example.kind == "valid":
        assert rows == [], f"{rule.code} flagged a valid example at rows {rows}"
        return
    assert rows == sorted(example.lines)
    if example.kind == "fix":
        result = fix_source(example.source, "example.py", unsafe_fixes=True, select=[rule.code])
        assert result.text == example.fixed
        assert _rows(rule.code, result.text) == []
        again = fix_source(result.text, "example.py", unsafe_fixes=True, select=[rule.code])
        assert again.text == result.text, "fixing twice must equal fixing once"


def _project_rows(code: str, root) -> dict[str, list[int]]:
    report = check_paths([root], select=[code])
    rows: dict[str, list[int]] = {}
    for d in report.remaining:
        rows.setdefault(Path(d.path).relative_to(root).as_posix(), []).append(d.span.start.row)
    return {k: sorted(v) for k, v in rows.items()}


@pytest.mark.parametrize(("rule", "example"), PROJECT_CASES)
def test_project_example(rule, example, tmp_path):
    """A multi-file example is checked as a project: each file flagged on exactly its rows."""
    root = tmp_path / "project"
    for name, source in example.files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(source.lstrip("\n"), encoding="utf-8")
    expected = {k: sorted(v) for k, v in example.file_lines.items() if v}
    assert _project_rows(rule.code, root) == expected
    if example.kind == "fix":
        check_paths([root], select=[rule.code], fix=True, unsafe_fixes=True)
        for name, source in example.files.items():
            text = (root / name).read_text(encoding="utf-8")
            wanted = example.fixed_files.get(name, source).lstrip("\n")
            assert text == wanted, f"{name} after the fix"
        assert _project_rows(rule.code, root) == {}
        before = {n: (root / n).read_text(encoding="utf-8") for n in example.files}
        check_paths([root], select=[rule.code], fix=True, unsafe_fixes=True)
        assert {n: (root / n).read_text(encoding="utf-8") for n in example.files} == before, \
            "fixing twice must equal fixing once"


@pytest.mark.parametrize("code", sorted(set(SOURCE_RULES) - ENGINE_CODES))
def test_every_source_rule_has_multi_file_examples(code):
    kinds = {e.kind for e in BOOK.rules[code].examples if e.files is not None}
    assert "valid" in kinds and kinds & {"invalid", "fix"}, \
        f"{code} needs a multi-file invalid and a multi-file valid example"


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
