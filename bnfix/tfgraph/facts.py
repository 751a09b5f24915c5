"""BN facts of an indexed TF graph: BN layers, moving-stat update ops, EMA shadows, train-mode
and unfolded BN in inference graphs (the GraphFacts behind BN203-BN206 and BN208)."""

from __future__ import annotations

from collections import defaultdict

from bnfix.tfgraph.graph_index import FUSED_BN_OPS, VARIABLE_OPS, GraphIndex

ROLES = {"gamma": "gamma", "beta": "beta", "moving_mean": "mean", "moving_variance": "var"}
MOVING = ("moving_mean", "moving_variance")
# Ops that write their first input (a variable) with their second.
WRITE_OPS = frozenset({"Assign", "AssignSub", "AssignAdd", "AssignVariableOp",
                       "AssignSubVariableOp", "AssignAddVariableOp"})
RESTORE_OPS = frozenset({"RestoreV2", "Restore", "RestoreSlice"})
CONV_OPS = frozenset({"Conv2D", "Conv3D", "DepthwiseConv2dNative", "MatMul",
                      "Conv2DBackpropInput"})


def role_of(name: str) -> tuple[str, str] | None:
    """("layer/prefix", role) for a node named like a BN parameter, e.g. "bn1/moving_mean"."""
    prefix, _, last = name.rpartition("/")
    return (prefix, ROLES[last]) if last in ROLES else None


def variables(index: GraphIndex) -> list[str]:
    return [name for name, node in index.nodes.items() if node.op in VARIABLE_OPS]


def stat_updates(index: GraphIndex, initializers: set[str]) -> dict[str, list[str]]:
    """Update ops per moving variable: writes to a moving_mean/moving_variance variable (through
    Identity/Switch/ReadVariableOp) that are neither its initializer nor a checkpoint restore."""
    updates: dict[str, list[str]] = defaultdict(list)
    for name, node in index.nodes.items():
        if node.op not in WRITE_OPS:
            continue
        target = index.source(index.data_input(name, 0))
        if target is None or index.op(target) not in VARIABLE_OPS:
            continue
        if target.rpartition("/")[2] not in MOVING:
            continue
        if name in initializers or name == f"{target}/Assign":
            continue
        value = index.source(index.data_input(name, 1)) or ""
        if value.startswith(f"{target}/Initializer/") or index.op(value) in RESTORE_OPS:
            continue
        updates[target].append(name)
    return {var: sorted(ops) for var, ops in sorted(updates.items())}


def ema_shadows(variable_names: list[str]) -> list[tuple[str, str]]:
    """(shadow, moving variable): a variable nested one level under a moving statistic is its
    ExponentialMovingAverage shadow (or an optimizer-style slot, as bad: stats are not weights)."""
    names = set(variable_names)
    shadows = []
    for name in sorted(names):
        parent, _, _ = name.rpartition("/")
        if parent in names and parent.rpartition("/")[2] in MOVING:
            shadows.append((name, parent))
    return shadows


def fused_bn_nodes(index: GraphIndex) -> list[str]:
    return [name for name, node in index.nodes.items() if node.op in FUSED_BN_OPS]


def training_mode_nodes(index: GraphIndex) -> list[str]:
    """FusedBatchNorm* nodes that normalize with the batch's statistics."""
    return [index.qualified(n) for n in fused_bn_nodes(index)
            if index.attr_bool(n, "is_training", default=True)]


def unfolded(index: GraphIndex) -> list[tuple[str, str]]:
    """(Conv2D/MatMul, FusedBatchNorm) pairs, optionally with a BiasAdd between, where the conv
    feeds only that path: the BN could be folded into the conv's weights."""
    pairs = []
    for bn in fused_bn_nodes(index):
        if index.attr_bool(bn, "is_training", default=True):
            continue
        producer = index.data_input(bn, 0)
        chain = [bn]
        if producer is not None and index.op(producer) == "BiasAdd":
            chain.append(producer)
            producer = index.data_input(producer, 0)
        if producer is None or index.op(producer) not in CONV_OPS:
            continue
        sole = all(len(index.consumers.get(n, [])) == 1 for n in [producer, *chain[1:]])
        if sole:
            pairs.append((index.qualified(producer), index.qualified(bn)))
    return pairs


def is_distributed(index: GraphIndex, updates: dict[str, list[str]]) -> bool:
    """Towers: BN nodes placed on several devices, or a moving statistic written by several
    update ops (one per tower)."""
    devices = {index.nodes[n].device for n in fused_bn_nodes(index) if index.nodes[n].device}
    return len(devices) > 1 or any(len(ops) > 1 for ops in updates.values())
