"""An `Artifact` written as plain data (TOML / JSON / dicts): how the artifact rules' examples in
`rules/BN2xx.toml` state their input, and a way to run the rules on values from anywhere.

    kind = "torch-state-dict"          # optional; also path, framework, trained_evidence
    trained = true
    [layers.bn1]                       # one table per BN layer, in order
    gamma = [1.0, 1.0]                 # gamma, beta, mean, var: lists of numbers (nan, inf ok)
    num_batches_tracked = 300          # optional; also keys = {role = "stored key"}
    [graph]                            # optional: GraphFacts fields by name
    train_ops = ["train_op"]
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import numpy as np

from bnfix.artifacts.model import Artifact, BNLayer, GraphFacts

GRAPH_FIELDS = {f.name for f in fields(GraphFacts)}
PAIRS = ("ema_shadows", "unfolded")  # lists of pairs; TOML gives them as lists of lists
SETS = ("frozen_layers", "update_collection")  # sets; TOML gives them as lists


def artifact_from_data(data: dict[str, Any]) -> Artifact:
    framework = data.get("framework", "torch")
    artifact = Artifact(path=data.get("path", "example"), kind=data.get("kind", "example"),
                        trained=data.get("trained"),
                        trained_evidence=data.get("trained_evidence", ""),
                        distributed=bool(data.get("distributed", False)))
    for name, layer in data.get("layers", {}).items():
        unknown = set(layer) - {"gamma", "beta", "mean", "var", "num_batches_tracked", "keys",
                                "framework"}
        if unknown:
            raise ValueError(f"layer {name}: unknown fields {sorted(unknown)}")
        artifact.layers.append(BNLayer(
            name=name, framework=layer.get("framework", framework),
            **{role: _array(layer.get(role)) for role in ("gamma", "beta", "mean", "var")},
            keys=dict(layer.get("keys", {})),
            num_batches_tracked=layer.get("num_batches_tracked")))
    if "graph" in data:
        graph = dict(data["graph"])
        unknown = set(graph) - GRAPH_FIELDS
        if unknown:
            raise ValueError(f"graph: unknown fields {sorted(unknown)}")
        for key in PAIRS:
            if key in graph:
                graph[key] = [tuple(pair) for pair in graph[key]]
        for key in SETS:
            if key in graph:
                graph[key] = set(graph[key])
        artifact.graph = GraphFacts(**graph)
    return artifact


def _array(value: Any) -> np.ndarray | None:
    return None if value is None else np.asarray(value, dtype=np.float64)
