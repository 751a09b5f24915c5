"""`read_onnx`: an ONNX model -> `Artifact` (BN layers from BatchNormalization nodes, and the
facts behind BN206 / BN208). An exported model is an inference artifact."""

from __future__ import annotations

from bnfix.artifacts.model import Artifact, BNLayer, GraphFacts
from bnfix.onnx.external_data import load_model
from bnfix.onnx.fold import why_not_foldable
from bnfix.onnx.graph import GraphView, attr, node_label

ROLES = ("gamma", "beta", "mean", "var")  # BatchNormalization inputs 1..4


def read_onnx(path: str) -> Artifact:
    """Read PATH (external data confined to its folder). Raises ArtifactError, one line."""
    model = load_model(path)
    view = GraphView.build(model.graph)
    layers, training, unfolded = [], [], []
    for node in model.graph.node:
        if node.op_type != "BatchNormalization":
            continue
        label = node_label(node)
        layer = BNLayer(label, "onnx")
        for role, name in zip(ROLES, node.input[1:5]):
            layer.keys[role] = name
            setattr(layer, role, view.constant(name))
        layer.flags = {"training_mode": bool(attr(node, "training_mode", 0)),
                       "epsilon": float(attr(node, "epsilon", 1e-5)),
                       "momentum": float(attr(node, "momentum", 0.9))}
        layers.append(layer)
        if layer.flags["training_mode"]:
            training.append(label)
        elif not isinstance(plan := why_not_foldable(view, node), str):
            unfolded.append((node_label(plan.producer), label))
    graph = GraphFacts(training_mode_nodes=training, unfolded=unfolded, inference=True)
    return Artifact(path=path, kind="onnx", layers=layers, graph=graph)
