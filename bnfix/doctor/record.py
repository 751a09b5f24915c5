"""What a BN monitor records during training, as plain data: framework-neutral, so that one set
of diagnoses (`bnfix.doctor.diagnose`) judges torch, Keras and TF1 runs alike, and a recording
can be written as JSON by the process that trained and read back by `bnfix doctor`.

Monitors record; they never judge. Every number is a measurement or a summary of one (a channel
average, a norm); thresholds live in the diagnoses and are documented in the BN3xx rule files.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

SCHEMA = "bnfix-doctor-recording/1"


@dataclass
class Sample:
    """One BN layer at one sampled training step (None: this monitor cannot measure it)."""

    step: int
    training: bool = True  # the layer normalized with batch statistics at this step
    count: int | None = None  # values per channel in this device's batch (N·H·W)
    batch: int | None = None  # N: independent samples in this device's batch
    global_count: int | None = None  # per channel over all replicas, when the layer is synced
    # batch vs running statistics: RMS over channels of |μB − μR| / σR, and of |log(σ²B / σ²R)|
    mean_gap: float | None = None
    var_ratio: float | None = None
    # channel averages (the plot of batch vs running statistics)
    batch_mean: float | None = None
    running_mean: float | None = None
    batch_var: float | None = None
    running_var: float | None = None
    var_min: float | None = None  # smallest / largest variance, batch and running together
    var_max: float | None = None
    nonfinite: int = 0  # non-finite values in the batch and running statistics
    gamma_mean: float | None = None
    gamma_min: float | None = None
    gamma_max: float | None = None
    gamma_abs_median: float | None = None
    beta_mean: float | None = None
    beta_min: float | None = None
    beta_max: float | None = None
    beta_over_gamma: float | None = None  # median over channels of |β| / |γ|
    gamma_grad: float | None = None  # gradient norms (torch); None where not observable
    beta_grad: float | None = None
    # the next few updates of γ (β): their mean size ‖Δ‖ / ‖γ‖, and how straight their path
    # is (net displacement / path length: 1 straight on, near 0 back and forth)
    gamma_step: float | None = None
    gamma_path: float | None = None
    beta_step: float | None = None
    beta_path: float | None = None
    dead: float | None = None  # fraction of channels ≤ 0 over the whole batch (dead after ReLU)


@dataclass
class FinalStats:
    """Per channel at the end: the batch statistics averaged over the last sampled steps (the
    mean of batch means; the mean of batch variances plus the variance of the batch means) and
    the running statistics, γ and β as they were then."""

    window: int  # sampled steps averaged
    batch_mean: list[float]
    batch_var: list[float]
    running_mean: list[float] | None
    running_var: list[float] | None
    gamma: list[float] | None = None
    beta: list[float] | None = None


@dataclass
class LayerTrace:
    """Everything recorded about one BN layer."""

    name: str
    cls: str
    channels: int
    # weight of a new batch in the running average (torch's convention; Keras' momentum is
    # 1 − this); None: cumulative average (torch momentum=None) or no running statistics
    momentum: float | None = None
    synced: bool = False
    affine: bool = True
    trainable: bool = True  # γ/β are trained
    dtype: str = "float32"  # of the running statistics
    input_dtype: str | None = None
    samples: list[Sample] = field(default_factory=list)
    updates: int = 0  # running-statistics updates in training steps
    eval_updates: int = 0  # running-statistics updates during evaluation
    eval_update_steps: list[list[int]] = field(default_factory=list)  # step ranges of those
    eval_mode_steps: list[list[int]] = field(default_factory=list)  # training steps in eval mode
    probes: list[list[float]] = field(default_factory=list)  # [step, train/eval output gap]
    final: FinalStats | None = None


@dataclass
class Recording:
    """One monitored model in one process (one rank)."""

    framework: str  # torch | keras | tf1
    model: str
    every: int
    rank: int | None = None
    world: int = 1  # ranks or replicas training together
    steps: int = 0  # training steps seen
    stopped: bool = False  # ended by `bnfix doctor --steps`
    layers: dict[str, LayerTrace] = field(default_factory=dict)
    output_gap: list[list[float]] = field(default_factory=list)  # [step, model output gap]
    notes: list[str] = field(default_factory=list)  # what could not be measured, and why

    def to_data(self) -> dict[str, Any]:
        return {"schema": SCHEMA, **_clean(asdict(self))}

    @classmethod
    def from_data(cls, data: dict[str, Any]) -> Recording:
        if data.get("schema", SCHEMA) != SCHEMA:
            raise ValueError(f"not a {SCHEMA} recording: {data.get('schema')!r}")
        layers = {}
        for name, layer in data.get("layers", {}).items():
            layer = {**_known(LayerTrace, layer), "name": layer.get("name", name)}
            layer["samples"] = [Sample(**_known(Sample, s)) for s in layer.get("samples", [])]
            final = layer.get("final")
            layer["final"] = FinalStats(**_known(FinalStats, final)) if final else None
            layers[name] = LayerTrace(**layer)
        body = {k: v for k, v in _known(cls, data).items() if k != "layers"}
        return cls(**body, layers=layers)


def _known(kind: type, data: dict[str, Any]) -> dict[str, Any]:
    names = {f.name for f in fields(kind)}
    return {k: v for k, v in data.items() if k in names}


def _clean(value: Any) -> Any:
    """JSON has no NaN or infinity: they become strings ("nan", "inf") that `float()` reads."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def add_step(ranges: list[list[int]], step: int) -> None:
    """Add `step` to sorted, disjoint [first, last] ranges (steps arrive in order)."""
    if ranges and ranges[-1][1] >= step - 1:
        ranges[-1][1] = max(ranges[-1][1], step)
    else:
        ranges.append([step, step])


def count_steps(ranges: list[list[int]]) -> int:
    return sum(last - first + 1 for first, last in ranges)


def write_recordings(path: Path, recordings: list[Recording]) -> None:
    """All of a process's recordings in one JSON file, written whole (temporary + rename)."""
    data = json.dumps([r.to_data() for r in recordings])
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".doctor-", suffix=".json")
    with os.fdopen(handle, "w", encoding="utf-8") as out:
        out.write(data)
    os.replace(temporary, path)


def read_recordings(path: Path) -> list[Recording]:
    return [Recording.from_data(item) for item in json.loads(path.read_text(encoding="utf-8"))]


def number(value: Any) -> float | None:
    """A recorded number back as a float ("nan"/"inf" strings included)."""
    return None if value is None else float(value)
