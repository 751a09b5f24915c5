"""Folding an inference-mode BatchNormalization into the Conv / ConvTranspose / Gemm before it.

ONNX BN computes  y = scale * (x - mean) / sqrt(var + epsilon) + B  with the *stored* `var`
used as-is (no Bessel correction at inference; torch and TF1 store the unbiased variance, Keras 3
the biased one, and whichever was stored is what the model computes) and `momentum` matters only
for training. With s = scale / sqrt(var + epsilon) per output channel:
  W' = W * s  (along the output-channel axis),  b' = (b - mean) * s + B.
The output-channel axis is axis 0 of a Conv weight (C_out, C_in/g, k...), axis 1 *within each
group* of a ConvTranspose weight (C_in, C_out/g, k...), and the N axis of Gemm's B (axis 0 with
transB=1, axis 1 otherwise).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from bnfix.onnx.graph import GraphView, attr, node_label

FOLDABLE = ("Conv", "ConvTranspose", "Gemm")


@dataclass
class FoldPlan:
    producer: Any
    bn: Any
    weight: np.ndarray
    bias: np.ndarray | None
    scale: np.ndarray
    shift: np.ndarray  # B - mean * s

    def describe(self) -> str:
        extra = ""
        if self.producer.op_type != "Gemm" and attr(self.producer, "group", 1) != 1:
            extra = f", group={attr(self.producer, 'group')}"
        elif self.producer.op_type == "Gemm":
            extra = f", transB={attr(self.producer, 'transB', 0)}"
        return (f"folded {node_label(self.bn)} (BatchNormalization) into "
                f"{node_label(self.producer)} ({self.producer.op_type}{extra})")


def why_not_foldable(view: GraphView, bn: Any) -> str | FoldPlan:
    """A FoldPlan for BN, or the reason it cannot be folded (a sentence for the user)."""
    if attr(bn, "training_mode", 0):
        return "it normalizes with batch statistics (training_mode=1): convert --to inference first"
    if len(bn.output) > 1 and any(view.uses(o) for o in bn.output[1:] if o):
        return "its running-statistics outputs are used"
    producer = view.producers.get(bn.input[0])
    if producer is None or producer.op_type not in FOLDABLE:
        return "its input does not come from a Conv, ConvTranspose or Gemm"
    if producer.output[0] != bn.input[0] or view.uses(bn.input[0]) != 1:
        return f"{node_label(producer)}'s output is used by other nodes too"
    params = [view.constant(name) for name in bn.input[1:5]]
    if any(p is None for p in params):
        return "its scale/B/mean/var are not constants"
    weight = view.constant(producer.input[1])
    bias = view.constant(producer.input[2]) if len(producer.input) > 2 and \
        producer.input[2] else None
    if weight is None or (len(producer.input) > 2 and producer.input[2] and bias is None):
        return f"{node_label(producer)}'s weights are not constants"
    if not np.issubdtype(weight.dtype, np.floating):
        return f"{node_label(producer)}'s weights are not floating point"
    gamma, beta, mean, var = (np.asarray(p, dtype=np.float64) for p in params)
    scale = gamma / np.sqrt(var + float(attr(bn, "epsilon", 1e-5)))
    return FoldPlan(producer, bn, weight, bias, scale, beta - mean * scale)


def folded_weights(plan: FoldPlan) -> tuple[np.ndarray, np.ndarray]:
    """(W', b') in the producer's dtype, per the layouts in the module docstring."""
    w = plan.weight.astype(np.float64)
    s = plan.scale
    op = plan.producer.op_type
    if op == "Conv":
        w = w * s.reshape((-1,) + (1,) * (w.ndim - 1))
        bias = np.zeros(w.shape[0]) if plan.bias is None else plan.bias.astype(np.float64)
        b = bias * s + plan.shift
    elif op == "ConvTranspose":
        groups = int(attr(plan.producer, "group", 1))
        c_in, per_group = w.shape[0], w.shape[1]
        grouped = w.reshape((groups, c_in // groups, per_group) + w.shape[2:])
        grouped = grouped * s.reshape((groups, 1, per_group) + (1,) * (w.ndim - 2))
        w = grouped.reshape(w.shape)
        bias = np.zeros(groups * per_group) if plan.bias is None else \
            plan.bias.astype(np.float64)
        b = bias * s + plan.shift
    else:  # Gemm: Y = alpha * A @ B' + beta * C
        w = w * (s[:, None] if attr(plan.producer, "transB", 0) else s[None, :])
        c = np.zeros(s.shape) if plan.bias is None else plan.bias.astype(np.float64)
        b = float(attr(plan.producer, "beta", 1.0)) * c * s + plan.shift
        b = np.broadcast_to(b, np.broadcast_shapes(b.shape, s.shape)).copy()
    dtype = plan.weight.dtype
    return w.astype(dtype), b.astype(dtype)


def apply_fold(model: Any, plan: FoldPlan, weight: np.ndarray, bias: np.ndarray) -> None:
    """Rewrite the graph: the producer reads new initializers W', b' and writes the BN's output
    name (so every reader and graph output is untouched); the BN node is removed."""
    from onnx import helper, numpy_helper

    graph = model.graph
    producer, bn = plan.producer, plan.bn
    existing = {t.name for t in graph.initializer} | {o for n in graph.node for o in n.output}
    base = node_label(producer).strip("/").replace("/", "_") or "folded"

    def fresh(suffix: str) -> str:
        name, i = f"{base}_{suffix}", 1
        while name in existing:
            name, i = f"{base}_{suffix}_{i}", i + 1
        existing.add(name)
        return name

    w_name, b_name = fresh("bnfolded_weight"), fresh("bnfolded_bias")
    graph.initializer.extend([numpy_helper.from_array(weight, w_name),
                              numpy_helper.from_array(bias, b_name)])
    inputs = list(producer.input)
    inputs[1:] = [w_name, b_name]
    del producer.input[:]
    producer.input.extend(inputs)
    if producer.op_type == "Gemm":
        for a in list(producer.attribute):
            if a.name == "beta":
                producer.attribute.remove(a)
        producer.attribute.append(helper.make_attribute("beta", 1.0))
    old_out = producer.output[0]
    producer.output[0] = bn.output[0]
    graph.node.remove(bn)
    for info in list(graph.value_info):
        if info.name == old_out:
            graph.value_info.remove(info)


def remove_unused(model: Any) -> None:
    """Drop initializers, Constant and Identity nodes that nothing reads any more."""
    graph = model.graph
    while True:
        used = {name for node in graph.node for name in node.input} | \
            {o.name for o in graph.output}
        dead = [n for n in graph.node if n.op_type in ("Constant", "Identity")
                and not any(o in used for o in n.output)]
        for node in dead:
            graph.node.remove(node)
        if not dead:
            break
    used = {name for node in graph.node for name in node.input} | {o.name for o in graph.output}
    removed = {t.name for t in graph.initializer if t.name not in used}
    for tensor in [t for t in graph.initializer if t.name in removed]:
        graph.initializer.remove(tensor)
    # IR < 4 models also list initializers as graph inputs
    for value in [i for i in graph.input if i.name in removed]:
        graph.input.remove(value)
