"""bnfix.tf1.sync_towers on two logical CPU devices: every BN entry point matches BN on the
concatenated batch (outputs, gradients, moving statistics after one update) and the unsynced
towers do not; the patch lives exactly as long as the context. One subprocess runs it all
(tests/programs/tf1_sync_proof.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import REPO, has_tf1_layers

PROGRAM = REPO / "tests" / "programs" / "tf1_sync_proof.py"
ENTRY_POINTS = ("layers", "fused", "bnfix")

pytestmark = [pytest.mark.slow, pytest.mark.tf]


@pytest.fixture(scope="module")
def proof() -> dict:
    if not has_tf1_layers():
        pytest.skip("needs tensorflow and tf-keras (pip install --no-deps tf-keras)")
    env = {**os.environ, "TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2",
           "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(REPO)}
    run = subprocess.run([sys.executable, str(PROGRAM)], capture_output=True, text=True,
                         env=env, timeout=600, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout)


@pytest.mark.parametrize("entry", [*ENTRY_POINTS, "bnfix_grads_after_loop"])
def test_synced_towers_equal_big_batch_bn(proof, entry):
    synced = proof[entry]["synced"]
    assert synced["output"] < 1e-6 * synced["output_scale"] + 1e-6, synced
    assert synced["input_grad"] < 1e-7, synced
    assert synced["grads"] < 1e-5 * synced["grads_scale"], synced
    assert synced["stats"] < 1e-6, synced
    assert synced["stats_moved"] > 0.1  # the reference's stats did move: the check can fail


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_unsynced_towers_differ_from_big_batch_bn(proof, entry):
    unsynced = proof[entry]["unsynced"]
    assert unsynced["output"] > 0.5
    assert unsynced["grads"] > 0.1 * unsynced["grads_scale"]
    assert unsynced["stats"] > 0.05


@pytest.mark.parametrize("entry", ["layers", "bnfix"])
def test_one_pair_of_update_ops_per_layer_in_the_last_tower(proof, entry):
    # 2 layers x (moving mean, moving variance), all in the last tower's name scope
    assert proof[entry]["updates_in_last_tower"] == proof[entry]["updates_total"] == 4


def test_hand_written_updates_around_fused_bn_stay_per_tower(proof):
    # fused_batch_norm returns the global statistics; the caller's own update ops are its own
    assert proof["fused"]["updates_in_last_tower"] == 4
    assert proof["fused"]["updates_total"] == 8


def test_patch_lives_as_long_as_the_context(proof):
    lifetime = proof["lifetime"]
    assert lifetime["patched_inside"]
    assert lifetime["restored_after"]
    assert lifetime["restored_after_exception"]
    assert lifetime["restored_after_errors"]


def test_unpairable_calls_are_clear_errors(proof):
    errors = proof["lifetime"]["errors"]
    assert "outside a tower" in errors["outside_tower"]
    assert "same order" in errors["order"]
    assert "every tower needs its own device" in errors["missing_tower"]
