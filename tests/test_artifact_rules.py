"""The artifact rules' wiring: rule files <-> checks, source/artifact separation of the rule
selection, name grouping across frameworks, the example form, and rule edge cases."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import run_bnfix

from bnfix import check_source
from bnfix.artifacts.grouping import group_keys
from bnfix.artifacts.literal import artifact_from_data
from bnfix.artifacts.model import BNLayer
from bnfix.checks.artifacts import (
    ARTIFACT_CHECKS,
    ARTIFACT_ENGINE_CODES,
    degenerate_summary,
    run_checks,
)
from bnfix.rulebook import RuleBookError, load_rulebook

BOOK = load_rulebook()
ARTIFACT_RULES = {c for c, r in BOOK.rules.items() if r.target == "artifact"}


def test_every_artifact_rule_has_a_check_and_every_check_a_rule():
    assert set(ARTIFACT_CHECKS) | ARTIFACT_ENGINE_CODES == ARTIFACT_RULES
    assert {f"BN20{i}" for i in range(1, 9)} | {"BN902"} <= ARTIFACT_RULES


def test_check_never_selects_artifact_rules():
    assert not BOOK.expand(["ALL"]) & ARTIFACT_RULES
    assert BOOK.expand(["BN2"]) == set()
    assert BOOK.expand(["BN2"], target="artifact") == ARTIFACT_RULES - {"BN902"}
    assert BOOK.expand(["ALL"], target=None) == set(BOOK.rules)
    with pytest.raises(RuleBookError):
        BOOK.expand(["BN299"], target="artifact")
    assert check_source("import torch\n", "x.py", select=["BN201"]) == []


def test_rule_command_prints_an_artifact_rule():
    run = run_bnfix("rule", "stats-never-updated")
    assert run.returncode == 0 and run.stdout == BOOK.rules["BN201"].markdown()
    listing = run_bnfix("rules").stdout
    assert "BN201  stats-never-updated" in listing and "BN902  unreadable-artifact" in listing


@pytest.mark.parametrize(("keys", "expected"), [
    # torch: BN has running stats; LayerNorm/GroupNorm only weight/bias
    (["bn.weight", "bn.bias", "bn.running_mean", "bn.running_var", "bn.num_batches_tracked",
      "ln.weight", "ln.bias", "fc.weight"],
     {"bn": {"gamma", "beta", "mean", "var", "num_batches_tracked"}}),
    # TF1 with optimizer slots and an EMA of the statistics
    (["tower/bn/gamma", "tower/bn/gamma/Momentum", "tower/bn/beta", "tower/bn/moving_mean",
      "tower/bn/moving_variance", "tower/bn/moving_mean/ExponentialMovingAverage"],
     {"tower/bn": {"gamma", "beta", "mean", "var", "mean_shadow"}}),
    # TF2 object checkpoints and Keras h5 decorations; slot variables skipped
    (["m/l-1/moving_mean/.ATTRIBUTES/VARIABLE_VALUE",
      "m/l-1/moving_variance/.ATTRIBUTES/VARIABLE_VALUE",
      "m/l-1/gamma/.OPTIMIZER_SLOT/optimizer/m/.ATTRIBUTES/VARIABLE_VALUE",
      "bn1/moving_mean:0", "bn1/moving_variance:0", "bn1/beta:0"],
     {"m/l-1": {"mean", "var"}, "bn1": {"mean", "var", "beta"}}),
    # statistics without a variance: not a BN
    (["norm.running_mean", "norm.weight"], {}),
])
def test_grouping_across_naming_schemes(keys, expected):
    assert {g.name: set(g.keys) for g in group_keys(keys)} == expected


def test_literal_rejects_unknown_fields():
    with pytest.raises(ValueError, match="unknown fields"):
        artifact_from_data({"layers": {"bn": {"mean": [0.0], "variance": [1.0]}}})
    with pytest.raises(ValueError, match="unknown fields"):
        artifact_from_data({"graph": {"train_op": ["x"]}})


def test_rules_need_training_evidence():
    data = {"layers": {"bn": {"gamma": [1.0], "beta": [0.0], "mean": [0.0], "var": [1.0]}}}
    for trained in (None, False):
        assert run_checks(artifact_from_data({**data, "trained": trained}), ARTIFACT_CHECKS) == []
    trained = run_checks(artifact_from_data({**data, "trained": True}), ARTIFACT_CHECKS)
    assert sorted(f.code for f in trained) == ["BN201", "BN202"]


def test_degenerate_summary_counts_channels():
    layer = BNLayer("bn", "torch", gamma=np.array([0.0, 1.0, 1.0, 1.0]),
                    mean=np.array([0.0, np.inf, 0.0, 0.0]), var=np.array([1.0, 1.0, -2.0, 0.0]))
    assert degenerate_summary(layer) == (
        "non-finite values (1 running_mean); 2 of 4 channels with running_var <= 0 (min -2); "
        "1 of 4 dead channels (|gamma| < 1e-06): inference through this layer gives NaN/Inf or "
        "garbage: the run diverged or the stats were overwritten; restore an earlier checkpoint")
    healthy = BNLayer("bn", "tf", gamma=np.array([0.5]), mean=np.array([1e5]),
                      var=np.array([1e10]))
    assert degenerate_summary(healthy) == ""


def test_graph_rules_group_by_layer():
    artifact = artifact_from_data({"graph": {
        "train_ops": ["train"],
        "update_ops": {"bn/moving_mean": ["u1"], "bn/moving_variance": ["u2"]},
        "reachable_updates": {},
    }})
    (finding,) = run_checks(artifact, {"BN203"})
    assert finding.layer == "bn"
    assert "(u1, u2)" in finding.message and "bn/moving_mean, bn/moving_variance" in finding.message


def test_artifact_example_form_is_validated(tmp_path):
    (tmp_path / "catalogue").mkdir()
    base = ('code = "BN201"\nname = "x"\nsummary = "s"\nfix = "none"\ntarget = "artifact"\n'
            '[docs]\nwhat = "w"\nwhy = "y"\nexample = "e"\nuse_instead = "u"\n'
            'fix_safety = "f"\n')
    cases = {
        "both": '[[examples]]\nkind = "valid"\nartifact = {}\nfile = {name = "a", text = "b"}\n',
        "no flagged": '[[examples]]\nkind = "invalid"\nartifact = {}\n',
        "fix": '[[examples]]\nkind = "fix"\nfixed = ""\nartifact = {}\n',
        "file": '[[examples]]\nkind = "valid"\nfile = {name = "a"}\n',
    }
    for case, examples in cases.items():
        (tmp_path / "BN201.toml").write_text(base + examples)
        with pytest.raises(RuleBookError, match="example 0"):
            load_rulebook(tmp_path)
        assert case
    (tmp_path / "BN201.toml").write_text(
        base + '[[examples]]\nkind = "invalid"\nflagged = ["bn"]\nartifact = {}\n')
    (example,) = load_rulebook(tmp_path).rules["BN201"].examples
    assert example.artifact == {} and example.flagged == ("bn",) and example.source == ""
