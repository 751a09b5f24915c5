"""`bnfix.keras.BNMonitor`: a Keras callback that watches every BatchNormalization of the model
while `fit` trains it (TensorFlow backend; any `tf.distribute` strategy).

At `on_train_begin` each BN layer gets two instance-level wrappers (its class is untouched, and
they are removed at `on_train_end`): `_moments`, where Keras computes the batch statistics
(synchronized ones included), also writes them with the per-replica sample count into
sync-on-read variables (each replica writes its own, no communication; reading averages the
replicas), and `call`, on sampled steps only (a `tf.cond` on a flag the callback sets), measures
the fraction of channels dead after a ReLU and the gap between the layer's train-mode output and
what its moving statistics would make of the same batch. The train function is retraced once.
Every `every` steps the callback reads those variables, the moving statistics (before the step's
update), γ and β; it follows γ/β over the next updates (oscillation), notes layers that trained
in inference mode (`training=False` while γ/β train), and moving statistics that changed during
an evaluation inside `fit`. Gradient norms are not observable from a callback (left empty).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import keras
import numpy as np

from bnfix.doctor.record import LayerTrace, Recording, Sample, add_step
from bnfix.doctor.stats import FOLLOW, Window, fill_path, fill_sample
from bnfix.keras.convert import layer_paths


@dataclass
class _Watch:
    """One BN layer: its monitor variables and what was seen of it."""

    layer: keras.layers.BatchNormalization
    trace: LayerTrace
    mean: Any
    var: Any
    count: Any
    batch: Any
    dead: Any
    gap: Any
    modes: set[bool] = field(default_factory=set)  # batch-statistics mode seen in the train trace
    window: Window = field(default_factory=Window)
    running: tuple[np.ndarray, np.ndarray] | None = None  # before the sampled step's update
    snapshots: dict[int, tuple[np.ndarray | None, np.ndarray | None]] = field(
        default_factory=dict)
    pending: dict[int, Sample] = field(default_factory=dict)


def _value(variable: Any) -> np.ndarray | None:
    """A variable read in cross-replica context (sync-on-read ones: the replicas' mean)."""
    return None if variable is None else np.asarray(variable.numpy())


class BNMonitor(keras.callbacks.Callback):
    """Records BN statistics every `every` training steps of `fit`; `recording` holds them,
    `diagnose()` judges them (BN3xx). `on_step`, if given, is called after every step and may
    return True to stop training (`bnfix doctor --steps`)."""

    def __init__(self, every: int = 10, *, on_step: Callable[[], bool] | None = None) -> None:
        super().__init__()
        if every < 1:
            raise ValueError(f"every must be at least 1 (got {every})")
        self.every = every
        self.on_step = on_step
        self.recording = Recording("keras", "", every)
        self.watches: list[_Watch] = []
        self.step = 0
        self.sampling = False
        self.tracing = False
        self.flag: Any = None
        self.evaluation: list[tuple[np.ndarray, np.ndarray]] | None = None
        self.attached = False

    # -- attach / detach -------------------------------------------------------------------------
    def on_train_begin(self, logs: Any = None) -> None:
        model = self.model
        if keras.backend.backend() != "tensorflow":
            self.recording.notes.append(f"BNMonitor needs the TensorFlow backend (this is "
                                        f"{keras.backend.backend()}): nothing recorded")
            return
        strategy = model.distribute_strategy
        world = int(getattr(strategy, "num_replicas_in_sync", 1) or 1)
        self.recording = Recording("keras", type(model).__name__, self.every, world=world)
        self.recording.notes.append("Keras: gradient norms are not observable from a callback; "
                                    "train/eval gap measured on the sampled training batch")
        seen: set[int] = set()
        with strategy.scope():
            self.flag = keras.Variable(False, dtype="bool", trainable=False, name="bnfix_sample")
            for path, layer in layer_paths(model).items():
                if isinstance(layer, keras.layers.BatchNormalization) and id(layer) not in seen:
                    seen.add(id(layer))
                    self.watches.append(self._watch(path, layer))
        self.attached = True
        model.make_train_function(force=True)  # retrace with the wrappers

    def _watch(self, path: str, layer: keras.layers.BatchNormalization) -> _Watch:
        channels = int(layer.moving_mean.shape[0])

        def variable(shape: tuple, name: str) -> Any:
            return keras.Variable(np.zeros(shape, "float32"), trainable=False,
                                  aggregation="mean", synchronization="on_read",
                                  name=f"bnfix_{name}")

        trace = LayerTrace(
            name=path, cls=type(layer).__name__, channels=channels,
            momentum=1.0 - float(layer.momentum), synced=bool(getattr(layer, "synchronized",
                                                                      False)),
            affine=bool(layer.scale or layer.center),
            trainable=bool(layer.trainable) and any(v.trainable for v in layer.weights),
            dtype=str(layer.moving_variance.dtype), input_dtype=str(layer.compute_dtype))
        self.recording.layers[path] = trace
        watch = _Watch(layer, trace, variable((channels,), "mean"), variable((channels,), "var"),
                       variable((), "count"), variable((), "batch"), variable((), "dead"),
                       variable((), "gap"))
        self._wrap(watch)
        return watch

    def _wrap(self, watch: _Watch) -> None:
        import tensorflow as tf

        layer = watch.layer
        moments, call = layer._moments, layer.call
        ops = keras.ops

        def watched_moments(inputs: Any, mask: Any) -> Any:
            mean, variance = moments(inputs, mask)
            channels = watch.trace.channels
            watch.mean.assign(ops.cast(ops.reshape(mean, (channels,)), "float32"))
            watch.var.assign(ops.cast(ops.reshape(variance, (channels,)), "float32"))
            watch.count.assign(ops.cast(ops.size(inputs), "float32") / channels)
            watch.batch.assign(ops.cast(ops.shape(inputs)[0], "float32"))
            return mean, variance

        def watched_call(inputs: Any, training: Any = None, mask: Any = None) -> Any:
            batch_mode = bool(training) and layer.trainable
            if self.tracing:
                watch.modes.add(batch_mode)
            moving_mean, moving_var = layer.moving_mean.value, layer.moving_variance.value
            outputs = call(inputs, training=training, mask=mask)
            if not batch_mode:
                return outputs

            def measure() -> Any:
                axes = layer._reduction_axes
                y = ops.cast(outputs, "float32")
                watch.dead.assign(ops.mean(ops.cast(ops.max(y, axis=axes) <= 0, "float32")))
                expected = ops.batch_normalization(
                    ops.cast(inputs, "float32"), moving_mean, moving_var, axis=layer.axis,
                    offset=layer.beta.value if layer.center else None,
                    scale=layer.gamma.value if layer.scale else None, epsilon=layer.epsilon)
                norm = ops.sqrt(ops.sum(ops.square(expected)))
                watch.gap.assign(ops.sqrt(ops.sum(ops.square(y - expected)))
                                 / ops.maximum(norm, 1e-12))
                return tf.constant(0)

            tf.cond(self.flag.value, measure, lambda: tf.constant(0))
            return outputs

        object.__setattr__(layer, "_moments", watched_moments)
        object.__setattr__(layer, "call", watched_call)

    def _detach(self) -> None:
        if not self.attached:
            return
        self.attached = False
        for watch in self.watches:
            for name in ("_moments", "call"):
                if name in watch.layer.__dict__:
                    object.__delattr__(watch.layer, name)
        self.model.train_function = None  # the next fit traces the plain layers

    # -- steps -----------------------------------------------------------------------------------
    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        if not self.attached:
            return
        self.step += 1
        self.recording.steps = self.step
        sampling = (self.step - 1) % self.every == 0
        if sampling != self.sampling:
            self.flag.assign(sampling)
        self.sampling = sampling
        self.tracing = True
        if sampling:
            for watch in self.watches:
                watch.running = (_value(watch.layer.moving_mean),
                                 _value(watch.layer.moving_variance))

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        if not self.attached:
            return
        self.tracing = False
        for watch in self.watches:
            trace = watch.trace
            if False in watch.modes and trace.trainable:
                add_step(trace.eval_mode_steps, self.step)
            if True in watch.modes:
                trace.updates += 1
            if self.sampling and True in watch.modes:
                self._sample(watch)
            self._follow(watch)
        if self.on_step is not None and self.on_step():
            self.model.stop_training = True

    def _sample(self, watch: _Watch) -> None:
        layer = watch.layer
        mean, var = _value(watch.mean), _value(watch.var)
        count, batch = float(_value(watch.count)), float(_value(watch.batch))
        sample = Sample(step=self.step, count=round(count), batch=round(batch))
        if watch.trace.synced and self.recording.world > 1:
            sample.global_count = sample.count * self.recording.world  # type: ignore[operator]
        running = watch.running or (None, None)
        fill_sample(sample, mean, var, running[0], running[1], _value(layer.gamma)
                    if layer.scale else None, _value(layer.beta) if layer.center else None,
                    float(layer.epsilon))
        sample.dead = float(_value(watch.dead))
        watch.trace.probes.append([self.step, float(_value(watch.gap))])
        watch.window.add(mean, var)
        watch.pending[self.step] = sample
        watch.trace.samples.append(sample)

    def _follow(self, watch: _Watch) -> None:
        """γ/β after the sampled step and the FOLLOW steps after it."""
        layer = watch.layer
        awaiting = [s for s in watch.pending if 0 <= self.step - s <= FOLLOW]
        if awaiting:
            watch.snapshots[self.step] = (_value(layer.gamma) if layer.scale else None,
                                          _value(layer.beta) if layer.center else None)
        for first in [s for s in watch.pending if self.step - s >= FOLLOW]:
            sample = watch.pending.pop(first)
            points = [watch.snapshots.get(first + k) for k in range(FOLLOW + 1)]
            if all(p is not None for p in points):
                fill_path(sample, [p[0] for p in points], [p[1] for p in points])  # type: ignore[index]
        for old in [s for s in watch.snapshots if s < self.step - FOLLOW]:
            del watch.snapshots[old]

    # -- evaluation inside fit -----------------------------------------------------------------
    def on_test_begin(self, logs: Any = None) -> None:
        if self.attached:
            self.evaluation = [(_value(w.layer.moving_mean), _value(w.layer.moving_variance))
                               for w in self.watches]

    def on_test_end(self, logs: Any = None) -> None:
        if not self.attached or self.evaluation is None:
            return
        for watch, (mean, var) in zip(self.watches, self.evaluation):
            if not (np.array_equal(mean, _value(watch.layer.moving_mean))
                    and np.array_equal(var, _value(watch.layer.moving_variance))):
                watch.trace.eval_updates += 1
                add_step(watch.trace.eval_update_steps, self.step)
        self.evaluation = None

    # -- results ---------------------------------------------------------------------------------
    def on_train_end(self, logs: Any = None) -> None:
        self._final()
        self._detach()

    def _final(self) -> None:
        for watch in self.watches:
            layer = watch.layer
            watch.trace.final = watch.window.final(
                _value(layer.moving_mean), _value(layer.moving_variance),
                _value(layer.gamma) if layer.scale else None,
                _value(layer.beta) if layer.center else None)

    def snapshot(self) -> Recording:
        if self.attached:
            self._final()
        return self.recording

    def close(self) -> Recording:
        if self.attached:
            self._final()
            self._detach()
        return self.recording

    def diagnose(self, select: set[str] | None = None) -> list[Any]:
        """The BN3xx findings for what was recorded (`bnfix.doctor.diagnose`)."""
        from bnfix.doctor.diagnose import diagnose

        return diagnose([self.snapshot()], select=select)
