"""The TF1 run of `bnfix validate tf1`, in a fresh process: `python -m bnfix.validate.tf1_worker
DIR` (TF_USE_LEGACY_KERAS must be set before TensorFlow is imported, for tf.compat.v1.layers).

Three graphs from the user's `BUILD(inputs, is_training)`, each under
`variable_scope("model", reuse=AUTO_REUSE)` (towers share their variables, as tower code does):
the reference (one device, the global batch), N towers inside `bnfix.tf1.sync_towers(N)`, and
the same towers without it. Tower i sits on /cpu:i (`ConfigProto(device_count={"CPU": N})`) or
/gpu:i when there are N GPUs. All three start from the reference's initial values, copied by
variable name. Each tower's loss is sum(per-example loss) / GB and the towers' gradients are
ADDED (not averaged), which is the global batch's gradient for any shard sizes; the moving
statistics are updated by the last tower's UPDATE_OPS (what `bnfix fix` writes for BN002; under
sync_towers that tower holds each layer's one update). TF1 towers share ONE set of variables, so
there is no per-replica drift to show: the unsynced gap is in the last tower's statistics.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np

from bnfix.validate import data, worker_io
from bnfix.validate.comparison import (
    MODEL,
    Fidelity,
    Key,
    Trace,
    Validation,
    compare,
    output_error,
)
from bnfix.validate.errors import RunFailed, ValidateUsageError
from bnfix.validate.loading import call_user, load_callable

SCOPE = "model"


def _key(variable: Any, suffix: str = "") -> Key:
    name = variable.op.name
    if name.startswith(SCOPE + "/"):
        name = name[len(SCOPE) + 1:]
    layer, _, leaf = name.rpartition("/")
    return layer or "(root)", leaf + suffix


class Tf1Run:
    def __init__(self, job: dict[str, Any], tf: Any, build: Callable[..., Any],
                 towers: int, devices: list[str]) -> None:
        self.job, self.tf, self.v1, self.build = job, tf, tf.compat.v1, build
        self.towers, self.devices = towers, devices
        self.shape = tuple(job["input_shape"])
        self.parts = data.shards(self.shape[0], towers)
        self.out_shape: tuple[int, ...] = ()
        self.synced_layers = 0  # BN layers sync_towers paired across the towers

    def session(self, graph: Any) -> Any:
        config = self.v1.ConfigProto(device_count={"CPU": self.towers},
                                     inter_op_parallelism_threads=2,
                                     intra_op_parallelism_threads=1)
        return self.v1.Session(graph=graph, config=config)

    def model(self, x: Any, training: bool) -> Any:
        with self.v1.variable_scope(SCOPE, reuse=self.v1.AUTO_REUSE):
            out = call_user(self.job["factory"], self.build, x, training)
        if not isinstance(out, self.tf.Tensor) or not out.shape.is_fully_defined():
            raise ValidateUsageError(f"{self.job['factory']} must return one tensor of fully "
                                     "known shape (the outputs or logits)")
        return out

    def check_output(self) -> None:
        """Build once on a placeholder of the global shape: the output shape for the targets,
        and the user's errors as usage errors."""
        with self.tf.Graph().as_default():
            x = self.v1.placeholder(self.job["dtype"], self.shape)
            try:
                out = self.model(x, True)
            except ValidateUsageError:
                raise
            except Exception as exc:  # noqa: BLE001 - the user's BUILD: one line
                raise ValidateUsageError(
                    f"{self.job['factory']}: BUILD rejects --input-shape "
                    f"{','.join(map(str, self.shape))}: {type(exc).__name__}: {exc}") from None
        if out.shape[0] != self.shape[0]:
            raise ValidateUsageError(f"{self.job['factory']}: the output's first dimension "
                                     "must be the batch")
        self.out_shape = tuple(out.shape[1:])

    def per_example_sum(self, out: Any, y: Any) -> Any:
        tf = self.tf
        if self.job["target"] == "classes":
            loss = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=out)
        else:
            loss = tf.square(out - y)
        per_example = tf.reduce_mean(tf.reshape(loss, [tf.shape(loss)[0], -1]), axis=1)
        return tf.reduce_sum(per_example) / self.shape[0]

    def _placeholders(self, size: int) -> tuple[Any, Any]:
        label = "int32" if self.job["target"] == "classes" else self.job["dtype"]
        y_shape = self.out_shape[:-1] if self.job["target"] == "classes" else self.out_shape
        return (self.v1.placeholder(self.job["dtype"], (size, *self.shape[1:])),
                self.v1.placeholder(label, (size, *y_shape)))

    def _train_op(self, params: list[Any], grads: list[Any], updates: list[Any]) -> Any:
        optimizer = self.v1.train.GradientDescentOptimizer(self.job["lr"])
        with self.tf.control_dependencies(updates):
            return optimizer.apply_gradients(list(zip(grads, params, strict=True)))

    def graph(self, mode: str) -> dict[str, Any]:
        """"reference", "synced" or "unsynced": the graph and what a step fetches and feeds."""
        tf, v1 = self.tf, self.v1
        graph = tf.Graph()
        with graph.as_default():
            if mode == "reference":
                x, y = self._placeholders(self.shape[0])
                out = self.model(x, True)
                loss = self.per_example_sum(out, y)
                params = v1.trainable_variables()
                grads = tf.gradients(loss, [*params, x])
                feeds, outs, losses, x_grads = [(x, y)], [out], [loss], [grads[-1]]
                param_grads, updates = grads[:-1], v1.get_collection(v1.GraphKeys.UPDATE_OPS)
            else:
                feeds, outs, losses, x_grads, tower_grads = [], [], [], [], []
                context = (self._sync() if mode == "synced" else contextlib.nullcontext())
                with context as sync:
                    for i, part in enumerate(self.parts):
                        with tf.device(self.devices[i]), tf.name_scope(f"tower_{i}") as scope:
                            x, y = self._placeholders(part.stop - part.start)
                            out = self.model(x, True)
                            loss = self.per_example_sum(out, y)
                            params = v1.trainable_variables()
                            grads = tf.gradients(loss, [*params, x])
                        feeds.append((x, y))
                        outs.append(out)
                        losses.append(loss)
                        x_grads.append(grads[-1])
                        tower_grads.append(grads[:-1])
                if sync is not None:
                    self.synced_layers = len(sync.layers)
                param_grads = [tf.add_n([g for g in per if g is not None]) if any(
                    g is not None for g in per) else None for per in zip(*tower_grads)]
                updates = v1.get_collection(v1.GraphKeys.UPDATE_OPS, scope)
            param_grads = [tf.zeros_like(p) if g is None else g
                           for g, p in zip(param_grads, params, strict=True)]
            stats = [v for v in v1.global_variables()
                     if not v.trainable and v.dtype.base_dtype.is_floating]
            return {"graph": graph, "feeds": feeds, "params": params, "stats": stats,
                    "init": v1.global_variables_initializer(), "variables": v1.global_variables(),
                    "fetch": {"output": tf.concat(outs, 0), "loss": tf.add_n(losses),
                              "input_grad": tf.concat(x_grads, 0), "grads": param_grads,
                              "train": self._train_op(params, param_grads, updates)}}

    def _sync(self) -> Any:
        import bnfix.tf1

        return bnfix.tf1.sync_towers(self.towers)

    def _feed(self, built: dict[str, Any], step: int) -> dict[Any, Any]:
        x = data.inputs(self.job["seed"], step, self.shape, self.towers, self.job["dtype"])
        y = data.targets(self.job["seed"], step, self.job["target"], self.shape[0],
                         self.out_shape, self.job["dtype"])
        parts = [slice(None)] if len(built["feeds"]) == 1 else self.parts
        feed = {}
        for (px, py), part in zip(built["feeds"], parts, strict=True):
            feed[px], feed[py] = x[part], y[part]
        return feed

    def train(self, mode: str, initial: dict[str, np.ndarray] | None
              ) -> tuple[Trace, dict[str, np.ndarray], dict[str, np.ndarray]]:
        """K steps of `mode`'s graph from `initial` (None: its own initialisers, seeded); returns
        the trace and every variable's value by name before and after the steps."""
        built = self.graph(mode)
        trace = Trace()
        with built["graph"].as_default(), self.session(built["graph"]) as sess:
            sess.run(built["init"])
            if initial is not None:
                for variable in built["variables"]:
                    if variable.op.name not in initial:
                        raise RunFailed(f"the {mode} graph has a variable the reference has not: "
                                        f"{variable.op.name}")
                    variable.load(initial[variable.op.name], sess)
            start = {v.op.name: value for v, value in
                     zip(built["variables"], sess.run(built["variables"]), strict=True)}
            grad_keys = [_key(p, ".grad") for p in built["params"]]
            for step in range(self.job["steps"]):
                got = sess.run(built["fetch"], self._feed(built, step))
                values: dict[Key, Any] = {(MODEL, "output"): got["output"],
                                          (MODEL, "loss"): got["loss"],
                                          (MODEL, "input_grad"): got["input_grad"]}
                values.update(zip(grad_keys, got["grads"], strict=True))
                trace.steps.append(values)
            trace.final = [{_key(v): value for v, value in
                            zip(built["stats"], sess.run(built["stats"]), strict=True)}]
            final = {v.op.name: value for v, value in
                     zip(built["variables"], sess.run(built["variables"]), strict=True)}
        return trace, start, final

    def inference(self, values: dict[str, np.ndarray], towers: bool) -> np.ndarray:
        """is_training=False outputs on step 0's batch: one graph, or towers in sync_towers."""
        tf = self.tf
        x_all = data.inputs(self.job["seed"], 0, self.shape, self.towers, self.job["dtype"])
        graph = tf.Graph()
        with graph.as_default():
            if towers:
                with self._sync():
                    outs = []
                    for i, part in enumerate(self.parts):
                        with tf.device(self.devices[i]), tf.name_scope(f"tower_{i}"):
                            outs.append(self.model(tf.constant(x_all[part]), False))
                out = tf.concat(outs, 0)
            else:
                out = self.model(tf.constant(x_all), False)
            variables = self.v1.global_variables()
            with self.session(graph) as sess:
                for variable in variables:
                    variable.load(values[variable.op.name], sess)
                return sess.run(out)


def _devices(tf: Any, job: dict[str, Any], towers: int) -> tuple[list[str], str]:
    gpus = tf.config.list_physical_devices("GPU")
    if job["backend"] == "gpu" and len(gpus) < towers:
        raise ValidateUsageError(f"--backend gpu: {towers} towers need {towers} GPUs, "
                                 f"TensorFlow sees {len(gpus)}")
    if job["backend"] in ("auto", "gpu") and len(gpus) >= towers:
        return [f"/gpu:{i}" for i in range(towers)], f"{towers} GPUs"
    return [f"/cpu:{i}" for i in range(towers)], f"{towers} CPU devices"


def run(job: dict[str, Any], workdir: Path) -> dict[str, Any]:
    started: list[tuple[str, float]] = []

    def phase(name: str) -> None:
        started.append((name, time.perf_counter()))
        worker_io.phase(workdir, name)

    phase("loading TensorFlow and BUILD")
    import tensorflow as tf

    towers = job["devices"] or job["default_devices"]
    devices, where = _devices(tf, job, towers)
    build = load_callable(job["factory"], Path(job["cwd"]))
    tf.compat.v1.set_random_seed(job["seed"])
    runner = Tf1Run(job, tf, build, towers, devices)
    runner.check_output()
    phase("reference graph (one device, global batch)")
    ref, initial, trained = runner.train("reference", None)
    phase(f"synced towers (sync_towers({towers}))")
    synced, _, _ = runner.train("synced", initial)
    phase("unsynced towers")
    unsynced, _, _ = runner.train("unsynced", initial)
    phase("inference graphs (is_training=False)")
    want = runner.inference(trained, towers=False)
    got = runner.inference(trained, towers=True)
    fidelity = (Fidelity("sync_towers (inference)", *output_error(got, want),
                         runner.synced_layers, (),
                         "towers built inside sync_towers, is_training=False"),)
    phase("comparing")
    seconds = {name: round(end - begin, 2)
               for (name, begin), (_, end) in pairwise(started)}
    kinds = {layer: "batch norm" for layer, name in ref.final[0] if name == "moving_mean"}
    settings = {"input_shape": list(job["input_shape"]), "devices": towers,
                "replica_word": "towers", "backend": "", "device": where,
                "launcher": "one TF1 graph", "steps": job["steps"], "lr": job["lr"],
                "dtype": job["dtype"], "target": job["target"], "seed": job["seed"],
                "loss": "sum(per-example loss) / global batch per tower, tower gradients "
                        "added; moving statistics updated by the last tower's UPDATE_OPS"}
    return Validation("tf1", job["factory"], settings, job["tolerance"], fidelity,
                      compare("synced", ref, synced, kinds),
                      compare("unsynced", ref, unsynced, kinds), seconds).to_json()


if __name__ == "__main__":
    worker_io.worker_main(run)
