"""Per-layer errors of one run against the reference, tolerances, and the verdict.

Framework-neutral (numpy only): the torch runner, the Keras and TF1 workers all reduce their
runs to `Trace`s and compare them here, so every framework's numbers mean the same thing.

Errors. For each layer and each category of its tensors (parameter gradients, running
statistics) the error is the max abs difference over every step and replica divided by the max
abs value of the reference over the same tensors: normwise, so a tensor that is exactly zero in
exact arithmetic (the gradient of a conv bias right before a BN is rounding noise) does not read
as a 100% error while its layer's weight gradient is well matched. A floor of 1e-6 of the
largest reference value of that category over the model avoids 0/0 for all-zero layers.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

# Max relative error allowed, by dtype: a few ulps grown over K steps of a deep model
# (fp32 runs measure 1e-7..1e-5; fp64 1e-15..1e-12).
TOLERANCE = {"float32": 1e-4, "float64": 1e-10}
# With a measured rounding noise (`Validation.noise`: the reference run again with the global
# batch reordered, equal in exact arithmetic), a layer may also be off by this many times the
# noise of that layer: an ill-conditioned model amplifies rounding past the fixed tolerance.
NOISE_FACTOR = 10.0
# When rounding alone moves the model's output or loss this far (relative), the training runs
# are chaotic at these settings (too large a learning rate for the model): no comparison of
# them means anything, and the verdict is "inconclusive".
NOISE_CEILING = 0.1
# A failing layer whose synced error is at least this fraction of its unsynced error: the sync
# did not close the gap (a sync bug, a refused layer), not rounding.
SYNC_BUG_FRACTION = 0.1
MODEL = ""  # the layer name of model-level quantities (output, loss, input gradient)
_FLOOR = 1e-6
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
    # the reference against itself on a reordered global batch (None: not measured)
    noise: RunComparison | None = None

    def allowed(self, layer: str) -> float:
        """The error a synced layer may have: the tolerance, or NOISE_FACTOR times the rounding
        noise measured on that layer when that is larger."""
        if self.noise is None:
            return self.tolerance
        noise = {row.layer: row.max_rel for row in self.noise.layers}.get(layer, 0.0)
        return max(self.tolerance, NOISE_FACTOR * noise)

    @property
    def inconclusive(self) -> str:
        """Why the runs cannot tell a sync bug from rounding ('' when they can): rounding alone
        moves the output or loss past NOISE_CEILING, or the unsynced run is itself within every
        layer's allowance (the comparison would pass without sync)."""
        if self.noise is None:
            return ""
        model = {row.layer: row.max_rel for row in self.noise.layers
                 if row.layer in ("(output)", "(loss)")}
        worst = max(model.values(), default=0.0)
        if worst > NOISE_CEILING:
            return (f"rounding alone (the reference trained again on the reordered batch) moves "
                    f"the model's output or loss by {worst:.1e}: the runs are chaotic at these "
                    "settings")
        if not any(row.max_rel > self.allowed(row.layer) for row in self.unsynced.layers):
            return ("the unsynced run is within the allowance too: at these settings rounding "
                    "hides the gap that sync closes")
        return ""

    def cause(self, layer: LayerError) -> str:
        """Why a synced layer is out of tolerance: "sync" when it is about as far from the
        global batch as without sync, else "numerics"."""
        unsynced = {row.layer: row.max_rel for row in self.unsynced.layers}.get(layer.layer, 0.0)
        return "sync" if layer.max_rel >= SYNC_BUG_FRACTION * unsynced else "numerics"

    @property
    def within_noise(self) -> list[str]:
        """Synced layers above the tolerance but within the measured rounding noise."""
        return [layer.layer for layer in self.synced.layers
                if self.tolerance < layer.max_rel <= self.allowed(layer.layer)]

    @property
    def failures(self) -> list[str]:
        """What is out of tolerance, in words (empty: the validation passed)."""
        found = [f"conversion {f.name}: max rel error {f.max_rel:.1e}" for f in self.fidelity
                 if not f.max_rel <= self.tolerance]
        found += [f"conversion {f.name}: {f.problem}" for f in self.fidelity if f.problem]
        if self.inconclusive:
            found.append(f"inconclusive: {self.inconclusive}")
        found += [f"synced training, {layer.layer}: max rel error {layer.max_rel:.1e} "
                  f"({self.cause(layer)})"
                  for layer in self.synced.layers if not layer.max_rel <= self.allowed(layer.layer)]
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
        if self.noise is not None:
            data["noise"]["max_rel"] = self.noise.max_rel
            data["noise_factor"] = NOISE_FACTOR
            data["noise_ceiling"] = NOISE_CEILING
            data["within_noise"] = self.within_noise
            data["inconclusive"] = self.inconclusive
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
        return cls(data["kind"], data["model"], data["settings"], data["tolerance"], fidelity,
                   run(data["synced"]), run(data["unsynced"]), data["seconds"],
                   run(data["noise"]) if data.get("noise") else None)


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
            denominator = max(max(s for _, _, s in rows), _FLOOR * top[cat], _TINY)
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
