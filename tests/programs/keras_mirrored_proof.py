"""Proof run for bnfix.keras.convert_sync (run by tests/test_keras_sync.py in a subprocess).

One model, three copies with the same weights: plain BN on one device fed the global batch (the
reference), the converted model (synchronized=True) and the unconverted one under
MirroredStrategy on two logical CPU devices. Three custom-training-loop steps with
`strategy.run`, losses scaled by the global batch size, gradients sum-reduced by the optimizer.
Prints one JSON object of max abs errors against the reference.
"""

from __future__ import annotations

import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf

CPU = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(CPU, [tf.config.LogicalDeviceConfiguration()] * 2)

import keras
import numpy as np

from bnfix.keras import ConversionReport, convert_sync

REPLICAS, PER_REPLICA, FEATURES, STEPS = 2, 4, 6, 3
GLOBAL_BATCH = REPLICAS * PER_REPLICA
rng = np.random.default_rng(0)
X = rng.normal(size=(GLOBAL_BATCH, FEATURES)).astype(np.float32)
X[PER_REPLICA:] += 2.0  # the replicas see differently distributed shards
Y = rng.normal(size=(GLOBAL_BATCH, 1)).astype(np.float32)


def build() -> keras.Model:
    keras.utils.set_random_seed(0)
    inputs = keras.Input((FEATURES,))
    h = keras.layers.Dense(8, name="dense1")(inputs)
    h = keras.layers.BatchNormalization(momentum=0.9, name="bn1")(h)
    h = keras.layers.Activation("relu")(h)
    h = keras.Sequential([keras.layers.Dense(4, name="dense2"),
                          keras.layers.BatchNormalization(momentum=0.9, name="bn2")],
                         name="block")(h)
    return keras.Model(inputs, keras.layers.Dense(1, name="head")(h))


def per_example_loss(model, x, y):
    out = model(x, training=True)
    return out, tf.reduce_sum(tf.square(out - y), axis=1)


def train_reference(model) -> dict:
    optimizer = keras.optimizers.SGD(0.1)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            out, per_example = per_example_loss(model, x, y)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=GLOBAL_BATCH)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return out, grads

    outs, grads = [], []
    for _ in range(STEPS):
        out, g = step(X, Y)
        outs.append(out.numpy())
        grads.append([v.numpy() for v in g])
    return {"outputs": outs, "grads": grads, "weights": model.get_weights()}


def train_replicated(strategy, model) -> dict:
    optimizer = keras.optimizers.SGD(0.1)
    with strategy.scope():
        optimizer.build(model.trainable_variables)

    def shard(ctx, data):
        start = ctx.replica_id_in_sync_group * PER_REPLICA
        return data[start:start + PER_REPLICA]

    x = strategy.experimental_distribute_values_from_function(lambda ctx: shard(ctx, X))
    y = strategy.experimental_distribute_values_from_function(lambda ctx: shard(ctx, Y))

    @tf.function
    def step(x, y):
        def replica(x, y):
            with tf.GradientTape() as tape:
                out, per_example = per_example_loss(model, x, y)
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=GLOBAL_BATCH)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return out, grads

        return strategy.run(replica, args=(x, y))

    outs, grads = [], []
    for _ in range(STEPS):
        out, g = step(x, y)
        outs.append(np.concatenate([t.numpy() for t in strategy.experimental_local_results(out)]))
        grads.append([sum(t.numpy() for t in strategy.experimental_local_results(v)) for v in g])
    moving = [v for v in model.weights if "moving" in v.path]
    local = [[t.numpy() for t in strategy.experimental_local_results(v.value)] for v in moving]
    drift = max(float(np.max(np.abs(first - second))) for first, second in local)
    return {"outputs": outs, "grads": grads, "weights": model.get_weights(),
            "replica_drift": drift}


def max_err(a, b) -> float:
    return max(float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64))))
               for x, y in zip(a, b, strict=True))


def compare(run: dict, ref: dict, moving: list[bool]) -> dict:
    stats = [w for w, m in zip(run["weights"], moving, strict=True) if m]
    ref_stats = [w for w, m in zip(ref["weights"], moving, strict=True) if m]
    return {"outputs": max(max_err([o], [r]) for o, r in zip(run["outputs"], ref["outputs"],
                                                               strict=True)),
            "grads": max(max_err(g, r) for g, r in zip(run["grads"], ref["grads"], strict=True)),
            "weights": max_err(run["weights"], ref["weights"]),
            "moving_stats": max_err(stats, ref_stats),
            "replica_drift": run["replica_drift"]}


def main() -> None:
    start = time.perf_counter()
    base = build()
    weights = base.get_weights()
    moving = ["moving" in v.path for v in base.weights]
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        report = ConversionReport()
        synced = convert_sync(base, report=report)
        unsynced = build()
        unsynced.set_weights(weights)
    reference = build()
    reference.set_weights(weights)
    ref = train_reference(reference)
    result = {"converted": [c.path for c in report.converted],
              "synced": compare(train_replicated(strategy, synced), ref, moving),
              "unsynced": compare(train_replicated(strategy, unsynced), ref, moving),
              "grads_scale": max(float(np.max(np.abs(g))) for g in ref["grads"][0]),
              "stats_moved": max_err([w for w, m in zip(ref["weights"], moving, strict=True) if m],
                                     [w for w, m in zip(weights, moving, strict=True) if m]),
              "seconds": round(time.perf_counter() - start, 2)}
    json.dump(result, sys.stdout, indent=1)


if __name__ == "__main__":
    main()
