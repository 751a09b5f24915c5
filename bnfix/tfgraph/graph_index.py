"""One pass over a GraphDef: name -> node, each node's inputs (data and control), consumers.

Everything else in the TF graph front-end queries this index, so a graph of 100k nodes is
walked once here and never again by a rule.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

# Ops that pass their first input through (a value or a reference/handle): a variable seen
# through these is still that variable.
PASS_THROUGH = frozenset({
    "Identity", "RefIdentity", "Snapshot", "ReadVariableOp", "Switch", "RefSwitch", "Enter",
    "RefEnter", "StopGradient", "_Retval", "IdentityN",
})
VARIABLE_OPS = frozenset({"VariableV2", "Variable", "VarHandleOp", "_VarHandlesOp"})
FUSED_BN_OPS = frozenset({"FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3"})


def node_name(tensor_ref: str) -> tuple[str, bool]:
    """("name", is_control) of an input string: "name", "name:1", "^name", "fn_node:out:0"."""
    if tensor_ref.startswith("^"):
        return tensor_ref[1:], True
    return tensor_ref.split(":", 1)[0], False


@dataclass
class GraphIndex:
    """Nodes of one graph body (the main graph, or one library function's body)."""

    nodes: dict[str, Any]
    inputs: dict[str, list[tuple[str, bool]]]
    consumers: dict[str, list[str]] = field(default_factory=dict)
    scope: str = ""  # function name for a library function's body, "" for the main graph

    @classmethod
    def build(cls, node_defs: Iterable[Any], scope: str = "") -> GraphIndex:
        nodes: dict[str, Any] = {}
        inputs: dict[str, list[tuple[str, bool]]] = {}
        consumers: dict[str, list[str]] = defaultdict(list)
        for node in node_defs:
            name = node.name
            nodes[name] = node
            edges = [node_name(ref) for ref in node.input]
            inputs[name] = edges
            for producer, _ in edges:
                consumers[producer].append(name)
        return cls(nodes, inputs, dict(consumers), scope)

    def qualified(self, name: str) -> str:
        """A node name as reported: prefixed with its function for library bodies."""
        return f"{self.scope}/{name}" if self.scope else name

    def op(self, name: str) -> str:
        node = self.nodes.get(name)
        return node.op if node is not None else ""

    def data_input(self, name: str, index: int) -> str | None:
        data = [producer for producer, control in self.inputs.get(name, ()) if not control]
        return data[index] if index < len(data) else None

    def source(self, name: str | None) -> str | None:
        """Follow pass-through ops (Identity, ReadVariableOp, Switch, ...) back to the node that
        holds the value: a variable, a constant, or the op that computed it."""
        seen: set[str] = set()
        while name is not None and name not in seen:
            seen.add(name)
            if self.op(name) not in PASS_THROUGH:
                return name
            name = self.data_input(name, 0)
        return name

    def attr_bool(self, name: str, key: str, default: bool = False) -> bool:
        node = self.nodes[name]
        return bool(node.attr[key].b) if key in node.attr else default

    def attr_float(self, name: str, key: str, default: float) -> float:
        node = self.nodes[name]
        return float(node.attr[key].f) if key in node.attr else default

    def function_calls(self) -> set[str]:
        """Names of the library functions this body calls (PartitionedCall, If, While ...)."""
        called: set[str] = set()
        for node in self.nodes.values():
            for value in node.attr.values():
                kind = value.WhichOneof("value")
                if kind == "func":
                    called.add(value.func.name)
                elif kind == "list":
                    called.update(f.name for f in value.list.func)
        return called
