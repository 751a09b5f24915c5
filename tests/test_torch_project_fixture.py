"""The multi-file PyTorch repository: `models/` with a segmentation net that freezes its
backbone's BN at construction (`freeze_bn()`), `trainer.py` with a `Trainer` whose epoch loop
calls `self.model.train()` and an `evaluate()` helper that runs the model under no_grad without
`model.eval()`, and `main.py` that trains it under DDP (gloo on CPU) with no SyncBN conversion.
bnfix's output must equal the golden files, and both versions run with 2 ranks on CPU.

What bnfix finds and fixes today (see docs/fixtures.md):
- BN006 at the DDP wrap in main.py (the BN is built in models/net.py): fixed by
  `bnfix.torch.convert_sync`, which runs on gloo. The ranks' running statistics differ in the
  original and are identical after the fix.
- BN101 is not found: `evaluate()` and the `Trainer` that calls it with `self.model` (put in
  train mode by `train_one_epoch`) are in the same file. The same helper moved to a file of its
  own is found (the caller in trainer.py is then "in another file"); in one file BN101 matches
  the evaluated model with a `.train()` by name only (`model` vs `self.model`).
- BN102 is not found: the freeze happens in `SegNet.__init__` (models/net.py), the model is
  built in main.py (`build_model(freeze_bn=...)`) and reaches `self.model.train()` through the
  `Trainer`'s constructor; BN102 follows the model only when the class is instantiated in the
  function (or class) that calls `train()`.
The runs show both symptoms in the original; that they are gone after the fix is a strict xfail
each, which starts passing once bnfix finds and fixes them (the golden tree then changes)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import FIXTURES, assert_golden_check, fix_tree, project_files, run_bnfix

TORCH = FIXTURES / "torch_project"
PROGRAMS = [p for p in project_files(TORCH) if p.endswith(".py")]
RANKS = 2


def test_check_output_is_the_golden_output():
    assert_golden_check(TORCH, PROGRAMS)


def test_ddp_finding_points_at_the_wrap_and_names_the_model_file():
    run = run_bnfix("check", "--no-cache", "--output-format", "json", ".", cwd=TORCH)
    found = [(r["code"], Path(r["filename"]).name, r["location"]["row"])
             for r in json.loads(run.stdout)]
    assert found == [("BN006", "main.py", 49)]
    assert "models/net.py:15" in json.loads(run.stdout)[0]["message"]


def test_fix_produces_the_golden_tree(tmp_path: Path):
    run = fix_tree(TORCH, tmp_path, "--extend-select", "BN104")
    assert "Found 1 error (1 fixed, 0 remaining)." in run.stdout, run.stdout
    again = run_bnfix("fix", "--unsafe-fixes", "--no-cache", "--extend-select", "BN104", ".",
                      cwd=tmp_path)
    assert again.returncode == 0 and "All checks passed!" in again.stdout
    for name in project_files(tmp_path):
        assert (tmp_path / name).read_text() == (TORCH / "fixed" / name).read_text(), name


def test_golden_tree_is_clean():
    run = run_bnfix("check", "--no-cache", "--extend-select", "BN104", ".",
                    cwd=TORCH / "fixed")
    assert run.returncode == 0, run.stdout


# -- the programs, run for real -----------------------------------------------------------


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, list[dict]]:
    """main.py of both versions, 2 ranks on gloo, 2 epochs, the backbone's BN frozen; run
    concurrently. Per version, one log per rank."""
    pytest.importorskip("torch")
    tmp = tmp_path_factory.mktemp("torch_project")
    jobs = {}
    for version, folder, port in (("original", TORCH, "29641"),
                                  ("fixed", TORCH / "fixed", "29642")):
        log = tmp / f"{version}.json"
        args = [sys.executable, str(folder / "main.py"), "--world-size", str(RANKS),
                "--epochs", "2", "--freeze-bn", "--port", port, "--log-bn", str(log)]
        jobs[version] = (subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          text=True), log)
    logs = {}
    for version, (proc, log) in jobs.items():
        out, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"{version} failed:\n{out[-3000:]}"
        logs[version] = json.loads(log.read_text())
        assert [r["rank"] for r in logs[version]] == list(range(RANKS))
    return logs


def _diff(a: list[float], b: list[float]) -> float:
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b))))


@pytest.mark.slow
def test_bn006_ranks_running_stats_differ_in_original_and_agree_after_fix(runs):
    for version in ("original", "fixed"):
        ranks = runs[version]
        for epoch in range(len(ranks[0]["epochs"])):
            head = [r["epochs"][epoch]["after_train"]["head"] for r in ranks]
            spread = max(_diff(head[0], other) for other in head[1:])
            if version == "original":
                assert spread > 1e-3, f"the ranks' running means agree without sync: {spread}"
            else:
                assert spread < 1e-6, f"the ranks' running means differ after the fix: {spread}"


def _frozen_bn_moved(ranks: list[dict]) -> float:
    """How far the frozen backbone BN's running mean moved from its initial value."""
    return min(_diff(r["initial"]["backbone"], e["after_train"]["backbone"])
               for r in ranks for e in r["epochs"])


def _moved_by_evaluation(ranks: list[dict]) -> float:
    return min(_diff(e["after_train"][bn], e["after_eval"][bn])
               for r in ranks for e in r["epochs"] for bn in ("backbone", "head"))


@pytest.mark.slow
def test_bn102_frozen_bn_running_stats_move_after_train_in_original(runs):
    assert _frozen_bn_moved(runs["original"]) > 1e-2


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason="bnfix does not find BN102: the model is built in "
                   "main.py and calls .train() as Trainer.self.model in trainer.py")
def test_bn102_frozen_bn_stays_frozen_after_fix(runs):
    assert _frozen_bn_moved(runs["fixed"]) == 0.0


@pytest.mark.slow
def test_bn101_evaluation_moves_running_stats_in_original(runs):
    assert _moved_by_evaluation(runs["original"]) > 1e-3


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason="bnfix does not find BN101: evaluate() and the Trainer "
                   "that calls it with self.model are in one file")
def test_bn101_evaluation_leaves_running_stats_alone_after_fix(runs):
    assert max(_diff(e["after_train"][bn], e["after_eval"][bn])
               for r in runs["fixed"] for e in r["epochs"] for bn in ("backbone", "head")) == 0.0
