"""`bnfix inspect` on real TensorFlow and Keras artifacts, written by TF itself in a subprocess:
TF1 checkpoints with and without the update ops run (BN201) and with an EMA over the moving
statistics (BN205), a TF2 object-based checkpoint, Keras `.keras` and `.h5` files healthy and
with a frozen BN (BN201 + BN202)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import has_tf1_layers, run_bnfix

pytestmark = [pytest.mark.slow, pytest.mark.tf]

TF1_SCRIPT = textwrap.dedent('''
    import sys
    import numpy as np
    import tensorflow as tf

    tf1 = tf.compat.v1
    out = sys.argv[1]

    # TF2 object-based checkpoint of a tf_keras model trained 2 steps
    model = tf.keras.Sequential([tf.keras.layers.Dense(3, input_shape=(4,)),
                                 tf.keras.layers.BatchNormalization(name="bn")])
    opt = tf.keras.optimizers.SGD(0.1)
    for _ in range(2):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(model(np.random.rand(8, 4).astype("float32"),
                                        training=True) ** 2)
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                model.trainable_variables))
    tf.train.Checkpoint(model=model, optimizer=opt).save(f"{out}/tf2/ckpt")


    def tf1_checkpoint(name, update_ops, ema=False):
        with tf.Graph().as_default():
            x = tf1.placeholder(tf.float32, [None, 3])
            step = tf1.train.get_or_create_global_step()
            h = tf1.layers.dense(x, 2, use_bias=False, name="fc")
            h = tf1.layers.batch_normalization(h, training=True, name="bn1")
            loss = tf.reduce_mean(h ** 2)
            opt = tf1.train.MomentumOptimizer(0.1, 0.9)
            deps = tf1.get_collection(tf1.GraphKeys.UPDATE_OPS) if update_ops else []
            with tf.control_dependencies(deps):
                train = opt.minimize(loss, global_step=step)
            ops = [train]
            if ema:
                moving = [v for v in tf1.global_variables() if "moving_" in v.name]
                ops.append(tf1.train.ExponentialMovingAverage(0.99).apply(moving))
            saver = tf1.train.Saver()
            with tf1.Session() as sess:
                sess.run(tf1.global_variables_initializer())
                for _ in range(3):
                    sess.run(ops, {x: np.random.rand(4, 3) * 3 + 1})
                saver.save(sess, f"{out}/{name}/model.ckpt", global_step=step,
                           write_meta_graph=False)


    tf1_checkpoint("healthy", update_ops=True)
    tf1_checkpoint("no_update_ops", update_ops=False)
    tf1_checkpoint("ema", update_ops=True, ema=True)
''')

KERAS_SCRIPT = textwrap.dedent('''
    import sys
    import numpy as np
    import keras

    out = sys.argv[1]

    def build(frozen):
        inputs = keras.Input((6, 6, 3))
        x = keras.layers.Conv2D(4, 3, use_bias=False)(inputs)
        bn = keras.layers.BatchNormalization(name="bn1")
        bn.trainable = not frozen  # Keras 3: a frozen BN also runs in inference mode
        x = keras.layers.Flatten()(bn(x))
        head = keras.Sequential([keras.layers.Dense(3),
                                 keras.layers.BatchNormalization(name="head_bn", center=False)],
                                name="head")
        model = keras.Model(inputs, head(x))
        model.compile(optimizer="sgd", loss="mse")
        return model

    for name, frozen in (("healthy", False), ("frozen", True)):
        model = build(frozen)
        rng = np.random.default_rng(0)
        model.fit(rng.normal(2.0, 1.0, (16, 6, 6, 3)), rng.normal(size=(16, 3)), batch_size=8,
                  epochs=1, verbose=0)
        model.save(f"{out}/{name}.keras")
        model.save(f"{out}/{name}.h5")
    build(False).save(f"{out}/untrained.keras")
''')


def _write(script: str, out: Path, env: dict[str, str]) -> None:
    full = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **env}
    proc = subprocess.run([sys.executable, "-c", script, str(out)], capture_output=True,
                          text=True, env=full, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]


def _inspect_json(*paths: Path) -> dict[tuple[str, str], list[str]]:
    """(artifact file name, code) -> flagged layers."""
    run = run_bnfix("inspect", *map(str, paths), "--output-format", "json", timeout=300)
    assert run.returncode in (0, 1), run.stderr
    out: dict[tuple[str, str], list[str]] = {}
    for record in json.loads(run.stdout):
        out.setdefault((Path(record["filename"]).name, record["code"]), []).append(record["layer"])
    return out


@pytest.fixture(scope="module")
def tf1_artifacts(tmp_path_factory) -> Path:
    if not has_tf1_layers():
        pytest.skip("needs tensorflow and tf-keras")
    out = tmp_path_factory.mktemp("tf1")
    _write(TF1_SCRIPT, out, {"TF_USE_LEGACY_KERAS": "1"})
    return out


@pytest.fixture(scope="module")
def keras_artifacts(tmp_path_factory) -> Path:
    pytest.importorskip("keras")
    pytest.importorskip("h5py")
    out = tmp_path_factory.mktemp("keras")
    _write(KERAS_SCRIPT, out, {})
    return out


def test_tf1_checkpoints(tf1_artifacts):
    found = _inspect_json(tf1_artifacts)
    assert found == {
        ("model.ckpt-3", "BN201"): ["bn1"],   # no_update_ops: the statistics never moved
        ("model.ckpt-3", "BN205"): ["bn1"],   # ema: shadows of the moving statistics
    }
    from bnfix.artifacts.inspect import inspect_paths

    result = inspect_paths([str(tf1_artifacts / "no_update_ops")])
    (artifact,) = result.artifacts
    assert artifact.kind == "tf-checkpoint" and artifact.trained_evidence == "global_step = 3"
    assert [(f.code, f.layer) for f in result.findings] == [("BN201", "bn1")]
    assert "moving_mean is all 0 and moving_variance all 1" in result.findings[0].message
    assert "BN003" in result.findings[0].message
    ema = inspect_paths([str(tf1_artifacts / "ema" / "model.ckpt-3.index")])
    assert sorted(ema.artifacts[0].layers[0].keys) == ["beta", "gamma", "mean", "mean_shadow",
                                                       "var", "var_shadow"]
    assert inspect_paths([str(tf1_artifacts / "healthy")]).findings == []


def test_tf2_object_checkpoint(tf1_artifacts):
    from bnfix.artifacts.inspect import inspect_paths

    result = inspect_paths([str(tf1_artifacts / "tf2")])
    (artifact,) = result.artifacts
    assert artifact.kind == "tf2-checkpoint" and artifact.trained is True
    assert [layer.name for layer in artifact.layers] == ["bn"]
    assert artifact.trained_evidence == "optimizer/_iterations = 2"
    assert result.findings == []


def test_keras_files(keras_artifacts):
    found = _inspect_json(keras_artifacts)
    assert found == {
        ("frozen.keras", "BN201"): ["bn1"],
        ("frozen.keras", "BN202"): ["bn1"],
        ("frozen.h5", "BN201"): ["bn1"],
        ("frozen.h5", "BN202"): ["bn1"],
    }
    from bnfix.artifacts.inspect import inspect_paths

    result = inspect_paths([str(keras_artifacts / "healthy.keras"),
                            str(keras_artifacts / "healthy.h5"),
                            str(keras_artifacts / "untrained.keras")])
    keras_file, h5, untrained = result.artifacts
    assert [(layer.name, layer.channels) for layer in keras_file.layers] == [("bn1", 4),
                                                                             ("head_bn", 3)]
    assert keras_file.layers[1].beta is None  # center=False
    assert [layer.name for layer in h5.layers] == ["bn1", "head/head_bn"]
    assert keras_file.trained_evidence == "optimizer iterations = 2" == h5.trained_evidence
    assert h5.layers[0].var.tolist() == pytest.approx(keras_file.layers[0].var.tolist())
    assert untrained.trained is False and untrained.trained_evidence == "optimizer iterations = 0"
