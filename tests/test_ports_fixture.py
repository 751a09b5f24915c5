"""The ports fixture: realistic TF1, Keras and PyTorch code with the migration-era BN bugs
(BN005, BN007-BN011). bnfix's output must equal the golden files, the fixed programs must run
where the originals cannot, and the Keras 3 graph-mode claim of BN011 is checked on real TF."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import FIXTURES, assert_golden_check, fix_into, has_tf1_layers, run_bnfix

PORTS = FIXTURES / "ports"
PROGRAMS = sorted(p.name for p in PORTS.glob("*.py"))
TF_ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}


def test_check_output_is_the_golden_output():
    assert_golden_check(PORTS, PROGRAMS)


def test_fix_produces_the_golden_programs_and_is_idempotent(tmp_path: Path):
    run = fix_into(PORTS, PROGRAMS, tmp_path)
    assert "Found 12 errors (10 fixed, 2 remaining)." in run.stdout
    before = {name: (tmp_path / name).read_bytes() for name in PROGRAMS}
    again = run_bnfix("fix", "--unsafe-fixes", "--output-format", "concise", ".", cwd=tmp_path)
    assert {name: (tmp_path / name).read_bytes() for name in PROGRAMS} == before
    # what remains is advice: BN009 (intent unknown) and BN011 (an environment change)
    codes = sorted(line.split()[1] for line in again.stdout.splitlines() if ": BN" in line)
    assert codes == ["BN009", "BN011"]


def _python(script: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True,
                          env=env or TF_ENV, timeout=600, check=False)


@pytest.mark.slow
@pytest.mark.tf
def test_fixed_tower_trainer_runs_where_the_original_cannot():
    if not has_tf1_layers():
        pytest.skip("needs tensorflow and tf-keras")
    args = ("--num-gpus", "2", "--device", "cpu", "--steps", "2")
    original = _python(PORTS / "tf1_tower_trainer.py", *args)
    assert original.returncode != 0
    assert "has no attribute 'contrib'" in original.stderr
    fixed = _python(PORTS / "fixed" / "tf1_tower_trainer.py", *args)
    assert fixed.returncode == 0, fixed.stderr[-3000:]
    assert "step 1 loss" in fixed.stdout


@pytest.mark.slow
@pytest.mark.tf
def test_fixed_mirrored_trainer_runs_with_synchronized_bn_on_two_cpus():
    pytest.importorskip("tensorflow")
    original = _python(PORTS / "keras_mirrored_trainer.py", "--cpus", "2", "--steps", "2")
    assert original.returncode != 0 and "experimental" in original.stderr
    fixed = _python(PORTS / "fixed" / "keras_mirrored_trainer.py", "--cpus", "2", "--steps", "2")
    assert fixed.returncode == 0, fixed.stderr[-3000:]
    assert "loss:" in fixed.stdout + fixed.stderr


GRAPH_MODE_PROBE = textwrap.dedent('''
    import json, sys
    import numpy as np
    import tensorflow as tf
    tf.compat.v1.disable_eager_execution()
    x = tf.compat.v1.placeholder(tf.float32, [None, 4])
    if sys.argv[1] == "keras":
        bn = tf.keras.layers.BatchNormalization(momentum=0.5)
        y = bn(x, training=True)
        names = {"moving_mean": bn.moving_mean.value, "gamma": bn.gamma.value}
    else:
        y = tf.compat.v1.layers.batch_normalization(x, momentum=0.5, training=True, name="bn")
        graph_vars = {v.op.name: v for v in tf.compat.v1.global_variables()}
        names = {"moving_mean": graph_vars["bn/moving_mean"], "gamma": graph_vars["bn/gamma"]}
    update_ops = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)
    with tf.control_dependencies(update_ops):
        step = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(tf.reduce_mean(y ** 2))
    data = np.random.RandomState(0).normal(3.0, 2.0, (16, 4)).astype(np.float32)
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        for _ in range(3):
            sess.run(step, {x: data})
        values = {k: sess.run(v).tolist() for k, v in names.items()}
    print(json.dumps({"update_ops": len(update_ops), **values}))
''')


@pytest.mark.slow
@pytest.mark.tf
def test_bn011_claim_keras3_bn_in_graph_mode_never_updates_its_moving_stats(tmp_path: Path):
    """The rule's premise, on the TensorFlow installed here: the Keras 3 layer adds nothing to
    UPDATE_OPS and its moving mean stays 0 while gamma trains; tf-keras' TF1 layer updates."""
    pytest.importorskip("tensorflow")
    import json

    script = tmp_path / "probe.py"
    script.write_text(GRAPH_MODE_PROBE)
    keras3 = _python(script, "keras")
    assert keras3.returncode == 0, keras3.stderr[-2000:]
    state = json.loads(keras3.stdout.strip().splitlines()[-1])
    assert state["update_ops"] == 0
    assert state["moving_mean"] == [0.0, 0.0, 0.0, 0.0]
    assert any(abs(g - 1.0) > 1e-4 for g in state["gamma"])
    if not has_tf1_layers():
        pytest.skip("the tf-keras counterpart needs tf-keras")
    legacy = _python(script, "legacy", env={**TF_ENV, "TF_USE_LEGACY_KERAS": "1"})
    assert legacy.returncode == 0, legacy.stderr[-2000:]
    state = json.loads(legacy.stdout.strip().splitlines()[-1])
    assert state["update_ops"] > 0 and all(abs(m) > 0.1 for m in state["moving_mean"])
