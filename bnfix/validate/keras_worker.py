"""The Keras run of `bnfix validate keras`, in a fresh process: `python -m
bnfix.validate.keras_worker DIR` (see bnfix.validate.worker_io for the files).

Devices first: N logical CPU devices (or the GPUs; one GPU split into N logical GPUs when there
are fewer than N), set before anything initialises TensorFlow. Then three copies of the model
with the same weights: the reference (plain BN, one device, the global batch), the converted
one (`bnfix.keras.convert_sync`, synchronized=True) and the unconverted one under
MirroredStrategy (MultiWorkerMirroredStrategy under TF_CONFIG). Each copy is a new call of the
factory, so its auto-named layers have new names: its layers are matched to the first build's
by position, class and weight shapes, and every copy is built and matched before any training.
Two more runs equal to the reference in exact arithmetic measure this model's rounding noise in
this dtype: the reference again on the global batch in reverse order, and the converted model
under a one-device strategy (Keras' synchronized moments, E[x²]-E[x]², on the whole batch: in
fp32 its backward pass alone can be 100x less accurate than the reference's two-pass variance).
The verdict uses them to tell an ill-conditioned model's rounding from a sync bug
(`Validation.noise`, `first_step`; see bnfix.validate.rounding).
Each replica's loss is
`tf.nn.compute_average_loss(per_example, global_batch_size=GB)` (its share of the mean over the
global batch) and the optimizer SUM-reduces the gradients, so the applied gradient is the
global batch's. Values leave the replicas in replica order: this process's replicas directly
(`experimental_local_results`), all workers' through `strategy.gather` under TF_CONFIG (one
gather per value and step retraces a function each time: minutes on a real model); the
recorded parameter gradients are the per-replica ones summed.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import replace
from itertools import pairwise
from pathlib import Path
from typing import Any

from bnfix.validate import data, worker_io
from bnfix.validate.comparison import (
    MODEL,
    Fidelity,
    Key,
    LayerError,
    Refusal,
    RunComparison,
    Trace,
    Validation,
    compare,
    output_error,
)
from bnfix.validate.errors import ValidateUsageError
from bnfix.validate.loading import call_user, load_callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ["KERAS_BACKEND"] = "tensorflow"


def tf_config_task() -> tuple[bool, str] | None:
    """(is the chief, description) under TF_CONFIG, else None."""
    raw = os.environ.get("TF_CONFIG")
    if not raw:
        return None
    config = json.loads(raw)
    task, cluster = config.get("task", {}), config.get("cluster", {})
    kind, index = task.get("type", "worker"), int(task.get("index", 0))
    chief = kind == "chief" or (kind == "worker" and index == 0 and "chief" not in cluster)
    return chief, f"MultiWorkerMirroredStrategy (TF_CONFIG {kind} {index})"


def configure_devices(tf: Any, job: dict[str, Any], count: int) -> tuple[list[str], str, Any]:
    """Logical devices for `count` replicas; returns (device names, what they are, the
    cross-device reduction to use, None for the default)."""
    gpus = tf.config.list_physical_devices("GPU")
    if job["backend"] == "gpu" and not gpus:
        raise ValidateUsageError("--backend gpu: TensorFlow sees no GPU here")
    if gpus and job["backend"] in ("auto", "gpu"):
        names = [f"/gpu:{i}" for i in range(count)]
        if len(gpus) >= count:
            return names, f"{count} GPUs", None
        config = tf.config.LogicalDeviceConfiguration(memory_limit=4096)
        tf.config.set_logical_device_configuration(gpus[0], [config] * count)
        # NCCL cannot reduce between logical devices of one GPU
        return names, f"{count} logical GPUs on one", tf.distribute.ReductionToOneDevice()
    if gpus:
        tf.config.set_visible_devices([], "GPU")
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * count)
    return [f"/cpu:{i}" for i in range(count)], f"{count} logical CPU devices", None


def model_maker(job: dict[str, Any], keras: Any) -> Callable[[], Any]:
    spec, cwd = job["factory"], Path(job["cwd"])
    if spec.endswith(".keras"):
        path = cwd / spec
        if not path.is_file():
            raise ValidateUsageError(f"{spec}: no such file")

        def load() -> Any:
            try:
                return keras.models.load_model(path)
            except Exception as exc:  # noqa: BLE001 - the user's file: one line
                raise ValidateUsageError(f"{spec}: cannot load the model: "
                                         f"{type(exc).__name__}: {exc}") from None
        return load
    factory = load_callable(spec, cwd)

    def build() -> Any:
        keras.utils.set_random_seed(job["seed"])
        model = call_user(spec, factory)
        if not isinstance(model, keras.Model):
            raise ValidateUsageError(f"{spec} returned a {type(model).__name__}, not a Keras 3 "
                                     "model")
        return model
    return build


def layout(model: Any) -> list[tuple[str, str, tuple[tuple[int, ...], ...]]]:
    """(path, class, weight shapes) of every sublayer, in Keras' tracking order."""
    from bnfix.keras.convert import layer_paths

    return [(path, type(layer).__name__, tuple(tuple(w.shape) for w in layer.weights))
            for path, layer in layer_paths(model).items()]


def canonical_names(model: Any, base: list[tuple[str, str, tuple[tuple[int, ...], ...]]],
                    what: str) -> dict[str, str]:
    """This model's layer paths -> the first build's (`base`), matched by position.

    The factory is called once per run (reference, synced, unsynced) in one process, and Keras
    numbers auto-named layers per process (`conv2d`, then `conv2d_1`, ...; a nested model's name
    too): the same layer has another name in every build. Matched by position, class and
    weight shapes; a build that differs is an error before anything trains."""
    mine = layout(model)
    for index, ((path, cls, shapes), (base_path, base_cls, base_shapes)) in enumerate(
            zip(mine, base)):
        if (cls, shapes) != (base_cls, base_shapes):
            raise ValidateUsageError(
                f"the {what} model differs from the first one the factory built: layer "
                f"{index + 1} is {path} ({cls}, weights {list(shapes)}) where the first had "
                f"{base_path} ({base_cls}, weights {list(base_shapes)}); the factory must build "
                "the same architecture on every call")
    if len(mine) != len(base):
        raise ValidateUsageError(f"the {what} model has {len(mine)} layers, the first build "
                                 f"{len(base)}: the factory must build the same architecture "
                                 "on every call")
    return {path: base_path for (path, _, _), (base_path, _, _) in zip(mine, base)}


def variable_keys(model: Any, names: dict[str, str]) -> dict[int, Key]:
    """(layer path, variable name) of every variable, by id, under the first build's paths
    (`names`); a shared layer under its first path."""
    from bnfix.keras.convert import layer_paths

    keys: dict[int, Key] = {}
    for path, layer in layer_paths(model).items():
        if layer._flatten_layers(include_self=False, recursive=False):
            continue  # a container: its leaves hold the variables
        for variable in layer.weights:
            keys.setdefault(id(variable), (names[path], variable.name))
    return keys


# Layers that draw random numbers in training mode, and the attribute that turns them off.
STOCHASTIC = {"Dropout": "rate", "SpatialDropout1D": "rate", "SpatialDropout2D": "rate",
              "SpatialDropout3D": "rate", "GaussianDropout": "rate", "AlphaDropout": "rate",
              "GaussianNoise": "stddev"}


def make_deterministic(model: Any) -> list[str]:
    """Turn off every Dropout/noise layer (rate or stddev 0): their masks differ between runs,
    and between one device's global batch and the replicas' shards, so no two runs could be
    compared (EfficientNetB0's stochastic depth moves its output by 100% run to run, float64
    included). BN sync does not depend on them. Returns their paths."""
    from bnfix.keras.convert import layer_paths

    found = []
    for path, layer in layer_paths(model).items():
        for cls in type(layer).__mro__:
            attribute = STOCHASTIC.get(cls.__name__)
            if attribute and cls.__module__.startswith("keras"):
                setattr(layer, attribute, 0.0)
                found.append(path)
                break
    return found


def layer_kinds(model: Any) -> dict[str, str]:
    from bnfix.keras.convert import layer_paths

    return {path: type(layer).__name__ for path, layer in layer_paths(model).items()}


class KerasRun:
    """One job's data, loss and training loops (the reference and the replicated one)."""

    def __init__(self, job: dict[str, Any], tf: Any, keras: Any, replicas: int) -> None:
        self.job, self.tf, self.keras, self.replicas = job, tf, keras, replicas
        self.shape = tuple(job["input_shape"])
        self.batch = self.shape[0]
        self.out_shape: tuple[int, ...] = ()

    def x(self, step: int) -> Any:
        return data.inputs(self.job["seed"], step, self.shape, self.replicas, self.job["dtype"])

    def y(self, step: int) -> Any:
        return data.targets(self.job["seed"], step, self.job["target"], self.batch,
                            self.out_shape, self.job["dtype"])

    def check_output(self, model: Any, spec: str) -> None:
        try:
            out = model(self.x(0), training=False)
        except Exception as exc:  # noqa: BLE001 - the user's model: one line
            raise ValidateUsageError(
                f"{spec}: the model rejects --input-shape {','.join(map(str, self.shape))}: "
                f"{type(exc).__name__}: {exc}") from None
        if not hasattr(out, "shape") or tuple(out.shape)[:1] != (self.batch,):
            raise ValidateUsageError(f"{spec}: the model must return one tensor with the batch "
                                     "as its first dimension")
        if self.job["target"] == "classes" and (len(out.shape) < 2 or out.shape[-1] < 2):
            raise ValidateUsageError(f"{spec}: --target classes needs outputs of shape "
                                     "(batch, ..., classes): use --target regression")
        self.out_shape = tuple(out.shape[1:])

    def per_example(self, out: Any, y: Any) -> Any:
        tf, keras = self.tf, self.keras
        if self.job["target"] == "classes":
            loss = keras.losses.sparse_categorical_crossentropy(y, out, from_logits=True)
        else:
            loss = tf.square(out - y)
        return tf.reduce_mean(tf.reshape(loss, [tf.shape(loss)[0], -1]), axis=1)

    def _replica_step(self, model: Any, optimizer: Any, moving: list[Any]) -> Callable:
        tf = self.tf

        def replica(x: Any, y: Any) -> Any:
            with tf.GradientTape() as tape:
                tape.watch(x)
                out = model(x, training=True)
                loss = tf.nn.compute_average_loss(self.per_example(out, y),
                                                  global_batch_size=self.batch)
            variables = model.trainable_variables
            grads = tape.gradient(loss, [*variables, x])
            grads = [tf.zeros_like(v) if g is None else g for g, v in zip(grads, [*variables, x],
                                                                          strict=True)]
            optimizer.apply_gradients(zip(grads[:-1], variables, strict=True))
            stats = [tf.expand_dims(tf.identity(v.value), 0) for v in moving]
            return (out, tf.reshape(loss, [1]), grads[-1],
                    [tf.expand_dims(g, 0) for g in grads[:-1]], stats)
        return replica

    def _distribute(self, strategy: Any, values: Any) -> Any:
        """Replica r gets shard r of `values` (all workers' replicas, in replica order)."""
        parts = data.shards(self.batch, strategy.num_replicas_in_sync)
        return strategy.experimental_distribute_values_from_function(
            lambda ctx: self.tf.constant(values[parts[ctx.replica_id_in_sync_group]]))

    @staticmethod
    def _collect(strategy: Any, value: Any) -> Any:
        """Every replica's part of a per-replica value, concatenated in replica order."""
        import numpy as np

        if strategy.extended._in_multi_worker_mode():
            return strategy.gather(value, axis=0).numpy()
        return np.concatenate([np.asarray(part) for part in
                               strategy.experimental_local_results(value)], axis=0)

    def train(self, model: Any, strategy: Any | None, names: dict[str, str],
              reverse: bool = False) -> Trace:
        """K steps; `strategy` None is the reference (one device, the whole batch). `names`:
        the model's layer paths -> the first build's. `reverse` feeds the reference the global
        batch in reverse order (outputs and input gradients put back in order): equal in exact
        arithmetic, so its difference from the reference is rounding alone."""
        tf, keras = self.tf, self.keras
        optimizer = keras.optimizers.SGD(self.job["lr"])
        keys = variable_keys(model, names)
        moving = [v for v in model.non_trainable_variables if id(v) in keys]
        if strategy is not None:
            with strategy.scope():
                optimizer.build(model.trainable_variables)
        replica = self._replica_step(model, optimizer, moving)
        step_fn = tf.function(replica if strategy is None else
                              lambda x, y: strategy.run(replica, args=(x, y)))
        grad_keys = [(keys[id(v)][0], keys[id(v)][1] + ".grad") for v in model.trainable_variables]
        trace = Trace()
        stats: list[Any] = []
        for step in range(self.job["steps"]):
            x, y = self.x(step), self.y(step)
            if strategy is None:
                order = slice(None, None, -1 if reverse else 1)
                out, loss, x_grad, grads, stats = step_fn(tf.constant(x[order]),
                                                          tf.constant(y[order]))
                out, loss, x_grad = out.numpy()[order], loss.numpy(), x_grad.numpy()[order]
                grads = [g.numpy() for g in grads]
                stats = [s.numpy() for s in stats]
            else:
                dx, dy = (self._distribute(strategy, values) for values in (x, y))
                out, loss, x_grad, grads, stats = step_fn(dx, dy)
                out, loss, x_grad = (self._collect(strategy, v) for v in (out, loss, x_grad))
                grads = [self._collect(strategy, g) for g in grads]
                stats = [self._collect(strategy, s) for s in stats]
            values: dict[Key, Any] = {(MODEL, "output"): out, (MODEL, "loss"): loss.sum(),
                                      (MODEL, "input_grad"): x_grad}
            for key, grad in zip(grad_keys, grads, strict=True):
                values[key] = grad.sum(0)
            trace.steps.append(values)
        state_keys = [keys[id(v)] for v in moving]
        trace.final = [{key: s[r] for key, s in zip(state_keys, stats, strict=True)}
                       for r in range(len(stats[0]) if stats else 1)]
        return trace


def noise_of(ref: Trace, runs: list[Trace], kinds: dict[str, str]) -> RunComparison:
    """Per layer, the largest difference from the reference of runs equal to it in exact
    arithmetic: the rounding noise the verdict allows for (bnfix.validate.rounding)."""
    rows: dict[str, LayerError] = {}
    for run in runs:
        for row in compare("noise", ref, run, kinds).layers:
            if row.layer not in rows or row.max_rel > rows[row.layer].max_rel:
                rows[row.layer] = row
    return RunComparison("noise", tuple(rows.values()), 0.0)


def first_step(trace: Trace) -> Trace:
    """The first step alone (no final statistics): where a sync bug shows in full and no SGD
    update has amplified rounding yet."""
    return Trace(steps=trace.steps[:1], final=[])


def _fidelity(reference: Any, x: Any, kinds: dict[str, str],
              names: dict[str, str]) -> tuple[Fidelity, ...]:
    from bnfix.keras import ConversionReport, convert_sync, revert_sync
    from bnfix.keras.convert import layer_paths

    want = reference(x, training=False).numpy()
    to_sync = ConversionReport()
    synced = convert_sync(reference, report=to_sync)
    refused = tuple(Refusal(names.get(r.path, r.path), kinds.get(names.get(r.path, r.path), ""),
                            r.reason) for r in to_sync.refused)
    problem = ""
    if to_sync.refused_everything:
        problem = (f"refused every BN layer that needed converting ({len(to_sync.refused)}): "
                   "nothing is synchronized")
    elif to_sync.refused:
        problem = (f"refused {len(to_sync.refused)} of {to_sync.bn_layers} BN layers: their "
                   "statistics stay per replica")
    results = [Fidelity("convert_sync", *output_error(synced(x, training=False).numpy(), want),
                        len(to_sync.converted), refused,
                        "in place" if to_sync.in_place else "a clone, weights copied", problem)]
    back = ConversionReport()
    plain = revert_sync(synced, report=back)
    still = [p for p, layer in layer_paths(plain).items() if getattr(layer, "synchronized", False)]
    results.append(Fidelity("revert_sync", *output_error(plain(x, training=False).numpy(), want),
                            len(back.converted), (), "synchronized=False everywhere again",
                            f"still synchronized: {', '.join(still)}" if still else ""))
    return tuple(results)


def run(job: dict[str, Any], workdir: Path) -> dict[str, Any] | None:
    started: list[tuple[str, float]] = []

    def phase(name: str) -> None:
        started.append((name, time.perf_counter()))
        worker_io.phase(workdir, name)

    phase("configuring devices")
    import tensorflow as tf

    task = tf_config_task()
    if task is None:
        count = job["devices"] or job["default_devices"]
        devices, where, reduction = configure_devices(tf, job, count)
    import keras

    from bnfix.keras import convert_sync

    if job["dtype"] == "float64":
        keras.config.set_floatx("float64")
    if task is None:
        strategy = tf.distribute.MirroredStrategy(devices, cross_device_ops=reduction)
        launcher = "MirroredStrategy"
    else:
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        launcher, where = task[1], f"{strategy.num_replicas_in_sync} replicas over the workers"
        if job["devices"] not in (None, strategy.num_replicas_in_sync):
            raise ValidateUsageError(f"--replicas {job['devices']} but the TF_CONFIG job has "
                                     f"{strategy.num_replicas_in_sync}: leave --replicas out")
    replicas = strategy.num_replicas_in_sync
    if job["input_shape"][0] < replicas:
        raise ValidateUsageError(f"a global batch of {job['input_shape'][0]} cannot give each "
                                 f"of {replicas} replicas a sample")
    phase("building the models")
    make = model_maker(job, keras)
    runner = KerasRun(job, tf, keras, replicas)
    base = make()
    runner.check_output(base, job["factory"])
    weights = base.get_weights()
    kinds = layer_kinds(base)
    shape = layout(base)
    stochastic = make_deterministic(base)

    # one device under a strategy: Keras' synchronized moments on the whole batch (single worker)
    alone = None if task is not None else tf.distribute.MirroredStrategy(devices[:1])

    def build(what: str, scope: Any | None) -> tuple[Any, dict[str, str]]:
        """Another build with the first one's weights, its layers matched to the first's."""
        with scope.scope() if scope is not None else contextlib.nullcontext():
            model = make()
            runner.check_output(model, job["factory"])  # builds a subclassed model's weights
            names = canonical_names(model, shape, what)
            model.set_weights(weights)
            make_deterministic(model)
        return model, names

    # every build made and matched before anything trains: a mismatch fails in seconds
    reference, ref_names = build("reference", None)
    to_sync, sync_names = build("synced", strategy)
    with strategy.scope():
        synced = convert_sync(to_sync)
    unsynced, unsync_names = build("unsynced", strategy)
    if alone is not None:
        to_sync_alone, alone_names = build("one-device synced", alone)
        with alone.scope():
            synced_alone = convert_sync(to_sync_alone)
    phase("reference run (plain BN, one device, global batch)")
    ref = runner.train(reference, None, ref_names)
    phase("rounding-noise runs (the reference on the reversed global batch; the synced model "
          "on one device)")
    reference.set_weights(weights)
    noise_traces = [runner.train(reference, None, ref_names, reverse=True)]
    if alone is not None:
        noise_traces.append(runner.train(synced_alone, alone, alone_names))
    phase(f"synced run on {replicas} replicas")
    synced_trace = runner.train(synced, strategy, sync_names)
    phase(f"unsynced run on {replicas} replicas")
    unsynced_trace = runner.train(unsynced, strategy, unsync_names)
    phase("conversion fidelity (eval mode)")
    reference.set_weights(weights)
    fidelity = _fidelity(reference, runner.x(0), kinds, ref_names)
    phase("comparing")
    seconds = {name: round(end - begin, 2)
               for (name, begin), (_, end) in pairwise(started)}
    settings = {"input_shape": list(job["input_shape"]), "devices": replicas,
                "replica_word": "replicas", "backend": "", "device": where,
                "launcher": launcher, "steps": job["steps"], "lr": job["lr"],
                "dtype": job["dtype"], "target": job["target"], "seed": job["seed"],
                "loss": "tf.nn.compute_average_loss(per_example, global_batch_size=GB) per "
                        "replica, gradients SUM-reduced by the optimizer",
                "deterministic": (f"{len(stochastic)} Dropout/noise layer(s) turned off (rate 0) "
                                  "in every run: their random masks differ between runs"
                                  if stochastic else "")}
    validation = Validation("keras", job["factory"], settings, job["tolerance"], fidelity,
                            compare("synced", ref, synced_trace, kinds),
                            compare("unsynced", ref, unsynced_trace, kinds), seconds,
                            noise_of(ref, noise_traces, kinds),
                            {"synced": compare("synced", first_step(ref),
                                               first_step(synced_trace), kinds),
                             "unsynced": compare("unsynced", first_step(ref),
                                                 first_step(unsynced_trace), kinds),
                             "noise": noise_of(first_step(ref),
                                               [first_step(t) for t in noise_traces], kinds)})
    from bnfix.validate.rounding import needs_float64

    if needs_float64(validation) and task is None and not job["factory"].endswith(".keras"):
        phase("float64 rerun (float32 differed by more than its measured rounding)")
        validation = replace(validation, float64=_float64_rerun(
            job, tf, keras, make, weights, shape, strategy, alone, kinds))
    if task is not None and not task[0]:
        return {"reporting": False, "exit_code": 0 if validation.passed else 1}
    return validation.to_json()


def _float64_rerun(job: dict[str, Any], tf: Any, keras: Any, make: Callable[[], Any],
                   weights: list[Any], shape: list[Any], strategy: Any, alone: Any,
                   kinds: dict[str, str]) -> dict[str, RunComparison]:
    """The reference, its noise runs and the synced run again, the model built in float64
    from the same (float32) weights: equal in float64 means float32 rounding made the
    difference, not the sync (bnfix.validate.rounding)."""
    from bnfix.keras import convert_sync

    keras.config.set_floatx("float64")
    keras.config.set_dtype_policy("float64")
    runner = KerasRun({**job, "dtype": "float64"}, tf, keras, strategy.num_replicas_in_sync)
    wide = [w.astype("float64") if w.dtype.kind == "f" else w for w in weights]

    def build(scope: Any | None) -> tuple[Any, dict[str, str]]:
        with scope.scope() if scope is not None else contextlib.nullcontext():
            model = make()
            runner.check_output(model, job["factory"])
            names = canonical_names(model, shape, "float64")
            model.set_weights(wide)
            make_deterministic(model)
        return model, names

    reference, ref_names = build(None)
    to_sync, sync_names = build(strategy)
    with strategy.scope():
        synced = convert_sync(to_sync)
    ref = runner.train(reference, None, ref_names)
    reference.set_weights(wide)
    noise = [runner.train(reference, None, ref_names, reverse=True)]
    if alone is not None:
        one, one_names = build(alone)
        with alone.scope():
            noise.append(runner.train(convert_sync(one), alone, one_names))
    return {"synced": compare("synced", ref, runner.train(synced, strategy, sync_names), kinds),
            "noise": noise_of(ref, noise, kinds)}


if __name__ == "__main__":
    worker_io.worker_main(run)
