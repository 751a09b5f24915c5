"""Proof run for bnfix.tf1.sync_towers (run by tests/test_tf1_sync.py in a subprocess).

For each BN entry point (tf.compat.v1.layers, fused_batch_norm, bnfix.tf1.batch_norm) it builds a
two-BN network as two towers on two logical CPU devices inside `sync_towers(2)`, takes each
tower's gradients inside the tower loop and averages them, runs one step with the update ops,
and compares with the same network on one device fed the concatenated batch; then the same
towers without the context (the gap sync closes). Also the patch lifetime and the errors.
Prints one JSON object.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf

import bnfix.tf1

V1 = tf.compat.v1
TOWERS = 2
BATCH, SIZE, CHANNELS, HIDDEN = 4, 3, 3, 4
MOMENTUM, EPSILON = 0.9, 1e-3
rng = np.random.default_rng(0)
DATA = [rng.normal(size=(BATCH, SIZE, SIZE, CHANNELS)).astype(np.float32) + 2.0 * i
        for i in range(TOWERS)]
TARGET = [rng.normal(size=(BATCH, SIZE, SIZE, HIDDEN)).astype(np.float32) for _ in range(TOWERS)]
KERNEL = rng.normal(size=(1, 1, CHANNELS, HIDDEN)).astype(np.float32)
GAMMA = {"bn1": 1.0 + 0.1 * np.arange(CHANNELS, dtype=np.float32),
         "bn2": 1.0 + 0.1 * np.arange(HIDDEN, dtype=np.float32)}
BETA = {name: 0.05 * np.ones_like(g) for name, g in GAMMA.items()}


def layers_bn(x, name):
    return V1.layers.batch_normalization(
        x, momentum=MOMENTUM, epsilon=EPSILON, training=True, name=name, reuse=V1.AUTO_REUSE,
        gamma_initializer=V1.constant_initializer(GAMMA[name]),
        beta_initializer=V1.constant_initializer(BETA[name]))


def fused_bn(x, name):
    """A hand-written BN around fused_batch_norm, as TF1 repositories have them."""
    with V1.variable_scope(name, reuse=V1.AUTO_REUSE):
        channels = x.shape[-1]
        gamma = V1.get_variable("gamma", [channels], initializer=V1.constant_initializer(GAMMA[name]))
        beta = V1.get_variable("beta", [channels], initializer=V1.constant_initializer(BETA[name]))
        mean = V1.get_variable("moving_mean", [channels], initializer=V1.zeros_initializer(),
                               trainable=False)
        variance = V1.get_variable("moving_variance", [channels],
                                   initializer=V1.ones_initializer(), trainable=False)
        y, batch_mean, batch_variance = V1.nn.fused_batch_norm(x, gamma, beta, epsilon=EPSILON,
                                                               is_training=True)
        for moving, value in ((mean, batch_mean), (variance, batch_variance)):
            V1.add_to_collection(V1.GraphKeys.UPDATE_OPS, V1.assign_sub(
                moving, (moving - value) * (1 - MOMENTUM)).op)
        return y


def bnfix_bn(x, name):
    return bnfix.tf1.batch_norm(x, True, momentum=MOMENTUM, epsilon=EPSILON, name=name,
                                reuse=V1.AUTO_REUSE)


ENTRY_POINTS = {"layers": layers_bn, "fused": fused_bn, "bnfix": bnfix_bn}


def net(x, bn):
    with V1.variable_scope("net", reuse=V1.AUTO_REUSE):
        h = bn(x, "bn1")
        kernel = V1.get_variable("kernel", initializer=KERNEL)
        h = tf.nn.relu(tf.nn.conv2d(h, kernel, [1, 1, 1, 1], "SAME"))
        return bn(h, "bn2")


def session(graph):
    config = V1.ConfigProto(device_count={"CPU": TOWERS}, inter_op_parallelism_threads=2,
                            intra_op_parallelism_threads=1)
    return V1.Session(graph=graph, config=config)


def moving_stats():
    return {v.op.name: v for v in V1.global_variables() if "moving_" in v.op.name}


def towers(bn, sync: bool, grads_after_loop: bool = False):
    """Outputs, averaged parameter gradients, input gradients and moving stats after one step.
    Gradients are taken per tower inside the loop, or once after it on the mean loss."""
    graph = tf.Graph()
    with graph.as_default():
        outputs, grads, input_grads, scopes, losses, inputs = [], [], [], [], [], []
        with bnfix.tf1.sync_towers(TOWERS) if sync else contextlib.nullcontext():
            for i in range(TOWERS):
                with tf.device(f"/cpu:{i}"), tf.name_scope(f"tower_{i}") as scope:
                    x = tf.constant(DATA[i])
                    y = net(x, bn)
                    loss = tf.reduce_mean(y * TARGET[i])
                    params = V1.trainable_variables()
                    if not grads_after_loop:
                        tower_grads = tf.gradients(loss, params + [x])
                        grads.append(tower_grads[:-1])
                        input_grads.append(tower_grads[-1])
                    outputs.append(y)
                    scopes.append(scope)
                    losses.append(loss)
                    inputs.append(x)
        if grads_after_loop:
            all_grads = tf.gradients(tf.add_n(losses) / TOWERS, params + inputs)
            mean_grads, input_grads = all_grads[:len(params)], all_grads[len(params):]
        else:
            mean_grads = [tf.add_n(g) / TOWERS for g in zip(*grads)]
            # every tower's loss is a mean over its batch: the big batch's gradient is their mean
            input_grads = [g / TOWERS for g in input_grads]
        updates = V1.get_collection(V1.GraphKeys.UPDATE_OPS, scopes[-1])
        all_updates = V1.get_collection(V1.GraphKeys.UPDATE_OPS)
        stats = moving_stats()
        with session(graph) as sess:
            sess.run(V1.global_variables_initializer())
            out, g, gx, _ = sess.run([tf.concat(outputs, 0), mean_grads,
                                      tf.concat(input_grads, 0), updates])
            moved = sess.run(stats)
        names = [v.op.name for v in params]
        return {"output": out, "grads": dict(zip(names, g)), "input_grad": gx, "stats": moved,
                "updates": len(updates), "all_updates": len(all_updates)}


def big_batch(bn):
    graph = tf.Graph()
    with graph.as_default():
        x = tf.constant(np.concatenate(DATA))
        y = net(x, bn)
        loss = tf.reduce_mean(y * np.concatenate(TARGET))
        params = V1.trainable_variables()
        grads = tf.gradients(loss, params + [x])
        updates = V1.get_collection(V1.GraphKeys.UPDATE_OPS)
        stats = moving_stats()
        with session(graph) as sess:
            sess.run(V1.global_variables_initializer())
            out, g, _ = sess.run([y, grads, updates])
            moved = sess.run(stats)
        return {"output": out, "grads": dict(zip([v.op.name for v in params], g[:-1])),
                "input_grad": g[-1], "stats": moved}


def max_err(a, b) -> float:
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


def compare(run, ref) -> dict:
    return {"output": max_err(run["output"], ref["output"]),
            "output_scale": float(np.max(np.abs(ref["output"]))),
            "input_grad": max_err(run["input_grad"], ref["input_grad"]),
            "grads": max(max_err(run["grads"][k], ref["grads"][k]) for k in ref["grads"]),
            "grads_scale": max(float(np.max(np.abs(v))) for v in ref["grads"].values()),
            "stats": max(max_err(run["stats"][k], ref["stats"][k]) for k in ref["stats"]),
            "stats_moved": max(max_err(v, 0.0 if "mean" in k else 1.0)
                               for k, v in ref["stats"].items())}


def lifetime_checks() -> dict:
    nn, layer_cls = V1.nn, __import__(
        "tf_keras.src.legacy_tf_layers.normalization", fromlist=["x"]).BatchNormalization
    original = (nn.fused_batch_norm, layer_cls.call)
    result = {}
    with tf.Graph().as_default(), bnfix.tf1.sync_towers(2):
        result["patched_inside"] = (nn.fused_batch_norm is not original[0]
                                    and layer_cls.call is not original[1])
    result["restored_after"] = (nn.fused_batch_norm, layer_cls.call) == original
    try:
        with tf.Graph().as_default(), bnfix.tf1.sync_towers(2):
            raise KeyError("boom")
    except KeyError:
        result["restored_after_exception"] = (nn.fused_batch_norm, layer_cls.call) == original
    errors = {}
    with tf.Graph().as_default():
        try:
            with bnfix.tf1.sync_towers(2):
                bnfix_bn(tf.zeros([2, 3]), "outside")
        except bnfix.tf1.TowerError as exc:
            errors["outside_tower"] = str(exc)
    with tf.Graph().as_default():
        try:
            with bnfix.tf1.sync_towers(2):
                for i, names in enumerate((("a", "b"), ("b", "a"))):
                    with tf.device(f"/cpu:{i}"):
                        for name in names:
                            bnfix_bn(tf.zeros([2, 3]), name)
        except bnfix.tf1.TowerError as exc:
            errors["order"] = str(exc)
    with tf.Graph().as_default():
        try:
            with bnfix.tf1.sync_towers(2), tf.device("/cpu:0"):
                bnfix_bn(tf.zeros([2, 3]), "one")
        except bnfix.tf1.TowerError as exc:
            errors["missing_tower"] = str(exc)
    result["errors"] = errors
    result["restored_after_errors"] = (nn.fused_batch_norm, layer_cls.call) == original
    return result


def main() -> None:
    report = {}
    for name, bn in ENTRY_POINTS.items():
        start = time.perf_counter()
        ref = big_batch(bn)
        synced = towers(bn, sync=True)
        plain = towers(bn, sync=False)
        report[name] = {"synced": compare(synced, ref), "unsynced": compare(plain, ref),
                        "updates_in_last_tower": synced["updates"],
                        "updates_total": synced["all_updates"],
                        "seconds": round(time.perf_counter() - start, 2)}
    ref = big_batch(bnfix_bn)
    report["bnfix_grads_after_loop"] = {"synced": compare(towers(bnfix_bn, True, True), ref)}
    report["lifetime"] = lifetime_checks()
    json.dump(report, sys.stdout, indent=1)


if __name__ == "__main__":
    main()
