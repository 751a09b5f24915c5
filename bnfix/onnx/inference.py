"""`--to inference`: every training-mode node -> inference mode.

A model exported in training mode carries two kinds of training-only behaviour:
- BatchNormalization(training_mode=1) normalizes each batch with its own statistics and also
  outputs the updated running mean/var; in inference it normalizes with the stored running
  statistics. The rewrite removes `training_mode` and the two extra outputs.
- Dropout with its `training_mode` input true zeroes a random part of its input on every run;
  in inference it is the identity. The rewrite drops the `training_mode` input (false by
  default) and the `mask` output.
Either is only faithful when nothing reads the dropped outputs -- otherwise it is refused. Nodes
that draw random numbers whatever the mode (RandomNormal, Bernoulli, ...) cannot be made
deterministic this way: a model that still holds one after the rewrite is refused.
"""

from __future__ import annotations

from typing import Any

from bnfix.onnx.graph import GraphView, attr, node_label

RANDOM_OPS = frozenset({"RandomNormal", "RandomNormalLike", "RandomUniform",
                        "RandomUniformLike", "Bernoulli", "Multinomial"})


def training_mode_nodes(graph: Any) -> list[Any]:
    """Training-mode BatchNormalization nodes."""
    return [n for n in graph.node
            if n.op_type == "BatchNormalization" and attr(n, "training_mode", 0)]


def training_dropouts(graph: Any) -> list[Any]:
    """Dropout nodes whose `training_mode` input is not known to be false (a constant false
    one, or none, is already inference)."""
    view = GraphView.build(graph)
    found = []
    for node in graph.node:
        if node.op_type != "Dropout" or len(node.input) < 3 or not node.input[2]:
            continue
        value = view.constant(node.input[2])
        if value is None or bool(value.reshape(-1)[0] if value.size else False):
            found.append(node)
    return found


def random_nodes(graph: Any) -> list[Any]:
    return [n for n in graph.node if n.op_type in RANDOM_OPS]


def _drop_outputs(model: Any, node: Any, keep: int) -> list[str]:
    dropped = [o for o in node.output[keep:] if o]
    del node.output[keep:]
    for info in [v for v in model.graph.value_info if v.name in dropped]:
        model.graph.value_info.remove(info)
    return dropped


def strip_training_mode(model: Any) -> list[str]:
    """Rewrite every training-mode BN and Dropout in place; returns one line per node. Raises
    ValueError naming the node when an output it loses is read."""
    view = GraphView.build(model.graph)
    lines = []
    for node in training_mode_nodes(model.graph):
        used = [o for o in node.output[1:] if o and view.uses(o)]
        if used:
            raise ValueError(f"{node_label(node)}: its running-statistics outputs {used} are "
                             "read by the graph; an inference-mode BN does not produce them")
        for a in list(node.attribute):
            if a.name == "training_mode":
                node.attribute.remove(a)
        dropped = _drop_outputs(model, node, 1)
        lines.append(f"{node_label(node)}: training_mode=1 -> inference (running statistics, "
                     f"epsilon={attr(node, 'epsilon', 1e-5):.3g}); dropped outputs "
                     f"{', '.join(dropped) or '-'}")
    for node in training_dropouts(model.graph):
        used = [o for o in node.output[1:] if o and view.uses(o)]
        if used:
            raise ValueError(f"{node_label(node)}: its dropout mask {used} is read by the "
                             "graph; an inference-mode Dropout does not produce it")
        inputs = list(node.input[:2])
        del node.input[:]
        node.input.extend(inputs)
        dropped = _drop_outputs(model, node, 1)
        lines.append(f"{node_label(node)}: Dropout training_mode -> inference (identity); "
                     f"dropped outputs {', '.join(dropped) or '-'}")
    return lines


def has_training_behaviour(graph: Any) -> bool:
    return bool(training_mode_nodes(graph) or training_dropouts(graph))
