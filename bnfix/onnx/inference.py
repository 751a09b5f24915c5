"""`--to inference`: BatchNormalization(training_mode=1) -> inference mode.

A training-mode BN normalizes each batch with its own statistics and also outputs the updated
running mean/var; an exported model should normalize with the stored running statistics. The
rewrite removes `training_mode` and the two extra outputs, which is only faithful when nothing
reads those outputs -- otherwise it is refused.
"""

from __future__ import annotations

from typing import Any

from bnfix.onnx.graph import GraphView, attr, node_label


def training_mode_nodes(graph: Any) -> list[Any]:
    return [n for n in graph.node
            if n.op_type == "BatchNormalization" and attr(n, "training_mode", 0)]


def strip_training_mode(model: Any) -> list[str]:
    """Rewrite every training-mode BN in place; returns one line per node. Raises ValueError
    naming the node when its running-statistics outputs are read."""
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
        dropped = [o for o in node.output[1:] if o]
        del node.output[1:]
        for info in [v for v in model.graph.value_info if v.name in dropped]:
            model.graph.value_info.remove(info)
        lines.append(f"{node_label(node)}: training_mode=1 -> inference (running statistics, "
                     f"epsilon={attr(node, 'epsilon', 1e-5):.3g}); dropped outputs "
                     f"{', '.join(dropped) or '-'}")
    return lines
