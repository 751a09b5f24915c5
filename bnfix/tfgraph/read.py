"""`read_tf_graph`: a TF graph file (.meta, .pb, .pbtxt, SavedModel) -> `Artifact` with
`GraphFacts`, for `bnfix inspect` and the artifact rules."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from bnfix.artifacts.grouping import as_vector
from bnfix.artifacts.model import Artifact, ArtifactError, BNLayer, GraphFacts
from bnfix.tfgraph import facts
from bnfix.tfgraph.graph_index import GraphIndex
from bnfix.tfgraph.load import LoadedGraph, load_graph
from bnfix.tfgraph.reachability import closure, find_train_ops
from bnfix.tfgraph.tensors import tensor_to_numpy

FUSED_INPUT_ROLES = ("gamma", "beta", "mean", "var")  # FusedBatchNorm inputs 1..4


def read_tf_graph(path: str) -> Artifact:
    """Read a TF graph artifact without executing it. Raises ArtifactError (one line) when the
    file is not a readable graph."""
    loaded = load_graph(path)
    index = GraphIndex.build(loaded.graph_def.node)
    global_steps = set(loaded.collections.get("global_step", [])) | (
        {"global_step"} if "global_step" in index.nodes else set())
    train_ops = find_train_ops(index, loaded.collections.get("train_op", [])
                               + loaded.collections.get("train_ops", []), global_steps)
    # An exported graph meant to serve: a frozen GraphDef or a SavedModel, with nothing to train.
    inference = not train_ops and (loaded.kind == "tf-graphdef" or loaded.serving)
    updates = facts.stat_updates(index, loaded.initializers)
    step_closure = closure(index, train_ops)
    reachable = {var: [op for op in ops if op in step_closure] for var, ops in updates.items()}
    bodies = [index, *_called_functions(loaded.graph_def, index)] if inference else [index]

    graph = GraphFacts(
        train_ops=train_ops,
        update_ops=updates,
        reachable_updates=reachable if train_ops else {},
        ema_shadows=facts.ema_shadows(facts.variables(index)),
        training_mode_nodes=[n for body in bodies for n in facts.training_mode_nodes(body)]
        if inference else [],
        unfolded=[pair for body in bodies for pair in facts.unfolded(body)] if inference else [],
        inference=inference,
    )
    checkpoint = _Checkpoint(loaded.checkpoint)
    layers = _layers(bodies, checkpoint)
    graph.update_collection = set(loaded.collections.get("update_ops", []))
    if "trainable_variables" in loaded.collections:
        trainable = set(loaded.collections["trainable_variables"])
        graph.frozen_layers = {
            layer.name for layer in layers
            if any(role in layer.keys for role in ("gamma", "beta"))
            and not any(layer.keys.get(role) in trainable for role in ("gamma", "beta"))}
    artifact = Artifact(path=path, kind=loaded.kind, layers=layers, graph=graph,
                        distributed=facts.is_distributed(index, updates))
    step = next((checkpoint.value(name) for name in sorted(global_steps)
                 if checkpoint.value(name) is not None), None)
    if step is not None and np.size(step) == 1:
        artifact.trained = int(np.reshape(step, ())) > 0
        artifact.trained_evidence = f"global_step = {int(np.reshape(step, ()))}"
    elif checkpoint.reader is not None:
        from bnfix.artifacts.tf_checkpoint import training_evidence

        evidence = training_evidence(checkpoint.reader)
        if evidence is not None:
            artifact.trained, artifact.trained_evidence = evidence
    if loaded.checkpoint is not None:
        artifact.notes.append(f"values from the checkpoint {Path(loaded.checkpoint).name}")
    return artifact


def _called_functions(graph_def: Any, index: GraphIndex) -> list[GraphIndex]:
    """Library function bodies the main graph calls, transitively (a TF2 SavedModel's serving
    function lives there). Functions only the object graph references -- Keras' training-mode
    traces -- are not called from the serving graph and stay out."""
    library = {f.signature.name: f for f in graph_def.library.function}
    bodies: list[GraphIndex] = []
    pending = sorted(index.function_calls())
    seen: set[str] = set()
    while pending:
        name = pending.pop()
        if name in seen or name not in library:
            continue
        seen.add(name)
        body = GraphIndex.build(library[name].node_def, scope=name)
        bodies.append(body)
        pending.extend(sorted(body.function_calls()))
    return bodies


class _Checkpoint:
    """Variable values from the checkpoint next to a .meta or inside a SavedModel, if any."""

    def __init__(self, prefix: str | None) -> None:
        self.reader: Any = None
        if prefix is None:
            return
        from tensorflow.python.framework import errors
        from tensorflow.python.training import py_checkpoint_reader

        try:
            self.reader = py_checkpoint_reader.NewCheckpointReader(prefix)
        except errors.OpError as exc:
            message = " ".join(str(exc).split())
            raise ArtifactError(f"cannot read the checkpoint {prefix}: {message}") from exc

    def value(self, name: str) -> Any:
        """The stored value of `name` (its declared size checked first), or None."""
        if self.reader is None or not self.reader.has_tensor(name):
            return None
        from bnfix.artifacts.tf_checkpoint import tensor_access

        fetch, _ = tensor_access(self.reader)
        return fetch(name)


def _layers(bodies: list[GraphIndex], checkpoint: _Checkpoint) -> list[BNLayer]:
    """BN layers: variables `prefix/{gamma,beta,moving_mean,moving_variance}` holding both moving
    statistics (LayerNorm's gamma/beta alone are not BN), and every FusedBatchNorm node's
    parameters -- grouped under the variables' prefix when they resolve to named variables or
    constants, under the node's own name otherwise."""
    layers: dict[str, BNLayer] = {}
    main = bodies[0]
    candidates: dict[str, dict[str, str]] = {}
    for name in facts.variables(main):
        found = facts.role_of(name)
        if found:
            candidates.setdefault(found[0], {})[found[1]] = name
    for prefix, keys in candidates.items():
        if "mean" in keys and "var" in keys:
            layers[prefix] = BNLayer(prefix, "tf", keys=dict(sorted(keys.items())))
    for body in bodies:
        for bn in facts.fused_bn_nodes(body):
            _add_fused(layers, body, bn)
    for layer in layers.values():
        for role, key in layer.keys.items():
            if getattr(layer, role) is None:
                setattr(layer, role, as_vector(checkpoint.value(key)))
    return list(layers.values())


def _add_fused(layers: dict[str, BNLayer], body: GraphIndex, bn: str) -> None:
    sources = {role: body.source(body.data_input(bn, i + 1))
               for i, role in enumerate(FUSED_INPUT_ROLES)}
    named = [facts.role_of(src) for src in sources.values() if src]
    prefixes = {found[0] for found in named if found}
    layer_name = body.qualified(prefixes.pop() if len(prefixes) == 1 else bn)
    layer = layers.setdefault(layer_name, BNLayer(layer_name, "tf"))
    layer.flags.setdefault("nodes", []).append(body.qualified(bn))
    training = body.attr_bool(bn, "is_training", default=True)
    layer.flags["training_mode"] = layer.flags.get("training_mode", False) or training
    layer.flags["epsilon"] = body.attr_float(bn, "epsilon", 1e-3)
    for role, src in sources.items():
        if src is None:
            continue
        value = None
        if body.op(src) == "Const":
            value = tensor_to_numpy(body.nodes[src].attr["value"].tensor)
            if value is None or not value.size:  # training-mode BN is fed empty mean/var
                continue
        if role not in layer.keys and (facts.role_of(src) or value is not None):
            layer.keys[role] = body.qualified(src)
        if value is not None and getattr(layer, role) is None:
            setattr(layer, role, as_vector(value))


def describe(artifact: Artifact) -> str:
    """A few lines on what was found (used by the tests and the README example)."""
    g = artifact.graph
    assert g is not None
    lines = [(f"{Path(artifact.path).name}: {artifact.kind}, {len(artifact.layers)} BN layers,"
              f" train ops {g.train_ops or '-'}, inference={g.inference}")]
    for var, ops in g.update_ops.items():
        lines.append(f"  {var}: {len(ops)} update ops, "
                     f"{len(g.reachable_updates.get(var, []))} reachable")
    lines += [f"  EMA shadow {shadow}" for shadow, _ in g.ema_shadows]
    lines += [f"  training-mode BN {node}" for node in g.training_mode_nodes]
    lines += [f"  unfolded {conv} -> {bn}" for conv, bn in g.unfolded]
    return "\n".join(lines)


__all__ = ["LoadedGraph", "describe", "read_tf_graph"]
