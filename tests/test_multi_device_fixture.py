"""The multi-device fixture (BN006): a DDP segmentation script with plain BN and 2 images per
process. bnfix's output equals the golden files, and both versions train for real on 2 gloo
processes: in the original each rank keeps its own running statistics, in the fixed program
(bnfix.torch.convert_sync, which has a CPU path) every rank holds the same ones."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import FIXTURES, assert_golden_check, fix_into

FOLDER = FIXTURES / "multi_device"
PROGRAMS = ("ddp_segmentation.py",)


def test_check_output_is_the_golden_output():
    assert_golden_check(FOLDER, PROGRAMS)


def test_fix_produces_the_golden_program(tmp_path: Path):
    run = fix_into(FOLDER, PROGRAMS, tmp_path)
    assert "Found 1 error (1 fixed, 0 remaining)." in run.stdout, run.stdout


def _rank_gap(log: dict) -> float:
    first, second = log["ranks"][0], log["ranks"][1]
    return max(abs(a - b) for layer in first for key in ("running_mean", "running_var")
               for a, b in zip(first[layer][key], second[layer][key]))


@pytest.mark.slow
@pytest.mark.parametrize(("version", "port"), [("original", "29631"), ("fixed", "29632")])
def test_ranks_share_running_stats_only_after_the_fix(tmp_path: Path, version, port):
    pytest.importorskip("torch")
    folder = FOLDER if version == "original" else FOLDER / "fixed"
    log = tmp_path / "bn.json"
    run = subprocess.run([sys.executable, str(folder / "ddp_segmentation.py"), "--world-size", "2",
                          "--steps", "3", "--port", port, "--log-bn", str(log)],
                         capture_output=True, text=True, timeout=600, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    gap = _rank_gap(json.loads(log.read_text()))
    if version == "original":
        assert gap > 1e-3, f"the ranks' running statistics agree without SyncBN: {gap}"
    else:
        assert gap < 1e-6, f"the ranks' running statistics differ after the fix: {gap}"
