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


    def tf1_checkpoint(name, update_ops, ema=False, meta=False, trainable=True):
        with tf.Graph().as_default():
            x = tf1.placeholder(tf.float32, [None, 3])
            step = tf1.train.get_or_create_global_step()
            h = tf1.layers.dense(x, 2, use_bias=False, name="fc")
            h = tf1.layers.batch_normalization(h, training=True, name="bn1",
                                               trainable=trainable)
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
                           write_meta_graph=meta)


    tf1_checkpoint("healthy", update_ops=True)
    tf1_checkpoint("no_update_ops", update_ops=False)
    tf1_checkpoint("ema", update_ops=True, ema=True)
    # what tf.train.Saver writes by default: the checkpoint and its .meta graph
    tf1_checkpoint("with_meta", update_ops=False, meta=True)
    tf1_checkpoint("frozen_with_meta", update_ops=True, meta=True, trainable=False)
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

    # Keras 3 weights files and a subclassed model (its config lists no layers)
    build(False).save_weights(f"{out}/functional.weights.h5")

    @keras.saving.register_keras_serializable()
    class Sub(keras.Model):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.dense = keras.layers.Dense(4)
            self.norm = keras.layers.BatchNormalization(name="norm")
            self.head = keras.layers.Dense(2)

        def call(self, x, training=False):
            return self.head(self.norm(self.dense(x), training=training))

    sub = Sub()
    sub.compile(optimizer="sgd", loss="mse")
    sub.norm.trainable = False  # frozen: inference mode, gamma/beta and stats stay at init
    rng = np.random.default_rng(0)
    sub.fit(rng.normal(size=(16, 3)), rng.normal(size=(16, 2)), batch_size=8, verbose=0)
    sub.save(f"{out}/subclassed.keras")
    sub.save_weights(f"{out}/subclassed.weights.h5")
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
        # a checkpoint with its .meta: one artifact (the graph, read with the checkpoint's
        # values), each finding once; frozen_with_meta's and with_meta's findings together
        ("model.ckpt-3.meta", "BN201"): ["bn1", "bn1"],
        ("model.ckpt-3.meta", "BN202"): ["bn1"],
        ("model.ckpt-3.meta", "BN203"): ["bn1", "bn1"],
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


def test_checkpoint_with_meta_is_one_artifact_and_bn203_names_the_cause(tf1_artifacts):
    """A Saver's folder (checkpoint + .meta) is one artifact; BN203's advice follows the
    evidence: update ops outside the train op's dependencies are BN003, a BN whose gamma/beta
    are not trainable publishes none to UPDATE_OPS (BN001). No TF/absl log line leaks."""
    run = run_bnfix("inspect", "--output-format", "concise", "with_meta", "frozen_with_meta",
                    cwd=tf1_artifacts, timeout=300)
    assert run.returncode == 1, run.stderr
    assert run.stderr == ""
    lines = run.stdout.strip().splitlines()[:-1]  # the summary line last
    assert all(line.split(":1:1: ")[0].endswith("model.ckpt-3.meta") for line in lines), lines
    codes = [(line.split("/")[0], line.split(": ")[1].split()[0]) for line in lines]
    assert sorted(codes) == [("frozen_with_meta", "BN201"), ("frozen_with_meta", "BN202"),
                             ("frozen_with_meta", "BN203"), ("with_meta", "BN201"),
                             ("with_meta", "BN203")], lines
    bn203 = {line.split("/")[0]: line for line in lines if " BN203 " in line}
    assert "(BN003)" in bn203["with_meta"] and "BN001" not in bn203["with_meta"]
    assert "built with trainable=False" in bn203["frozen_with_meta"]
    assert "(BN001)" in bn203["frozen_with_meta"]
    full = run_bnfix("inspect", "with_meta", cwd=tf1_artifacts, timeout=300)
    assert "values from the checkpoint model.ckpt-3" in full.stdout
    for noise in ("absl", "oneDNN", "InitializeLog", "cpu_feature_guard", "I0000"):
        assert noise not in full.stdout + full.stderr


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
        ("subclassed.keras", "BN201"): ["norm"],
        ("subclassed.keras", "BN202"): ["norm"],
        ("subclassed.weights.h5", "BN201"): ["norm"],
        ("subclassed.weights.h5", "BN202"): ["norm"],
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


def test_keras3_weights_files_and_subclassed_models(keras_artifacts):
    """Keras 3 `.weights.h5` (no legacy `weight_names`) and a subclassed `.keras` (its config
    lists no layers): BN found by the stored layout."""
    from bnfix.artifacts.inspect import inspect_paths

    result = inspect_paths([str(keras_artifacts / name) for name in (
        "functional.weights.h5", "subclassed.keras", "subclassed.weights.h5")])
    assert not [f for f in result.findings if f.code == "BN902"], result.findings
    weights, sub_keras, sub_weights = result.artifacts
    assert weights.kind == "keras-weights-h5"
    assert [(layer.name, layer.channels) for layer in weights.layers] == [("bn1", 4),
                                                                          ("head_bn", 3)]
    assert weights.layers[1].beta is None and weights.layers[1].gamma is None  # 3 vars
    for artifact in (sub_keras, sub_weights):
        assert [layer.name for layer in artifact.layers] == ["norm"]
        assert artifact.trained_evidence == "optimizer iterations = 2"
    flagged = sorted((Path(f.path).name, f.code) for f in result.findings)
    assert flagged == [("subclassed.keras", "BN201"), ("subclassed.keras", "BN202"),
                       ("subclassed.weights.h5", "BN201"), ("subclassed.weights.h5", "BN202")]
