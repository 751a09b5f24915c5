"""BN monitor for TF1 graphs: `BNMonitorHook(every=10)`, a `tf.compat.v1.train.SessionRunHook`
for `MonitoredTrainingSession` / Estimator, and `watch_sessions` (what `bnfix doctor` uses), which
watches every `Session.run` of the process.

BN layers are the graph's FusedBatchNorm ops (what `tf.compat.v1.layers.batch_normalization`,
`tf.compat.v1.nn.fused_batch_norm` and Keras BN on 4-D inputs build), grouped by their γ
variable (towers share it: the first tower is recorded, the tower count is the replica count);
their scope's `moving_mean` / `moving_variance` are the running statistics. A run is a training
step when its fetches reach an optimizer's Apply op. On every training step: the layers whose
moving statistics the run updates, and those that ran with `is_training=False` while γ is
trainable; every `every` steps: the batch mean/variance (the op's outputs), the per-tower count,
the dead-channel fraction, the moving statistics before the step, γ and β, then γ/β after the
next steps (oscillation). A run that trains nothing but updates moving statistics is an
evaluation that changed them. Non-fused BN (2-D inputs, `tf.nn.batch_normalization`) is not
recorded (said in the recording's notes).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tensorflow as tf

from bnfix.doctor.record import LayerTrace, Recording, Sample, add_step
from bnfix.doctor.stats import FOLLOW, Window, fill_path, fill_sample

FUSED = ("FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3")
ASSIGNS = ("Assign", "AssignSub", "AssignAdd", "AssignVariableOp", "AssignSubVariableOp",
           "AssignAddVariableOp")


@dataclass
class _Layer:
    name: str  # the variables' scope
    ops: list[Any]  # FusedBatchNorm ops, one per tower
    gamma: Any
    beta: Any
    moving_mean: Any
    moving_var: Any
    epsilon: float
    trace: LayerTrace
    towers: int = 1
    measures: dict[str, Any] = field(default_factory=dict)  # fetchable tensors (first tower)
    window: Window = field(default_factory=Window)
    pending: dict[int, Sample] = field(default_factory=dict)
    snapshots: dict[int, tuple[Any, Any]] = field(default_factory=dict)


@dataclass
class _Plan:
    """What one fetch structure does: trains? which layers it updates, runs in eval mode."""

    train: bool
    active: list[_Layer]  # its BN ops run
    updated: list[_Layer]  # its moving statistics are assigned
    eval_mode: list[_Layer]


def _outside(graph: Any, tensor: Any) -> Any:
    """The tensor itself, or what a v1 cond's Switch passes into it (fetchable)."""
    while not graph.is_fetchable(tensor) and tensor.op.type in ("Switch", "Identity"):
        tensor = tensor.op.inputs[0]
    return tensor if graph.is_fetchable(tensor) else None


def _merged(graph: Any, tensor: Any) -> Any:
    """The tensor itself, or the output of the v1 cond's Merge it feeds (fetchable)."""
    if graph.is_fetchable(tensor):
        return tensor
    for consumer in tensor.consumers():
        if consumer.type == "Merge" and graph.is_fetchable(consumer.outputs[0]):
            return consumer.outputs[0]
    return None


def _variable_of(tensor: Any) -> Any:
    """The variable op a read of it comes from (reads, identities, v1 cond switches)."""
    op = tensor.op
    while op.type in ("ReadVariableOp", "Identity", "Enter", "Cast", "Switch") and op.inputs:
        op = op.inputs[0].op
    return op


class Tf1Monitor:
    """The BN layers of one graph and their recording."""

    def __init__(self, graph: Any, every: int = 10) -> None:
        self.graph = graph
        self.every = every
        self.recording = Recording("tf1", "graph", every)
        self.layers = self._find_layers()
        self.plans: dict[tuple, _Plan] = {}
        self.step = 0
        self.sampling = False
        self.evaluation: dict[str, Any] | None = None  # moving means before an evaluation
        if not self.layers:
            self.recording.notes.append("no FusedBatchNorm op in the graph (non-fused BN is not "
                                        "recorded)")

    def _find_layers(self) -> dict[str, _Layer]:
        variables = {v.op.name: v for v in self.graph.get_collection("variables")}
        trainable = {v.op.name for v in self.graph.get_collection("trainable_variables")}
        layers: dict[str, _Layer] = {}
        for op in self.graph.get_operations():
            if op.type not in FUSED:
                continue
            gamma_op = _variable_of(op.inputs[1])
            scope = gamma_op.name.rsplit("/", 1)[0]
            if scope in layers:
                layers[scope].ops.append(op)
                continue
            mean, var = variables.get(f"{scope}/moving_mean"), \
                variables.get(f"{scope}/moving_variance")
            gamma, beta = variables.get(gamma_op.name), \
                variables.get(_variable_of(op.inputs[2]).name)
            if mean is None or var is None:
                continue
            # the momentum is measured on the first sampled step (the update's constant may sit
            # behind a tf.cond)
            trace = LayerTrace(name=scope, cls=op.type, channels=int(mean.shape[0]),
                               trainable=gamma_op.name in trainable,
                               dtype=mean.dtype.base_dtype.name,
                               input_dtype=op.inputs[0].dtype.name)
            self.recording.layers[scope] = trace
            layers[scope] = _Layer(scope, [op], gamma, beta, mean, var,
                                   float(op.get_attr("epsilon")), trace)
        for layer in layers.values():
            # a layer under a v1 `tf.cond(training, ...)` has a training and an inference op;
            # towers have one training op each
            towers = [op for op in layer.ops if op.get_attr("is_training")] or layer.ops
            layer.ops = towers + [op for op in layer.ops if op not in towers]
            layer.towers = len(towers)
            layer.trace.cls = f"{towers[0].type} x{len(towers)}" if len(towers) > 1 \
                else towers[0].type
        if layers:
            self.recording.world = max(layer.towers for layer in layers.values())
        return layers

    def build(self) -> None:
        """The extra tensors fetched on sampled steps (built before the graph is finalized). A
        BN under a v1 `tf.cond` cannot be fetched from inside: its input is read before the
        cond's Switch, its output after the Merge, and the moments are computed again there."""
        if self.graph.finalized:
            return
        with self.graph.as_default(), tf.name_scope("bnfix_monitor"):
            for layer in self.layers.values():
                op = layer.ops[0]
                x, y = _outside(self.graph, op.inputs[0]), _merged(self.graph, op.outputs[0])
                if x is None:
                    continue
                nchw = op.get_attr("data_format") in (b"NCHW", b"NCDHW")
                axes = [0, *range(2, x.shape.rank)] if nchw else list(range(x.shape.rank - 1))
                shape = tf.shape(x)
                channels = shape[1] if nchw else shape[-1]
                if self.graph.is_fetchable(op.outputs[1]):
                    mean, var = op.outputs[1], op.outputs[2]
                else:
                    mean, var = tf.nn.moments(tf.cast(x, tf.float32), axes)
                layer.measures = {"mean": mean, "var": var, "count": tf.size(x) // channels,
                                  "batch": shape[0]}
                if y is not None:
                    layer.measures["dead"] = tf.reduce_mean(tf.cast(
                        tf.reduce_max(tf.cast(y, tf.float32), axis=axes) <= 0, tf.float32))

    # -- plans -----------------------------------------------------------------------------------
    def plan(self, fetches: Any) -> _Plan | None:
        elements = []
        for item in tf.nest.flatten(fetches):
            try:
                elements.append(self.graph.as_graph_element(item, allow_tensor=True,
                                                            allow_operation=True))
            except (TypeError, ValueError, KeyError):
                continue
        key = tuple(e.name for e in elements)
        if key not in self.plans:
            self.plans[key] = self._make_plan([getattr(e, "op", e) for e in elements])
        return self.plans[key]

    def _make_plan(self, ops: list[Any]) -> _Plan:
        seen = {op.name for op in ops}
        queue = deque(ops)
        train = False
        assigned: dict[str, Any] = {}
        initializers = {v.initializer.name for v in self.graph.get_collection("variables")}
        while queue:
            op = queue.popleft()
            if op.type.startswith(("Apply", "ResourceApply")):
                train = True
            if op.type in ASSIGNS and op.inputs and op.name not in initializers:
                assigned[_variable_of(op.inputs[0]).name] = op
            for nxt in [t.op for t in op.inputs] + list(op.control_inputs):
                if nxt.name not in seen:
                    seen.add(nxt.name)
                    queue.append(nxt)
        active, updated, eval_mode = [], [], []
        for layer in self.layers.values():
            if layer.moving_mean.op.name in assigned:
                updated.append(layer)
            modes = {bool(op.get_attr("is_training")) for op in layer.ops if op.name in seen}
            if modes:
                active.append(layer)
            if train and modes == {False}:  # both modes present: a tf.cond decides at run time
                eval_mode.append(layer)
        return _Plan(train, active, updated, eval_mode)

    # -- runs ------------------------------------------------------------------------------------
    def before(self, plan: _Plan, read: Callable[[Any], Any]) -> dict[str, Any]:
        """Start of a run: count the step; on sampled steps read the moving statistics, γ and
        β (before the update) and return the extra fetches."""
        if not plan.train:
            if plan.updated:  # did this evaluation change them? (training=False: momentum 1)
                self.evaluation = read({l.name: l.moving_mean for l in plan.updated})
            return {}
        self.step += 1
        self.recording.steps = self.step
        self.sampling = (self.step - 1) % self.every == 0
        if not self.sampling:
            return {}
        layers = [l for l in plan.active if l.measures]
        state = read({l.name: (l.moving_mean, l.moving_var) for l in layers})
        for layer in layers:
            layer.pending[self.step] = Sample(step=self.step)
            layer.snapshots[-self.step] = state[layer.name]  # the running statistics before
        return {l.name: l.measures for l in layers}

    def after(self, plan: _Plan, values: dict[str, Any], read: Callable[[Any], Any]) -> None:
        if not plan.train:
            if plan.updated and self.evaluation is not None:
                now = read({l.name: l.moving_mean for l in plan.updated})
                for layer in plan.updated:
                    if not np.array_equal(now[layer.name], self.evaluation[layer.name]):
                        layer.trace.eval_updates += 1
                        add_step(layer.trace.eval_update_steps, self.step)
            self.evaluation = None
            return
        for layer in plan.updated:
            layer.trace.updates += 1
        for layer in plan.eval_mode:
            if layer.trace.trainable:
                add_step(layer.trace.eval_mode_steps, self.step)
        follow = [l for l in self.layers.values()
                  if any(0 <= self.step - s <= FOLLOW for s in l.pending)]
        if not follow:
            return
        state = read({l.name: (l.gamma, l.beta, l.moving_mean, l.moving_var) for l in follow})
        for layer in follow:
            gamma, beta, mean, var = state[layer.name]
            if self.step in layer.pending and layer.name in values:
                before = layer.snapshots.get(-self.step)
                self._sample(layer, layer.pending[self.step], values[layer.name], gamma, beta)
                layer.trace.final = layer.window.final(mean, var, gamma, beta)
                if layer.trace.momentum is None and before is not None:
                    layer.trace.momentum = _momentum(before[0], values[layer.name]["mean"], mean)
            layer.snapshots[self.step] = (gamma, beta)
            for first in [s for s in layer.pending if self.step - s >= FOLLOW]:
                sample = layer.pending.pop(first)
                points = [layer.snapshots.get(first + k) for k in range(FOLLOW + 1)]
                if all(p is not None for p in points):
                    fill_path(sample, [p[0] for p in points], [p[1] for p in points])  # type: ignore[index]
            for old in [s for s in layer.snapshots if 0 < s < self.step - FOLLOW]:
                del layer.snapshots[old]

    def _sample(self, layer: _Layer, sample: Sample, measured: dict[str, Any], gamma: Any,
                beta: Any) -> None:
        running_mean, running_var = layer.snapshots.pop(-sample.step)
        sample.count, sample.batch = int(measured["count"]), int(measured["batch"])
        if "dead" in measured:
            sample.dead = float(measured["dead"])
        fill_sample(sample, measured["mean"], measured["var"], running_mean, running_var,
                    gamma, beta, layer.epsilon)
        layer.window.add(measured["mean"], measured["var"])
        layer.trace.samples.append(sample)

    def snapshot(self, read: Callable[[Any], Any] | None = None) -> Recording:
        """The recording; with `read` (a live session's run), the end state read now (else the
        one read at the last sampled step)."""
        if read is not None:
            state = read({name: (l.moving_mean, l.moving_var, l.gamma, l.beta)
                          for name, l in self.layers.items()})
            for name, layer in self.layers.items():
                layer.trace.final = layer.window.final(*state[name])
        return self.recording

    def close(self) -> Recording:
        return self.snapshot()


def _momentum(before: Any, batch: Any, after: Any) -> float | None:
    """The weight of the new batch in the moving-mean update, measured: (after − before) /
    (batch − before), the median over channels where the batch moved the mean."""
    before, batch, after = (np.asarray(v, np.float64) for v in (before, batch, after))
    moved = np.abs(batch - before) > 1e-3 * (1 + np.abs(before))
    if not moved.any():
        return None
    value = float(np.median((after - before)[moved] / (batch - before)[moved]))
    return value if 0 < value < 1 else None


class BNMonitorHook(tf.compat.v1.train.SessionRunHook):
    """`hooks=[BNMonitorHook(every=10)]` for `MonitoredTrainingSession` (or any hook list);
    `recording` / `diagnose()` after (or during) training."""

    def __init__(self, every: int = 10) -> None:
        self.every = every
        self.monitor: Tf1Monitor | None = None
        self.plan: _Plan | None = None

    def begin(self) -> None:
        self.monitor = Tf1Monitor(tf.compat.v1.get_default_graph(), self.every)
        self.monitor.build()

    def before_run(self, run_context: Any) -> Any:
        monitor = self.monitor
        assert monitor is not None, "begin() was not called"
        session = run_context.session
        self.plan = monitor.plan(run_context.original_args.fetches)
        extra = monitor.before(self.plan, session.run) if self.plan else {}
        return tf.compat.v1.train.SessionRunArgs(extra)

    def after_run(self, run_context: Any, run_values: Any) -> None:
        if self.monitor is not None and self.plan is not None:
            self.monitor.after(self.plan, run_values.results or {}, run_context.session.run)

    def end(self, session: Any) -> None:
        if self.monitor is not None:
            self.monitor.snapshot(session.run)

    @property
    def recording(self) -> Recording:
        return self.monitor.recording if self.monitor else Recording("tf1", "graph", self.every)

    def diagnose(self, select: set[str] | None = None) -> list[Any]:
        from bnfix.doctor.diagnose import diagnose

        return diagnose([self.recording], select=select)


Guard = Callable[[str, Callable[[], Any]], Any]


def watch_sessions(every: int, add: Callable[[Tf1Monitor], None], stepped: Callable[[], None],
                   guard: Guard) -> None:
    """Watch every `Session.run` of this process (`bnfix doctor`): a monitor per graph that
    trains with BN, `stepped()` after each training step. `guard(where, action)` runs the
    monitor's part of a run and swallows (logs) its failures: the script's run always runs."""
    from tensorflow.python.client import session as session_module

    monitors: dict[int, Tf1Monitor | None] = {}
    original = session_module.BaseSession.run

    def monitor_of(graph: Any) -> Tf1Monitor | None:
        if id(graph) not in monitors:
            found = Tf1Monitor(graph, every)
            monitors[id(graph)] = found if found.layers else None
            if found.layers:
                found.build()
                add(found)
        return monitors[id(graph)]

    def run(self: Any, fetches: Any, feed_dict: Any = None, options: Any = None,
            run_metadata: Any = None) -> Any:
        monitor = guard("tf1 monitor", lambda: monitor_of(self.graph))
        plan = guard("tf1 plan", lambda: monitor.plan(fetches)) if monitor else None
        if monitor is None or plan is None:
            return original(self, fetches, feed_dict, options, run_metadata)

        def read(tensors: Any) -> Any:
            return original(self, tensors)

        extra = guard("tf1 before", lambda: monitor.before(plan, read)) or {}
        if extra:
            result, values = original(self, [fetches, extra], feed_dict, options, run_metadata)
        else:
            result, values = original(self, fetches, feed_dict, options, run_metadata), {}
        guard("tf1 after", lambda: monitor.after(plan, values, read))
        if plan.train:
            stepped()
        return result

    run.__doc__ = original.__doc__
    session_module.BaseSession.run = run
