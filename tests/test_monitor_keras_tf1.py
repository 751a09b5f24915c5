"""The Keras and TF1 monitors on real small trainings: Keras `fit` under a MirroredStrategy over
two logical CPUs (through `bnfix doctor`, and a BNMonitor from Python), TF1 graphs through
`bnfix doctor` (plain Session.run loop) and with BNMonitorHook under MonitoredTrainingSession."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import FIXTURES, has_tf1_layers, run_bnfix

pytestmark = [pytest.mark.slow, pytest.mark.tf,
              pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None,
                                 reason="needs tensorflow")]
KERAS = FIXTURES / "doctor" / "keras_train.py"
TF1 = FIXTURES / "doctor" / "tf1_train.py"
ENV = {"TF_CPP_MIN_LOG_LEVEL": "3", "OMP_NUM_THREADS": "1"}
needs_tf1 = pytest.mark.skipif(not has_tf1_layers(), reason="needs tf-keras for the TF1 layers")


def _doctor(tmp_path: Path, *command: str, options: tuple[str, ...] = ()) -> tuple:
    out = tmp_path / "report.json"
    run = run_bnfix("doctor", "--json", str(out), "--every", "5", *options, "--",
                    sys.executable, *command, cwd=tmp_path, env=ENV, timeout=300)
    assert out.exists(), run.stdout + run.stderr
    return run, json.loads(out.read_text())


def _script(*args: str) -> str:
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True,
                          env={**__import__("os").environ, **ENV}, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_keras_fit_under_a_mirrored_strategy_healthy(tmp_path):
    run, document = _doctor(tmp_path, str(KERAS), "--replicas", "2")
    assert run.returncode == 0, run.stdout + run.stderr
    assert document["findings"] == []
    (recording,) = document["recordings"]
    assert recording["framework"] == "keras" and recording["world"] == 2
    assert recording["steps"] == 30
    layers = recording["layers"]
    assert set(layers) == {"block1/bn", "block2/bn"}
    sample = layers["block1/bn"]["samples"][0]
    # 32 samples per replica of 8x8 images: per-replica counts, read back from both replicas
    assert (sample["batch"], sample["count"]) == (32, 32 * 64)
    assert sample["running_mean"] == 0.0 and sample["dead"] is not None
    assert layers["block1/bn"]["momentum"] == pytest.approx(0.1)


def test_keras_small_per_replica_batch_and_steps(tmp_path):
    run, document = _doctor(tmp_path, str(KERAS), "--replicas", "2", "--bug", "batch4",
                            options=("--steps", "10"))
    assert run.returncode == 1, run.stdout + run.stderr
    assert {(f["code"], f["layer"]) for f in document["findings"]} == {
        ("BN301", "block1/bn"), ("BN301", "block2/bn")}
    assert "4 samples per device (2 replicas, not synced)" in run.stdout
    assert document["recordings"][0]["steps"] == 10 and document["stopped"] is True


def test_keras_monitor_from_python_sees_training_false():
    out = _script(str(KERAS), "--bug", "frozen-eval", "--monitor")
    assert "BN305 block1/bn: ran in eval mode during 30 of 30" in out
    assert "block2" not in out


@needs_tf1
def test_tf1_session_loop_through_doctor(tmp_path):
    run, document = _doctor(tmp_path, str(TF1), "--bug", "eval-updates")
    assert run.returncode == 1, run.stdout + run.stderr
    assert {(f["code"], f["layer"]) for f in document["findings"]} == {
        ("BN304", "bn1"), ("BN304", "bn2")}
    (recording,) = document["recordings"]
    assert recording["framework"] == "tf1" and recording["steps"] == 60
    assert recording["layers"]["bn1"]["momentum"] == pytest.approx(0.1, rel=1e-3)
    assert recording["layers"]["bn1"]["updates"] == 60


@needs_tf1
def test_tf1_hook_under_monitored_training_session():
    out = _script(str(TF1), "--bug", "no-update-ops", "--hook")
    assert "BN302 bn1:" in out and "never updated in 60 training steps" in out


@needs_tf1
def test_tf1_healthy_gives_none(tmp_path):
    run, document = _doctor(tmp_path, str(TF1))
    assert run.returncode == 0, run.stdout + run.stderr
    assert document["findings"] == [] and document["recordings"][0]["steps"] == 60
