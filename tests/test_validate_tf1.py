"""`bnfix validate tf1`: `bnfix.tf1.sync_towers` towers on 2 CPU devices of one TF1 graph
against the same network on the global batch, run as a user runs the command.

Fixtures: fixtures/validate/tf1_towers.py (TF1 layers BN and bnfix.tf1.batch_norm; a
`tf.nn.moments` normalisation that sync_towers does not reroute, which must fail).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import REPO, has_tf1_layers, run_bnfix

pytestmark = [pytest.mark.tf, pytest.mark.slow,
              pytest.mark.skipif(not has_tf1_layers(), reason="needs tensorflow and tf-keras")]
TOWERS = "fixtures/validate/tf1_towers.py"
QUIET = {"TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}


def test_synced_towers_match_the_global_batch(tmp_path: Path) -> None:
    run = run_bnfix("validate", "tf1", f"{TOWERS}:build", "--input-shape", "8,6,6,3",
                    "--towers", "2", "--steps", "2", "--json", str(tmp_path / "r.json"),
                    "--plot", str(tmp_path / "e.png"), cwd=REPO, env=QUIET, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["verdict"] == "pass" and report["settings"]["devices"] == 2
    synced = {layer["layer"]: layer for layer in report["synced"]["layers"]}
    unsynced = {layer["layer"]: layer for layer in report["unsynced"]["layers"]}
    for bn in ("bn_conv", "bn_dense"):  # TF1 layers BN and bnfix.tf1.batch_norm
        assert synced[bn]["kind"] == "batch norm"
        assert {t["name"] for t in synced[bn]["tensors"]} >= {"moving_mean", "moving_variance"}
        assert synced[bn]["max_rel"] < report["tolerance"] < 1e-2 < unsynced[bn]["max_rel"]
    assert unsynced["(output)"]["max_rel"] > 1e-2
    # the inference graph per tower vs the whole batch: exact on some CPUs, float32 rounding on
    # others (TF's CPU kernels block a 4-example slice differently from 8: 3e-8 seen on one)
    assert report["fidelity"][0]["converted"] == 2 and report["fidelity"][0]["max_rel"] < 1e-6
    assert (tmp_path / "e.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    print(f"\ntf1 build fp32: synced max rel {report['synced']['max_rel']:.1e}, unsynced "
          f"{report['unsynced']['max_rel']:.1e}, {report['seconds']['total']} s")


def test_unrerouted_moments_fail(tmp_path: Path) -> None:
    run = run_bnfix("validate", "tf1", f"{TOWERS}:build_moments", "--input-shape", "8,6",
                    "--steps", "2", "--dtype", "float64", "--json", str(tmp_path / "r.json"),
                    cwd=REPO, env=QUIET, timeout=300)
    assert run.returncode == 1, run.stdout + run.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["synced"]["max_rel"] > 1e-2 and "sync did not close the gap" in run.stdout


@pytest.mark.parametrize(("args", "message"), [
    ((f"{TOWERS}:build_fails", "--input-shape", "8,6"),
     "build_fails raised ValueError: unknown backbone 'resnet-9000'"),
    ((f"{TOWERS}:build", "--input-shape", "8,6,6,3", "--backend", "nccl"),
     "--backend nccl is a torch backend"),
    ((f"{TOWERS}:build", "--input-shape", "8,6,6,3", "--towers", "0"),
     "the device count must be at least 1"),
], ids=["build-raises", "torch-backend", "no-towers"])
def test_usage_errors_are_one_line(args: tuple[str, ...], message: str) -> None:
    run = run_bnfix("validate", "tf1", *args, cwd=REPO, env=QUIET)
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.count("\n") == 1 and message in run.stderr, run.stderr
