"""Telling a sync bug from rounding, for runners that measure the rounding (validate keras).

A fixed tolerance fails correct conversions of real models in fp32: deep networks amplify
rounding (the issue's MobileNetV2 and DenseNet121 fail at 1e-4 in fp32 and pass at 6e-14 in
fp64). So the runner measures each model's own rounding noise, `Validation.noise`: runs equal to
the reference in exact arithmetic (the reference on the reversed batch; for Keras, the
synchronized model on one device, whose E[x²]-E[x]² variance loses more in fp32 than the
reference's two-pass one). And it
compares every run on step 1 alone (`Validation.first_step`), where a sync bug already shows in
full (the batch statistics, the outputs and every gradient of the first step) and no update has
yet been amplified.

The verdict, in order:
- a layer passes within max(tolerance, NOISE_FACTOR x its measured noise);
- the comparison is *inconclusive* when rounding alone moves the step-1 output, loss or input
  gradient past NOISE_CEILING, or when the unsynced run would pass as well (nothing to tell
  apart);
- layers out of allowance only after step 1, with step 1 within its own allowance and the
  replicas' running statistics bit-identical, are the model amplifying rounding over its SGD
  steps (*numerics*): the statistics are synchronized, step 1 is the global batch's. Reported,
  not failed. Likewise when rounding alone moves the model past NOISE_CEILING only after step
  1 (*chaotic later*): later steps are no evidence either way, and step 1 is what is judged;
- otherwise a failing layer is a *sync* bug when the replicas' statistics disagree or its
  step-1 error is at least SYNC_BUG_FRACTION of the unsynced run's, else *numerics*;
- numerics alone, or an inconclusive comparison, in float32 is settled in float64
  (`Validation.float64`: the synced run and the reference again, the model built in float64
  from the same weights): when they agree there within float64's allowance, the conversion is
  right and float32 rounding made the difference
  (measured on MobileNetV2: the 2-replica synced float32 run is 1e-2 off the float64 truth on
  step 1's gradients while the one-device float32 reference is 1e-4 off: TensorFlow's float32
  numerics for the per-replica shapes, not the sync). Passed, and said so.
"""

from __future__ import annotations

from typing import Any

from bnfix.validate.comparison import TOLERANCE, LayerError, RunComparison, Validation

NOISE_FACTOR = 10.0
NOISE_CEILING = 0.1
SYNC_BUG_FRACTION = 0.1
MODEL_ROWS = ("(output)", "(loss)", "(input grad)")


def _rel(run: RunComparison | None, layer: str) -> float:
    if run is None:
        return 0.0
    return {row.layer: row.max_rel for row in run.layers}.get(layer, 0.0)


def allowed(v: Validation, layer: str, noise: RunComparison | None = None,
            tolerance: float | None = None) -> float:
    """The error a synced layer may have against `noise` (default: all steps' noise)."""
    floor = v.tolerance if tolerance is None else tolerance
    return max(floor, NOISE_FACTOR * _rel(noise if noise is not None else v.noise, layer))


def _out(v: Validation, run: RunComparison, noise: RunComparison | None,
         tolerance: float | None = None) -> list[LayerError]:
    return [row for row in run.layers
            if not row.max_rel <= allowed(v, row.layer, noise, tolerance)]


def inconclusive(v: Validation) -> str:
    """Why the runs cannot tell a sync bug from rounding ('' when they can)."""
    first = v.first_step or {}
    noise = first.get("noise", v.noise)
    unsynced = first.get("unsynced", v.unsynced)
    worst = max((_rel(noise, row) for row in MODEL_ROWS), default=0.0)
    if worst > NOISE_CEILING:
        return (f"rounding alone (runs equal to the reference in exact arithmetic) moves the "
                f"model's output, loss or input gradient by {worst:.1e} on the first step")
    if not _out(v, unsynced, noise):
        return ("the unsynced run is within the allowance too: rounding hides the gap that sync "
                "closes")
    return ""


def _model_noise(noise: RunComparison | None) -> float:
    return max((_rel(noise, row) for row in MODEL_ROWS), default=0.0)


def chaotic_later(v: Validation) -> float:
    """How far rounding alone moves the model over all steps when that is past NOISE_CEILING
    while step 1 is not (0.0 otherwise)."""
    first = v.first_step
    if not first or _model_noise(first["noise"]) > NOISE_CEILING:
        return 0.0
    worst = _model_noise(v.noise)
    return worst if worst > NOISE_CEILING else 0.0


def judged(v: Validation) -> tuple[RunComparison, RunComparison | None]:
    """The synced comparison the verdict rests on, and its noise: step 1 alone when later
    steps are chaotic, else every step."""
    if chaotic_later(v) and v.first_step:
        return v.first_step["synced"], v.first_step["noise"]
    return v.synced, v.noise


def amplified(v: Validation) -> list[str]:
    """Synced layers out of allowance over all steps while step 1 is within its own and the
    replicas' statistics are identical: rounding amplified by the model, not a sync bug."""
    first = v.first_step
    if not first or v.synced.replica_drift != 0.0 or _out(v, first["synced"], first["noise"]):
        return []
    return [row.layer for row in _out(v, v.synced, v.noise)]


def cause(v: Validation, layer: LayerError) -> str:
    """"sync" or "numerics" for a failing synced layer (see the module docstring)."""
    if v.synced.replica_drift > 0.0:
        return "sync"
    first = v.first_step
    if first is not None:
        got, gap = _rel(first["synced"], layer.layer), _rel(first["unsynced"], layer.layer)
    else:
        got, gap = layer.max_rel, _rel(v.unsynced, layer.layer)
    return "sync" if got > 0 and got >= SYNC_BUG_FRACTION * gap else "numerics"


def within_noise(v: Validation) -> list[str]:
    """Synced layers above the fixed tolerance but within their measured rounding."""
    run, noise = judged(v)
    return [row.layer for row in run.layers
            if v.tolerance < row.max_rel <= allowed(v, row.layer, noise)]


def needs_float64(v: Validation) -> bool:
    """A float32 run that is inconclusive, or whose only failures are numerics, with no sign of
    a sync bug (replicas' statistics identical, nothing refused): float64 can settle it."""
    if v.settings.get("dtype") != "float32" or v.noise is None or amplified(v):
        return False
    if v.synced.replica_drift != 0.0 or any(f.problem for f in v.fidelity):
        return False
    failing = _out(v, *judged(v))
    numerics = bool(failing) and all(cause(v, row) == "numerics" for row in failing)
    return numerics or bool(inconclusive(v))


def confirmed_in_float64(v: Validation) -> bool:
    """The float64 rerun agrees with its reference within float64's allowance."""
    runs = v.float64
    return bool(runs) and not _out(v, runs["synced"], runs["noise"], TOLERANCE["float64"])


def synced_failures(v: Validation) -> list[str]:
    """The synced run's part of `Validation.failures` when the noise was measured."""
    if v.float64 is not None:
        if confirmed_in_float64(v):
            return []
        return [f"float64 rerun, {row.layer}: max rel error {row.max_rel:.1e} (sync)"
                for row in _out(v, v.float64["synced"], v.float64["noise"],
                                TOLERANCE["float64"])]
    found = []
    why = inconclusive(v)
    if why:
        found.append(f"inconclusive: {why}")
    if amplified(v):
        return found
    run, noise = judged(v)
    step = " on step 1" if run is not v.synced else ""
    found += [f"synced training, {row.layer}: max rel error {row.max_rel:.1e}{step} "
              f"({cause(v, row)})" for row in _out(v, run, noise)]
    return found


def json_fields(v: Validation) -> dict[str, Any]:
    return {"noise_factor": NOISE_FACTOR, "noise_ceiling": NOISE_CEILING,
            "within_noise": within_noise(v), "amplified_after_step_1": amplified(v),
            "chaotic_after_step_1": chaotic_later(v),
            "inconclusive": inconclusive(v),
            "float64_confirms": confirmed_in_float64(v) if v.float64 else None}
