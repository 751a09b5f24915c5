"""The BN3xx rule book: every runtime rule's examples (recorded statistics as data) run through
the diagnoses and flag exactly the listed layers; every diagnosis has a rule file and every
runtime rule a diagnosis; recordings survive JSON; the precedence between findings on one
layer; the findings of a distributed run are merged across ranks."""

from __future__ import annotations

import json

import pytest

from bnfix.doctor.diagnose import EXPLAINED_BY, diagnose, runtime_codes
from bnfix.doctor.record import FinalStats, LayerTrace, Recording, Sample, add_step, count_steps
from bnfix.rulebook import load_rulebook

BOOK = load_rulebook()
RUNTIME = {code: rule for code, rule in BOOK.rules.items() if rule.target == "runtime"}
CASES = [pytest.param(rule, example, id=f"{code}-{example.kind}-{example.name}")
         for code, rule in sorted(RUNTIME.items()) for example in rule.examples]


def _recordings(example) -> list[Recording]:
    return [Recording.from_data(json.loads(json.dumps(data))) for data in example.recordings]


@pytest.mark.parametrize(("rule", "example"), CASES)
def test_runtime_example(rule, example):
    findings = diagnose(_recordings(example), {rule.code})
    assert all(f.code == rule.code for f in findings)
    layers = sorted(f.layer for f in findings)
    assert layers == ([] if example.kind == "valid" else sorted(example.flagged))
    for finding in findings:  # names the layer's numbers and a fix
        assert finding.message and finding.fix and finding.numbers


def test_every_diagnosis_has_a_rule_file_and_back():
    assert set(RUNTIME) == runtime_codes()
    assert set(EXPLAINED_BY) <= set(RUNTIME)


@pytest.mark.parametrize("code", sorted(RUNTIME))
def test_runtime_rule_docs(code):
    rule = RUNTIME[code]
    kinds = {e.kind for e in rule.examples}
    assert {"valid", "invalid"} <= kinds
    for text in (rule.docs.example, rule.docs.use_instead):
        compile(text, f"{code}.toml", "exec")
    assert "Threshold" in rule.docs.what or code in ("BN304", "BN305"), \
        f"{code}: thresholds are documented with their reason"


def test_runtime_rules_are_not_selected_by_check():
    assert not BOOK.expand(["ALL"], target="source") & set(RUNTIME)
    assert BOOK.expand(["BN3"], target="runtime") == set(RUNTIME)


def test_recording_round_trips_through_json_with_non_finite_values():
    rec = Recording("torch", "Net", 5, rank=1, world=2, steps=7)
    rec.layers["bn"] = LayerTrace("bn", "BatchNorm2d", 2, momentum=0.1, samples=[
        Sample(step=1, count=64, batch=4, var_max=float("inf"), nonfinite=2)],
        final=FinalStats(3, [0.0, 1.0], [1.0, 2.0], [0.0, 0.5], [1.0, float("nan")]))
    back = Recording.from_data(json.loads(json.dumps(rec.to_data())))
    assert back.layers["bn"].samples[0].var_max == "inf"
    assert back.to_data() == json.loads(json.dumps(rec.to_data()))
    assert back.rank == 1 and back.world == 2 and back.layers["bn"].final.window == 3


def test_step_ranges():
    ranges: list[list[int]] = []
    for step in (1, 2, 3, 7, 8, 10):
        add_step(ranges, step)
    assert ranges == [[1, 3], [7, 8], [10, 10]] and count_steps(ranges) == 6


def _layer(name: str, **fields) -> LayerTrace:
    return LayerTrace(name, "BatchNorm2d", 2, **fields)


def test_a_cause_hides_its_consequence_on_the_same_layer():
    """A layer in eval mode all run long also has unconverged, mismatched statistics: only
    BN305 (the cause) is reported; another layer's mismatch still is."""
    stale = FinalStats(4, [2.0, -2.0], [1.0, 1.0], [0.0, 0.0], [1.0, 1.0])
    rec = Recording("torch", "Net", 10, steps=50, layers={
        "frozen": _layer("frozen", momentum=0.001, updates=50, eval_mode_steps=[[1, 50]],
                         final=stale),
        "other": _layer("other", momentum=0.1, updates=50, final=stale)})
    found = {(f.layer, f.code) for f in diagnose([rec])}
    assert found == {("frozen", "BN305"), ("other", "BN302")}


def test_ranks_are_merged_into_one_finding_per_layer():
    recs = [Recording("torch", "Net", 10, rank=r, world=2, steps=20, layers={
        "bn": _layer("bn", samples=[Sample(step=1, batch=4, count=256)])}) for r in (0, 1)]
    findings = diagnose(recs)
    assert [(f.code, f.layer, f.ranks) for f in findings] == [("BN301", "bn", (0, 1))]
    assert "2 replicas, not synced" in findings[0].message


def test_a_run_stopped_by_steps_is_not_judged_on_convergence():
    """Stopped early, a slow running average is still converging (neither BN303 nor BN302);
    one that had time to converge and is still off is a mismatch."""
    final = FinalStats(4, [2.0, -2.0], [1.0, 1.0], [0.0, 0.0], [1.0, 1.0])
    rec = Recording("torch", "Net", 10, steps=20, stopped=True, layers={
        "slow": _layer("slow", momentum=0.01, updates=20, final=final),
        "fast": _layer("fast", momentum=0.5, updates=20, final=final)})
    assert {(f.layer, f.code) for f in diagnose([rec])} == {("fast", "BN302")}
