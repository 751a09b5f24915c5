"""Per-layer errors of one run against the reference, tolerances, and the verdict.

Framework-neutral (numpy only): the torch runner, the Keras and TF1 workers all reduce their
runs to `Trace`s and compare them here, so every framework's numbers mean the same thing.

Errors. For each layer and each category of its tensors (parameter gradients, running
statistics) the error is the max abs difference over every step and replica divided by the max
abs value of the reference over the same tensors: normwise, so a tensor that is exactly zero in
exact arithmetic (the gradient of a conv bias right before a BN is rounding noise) does not read
as a 100% error while its layer's weight gradient is well matched. The denominator has a floor:
1e-3 of the largest reference value of that category (gradients, running statistics) over the
model. A layer whose gradients are a thousandth of the model's largest or less (LeViT's
attention BN, a bias before a conv and a BN) receives rounding of the large ones undiminished:
in fp32 that read as 1.3e-4 relative there while every other layer was at 1e-6, and as 1e-14
in fp64; likewise a running mean that is 0 in exact arithmetic (2e-9 next to variances of 1).
Against the model's scale it is what it is, rounding; a sync bug moves a layer's gradients and
statistics by their own size, and the outputs with them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

# Max relative error allowed, by dtype: a few ulps grown over K steps of a deep model
# (fp32 runs measure 1e-7..1e-5; fp64 1e-15..1e-12).
TOLERANCE = {"float32": 1e-4, "float64": 1e-10}
MODEL = ""  # the layer name of model-level quantities (output, loss, input gradient)
_FLOOR = {"grad": 1e-3, "state": 1e-3}  # by category; 1e-6 for model-level quantities
_DEFAULT_FLOOR = 1e-6
_TINY = 1e-300

Key = tuple[str, str]  # (layer path, quantity): ("", "output"), ("conv1", "weight.grad")


def category(key: Key) -> str:
    """What a tensor is: model-level quantities are their own category."""
    layer, quantity = key
    if layer == MODEL:
        return quantity
    return "grad" if quantity.endswith(".grad") else "state"


@dataclass
class Trace:
    """One run's numbers. `steps[s]` maps a key to its value at step s (outputs and input
    gradients of all replicas concatenated in replica order; gradients summed over replicas);
    `final[r]` maps a key to replica r's running statistics after the last step."""

    steps: list[dict[Key, np.ndarray]] = field(default_factory=list)
    final: list[dict[Key, np.ndarray]] = field(default_factory=list)


@dataclass(frozen=True)
class TensorError:
    name: str  # the quantity: "output", "weight.grad", "running_var", ...
    max_abs: float
    scale: float  # max abs value of the reference
    max_rel: float


@dataclass(frozen=True)
class LayerError:
    layer: str  # dotted/slashed path; "(output)", "(loss)", "(input grad)" for model-level rows
    kind: str  # the layer's class (e.g. "BatchNorm2d"), "" for model-level rows
    max_abs: float
    max_rel: float
    tensors: tuple[TensorError, ...]


@dataclass(frozen=True)
class RunComparison:
    """One N-replica run (synced or unsynced) against the single-device global-batch run."""

    label: str
    layers: tuple[LayerError, ...]
    replica_drift: float  # max abs difference between replicas' running statistics

    @property
    def max_rel(self) -> float:
        return max((layer.max_rel for layer in self.layers), default=0.0)

    def worst(self) -> LayerError | None:
        return max(self.layers, key=lambda layer: layer.max_rel, default=None)


@dataclass(frozen=True)
class Refusal:
    path: str
    layer_class: str
    reason: str


@dataclass(frozen=True)
class Fidelity:
    """A conversion run in eval mode on the same weights as the original, outputs compared."""

    name: str  # "convert_sync", "revert_sync", "fold", ...
    max_abs: float
    max_rel: float
    converted: int
    refused: tuple[Refusal, ...] = ()
    note: str = ""
    problem: str = ""  # a failure the outputs do not show (e.g. classes not restored)


@dataclass(frozen=True)
class Validation:
    """Everything `bnfix validate torch|keras|tf1` measured; serialised as the JSON report."""

    kind: str
    model: str
    settings: dict[str, Any]
    tolerance: float
    fidelity: tuple[Fidelity, ...]
    synced: RunComparison
    unsynced: RunComparison
    seconds: dict[str, float]
    # Measured rounding noise, when a runner provides it (see bnfix.validate.rounding): runs
    # equal to the reference in exact arithmetic, every run on step 1 alone, and the synced
    # run against the reference again in float64 when float32 differed by more than rounding.
    noise: RunComparison | None = None
    first_step: dict[str, RunComparison] | None = None
    float64: dict[str, RunComparison] | None = None

    @property
    def failures(self) -> list[str]:
        """What is out of tolerance, in words (empty: the validation passed)."""
        found = [f"conversion {f.name}: max rel error {f.max_rel:.1e}" for f in self.fidelity
                 if not f.max_rel <= self.tolerance]
        found += [f"conversion {f.name}: {f.problem}" for f in self.fidelity if f.problem]
        if self.noise is not None:
            from bnfix.validate.rounding import synced_failures

            return found + synced_failures(self)
        found += [f"synced training, {layer.layer}: max rel error {layer.max_rel:.1e}"
                  for layer in self.synced.layers if not layer.max_rel <= self.tolerance]
        return found

    @property
    def passed(self) -> bool:
        return not self.failures

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data = {"schema": "bnfix-validate/1", "verdict": "pass" if self.passed else "fail",
                **data, "failures": self.failures}
        for run in ("synced", "unsynced"):
            data[run]["max_rel"] = getattr(self, run).max_rel
        for optional in ("noise", "first_step", "float64"):
            if data[optional] is None:
                del data[optional]
        if self.noise is not None:
            from bnfix.validate.rounding import json_fields

            data.update(json_fields(self))
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Validation:
        def run(raw: dict[str, Any]) -> RunComparison:
            layers = tuple(
                LayerError(raw_layer["layer"], raw_layer["kind"], raw_layer["max_abs"],
                           raw_layer["max_rel"],
                           tuple(TensorError(**t) for t in raw_layer["tensors"]))
                for raw_layer in raw["layers"])
            return RunComparison(raw["label"], layers, raw["replica_drift"])

        fidelity = tuple(Fidelity(**{**f, "refused": tuple(Refusal(**r) for r in f["refused"])})
                         for f in data["fidelity"])
        first, confirm = data.get("first_step"), data.get("float64")
        return cls(data["kind"], data["model"], data["settings"], data["tolerance"], fidelity,
                   run(data["synced"]), run(data["unsynced"]), data["seconds"],
                   run(data["noise"]) if data.get("noise") else None,
                   {name: run(raw) for name, raw in first.items()} if first else None,
                   {name: run(raw) for name, raw in confirm.items()} if confirm else None)


def tolerance_for(dtype: str, override: float | None) -> float:
    return override if override is not None else TOLERANCE[dtype]


def output_error(got: np.ndarray, want: np.ndarray) -> tuple[float, float]:
    """(max abs, max abs / max abs of `want`) of two outputs: a conversion's fidelity."""
    got64, want64 = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got64.shape != want64.shape:
        return float("inf"), float("inf")
    diff = float(np.max(np.abs(got64 - want64), initial=0.0))
    scale = float(np.max(np.abs(want64), initial=0.0))
    return diff, (diff / max(scale, _TINY) if diff else 0.0)


_ROW_NAMES = {"output": "(output)", "loss": "(loss)", "input_grad": "(input grad)"}


def _pairs(ref: Trace, run: Trace) -> dict[Key, list[tuple[np.ndarray, np.ndarray]]]:
    """Every (got, want) pair per key: each step, and each replica's final state."""
    if len(ref.steps) != len(run.steps):
        raise ValueError(f"{len(run.steps)} steps recorded against {len(ref.steps)}")
    pairs: dict[Key, list[tuple[np.ndarray, np.ndarray]]] = {}
    for got_step, want_step in zip(run.steps, ref.steps, strict=True):
        for key, want in want_step.items():
            pairs.setdefault(key, []).append((got_step[key], want))
    for replica in run.final:
        for key, want in ref.final[0].items():
            pairs.setdefault(key, []).append((replica[key], want))
    return pairs


def _tensor_errors(pairs: list[tuple[np.ndarray, np.ndarray]]) -> tuple[float, float]:
    diff = scale = 0.0
    for got, want in pairs:
        got64, want64 = np.asarray(got, np.float64), np.asarray(want, np.float64)
        if got64.shape != want64.shape:
            return float("inf"), float(np.max(np.abs(want64), initial=0.0))
        diff = max(diff, float(np.max(np.abs(got64 - want64), initial=0.0)))
        scale = max(scale, float(np.max(np.abs(want64), initial=0.0)))
    return diff, scale


def compare(label: str, ref: Trace, run: Trace, kinds: dict[str, str]) -> RunComparison:
    """Per-layer errors of `run` against `ref`; `kinds` maps layer paths to class names."""
    measured = {key: _tensor_errors(pairs) for key, pairs in _pairs(ref, run).items()}
    top: dict[str, float] = {}
    for key, (_, scale) in measured.items():
        top[category(key)] = max(top.get(category(key), 0.0), scale)
    by_layer: dict[str, dict[str, list[tuple[str, float, float]]]] = {}
    for key, (diff, scale) in measured.items():
        layer, quantity = key
        by_layer.setdefault(layer, {}).setdefault(category(key), []).append(
            (quantity, diff, scale))
    layers: list[LayerError] = []
    for layer, categories in by_layer.items():
        tensors: list[TensorError] = []
        layer_abs = layer_rel = 0.0
        for cat, rows in categories.items():
            floor = _FLOOR.get(cat, _DEFAULT_FLOOR) * top[cat]
            denominator = max(max(s for _, _, s in rows), floor, _TINY)
            for quantity, diff, scale in rows:
                rel = diff / denominator if diff else 0.0
                tensors.append(TensorError(quantity, diff, scale, rel))
                layer_abs, layer_rel = max(layer_abs, diff), max(layer_rel, rel)
        if layer == MODEL:  # one row per model-level quantity
            layers += [LayerError(_ROW_NAMES.get(t.name, t.name), "", t.max_abs, t.max_rel, (t,))
                       for t in tensors]
            continue
        layers.append(LayerError(layer, kinds.get(layer, ""), layer_abs, layer_rel,
                                 tuple(tensors)))
    return RunComparison(label, tuple(layers), replica_drift(run.final))


def replica_drift(finals: Iterable[dict[Key, np.ndarray]]) -> float:
    """How far the replicas' running statistics ended apart (0 when they agree)."""
    replicas = list(finals)
    drift = 0.0
    for other in replicas[1:]:
        for key, value in replicas[0].items():
            diff = np.abs(np.asarray(other[key], np.float64) - np.asarray(value, np.float64))
            drift = max(drift, float(np.max(diff, initial=0.0)))
    return drift


@dataclass(frozen=True)
class NotReporting:
    """What a non-reporting rank of a `torchrun` / TF_CONFIG job ends with: the exit code the
    reporting rank decided (every rank exits alike), and no output of its own."""

    exit_code: int
