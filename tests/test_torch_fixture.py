"""The PyTorch training fixture: a DDP script with train/validate loops and a segmentation
trainer with a BN freeze. bnfix's output must equal the golden files, and both versions run on
CPU: in the originals BN running statistics move during validation and while "frozen"; in the
fixed programs they do not."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import FIXTURES, assert_golden_check, fix_into, run_bnfix

TORCH = FIXTURES / "torch_training"
PROGRAMS = ("ddp_train.py", "seg_trainer.py")


def test_check_output_is_the_golden_output():
    assert_golden_check(TORCH, PROGRAMS)


def test_fix_produces_the_golden_programs(tmp_path: Path):
    run = fix_into(TORCH, PROGRAMS, tmp_path)
    # BN105's fix makes freeze_bn() a real BN freeze, which BN102 then keeps alive across
    # train(): five fixes for four findings
    assert "Found 5 errors (5 fixed, 0 remaining)." in run.stdout, run.stdout
    again = run_bnfix("fix", "--unsafe-fixes", "--extend-select", "BN104", ".", cwd=tmp_path)
    assert again.returncode == 0 and "All checks passed!" in again.stdout


def _run(script: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True,
                          timeout=600, check=False)


def _moved(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b))


@pytest.mark.slow
@pytest.mark.parametrize(("version", "port"), [("original", "29611"), ("fixed", "29612")])
def test_ddp_validation_leaves_running_stats_alone_after_the_fix(tmp_path: Path, version, port):
    pytest.importorskip("torch")
    folder = TORCH if version == "original" else TORCH / "fixed"
    log = tmp_path / "bn.json"
    run = _run(folder / "ddp_train.py", "--world-size", "2", "--epochs", "2", "--port", port,
               "--log-bn", str(log))
    assert run.returncode == 0, run.stderr[-3000:]
    epochs = json.loads(log.read_text())
    moved = [_moved(e["running_mean_before_val"], e["running_mean_after_val"]) for e in epochs]
    if version == "original":
        assert min(moved) > 1e-4, f"validation did not move the running mean: {moved}"
    else:
        assert max(moved) == 0.0, f"validation moved the running mean: {moved}"


@pytest.mark.slow
@pytest.mark.parametrize("version", ["original", "fixed"])
def test_frozen_backbone_bn_stays_frozen_after_the_fix(tmp_path: Path, version):
    pytest.importorskip("torch")
    folder = TORCH if version == "original" else TORCH / "fixed"
    log = tmp_path / "bn.json"
    run = _run(folder / "seg_trainer.py", "--epochs", "2", "--freeze-bn", "--log-bn", str(log))
    assert run.returncode == 0, run.stderr[-3000:]
    state = json.loads(log.read_text())
    moved = [_moved(state["initial"], e["backbone_bn1_running_mean"]) for e in state["epochs"]]
    if version == "original":
        assert min(moved) > 1e-3, f"the frozen BN did not move: {moved}"
    else:
        assert max(moved) == 0.0, f"the frozen BN moved: {moved}"
