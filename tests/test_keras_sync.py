"""bnfix.keras: BatchNormalization ↔ synchronized BN on real Keras 3 models (weights, sharing,
nesting, subclassed models, refusals), `bnfix convert` on .keras files, and the proof that the
converted model under MirroredStrategy on two logical CPU devices trains like BN on the global
batch (tests/programs/keras_mirrored_proof.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, run_bnfix

keras = pytest.importorskip("keras")

from bnfix.keras import ConversionRefused, ConversionReport, convert_sync, revert_sync
from bnfix.keras.convert import layer_paths

pytestmark = pytest.mark.tf
QUIET = {"TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}


def randomize(model: keras.Model) -> keras.Model:
    """Distinct weights everywhere (moving variance kept positive), so a lost copy shows."""
    rng = np.random.default_rng(1)
    model.set_weights([rng.uniform(0.5, 1.5, w.shape).astype(w.dtype)
                       for w in model.get_weights()])
    return model


def functional_model() -> keras.Model:
    block = keras.Sequential([keras.layers.Dense(4, name="dense"),
                              keras.layers.BatchNormalization(name="inner_bn")], name="block")
    shared = keras.layers.BatchNormalization(name="shared_bn")
    inputs = keras.Input((3,))
    h = shared(block(inputs))
    h = shared(keras.layers.Dense(4, name="middle")(h))
    return randomize(keras.Model(inputs, keras.layers.Dense(2, name="head")(h)))


def converted(convert, model):  # type: ignore[no-untyped-def]
    """(model, report) of one conversion through the `report=` argument."""
    report = ConversionReport()
    return convert(model, report=report), report


def bn_layers(model: keras.Model) -> dict[str, keras.layers.BatchNormalization]:
    return {p: layer for p, layer in layer_paths(model).items()
            if isinstance(layer, keras.layers.BatchNormalization)}


def assert_same_weights(a: keras.Model, b: keras.Model) -> None:
    paths_a, paths_b = layer_paths(a), layer_paths(b)
    assert paths_a.keys() == paths_b.keys()
    for path, layer in paths_a.items():
        for wa, wb in zip(layer.get_weights(), paths_b[path].get_weights(), strict=True):
            np.testing.assert_array_equal(wa, wb, err_msg=path)


def test_functional_model_round_trip_keeps_weights_nesting_and_sharing():
    model = functional_model()
    synced, report = converted(convert_sync, model)
    assert synced is not model and not report.in_place
    assert {p: bn.synchronized for p, bn in bn_layers(synced).items()} == {
        "block/inner_bn": True, "shared_bn": True}
    assert all(not bn.synchronized for bn in bn_layers(model).values())  # original untouched
    assert [(c.path, c.before, c.after, c.via) for c in report.converted] == [
        ("block/inner_bn", False, True, "config"), ("shared_bn", False, True, "config")]
    assert_same_weights(model, synced)
    # the shared layer is one layer in the clone, called twice
    shared = [layer for layer in synced.layers if layer.name == "shared_bn"]
    assert len(shared) == 1 and len(shared[0]._inbound_nodes) == 2
    x = np.random.default_rng(2).normal(size=(5, 3)).astype("float32")
    np.testing.assert_array_equal(model(x, training=False), synced(x, training=False))

    plain, back = converted(revert_sync, synced)
    assert all(not bn.synchronized for bn in bn_layers(plain).values())
    assert [(c.before, c.after) for c in back.converted] == [(True, False)] * 2
    assert_same_weights(model, plain)
    assert type(plain.get_layer("block")) is keras.Sequential


def test_sequential_model_and_compile_state():
    model = randomize(keras.Sequential([keras.Input((3,)), keras.layers.Dense(4),
                                        keras.layers.BatchNormalization(name="bn")]))
    model.compile(optimizer="sgd", loss="mse")
    synced, report = converted(convert_sync, model)
    assert isinstance(synced, keras.Sequential)
    assert synced.get_layer("bn").synchronized
    assert synced.compiled and synced.loss == "mse"
    assert any("the optimizer had no state yet" in note for note in report.notes)
    assert_same_weights(model, synced)


def test_returns_the_model_as_a_drop_in():
    """`model = convert_sync(model)`: the model comes back, not a tuple; the report is filled
    through `report=` and collects several calls."""
    model = functional_model()
    synced = convert_sync(model)
    assert isinstance(synced, keras.Model) and synced is not model
    report = ConversionReport()
    plain = revert_sync(convert_sync(model, report=report), report=report)
    assert isinstance(plain, keras.Model)
    assert [(c.before, c.after) for c in report.converted] == [(False, True)] * 2 + \
        [(True, False)] * 2
    subclassed = Subclassed()
    subclassed(np.ones((2, 3), "float32"))
    assert convert_sync(subclassed) is subclassed and subclassed.bn.synchronized


def test_optimizer_state_is_carried_to_the_clone():
    """A trained, compiled model: the clone's optimizer holds the same iteration count and
    momenta, each slot on the clone of its variable."""
    model = functional_model()
    model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9), loss="mse")
    rng = np.random.default_rng(0)
    model.fit(rng.normal(size=(8, 3)), rng.normal(size=(8, 2)), batch_size=4, epochs=2,
              verbose=0)
    synced, report = converted(convert_sync, model)
    assert int(synced.optimizer.iterations.numpy()) == 4
    assert any("optimizer state carried over" in note and "iterations = 4" in note
               for note in report.notes)
    for a, b in zip(model.optimizer.variables, synced.optimizer.variables, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    momenta = [v for v in synced.optimizer.variables if "momentum" in v.path]
    assert momenta and any(np.any(v.numpy() != 0) for v in momenta)


def ops_model() -> keras.Model:
    """A functional graph with `keras.ops` nodes (Operations, not Layers), like
    keras.applications.MobileNetV3Small's hard-swish."""
    inputs = keras.Input((4, 4, 3))
    h = keras.layers.Conv2D(4, 3, padding="same", name="conv")(inputs)
    h = keras.layers.BatchNormalization(name="bn")(h)
    h = keras.ops.multiply(h, keras.ops.relu6(keras.ops.add(h, 3.0)) / 6.0)
    return randomize(keras.Model(inputs, keras.layers.GlobalAveragePooling2D()(h)))


@pytest.mark.parametrize("build", [
    ops_model,
    lambda: keras.applications.MobileNetV3Small(weights=None, input_shape=(32, 32, 3),
                                                classes=4),
], ids=["keras-ops", "MobileNetV3Small"])
def test_functional_models_with_keras_ops_nodes_convert_exactly(build):
    model = build()
    synced, report = converted(convert_sync, model)
    assert report.converted and not report.refused
    assert all(bn.synchronized for bn in bn_layers(synced).values())
    x = np.random.default_rng(3).normal(size=(2, *model.input_shape[1:])).astype("float32")
    np.testing.assert_array_equal(model(x, training=False), synced(x, training=False))
    plain = revert_sync(synced)
    assert not any(bn.synchronized for bn in bn_layers(plain).values())
    np.testing.assert_array_equal(model(x, training=False), plain(x, training=False))


def test_subclassed_model_built_outside_the_strategy_scope_is_refused():
    import tensorflow as tf

    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    outside = Subclassed()
    outside(np.ones((2, 3), "float32"))
    with strategy.scope(), pytest.raises(ConversionRefused,
                                         match="built outside this tf.distribute strategy"):
        convert_sync(outside)
    assert not outside.bn.synchronized  # refused before anything changed
    with strategy.scope():
        inside = Subclassed()
        inside(np.ones((2, 3), "float32"))
        assert convert_sync(inside) is inside and inside.bn.synchronized
        functional = convert_sync(functional_model())  # a clone: rebuilt under the scope
    assert all(bn.synchronized for bn in bn_layers(functional).values())


def test_already_synchronized_layers_are_reported_unchanged():
    synced, _ = converted(convert_sync, functional_model())
    _, report = converted(convert_sync, synced)
    assert report.converted == [] and report.unchanged == ["block/inner_bn", "shared_bn"]
    assert "0 of 2 BatchNormalization layers" in report.table()


class Subclassed(keras.Model):
    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(4)
        self.bn = keras.layers.BatchNormalization()

    def call(self, x, training=False):
        return self.bn(self.dense(x), training=training)


def test_subclassed_model_is_converted_in_place_and_retraces():
    model = Subclassed()
    x = np.ones((2, 3), "float32")
    model.compile(loss="mse")
    model.predict(x, verbose=0)
    assert model.predict_function is not None
    same, report = converted(convert_sync, model)
    assert same is model and report.in_place
    assert model.bn.synchronized
    assert [(c.path, c.before, c.after, c.via) for c in report.converted] == [
        (model.bn.name, False, True, "attribute")]
    assert model.predict_function is None  # the traced function saw the old flag
    revert_sync(model)
    assert not model.bn.synchronized


class OwnMoments(keras.layers.BatchNormalization):
    def _moments(self, inputs, mask):
        return super()._moments(inputs, mask)


def test_bn_subclass_overriding_moments_is_refused():
    inputs = keras.Input((3,))
    model = keras.Model(inputs, OwnMoments(name="own")(keras.layers.BatchNormalization(
        name="plain")(inputs)))
    synced, report = converted(convert_sync, model)
    assert [r.path for r in report.refused] == ["own"]
    assert "overrides _moments()" in report.refused[0].reason
    assert not synced.get_layer("own").synchronized and synced.get_layer("plain").synchronized
    assert "1 refused" in report.table()


def test_non_keras3_models_are_refused():
    with pytest.raises(ConversionRefused, match="not a Keras 3 model"):
        convert_sync(object())


# -- the command line ------------------------------------------------------------------------


@pytest.mark.slow
def test_cli_converts_a_keras_file(tmp_path: Path):
    """A trained, compiled model: the converted file keeps the optimizer state (the iteration
    count `bnfix inspect` reads as the evidence of training), and no TF log line is printed."""
    model = functional_model()
    model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9), loss="mse")
    rng = np.random.default_rng(0)
    model.fit(rng.normal(size=(8, 3)), rng.normal(size=(8, 2)), batch_size=4, epochs=1,
              verbose=0)
    model.save(tmp_path / "m.keras")
    run = run_bnfix("convert", "m.keras", "--to", "sync", "-o", "out.keras", cwd=tmp_path,
                    env=QUIET, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stderr == ""
    assert "block/inner_bn" in run.stdout and "2 of 2 BatchNormalization layers" in run.stdout
    assert "max abs error 0" in run.stdout
    assert "optimizer state carried over" in run.stdout and "iterations = 2" in run.stdout
    written = keras.saving.load_model(tmp_path / "out.keras")
    assert all(bn.synchronized for bn in bn_layers(written).values())
    assert_same_weights(keras.saving.load_model(tmp_path / "m.keras"), written)
    assert int(written.optimizer.iterations.numpy()) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.keras", "out.keras"]
    inspected = run_bnfix("inspect", "out.keras", cwd=tmp_path, env=QUIET)
    assert "trained: optimizer iterations = 2" in inspected.stdout


@pytest.mark.slow
@pytest.mark.parametrize(("content", "message"), [
    (b"PK\x03\x04 truncated", "not a .keras file"),
    (None, "no BatchNormalization layer in the model"),
])
def test_cli_refuses_with_one_line_and_writes_nothing(tmp_path: Path, content, message):
    model = tmp_path / "m.keras"
    if content is None:
        inputs = keras.Input((3,))
        keras.Model(inputs, keras.layers.Dense(2)(inputs)).save(model)
    else:
        model.write_bytes(content)
    run = run_bnfix("convert", "m.keras", "--to", "sync", "-o", "out.keras", cwd=tmp_path,
                    env=QUIET, timeout=300)
    assert run.returncode == 1
    errors = [line for line in run.stderr.splitlines() if line.startswith("bnfix:")]
    assert len(errors) == 1 and message in errors[0], run.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.keras"]


# -- the proof -------------------------------------------------------------------------------


@pytest.mark.slow
def test_converted_model_under_mirrored_strategy_trains_like_global_batch_bn():
    env = {**os.environ, **QUIET, "PYTHONPATH": str(REPO)}
    run = subprocess.run([sys.executable, str(REPO / "tests" / "programs" /
                                              "keras_mirrored_proof.py")],
                         capture_output=True, text=True, env=env, timeout=600, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    proof = json.loads(run.stdout)
    assert proof["converted"] == ["bn1", "block/bn2"]
    synced, unsynced = proof["synced"], proof["unsynced"]
    assert synced["outputs"] < 2e-6 and synced["weights"] < 1e-6
    assert synced["grads"] < 1e-6 * proof["grads_scale"]
    assert synced["moving_stats"] < 1e-6 and synced["replica_drift"] == 0.0
    assert proof["stats_moved"] > 0.1  # the statistics did move: equal is not trivially equal
    # without the conversion: per-replica statistics, and the replicas' moving stats drift apart
    assert unsynced["outputs"] > 0.1 and unsynced["grads"] > 0.1 * proof["grads_scale"]
    assert unsynced["replica_drift"] > 0.1
