"""Which ops a train op runs: its closure over data AND control inputs (`^name`).

A moving-stat update runs in a training step exactly when it is in the closure of the op the
step fetches; a `control_dependencies(UPDATE_OPS)` wrapper is only a control edge, so control
inputs count as much as data inputs. Iterative, so 100k-node chains need no recursion.
"""

from __future__ import annotations

from collections.abc import Iterable

from bnfix.tfgraph.graph_index import GraphIndex

# Ops a training step runs to change weights: the seeds when a graph has no train_op collection.
APPLY_PREFIXES = ("Apply", "ResourceApply", "SparseApply", "ResourceSparseApply")
# Ops that only bundle other ops (tf.group, tf.identity of a train op, control-dep wrappers).
GROUPING_OPS = frozenset({"NoOp", "Identity", "IdentityN"})


def closure(index: GraphIndex, roots: Iterable[str]) -> set[str]:
    """Every node the roots depend on, the roots included."""
    seen: set[str] = set()
    stack = [root for root in roots if root in index.nodes]
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        for producer, _ in index.inputs.get(name, ()):
            if producer not in seen and producer in index.nodes:
                stack.append(producer)
    return seen


def is_gradient_application(index: GraphIndex, name: str, global_steps: set[str]) -> bool:
    op = index.op(name)
    if op.startswith(APPLY_PREFIXES):
        return True
    if op in ("AssignAdd", "AssignAddVariableOp"):
        return index.source(index.data_input(name, 0)) in global_steps
    return False


def outermost(index: GraphIndex, seeds: Iterable[str]) -> list[str]:
    """The ops that bundle the seeds and that nothing runs after: `tf.group(apply_op, ema_op)`
    for an optimizer's apply op, the global-step increment that control-depends on its
    `update` NoOp. Followed: grouping consumers and control-edge consumers; the ends are the
    train ops (what a training loop fetches)."""
    result: list[str] = []
    seen: set[str] = set()
    stack = list(seeds)
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        bundling = [c for c in index.consumers.get(name, [])
                    if index.op(c) in GROUPING_OPS or (name, False) not in index.inputs[c]]
        if bundling:
            stack.extend(bundling)
        else:
            result.append(name)
    return sorted(result)


def find_train_ops(index: GraphIndex, collection: list[str], global_steps: set[str]) -> list[str]:
    """The train_op collection's ops, else the ops that apply gradients, each widened to the
    group that bundles it (what a training loop fetches)."""
    seeds = [name for name in collection if name in index.nodes]
    if not seeds:
        seeds = [name for name in index.nodes
                 if is_gradient_application(index, name, global_steps)]
    return outermost(index, seeds) if seeds else []
