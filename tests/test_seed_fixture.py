"""Seed 000 end to end: bnfix finds the four TF1 BatchNorm bugs in a real multi-tower training
program, fixes them into the golden files, and both versions train for 3 steps on logical CPU
devices: the bugs' symptoms are in the original runs and gone from the fixed ones."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import FIXTURES, has_tf1_layers, run_bnfix

SEED = FIXTURES / "seed000"
PROGRAMS = ("multi_gpu_train.py", "single_gpu_finetune.py")
EXPECTED = [
    ("multi_gpu_train.py", "BN001", 42),
    ("multi_gpu_train.py", "BN006", 102),
    ("multi_gpu_train.py", "BN002", 115),
    ("multi_gpu_train.py", "BN004", 121),
    ("single_gpu_finetune.py", "BN003", 43),
]


def test_check_reports_exactly_the_seed_bugs():
    run = run_bnfix("check", "--output-format", "json", *[str(SEED / p) for p in PROGRAMS])
    assert run.returncode == 1
    found = [(Path(r["filename"]).name, r["code"], r["location"]["row"])
             for r in json.loads(run.stdout)]
    assert found == EXPECTED


def test_fix_produces_the_golden_programs(tmp_path: Path):
    for name in PROGRAMS:
        shutil.copy(SEED / name, tmp_path / name)
    run = run_bnfix("fix", "--unsafe-fixes", ".", cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Found 5 errors (5 fixed, 0 remaining)." in run.stdout
    for name in PROGRAMS:
        assert (tmp_path / name).read_text() == (SEED / "fixed" / name).read_text(), name
    again = run_bnfix("fix", "--unsafe-fixes", ".", cwd=tmp_path)
    assert again.returncode == 0 and "All checks passed!" in again.stdout
    for name in PROGRAMS:
        assert (tmp_path / name).read_text() == (SEED / "fixed" / name).read_text()


def test_golden_programs_are_clean():
    run = run_bnfix("check", str(SEED / "fixed"))
    assert run.returncode == 0, run.stdout


# -- the programs, run for real -----------------------------------------------------------


def _run_all(tmp_path: Path) -> dict[str, dict]:
    """Run the four programs (original and fixed, multi- and single-device) concurrently."""
    env = {**os.environ, "TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2",
           "CUDA_VISIBLE_DEVICES": ""}
    jobs = {}
    for version, folder in (("original", SEED), ("fixed", SEED / "fixed")):
        for name in PROGRAMS:
            log = tmp_path / f"{version}-{name}.json"
            args = [sys.executable, str(folder / name), "--steps", "3", "--log-bn", str(log)]
            if name == "multi_gpu_train.py":
                args += ["--num-gpus", "2", "--device", "cpu"]
            jobs[(version, name)] = (subprocess.Popen(args, env=env, stdout=subprocess.PIPE,
                                                      stderr=subprocess.STDOUT, text=True), log)
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
    return _run_all(tmp_path_factory.mktemp("seed000"))


def _max_abs(values, ref: float) -> float:
    return float(np.max(np.abs(np.asarray(values, dtype=np.float64) - ref)))


@pytest.mark.slow
@pytest.mark.tf
def test_bn001_gamma_beta_frozen_in_original_and_trained_after_fix(runs):
    for version in ("original", "fixed"):
        last = runs[(version, "multi_gpu_train.py")]["steps"][-1]["after"]
        for layer, state in last.items():
            moved = max(_max_abs(state["gamma"], 1.0), _max_abs(state["beta"], 0.0))
            if version == "original":
                assert moved == 0.0, f"{layer}: gamma/beta moved in the original"
            else:
                assert moved > 1e-3, f"{layer}: gamma/beta did not train after the fix"


@pytest.mark.slow
@pytest.mark.tf
def test_bn002_bn006_moving_stats_updated_once_per_step_from_the_global_batch_after_fix(runs):
    """The original updates the shared moving mean once per tower (BN002) from each tower's
    own batch (BN006); the fixed program (one tower's UPDATE_OPS, towers synchronized by
    bnfix.tf1.sync_towers) updates it once per step from the global batch's mean."""
    for version in ("original", "fixed"):
        log = runs[(version, "multi_gpu_train.py")]
        momentum = log["momentum"]
        for step in log["steps"]:
            before = np.asarray(step["before"]["bn_conv1"]["moving_mean"])
            after = np.asarray(step["after"]["bn_conv1"]["moving_mean"])
            tower_means = [np.asarray(m) for m in step["tower_batch_mean"]["bn_conv1"]]
            global_mean = np.mean(tower_means, axis=0)  # the towers' batches are equal halves
            candidates = [*tower_means, global_mean]
            errors = [float(np.max(np.abs(after - (momentum * before + (1 - momentum) * mean))))
                      for mean in candidates]
            if version == "original":
                assert min(errors) > 1e-3, f"one update per step in the original: {errors}"
            else:
                assert errors[-1] < 1e-5, f"not one update from the global batch: {errors}"
                assert min(errors[:-1]) > 1e-3, f"an update from one tower's batch: {errors}"


@pytest.mark.slow
@pytest.mark.tf
def test_bn003_moving_stats_stay_at_init_in_original_and_move_after_fix(runs):
    for version in ("original", "fixed"):
        last = runs[(version, "single_gpu_finetune.py")]["steps"][-1]["after"]
        means = [v for k, v in last.items() if k.endswith("moving_mean")]
        variances = [v for k, v in last.items() if k.endswith("moving_variance")]
        assert means and variances
        moved = max(max(_max_abs(m, 0.0) for m in means), max(_max_abs(v, 1.0) for v in variances))
        if version == "original":
            assert moved == 0.0
        else:
            assert moved > 1e-3


@pytest.mark.slow
@pytest.mark.tf
def test_bn004_no_ema_shadows_of_moving_stats_after_fix(runs):
    def shadows(version):
        names = runs[(version, "multi_gpu_train.py")]["global_variables"]
        return [n for n in names if "ExponentialMovingAverage" in n and "/moving_" in n]

    assert len(shadows("original")) == 6  # mean and variance of 3 BN layers
    assert shadows("fixed") == []
