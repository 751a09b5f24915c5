"""The TF1 probe: `Session.run` is wrapped so that each training step (a run whose fetches reach
an optimizer's Apply op) records the BN variables before and after, and the BN layers' inputs of
that step (fetched in the same run: they are computed anyway); graph facts are recorded once per
train op: moving-statistic updates reachable from it and EMA shadows of moving statistics."""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from bnfix.validate.probe_runtime import ProbeLog, values

LEGACY_LAYERS = "tf_keras.src.legacy_tf_layers.normalization"
STATS = ("gamma", "beta", "moving_mean", "moving_variance")
ASSIGNS = {"Assign", "AssignSub", "AssignAdd", "AssignVariableOp", "AssignSubVariableOp",
           "AssignAddVariableOp"}


@dataclass
class LayerCall:
    """One call of a TF1 BN layer while a graph was built."""

    layer: str  # the variables' scope, e.g. bn_conv1/BatchNorm/bn
    momentum: float
    axis: int
    inputs: Any  # tf.Tensor
    outputs: Any  # tf.Tensor: where it is centred tells which statistics normalized it


@dataclass
class Plan:
    """What to record for one train op (fetch structure)."""

    index: int
    variables: dict[str, Any]  # name -> tf.Variable (BN variables, shadows excluded)
    inputs: list[LayerCall]


@dataclass
class Tf1Probe:
    log: ProbeLog
    calls: dict[int, list[LayerCall]] = field(default_factory=dict)  # by id(graph)
    plans: dict[tuple, Plan | None] = field(default_factory=dict)
    steps: int = 0

    def layer_called(self, layer: Any, inputs: Any, outputs: Any, training: Any) -> None:
        if training is False or not hasattr(inputs, "graph") or getattr(layer, "moving_mean",
                                                                         None) is None:
            return
        axis = layer.axis[0] if isinstance(layer.axis, (list, tuple)) else layer.axis
        scope = layer.moving_mean.op.name.rsplit("/", 1)[0]
        self.calls.setdefault(id(inputs.graph), []).append(
            LayerCall(scope, float(layer.momentum), int(axis), inputs, outputs))

    def plan(self, session: Any, fetches: Any) -> Plan | None:
        import tensorflow as tf

        graph = session.graph
        elements = []
        for item in tf.nest.flatten(fetches):
            try:
                elements.append(graph.as_graph_element(item, allow_tensor=True,
                                                       allow_operation=True))
            except (TypeError, ValueError, KeyError):
                continue  # not a graph element: the session reports it, not the probe
        key = (id(graph), tuple(e.name for e in elements))
        if key not in self.plans:
            self.plans[key] = self._make_plan(graph, elements)
        return self.plans[key]

    def _make_plan(self, graph: Any, elements: list[Any]) -> Plan | None:
        ops = [getattr(e, "op", e) for e in elements]
        seen = {op.name for op in ops}
        queue = deque(ops)
        trainable = {v.op.name for v in graph.get_collection("trainable_variables")}
        initializers = {v.initializer.name for v in graph.get_collection("variables")}
        updates: Counter[str] = Counter()
        train = False
        while queue:
            op = queue.popleft()
            if op.type.startswith(("Apply", "ResourceApply")):
                train = True
            if op.type in ASSIGNS and op.inputs and op.name not in initializers:
                target = op.inputs[0].op.name
                train = train or target in trainable
                if target.rsplit("/", 1)[-1].startswith("moving_"):
                    updates[target] += 1
            for nxt in [t.op for t in op.inputs] + list(op.control_inputs):
                if nxt.name not in seen:
                    seen.add(nxt.name)
                    queue.append(nxt)
        if not train:
            return None
        names = [v.op.name for v in graph.get_collection("variables")]
        variables = {v.op.name: v for v in graph.get_collection("variables")
                     if v.op.name.rsplit("/", 1)[-1] in STATS
                     and "ExponentialMovingAverage" not in v.op.name}
        shadows = [n for n in names if "ExponentialMovingAverage" in n
                   and any(part.startswith("moving_") for part in n.split("/"))]
        inputs = [c for c in self.calls.get(id(graph), [])
                  if c.outputs.op.name in seen and graph.is_fetchable(c.inputs)
                  and graph.is_fetchable(c.outputs)]
        plan = Plan(len(self.plans), variables, inputs)
        layers: dict[str, dict[str, Any]] = {}
        for call in inputs:
            layers.setdefault(call.layer, {"momentum": call.momentum, "towers": 0})["towers"] += 1
        self.log.write("tf1_graph", plan=plan.index, updates=dict(updates), ema_shadows=shadows,
                       layers=layers, variables=sorted(variables),
                       update_ops=len(graph.get_collection("update_ops")))
        self.log.write("files", files=self.log.project_files())
        return plan

    def run(self, original: Any, session: Any, fetches: Any, feed_dict: Any, options: Any,
            run_metadata: Any) -> Any:
        if self.steps >= self.log.max_steps:
            return original(session, fetches, feed_dict, options, run_metadata)
        plan = self.log.guard("tf1 plan", lambda: self.plan(session, fetches))
        if plan is None:
            return original(session, fetches, feed_dict, options, run_metadata)
        before = self.log.guard("tf1 read", lambda: original(session, plan.variables))
        extra = [[c.inputs, c.outputs] for c in plan.inputs]
        outputs, tensors = original(session, [fetches, extra], feed_dict, options, run_metadata)
        self.steps += 1
        self.log.guard("tf1 step", lambda: self._record(original, session, plan, before, tensors))
        return outputs

    def _record(self, original: Any, session: Any, plan: Plan, before: dict | None,
                tensors: list[Any]) -> None:
        import numpy as np

        after = original(session, plan.variables)
        towers: dict[str, list[dict[str, Any]]] = {}
        for call, (x, y) in zip(plan.inputs, tensors):
            x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
            axes = tuple(a for a in range(x.ndim) if a != call.axis % x.ndim)
            towers.setdefault(call.layer, []).append(
                {"mean": values(x.mean(axis=axes)), "output_mean": values(y.mean(axis=axes)),
                 "count": int(x.size // x.shape[call.axis])})
        self.log.write("tf1_step", plan=plan.index, step=self.steps,
                       before={k: values(np.asarray(v)) for k, v in (before or {}).items()},
                       after={k: values(np.asarray(v)) for k, v in after.items()}, towers=towers)


PROBE: Tf1Probe | None = None


def _probe(log: ProbeLog) -> Tf1Probe:
    global PROBE
    if PROBE is None:
        PROBE = Tf1Probe(log)
    return PROBE


def install_session(tensorflow: ModuleType, log: ProbeLog) -> None:
    """Wrap BaseSession.run (tf.compat.v1.Session and InteractiveSession run through it)."""
    from tensorflow.python.client import session

    probe = _probe(log)
    original = session.BaseSession.run

    def run(self: Any, fetches: Any, feed_dict: Any = None, options: Any = None,
            run_metadata: Any = None) -> Any:
        return probe.run(original, self, fetches, feed_dict, options, run_metadata)

    run.__doc__ = original.__doc__
    session.BaseSession.run = run


def install_layers(module: ModuleType, log: ProbeLog) -> None:
    """Record each call of tf-keras's TF1 BN layer (`tf.compat.v1.layers.batch_normalization`):
    its variables' scope, momentum and input tensor."""
    probe = _probe(log)
    layer_class = module.BatchNormalization
    original = layer_class.__call__

    def __call__(self: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        outputs = original(self, inputs, *args, **kwargs)
        log.guard("tf1 layer", lambda: probe.layer_called(self, inputs, outputs,
                                                          kwargs.get("training")))
        return outputs

    layer_class.__call__ = __call__
