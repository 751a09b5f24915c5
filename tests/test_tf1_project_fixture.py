"""The multi-file TF1 repository: a `models/` package whose BN wrapper freezes gamma/beta by
default and registers the moving statistics in MOVING_AVERAGE_VARIABLES, a ResNet built on it,
`utils.py` with the tower-gradient and EMA helpers, a multi-tower `train.py` and a single-device
`finetune.py`. Every bug spans files; bnfix must find it where the user edits and fix it into the
golden fixed/ tree, and the programs train for 3 steps on 2 logical CPUs before and after.

What bnfix finds (see docs/fixtures.md): every finding at the place the user edits, with the
other file named. BN004 is found in the EMA helper `utils.moving_average_op`, which averages
`tf.trainable_variables() + tf.moving_average_variables()`: utils.py builds no BN, but its
caller in train.py builds the ResNet whose BN wrapper (models/layers.py) registers its moving
statistics in MOVING_AVERAGE_VARIABLES. All six findings have fixes that apply (none is
display-only), and the fixed program keeps no EMA shadow of a moving statistic.

Measured symptoms, and which bug they belong to: under tf-keras a `tf.layers` BN built with
`trainable=False` adds no update ops at all, so in the original even the wired UPDATE_OPS
leave the moving statistics at 0/1. The runs therefore include the project with only BN001
fixed (bnfix's own fix, `--select BN001`): it shows the symptoms of BN002/BN006 (two updates
per step, from each tower's own batch) and BN003 (finetune's statistics still never move) that
BN001 hides in the original."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import (
    FIXTURES,
    assert_golden_check,
    fix_tree,
    has_tf1_layers,
    project_files,
    run_bnfix,
)

TF1 = FIXTURES / "tf1_project"
PROGRAMS = [p for p in project_files(TF1) if p.endswith(".py")]
TOWERS = 2


def test_check_output_is_the_golden_output():
    assert_golden_check(TF1, PROGRAMS)


def test_each_bug_is_found_where_the_user_edits():
    run = run_bnfix("check", "--no-cache", "--output-format", "json", ".", cwd=TF1)
    found = {(r["code"], Path(r["filename"]).relative_to(TF1).as_posix(), r["location"]["row"])
             for r in json.loads(run.stdout)}
    assert found == {
        ("BN001", "models/layers.py", 20),  # the wrapper's default reaches the BN
        ("BN002", "train.py", 63),  # collected after the tower loop
        ("BN003", "finetune.py", 34),  # the model comes from models/
        ("BN004", "utils.py", 21),  # the EMA helper's callers build the registering BN
        ("BN005", "utils.py", 13),  # the helper sums over towers
        ("BN006", "train.py", 54),  # the towers build the BN of models/
    }
    related = {r["code"]: {Path(x["filename"]).name for x in r.get("related", [])}
               for r in json.loads(run.stdout)}
    assert related["BN001"] == {"resnet.py"}  # the call that runs it in training mode
    assert related["BN003"] == related["BN006"] == {"layers.py"}  # the BN that is built


def test_fix_produces_the_golden_tree(tmp_path: Path):
    run = fix_tree(TF1, tmp_path)
    assert "Found 6 errors (6 fixed, 0 remaining)." in run.stdout, run.stdout
    again = run_bnfix("fix", "--unsafe-fixes", "--no-cache", ".", cwd=tmp_path)
    assert again.returncode == 0 and "All checks passed!" in again.stdout
    assert project_files(tmp_path) == project_files(TF1 / "fixed")
    for name in project_files(tmp_path):
        assert (tmp_path / name).read_text() == (TF1 / "fixed" / name).read_text(), name


def test_golden_tree_is_clean():
    run = run_bnfix("check", "--no-cache", "--extend-select", "BN104", ".", cwd=TF1 / "fixed")
    assert run.returncode == 0, run.stdout


# -- the programs, run for real -----------------------------------------------------------


def _bn001_only(target: Path) -> Path:
    """The project with bnfix's BN001 fix only: what the other bugs do once BN001 no longer
    hides them."""
    for name in project_files(TF1):
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        (target / name).write_bytes((TF1 / name).read_bytes())
    run = run_bnfix("fix", "--unsafe-fixes", "--no-cache", "--select", "BN001", ".", cwd=target)
    assert "Found 1 error (1 fixed, 0 remaining)." in run.stdout, run.stdout
    return target


def _run_all(tmp_path: Path) -> dict[tuple[str, str], dict]:
    """Run train.py and finetune.py of the three versions concurrently."""
    env = {**os.environ, "TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2",
           "CUDA_VISIBLE_DEVICES": ""}
    versions = {"original": TF1, "bn001_fixed": _bn001_only(tmp_path / "bn001"),
                "fixed": TF1 / "fixed"}
    jobs = {}
    for version, folder in versions.items():
        for program in ("train.py", "finetune.py"):
            log = tmp_path / f"{version}-{program}.json"
            args = [sys.executable, str(folder / program), "--steps", "3", "--log-bn", str(log)]
            if program == "train.py":
                args += ["--num-towers", str(TOWERS), "--device", "cpu"]
            proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True)
            jobs[(version, program)] = (proc, log)
    logs = {}
    for key, (proc, log) in jobs.items():
        out, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"{key} failed:\n{out[-3000:]}"
        logs[key] = json.loads(log.read_text())
    return logs


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    if not has_tf1_layers():
        pytest.skip("needs tensorflow and tf-keras (pip install --no-deps tf-keras)")
    return _run_all(tmp_path_factory.mktemp("tf1_project"))


def _moved(state: dict, name: str, initial: float) -> float:
    """How far variable `name` of any BN layer is from its initial value."""
    return max(float(np.max(np.abs(np.asarray(layer[name]) - initial)))
               for layer in state.values())


@pytest.mark.slow
@pytest.mark.tf
def test_bn001_gamma_beta_frozen_in_original_and_trained_after_fix(runs):
    for program in ("train.py", "finetune.py"):
        for version in ("original", "bn001_fixed", "fixed"):
            last = runs[(version, program)]["steps"][-1]["after"]
            moved = max(_moved(last, "gamma", 1.0), _moved(last, "beta", 0.0))
            if version == "original":
                assert moved == 0.0, f"{program}: gamma/beta moved in the original"
            else:
                assert moved > 1e-3, f"{program} ({version}): gamma/beta did not train"


@pytest.mark.slow
@pytest.mark.tf
def test_bn001_frozen_layer_adds_no_update_ops_so_wired_updates_do_nothing(runs):
    """train.py wires UPDATE_OPS to its train op, yet a `trainable=False` layer adds none."""
    moved = {version: _moved(runs[(version, "train.py")]["steps"][-1]["after"],
                             "moving_mean", 0.0)
             for version in ("original", "bn001_fixed")}
    assert moved["original"] == 0.0
    assert moved["bn001_fixed"] > 1e-2


def _updates(log: dict) -> list[dict[str, float]]:
    """Per step, how far bn_conv1's moving mean after the step is from each way of updating
    it: once from the global batch, once from one tower's batch, or once per tower."""
    momentum = log["momentum"]

    def update(prev, mean):
        return momentum * prev + (1 - momentum) * mean

    out = []
    for step in log["steps"]:
        before = np.asarray(step["before"]["bn_conv1"]["moving_mean"])
        after = np.asarray(step["after"]["bn_conv1"]["moving_mean"])
        towers = [np.asarray(m) for m in step["tower_batch_mean"]["bn_conv1"]]
        assert len(towers) == TOWERS
        once = {f"tower {i}": update(before, m) for i, m in enumerate(towers)}
        once["global batch"] = update(before, np.mean(towers, axis=0))  # equal halves
        per_tower = [update(update(before, towers[0]), towers[1]),
                     update(update(before, towers[1]), towers[0]),
                     before - (1 - momentum) * sum(before - m for m in towers)]  # both read first
        errors = {k: float(np.max(np.abs(after - v))) for k, v in once.items()}
        errors["once per tower"] = min(float(np.max(np.abs(after - v))) for v in per_tower)
        out.append(errors)
    return out


@pytest.mark.slow
@pytest.mark.tf
def test_bn002_bn006_moving_stats_updated_once_per_step_from_the_global_batch_after_fix(runs):
    """BN002: the unscoped UPDATE_OPS hold every tower's updates, so the shared moving mean
    is updated once per tower; BN006: each update uses one tower's batch. After the fix (one
    tower's UPDATE_OPS, towers synchronized by bnfix.tf1.sync_towers) it is updated once per
    step from the global batch."""
    for errors in _updates(runs[("bn001_fixed", "train.py")]):
        assert errors["once per tower"] < 1e-5, errors
        assert min(v for k, v in errors.items() if k != "once per tower") > 1e-3, errors
    for errors in _updates(runs[("fixed", "train.py")]):
        assert errors["global batch"] < 1e-5, errors
        assert min(v for k, v in errors.items() if k != "global batch") > 1e-3, errors


@pytest.mark.slow
@pytest.mark.tf
def test_bn003_finetune_moving_stats_stay_at_init_until_fixed(runs):
    for version in ("original", "bn001_fixed", "fixed"):
        last = runs[(version, "finetune.py")]["steps"][-1]["after"]
        moved = max(_moved(last, "moving_mean", 0.0), _moved(last, "moving_variance", 1.0))
        if version == "fixed":
            assert moved > 1e-2, "finetune's moving statistics did not move after the fix"
        else:
            assert moved == 0.0, f"finetune's moving statistics moved ({version})"


@pytest.mark.slow
@pytest.mark.tf
def test_bn005_tower_gradients_summed_in_original_and_averaged_after_fix(runs):
    for version in ("original", "fixed"):
        for step in runs[(version, "train.py")]["steps"]:
            towers = np.asarray(step["tower_grads"])
            combined = np.asarray(step["combined_grad"])
            assert towers.shape[0] == TOWERS
            ratio = float(np.linalg.norm(combined) / np.linalg.norm(towers.mean(axis=0)))
            expected = towers.sum(axis=0) if version == "original" else towers.mean(axis=0)
            assert np.allclose(combined, expected, rtol=1e-5, atol=1e-7), version
            assert ratio == pytest.approx(TOWERS if version == "original" else 1.0, rel=1e-5)


def _moving_stat_shadows(log: dict) -> list[str]:
    return [n for n in log["global_variables"]
            if "ExponentialMovingAverage" in n and "/moving_" in n]


@pytest.mark.slow
@pytest.mark.tf
def test_bn004_original_keeps_ema_shadows_of_the_moving_stats(runs):
    assert len(_moving_stat_shadows(runs[("original", "train.py")])) == 6  # 3 BN x mean, var


@pytest.mark.slow
@pytest.mark.tf
def test_bn004_no_ema_shadows_of_the_moving_stats_after_fix(runs):
    assert _moving_stat_shadows(runs[("fixed", "train.py")]) == []
