"""Lookups over an ONNX graph that the reader and the rewrites share: constants (initializers,
`Constant` nodes, seen through `Identity`), producers, consumers, attributes."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class GraphView:
    graph: Any
    initializers: dict[str, Any]
    constants: dict[str, Any]           # Constant node output -> its tensor
    producers: dict[str, Any]           # value name -> node that outputs it
    consumers: dict[str, list[Any]]     # value name -> nodes that read it
    outputs: set[str]                   # graph output names

    @classmethod
    def build(cls, graph: Any) -> GraphView:
        from onnx import helper

        producers: dict[str, Any] = {}
        consumers: dict[str, list[Any]] = defaultdict(list)
        constants: dict[str, Any] = {}
        for node in graph.node:
            for out in node.output:
                producers[out] = node
            for name in node.input:
                if name:
                    consumers[name].append(node)
            if node.op_type == "Constant":
                for attr in node.attribute:
                    if attr.name == "value":
                        constants[node.output[0]] = helper.get_attribute_value(attr)
        return cls(graph, {t.name: t for t in graph.initializer}, constants, producers,
                   dict(consumers), {o.name for o in graph.output})

    def constant_source(self, name: str) -> str | None:
        """The initializer/Constant a value is, through Identity nodes; None if computed."""
        seen: set[str] = set()
        while name not in seen:
            seen.add(name)
            if name in self.initializers or name in self.constants:
                return name
            node = self.producers.get(name)
            if node is None or node.op_type != "Identity":
                return None
            name = node.input[0]
        return None

    def constant(self, name: str) -> np.ndarray | None:
        from onnx import numpy_helper

        source = self.constant_source(name) if name else None
        if source is None:
            return None
        tensor = self.initializers[source] if source in self.initializers \
            else self.constants[source]
        return numpy_helper.to_array(tensor)

    def uses(self, name: str) -> int:
        """How many readers a value has (a graph output counts as one)."""
        return len(self.consumers.get(name, [])) + (name in self.outputs)


def attr(node: Any, name: str, default: Any = None) -> Any:
    from onnx import helper

    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def node_label(node: Any) -> str:
    return node.name or node.output[0]
