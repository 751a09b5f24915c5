"""The artifact IR: what every artifact reader lifts a checkpoint, graph or model into.

Readers (torch state dicts, TF checkpoints and graphs, Keras files, ONNX models) each produce one
`Artifact`; the artifact rules (BN201-BN209) see only this, never the file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class BNLayer:
    """One BatchNorm layer found in an artifact, grouped from its stored tensors."""

    name: str                      # layer path as stored: "layer1.0.bn1", "tower_0/bn_conv1"
    framework: str                 # "torch" | "tf" | "keras" | "onnx"
    gamma: Any = None              # numpy arrays (None when the artifact does not hold them)
    beta: Any = None
    mean: Any = None
    var: Any = None
    # role ("gamma", "beta", "mean", "var", "num_batches_tracked", "mean_shadow",
    # "var_shadow": an EMA shadow of a moving stat) -> stored key
    keys: dict[str, str] = field(default_factory=dict)
    num_batches_tracked: int | None = None               # torch only
    flags: dict[str, Any] = field(default_factory=dict)  # reader facts: "training_mode", ...

    @property
    def channels(self) -> int | None:
        for value in (self.gamma, self.beta, self.mean, self.var):
            if value is not None:
                return int(value.shape[0]) if value.shape else 1
        return None


@dataclass
class GraphFacts:
    """What a graph reader found about BN's training machinery (TF graphs, ONNX models)."""

    train_ops: list[str] = field(default_factory=list)
    # moving variable -> the ops that update it, and those reachable from a train op
    update_ops: dict[str, list[str]] = field(default_factory=dict)
    reachable_updates: dict[str, list[str]] = field(default_factory=dict)
    # (shadow variable, moving variable it averages)
    ema_shadows: list[tuple[str, str]] = field(default_factory=list)
    # BN nodes that normalize with batch statistics in a graph meant for inference
    training_mode_nodes: list[str] = field(default_factory=list)
    # (producer node, BN node): Conv/Gemm directly followed by BN in an inference graph
    unfolded: list[tuple[str, str]] = field(default_factory=list)
    inference: bool = False        # a frozen/serving graph or an exported model
    # BN layers whose gamma/beta the graph's trainable_variables collection leaves out
    # (built with trainable=False), and the ops the UPDATE_OPS collection holds
    frozen_layers: set[str] = field(default_factory=set)
    update_collection: set[str] = field(default_factory=set)


@dataclass
class Artifact:
    """One file or folder read by a reader."""

    path: str
    kind: str                      # "torch-state-dict", "safetensors", "tf-checkpoint", ...
    layers: list[BNLayer] = field(default_factory=list)
    trained: bool | None = None    # evidence the artifact was trained (None: unknown)
    trained_evidence: str = ""     # e.g. "num_batches_tracked = 300", "global_step = 1200"
    graph: GraphFacts | None = None
    distributed: bool = False      # prepared for multi-device training (DDP "module." keys, ...)
    notes: list[str] = field(default_factory=list)  # what the reader did: "nested under 'model'"
    seconds: float = 0.0           # time the reader took (shown in the full output)


@dataclass(frozen=True)
class ArtifactFinding:
    code: str
    path: str
    layer: str                     # BN layer (or node) name; "" for the whole artifact
    message: str


class ArtifactError(Exception):
    """An artifact that cannot be read: reported as BN902 with this message, the run goes on."""


def short_reason(exc: BaseException) -> str:
    """The first sentence of a library's error (torch and TF append paragraphs of advice)."""
    lines = str(exc).strip().splitlines()
    text = lines[0] if lines else type(exc).__name__
    head, dot, _ = text.partition(". ")
    return head + "." if dot else text
