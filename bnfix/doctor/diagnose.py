"""The BN3xx diagnoses: judge what the monitors recorded (`bnfix.doctor.record`), whatever the
framework. Each finding names the layer, the steps, the numbers and the fix.

Every threshold below is documented, with the reason for its value, in the rule's file
(`rules/BN3xx.toml`, `bnfix rule BN301`). When one layer has a finding that explains another
(its batch is too small, its statistics never converged, were updated during evaluation, the
layer ran in eval mode, γ/β oscillate), the consequence is not reported again (`EXPLAINED_BY`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from statistics import median

from bnfix.doctor.record import LayerTrace, Recording, Sample, count_steps, number

# BN301: fewer independent samples per channel than this in a device's batch
MIN_BATCH = 16
# BN302: RMS over channels of the mean shift (in batch standard deviations) and of the
# |log| variance ratio between the end-of-run batch statistics and the running ones
MISMATCH_SHIFT = 0.5
MISMATCH_SCALE = math.log(2.0)
# BN303: share of the initial running statistics (0 / 1) still in them, and the evidence that
# they are off (shift in std units, |log| variance ratio)
UNCONVERGED_WEIGHT = 0.05
UNCONVERGED_SHIFT = 0.2
UNCONVERGED_SCALE = math.log(1.25)
# BN306: median |γ| collapsed below / exploded above (from a start inside the other bound)
GAMMA_COLLAPSE = 0.1
GAMMA_COLLAPSE_FROM = 0.5
GAMMA_EXPLODE = 10.0
GAMMA_EXPLODE_FROM = 2.0
# BN307: median |β| / |γ| at the end above this (from below BETA_DRIFT_FROM at the start)
BETA_DRIFT = 2.0
BETA_DRIFT_FROM = 0.5
# BN308: updates that are large (median mean step, relative to ‖γ‖) and go back and forth
# (median net displacement / path length over the followed updates), over enough samples
OSCILLATION_STEP = 0.05
OSCILLATION_PATH = 0.5
OSCILLATION_SAMPLES = 3
# BN309: float16 range (largest finite value, smallest normal number)
FP16_MAX = 65504.0
FP16_MIN_NORMAL = 6.104e-05
LOW_PRECISION = ("float16", "bfloat16", "half")
# BN310: the running statistics of two ranks differ by more than this (shift in std units,
# |log| variance ratio), or γ/β by more than this relative difference
RANK_SHIFT = 0.1
RANK_SCALE = 0.1
RANK_AFFINE = 1e-3

# a finding of a code on the right explains (and hides) one on the left on the same layer
EXPLAINED_BY = {
    "BN302": {"BN301", "BN303", "BN304", "BN305", "BN308", "BN309"},
    "BN303": {"BN305"},
    "BN306": {"BN308"},
    "BN307": {"BN308"},
}


@dataclass(frozen=True)
class Finding:
    """One diagnosis on one layer (of one model; ranks: where it was seen)."""

    code: str
    layer: str
    message: str
    fix: str
    first_step: int | None = None
    last_step: int | None = None
    numbers: dict[str, float] = field(default_factory=dict, compare=False)
    model: str = ""
    framework: str = ""
    ranks: tuple[int, ...] = ()
    weight: float = 1.0  # how far past its threshold (sorts the worst first)

    @property
    def steps(self) -> str:
        if self.first_step is None:
            return ""
        if self.last_step is None or self.last_step == self.first_step:
            return f"step {self.first_step}"
        return f"steps {self.first_step}-{self.last_step}"


LayerDiagnosis = Callable[[Recording, LayerTrace], Finding | None]
GroupDiagnosis = Callable[[Sequence[Recording]], Iterable[Finding]]
LAYER_DIAGNOSES: dict[str, LayerDiagnosis] = {}
GROUP_DIAGNOSES: dict[str, GroupDiagnosis] = {}


def layer_diagnosis(code: str) -> Callable[[LayerDiagnosis], LayerDiagnosis]:
    def register(fn: LayerDiagnosis) -> LayerDiagnosis:
        LAYER_DIAGNOSES[code] = fn
        return fn
    return register


def group_diagnosis(code: str) -> Callable[[GroupDiagnosis], GroupDiagnosis]:
    def register(fn: GroupDiagnosis) -> GroupDiagnosis:
        GROUP_DIAGNOSES[code] = fn
        return fn
    return register


def runtime_codes() -> set[str]:
    return set(LAYER_DIAGNOSES) | set(GROUP_DIAGNOSES)


# -- helpers -----------------------------------------------------------------------------------
def _values(samples: Iterable[Sample], name: str) -> list[float]:
    out = []
    for sample in samples:
        value = number(getattr(sample, name))
        if value is not None:
            out.append(value)
    return out


def _span(samples: Sequence[Sample]) -> tuple[int | None, int | None]:
    return (samples[0].step, samples[-1].step) if samples else (None, None)


def _g(value: float) -> str:
    return f"{value:.3g}"


def _finding(rec: Recording, layer: LayerTrace, code: str, message: str, fix: str,
             steps: tuple[int | None, int | None], numbers: dict[str, float],
             weight: float) -> Finding:
    return Finding(code, layer.name, message, fix, steps[0], steps[1], numbers, rec.model,
                   rec.framework, () if rec.rank is None else (rec.rank,), weight)


def end_gaps(layer: LayerTrace) -> tuple[float, float] | None:
    """(shift, scale) between the end-of-run batch statistics and the running statistics:
    RMS over channels of |μB − μR| / σB and of |log(σ²B / σ²R)|."""
    final = layer.final
    if final is None or final.running_mean is None or final.running_var is None:
        return None
    shifts, scales = [], []
    for mb, vb, mr, vr in zip(final.batch_mean, final.batch_var, final.running_mean,
                              final.running_var):
        mb, vb, mr, vr = (float(v) for v in (mb, vb, mr, vr))
        if not all(math.isfinite(v) for v in (mb, vb, mr, vr)):
            continue
        eps = 1e-5
        shifts.append((mb - mr) ** 2 / (vb + eps))
        scales.append(math.log((vb + eps) / (max(vr, 0.0) + eps)) ** 2)
    if not shifts:
        return None
    return math.sqrt(sum(shifts) / len(shifts)), math.sqrt(sum(scales) / len(scales))


_SYNC_FIX = {"torch": "bnfix.torch.convert_sync(model) before wrapping it in DDP",
             "keras": "BatchNormalization(synchronized=True) (bnfix.keras.convert_sync(model))",
             "tf1": "bnfix.tf1.sync_towers(n) around the tower loop"}


def _fix_small_batch(rec: Recording) -> str:
    sync = _SYNC_FIX.get(rec.framework, "sync BN")
    gn = {"torch": "bnfix.torch.to_group_norm(model)",
          "keras": "bnfix.keras.to_group_norm(model)"}.get(rec.framework, "GroupNorm")
    if rec.world > 1:
        return (f"synchronize the statistics across the {rec.world} replicas ({sync}), or "
                f"switch to GroupNorm ({gn}), or accumulate gradients over larger batches")
    return (f"use a larger batch per device, or switch to GroupNorm ({gn}); with several "
            f"devices, synchronize the statistics ({sync})")


# -- per-layer diagnoses -------------------------------------------------------------------------
@layer_diagnosis("BN301")
def batch_too_small(rec: Recording, layer: LayerTrace) -> Finding | None:
    samples = [s for s in layer.samples if s.training and s.batch is not None]
    if not samples:
        return None
    batch = median(s.batch for s in samples)  # type: ignore[misc]
    count = median(s.count for s in samples if s.count is not None)
    synced = layer.synced and rec.world > 1
    effective = batch * rec.world if synced else batch
    if effective >= MIN_BATCH:
        return None
    where = (f"{int(batch)} samples per device, {int(effective)} over {rec.world} synced "
             f"replicas" if synced else f"{int(batch)} samples per device"
             + (f" ({rec.world} replicas, not synced)" if rec.world > 1 else ""))
    message = (f"per-channel batch statistics come from {where} ({int(count)} values per "
               f"channel): below {MIN_BATCH}, BN's batch statistics are noisy and the running "
               f"statistics do not match them")
    return _finding(rec, layer, "BN301", message, _fix_small_batch(rec), _span(samples),
                    {"batch": float(batch), "count": float(count), "world": float(rec.world),
                     "threshold": float(MIN_BATCH)}, MIN_BATCH / max(effective, 1))


@layer_diagnosis("BN302")
def train_eval_mismatch(rec: Recording, layer: LayerTrace) -> Finding | None:
    gaps = end_gaps(layer)
    if gaps is None or (rec.stopped and _still_converging(layer)):
        return None  # stopped by --steps before the running average could converge
    shift, scale = gaps
    if shift <= MISMATCH_SHIFT and scale <= MISMATCH_SCALE:
        return None
    probe = f"; on the probe batch its eval-mode output differs from its train-mode output by " \
            f"{layer.probes[-1][1]:.0%}" if layer.probes else ""
    if layer.updates == 0 and rec.steps:
        probe += (f"; the running statistics were never updated in {rec.steps} training steps"
                  + (" (the train op does not run UPDATE_OPS)" if rec.framework == "tf1" else ""))
    message = (f"at the end of the run the running statistics are far from the batch "
               f"statistics of the last {layer.final.window} sampled steps: means "  # type: ignore[union-attr]
               f"{_g(shift)} std apart (RMS over channels), variances a factor "
               f"{_g(math.exp(scale))} apart{probe}; eval mode will normalize differently from "
               f"training")
    if layer.updates == 0:
        fix = {"tf1": "run the train op under tf.control_dependencies(tf.compat.v1.get_collection("
                      "UPDATE_OPS)) (BN003)",
               "keras": "train the layer in training mode (not trainable=False / training=False)",
               "torch": "train the layer in train mode (model.train()) with momentum > 0"
               }.get(rec.framework, "update the running statistics during training")
    else:
        fix = ("recompute the running statistics on training data before evaluating "
               "(train-mode forwards without gradients, cumulative average, then eval mode); "
               "check the momentum and that training data and the statistics' data match")
    numbers = {"shift": shift, "scale": math.exp(scale)}
    if layer.probes:
        numbers["probe_gap"] = layer.probes[-1][1]
    return _finding(rec, layer, "BN302", message, fix, _span(layer.samples[-1:]), numbers,
                    max(shift / MISMATCH_SHIFT, scale / MISMATCH_SCALE))


def _still_converging(layer: LayerTrace) -> bool:
    m = layer.momentum
    return m is not None and 0 < m < 1 and (1 - m) ** layer.updates > UNCONVERGED_WEIGHT


@layer_diagnosis("BN303")
def running_stats_unconverged(rec: Recording, layer: LayerTrace) -> Finding | None:
    m = layer.momentum
    if m is None or not 0 < m < 1 or layer.updates == 0 or rec.stopped:
        return None  # a run stopped by --steps says nothing about the full run's length
    remaining = (1 - m) ** layer.updates
    gaps = end_gaps(layer)
    if remaining <= UNCONVERGED_WEIGHT or gaps is None:
        return None
    shift, scale = gaps
    if shift <= UNCONVERGED_SHIFT and scale <= UNCONVERGED_SCALE:
        return None
    needed = math.ceil(math.log(UNCONVERGED_WEIGHT) / math.log(1 - m))
    wanted = 1 - UNCONVERGED_WEIGHT ** (1 / layer.updates)
    convention = (f"momentum={_g(1 - m)}" if rec.framework in ("keras", "tf1")
                  else f"momentum={_g(m)}")
    better = (f"momentum={_g(1 - wanted)} or lower" if rec.framework in ("keras", "tf1")
              else f"momentum={_g(wanted)} or higher")
    message = (f"{convention} over {layer.updates} updates leaves {remaining:.0%} of the "
               f"initial running statistics (mean 0, variance 1) in them; they would need "
               f"{needed} updates to fall below {UNCONVERGED_WEIGHT:.0%}; at the end "
               f"they are {_g(shift)} std from the batch means, variances a factor "
               f"{_g(math.exp(scale))} apart")
    fix = (f"for a run of {layer.updates} steps use {better}, or recompute the statistics "
           f"after training (torch: momentum=None and train-mode forwards without gradients)")
    return _finding(rec, layer, "BN303", message, fix, _span(layer.samples),
                    {"momentum": m, "updates": float(layer.updates), "remaining": remaining,
                     "needed": float(needed), "shift": shift, "scale": math.exp(scale)},
                    remaining / UNCONVERGED_WEIGHT)


EVAL_UPDATE_FIX = {
    "torch": "call model.eval() before evaluating and model.train() after it",
    "keras": "evaluate with model.evaluate/predict or call the model with training=False",
    "tf1": "fetch the evaluation outputs without UPDATE_OPS (training=False in the evaluation "
           "graph)",
}


@layer_diagnosis("BN304")
def stats_updated_in_eval(rec: Recording, layer: LayerTrace) -> Finding | None:
    if layer.eval_updates == 0:
        return None
    first = layer.eval_update_steps[0][0] if layer.eval_update_steps else None
    last = layer.eval_update_steps[-1][1] if layer.eval_update_steps else None
    how = {"torch": "forwards in train mode without gradients",
           "keras": "calls in training mode outside fit",
           "tf1": "session runs that train nothing"}.get(rec.framework, "evaluation calls")
    message = (f"the running statistics were updated {layer.eval_updates} times during "
               f"evaluation ({how}, after training steps {first}-{last}): evaluation data "
               f"overwrite the training statistics, and evaluation normalizes with batch "
               f"statistics")
    return _finding(rec, layer, "BN304", message, EVAL_UPDATE_FIX.get(rec.framework, ""),
                    (first, last), {"eval_updates": float(layer.eval_updates)},
                    1.0 + math.log10(layer.eval_updates))


@layer_diagnosis("BN305")
def eval_mode_during_training(rec: Recording, layer: LayerTrace) -> Finding | None:
    steps = count_steps(layer.eval_mode_steps)
    if steps == 0 or not layer.trainable:
        return None
    first, last = layer.eval_mode_steps[0][0], layer.eval_mode_steps[-1][1]
    message = (f"ran in eval mode during {steps} of {rec.steps} training steps while its γ/β "
               f"were trained: it normalizes with running statistics that it never updates, "
               f"so training sees statistics that do not match its batches")
    fix = {"torch": "call model.train() after evaluation and do not call .eval() on the layer; "
                    "to freeze BN on purpose also freeze γ/β (bnfix.torch.freeze(model))",
           "keras": "call the layer with training=True (or leave training unset) in the "
                    "training step; to freeze BN on purpose set trainable=False",
           "tf1": "pass training=True to the layer in the training graph; to freeze BN on "
                  "purpose also keep γ/β out of the optimizer"}.get(rec.framework, "")
    return _finding(rec, layer, "BN305", message, fix, (first, last),
                    {"eval_mode_steps": float(steps), "steps": float(rec.steps)},
                    1.0 + steps / max(rec.steps, 1))


def _bn_lr_fix(rec: Recording) -> str:
    if rec.framework == "torch":
        return ("give BN parameters their own optimizer group with a lower learning rate "
                "(e.g. 10x lower) and weight_decay=0")
    return "lower the learning rate of BN's γ/β (or overall) and exclude them from weight decay"


@layer_diagnosis("BN306")
def gamma_collapse_or_explosion(rec: Recording, layer: LayerTrace) -> Finding | None:
    samples = [s for s in layer.samples if s.gamma_abs_median is not None]
    if len(samples) < 2:
        return None
    start, end = float(samples[0].gamma_abs_median), float(samples[-1].gamma_abs_median)  # type: ignore[arg-type]
    if not math.isfinite(end):
        what, weight = "became non-finite", 10.0
    elif end < GAMMA_COLLAPSE <= GAMMA_COLLAPSE_FROM <= start:
        what, weight = "collapsed towards 0", GAMMA_COLLAPSE / max(end, 1e-6)
    elif end > GAMMA_EXPLODE and start <= GAMMA_EXPLODE_FROM:
        what, weight = "exploded", end / GAMMA_EXPLODE
    else:
        return None
    message = (f"median |γ| {what}: {_g(start)} at step {samples[0].step}, {_g(end)} at step "
               f"{samples[-1].step} (healthy layers stay near 1); the channels' outputs are "
               + ("squashed to β" if "collapsed" in what else "amplified"))
    fix = _bn_lr_fix(rec) + ("; weight decay on γ drives it to 0" if "collapsed" in what else "")
    return _finding(rec, layer, "BN306", message, fix, _span(samples),
                    {"gamma_start": start, "gamma_end": end}, weight)


@layer_diagnosis("BN307")
def beta_drift(rec: Recording, layer: LayerTrace) -> Finding | None:
    samples = [s for s in layer.samples if s.beta_over_gamma is not None]
    if len(samples) < 2:
        return None
    start, end = float(samples[0].beta_over_gamma), float(samples[-1].beta_over_gamma)  # type: ignore[arg-type]
    if not (end > BETA_DRIFT and start < BETA_DRIFT_FROM):
        return None
    dead = samples[-1].dead
    dead_text = f"; {dead:.0%} of its channels are dead after a ReLU" if dead is not None else ""
    message = (f"β drifted away from 0: median |β|/|γ| went from {_g(start)} (step "
               f"{samples[0].step}) to {_g(end)} (step {samples[-1].step}), so most channels sit "
               f"more than {BETA_DRIFT:g} of their standard deviations off 0: after a ReLU "
               f"they are always off or always on{dead_text}")
    numbers = {"beta_over_gamma_start": start, "beta_over_gamma_end": end}
    if dead is not None:
        numbers["dead"] = float(dead)
    return _finding(rec, layer, "BN307", message,
                    _bn_lr_fix(rec) + "; check the input distribution (normalize inputs)",
                    _span(samples), numbers, end / BETA_DRIFT)


@layer_diagnosis("BN308")
def affine_oscillation(rec: Recording, layer: LayerTrace) -> Finding | None:
    worst: Finding | None = None
    for name, symbol in (("gamma", "γ"), ("beta", "β")):
        samples = [s for s in layer.samples if getattr(s, f"{name}_path") is not None
                   and getattr(s, f"{name}_step") is not None]
        if len(samples) < OSCILLATION_SAMPLES:
            continue
        path = median(_values(samples, f"{name}_path"))
        step = median(_values(samples, f"{name}_step"))
        if path >= OSCILLATION_PATH or step <= OSCILLATION_STEP:
            continue
        message = (f"{symbol} oscillates: each update moves it by {step:.1%} of ‖γ‖ (median over "
                   f"{len(samples)} sampled steps) but the updates undo each other (net "
                   f"displacement {path:.0%} of the path length): the learning rate is too high "
                   f"for BN's parameters")
        weight = (step / OSCILLATION_STEP) * (OSCILLATION_PATH / max(path, 0.05))
        if worst is None or weight > worst.weight:
            worst = _finding(rec, layer, "BN308", message, _bn_lr_fix(rec), _span(samples),
                             {f"{name}_step": step, f"{name}_path": path}, weight)
    return worst


@layer_diagnosis("BN309")
def low_precision_variance(rec: Recording, layer: LayerTrace) -> Finding | None:
    dtypes = {layer.dtype, layer.input_dtype or ""}
    low = sorted(d for d in dtypes if d in LOW_PRECISION)
    if not low:
        return None
    fp16_stats = layer.dtype in ("float16", "half")
    bad = [s for s in layer.samples if s.nonfinite > 0]
    over = [s for s in layer.samples if fp16_stats and s.var_max is not None
            and number(s.var_max) > FP16_MAX / 2]  # type: ignore[operator]
    under = [s for s in layer.samples if fp16_stats and s.var_min is not None
             and 0 < number(s.var_min) < FP16_MIN_NORMAL]  # type: ignore[operator]
    hit = bad or over or under
    if not hit:
        return None
    if bad:
        what = f"non-finite batch or running statistics in {len(bad)} sampled steps"
    elif over:
        what = (f"variances up to {_g(max(_values(over, 'var_max')))}, at float16's limit "
                f"({FP16_MAX:g})")
    else:
        what = (f"variances down to {_g(min(_values(under, 'var_min')))}, below float16's "
                f"smallest normal number ({FP16_MIN_NORMAL:.3g}): they lose their precision")
    message = f"statistics kept in {'/'.join(low)}: {what}"
    fix = ("keep BN in float32: mixed precision (torch.autocast, Keras mixed_float16) runs BN "
           "in float32; do not cast BN layers or their running statistics to half")
    return _finding(rec, layer, "BN309", message, fix, _span(hit),
                    {"samples": float(len(hit))}, 2.0 + len(hit) / max(len(layer.samples), 1))


# -- across ranks --------------------------------------------------------------------------------
@dataclass(frozen=True)
class RankGap:
    """How far one layer's end state differs between ranks (the worst pair with rank 0)."""

    layer: str
    ranks: tuple[int, int]
    shift: float
    scale: float
    affine: float


def rank_gaps(group: Sequence[Recording]) -> list[RankGap]:
    """Per layer, the largest difference between the first rank and any other (running
    statistics in std units and |log| variance ratio; γ/β relative difference)."""
    ordered = sorted(group, key=lambda r: -1 if r.rank is None else r.rank)
    if len(ordered) < 2:
        return []
    base = ordered[0]
    gaps = []
    for name, layer in base.layers.items():
        worst: RankGap | None = None
        for other in ordered[1:]:
            peer = other.layers.get(name)
            if peer is None or layer.final is None or peer.final is None:
                continue
            shift, scale = _state_gap(layer, peer)
            affine = _affine_gap(layer, peer)
            gap = RankGap(name, (base.rank or 0, other.rank or 0), shift, scale, affine)
            if worst is None or (shift, scale, affine) > (worst.shift, worst.scale, worst.affine):
                worst = gap
        if worst is not None:
            gaps.append(worst)
    return sorted(gaps, key=lambda g: -max(g.shift / RANK_SHIFT, g.scale / RANK_SCALE,
                                           g.affine / RANK_AFFINE))


def _state_gap(a: LayerTrace, b: LayerTrace) -> tuple[float, float]:
    fa, fb = a.final, b.final
    if fa is None or fb is None or fa.running_mean is None or fb.running_mean is None or \
            fa.running_var is None or fb.running_var is None:
        return 0.0, 0.0
    shifts, scales = [], []
    for ma, va, mb, vb in zip(fa.running_mean, fa.running_var, fb.running_mean, fb.running_var):
        ma, va, mb, vb = (float(v) for v in (ma, va, mb, vb))
        if all(math.isfinite(v) for v in (ma, va, mb, vb)):
            shifts.append((ma - mb) ** 2 / (max(va, 0.0) + 1e-5))
            scales.append(math.log((max(va, 0.0) + 1e-5) / (max(vb, 0.0) + 1e-5)) ** 2)
    if not shifts:
        return 0.0, 0.0
    return math.sqrt(sum(shifts) / len(shifts)), math.sqrt(sum(scales) / len(scales))


def _affine_gap(a: LayerTrace, b: LayerTrace) -> float:
    worst = 0.0
    for attr in ("gamma", "beta"):
        va = getattr(a.final, attr, None)
        vb = getattr(b.final, attr, None)
        if not va or not vb:
            continue
        scale = max(max(abs(float(v)) for v in va), 1e-6)
        worst = max(worst, max(abs(float(x) - float(y)) for x, y in zip(va, vb)) / scale)
    return worst


@group_diagnosis("BN310")
def ranks_disagree(group: Sequence[Recording]) -> Iterable[Finding]:
    by_rank = {r.rank: r for r in group}
    for gap in rank_gaps(group):
        if gap.shift <= RANK_SHIFT and gap.scale <= RANK_SCALE and gap.affine <= RANK_AFFINE:
            continue
        rec = by_rank[gap.ranks[1]] if gap.ranks[1] in by_rank else group[0]
        parts = []
        if gap.shift > RANK_SHIFT or gap.scale > RANK_SCALE:
            parts.append(f"running statistics {_g(gap.shift)} std apart, variances a factor "
                         f"{_g(math.exp(gap.scale))} apart")
        if gap.affine > RANK_AFFINE:
            parts.append(f"γ/β differ by {gap.affine:.2%}: their gradients are not averaged "
                         f"(parameters outside DDP or the strategy?)")
        message = (f"ranks {gap.ranks[0]} and {gap.ranks[1]} end with different states of "
                   f"this layer: {'; '.join(parts)}; each rank evaluates differently and a "
                   f"checkpoint saved by one rank keeps only its own statistics")
        fix = (_SYNC_FIX.get(rec.framework, "synchronize BN across the ranks")
               + " so that every rank normalizes with the same statistics; γ/β that differ "
                 "mean their gradients are not averaged: keep BN inside the DDP/strategy model")
        yield Finding("BN310", gap.layer, message, fix, 1 if rec.steps else None, rec.steps,
                      {"shift": gap.shift, "scale": math.exp(gap.scale), "affine": gap.affine},
                      rec.model, rec.framework, tuple(sorted(gap.ranks)),
                      max(gap.shift / RANK_SHIFT, gap.scale / RANK_SCALE,
                          gap.affine / RANK_AFFINE))


# -- running everything ----------------------------------------------------------------------
def groups(recordings: Sequence[Recording]) -> list[list[Recording]]:
    """Recordings of the same model (framework, class, layer names) across ranks."""
    out: dict[tuple, list[Recording]] = {}
    for rec in recordings:
        out.setdefault((rec.framework, rec.model, tuple(sorted(rec.layers))), []).append(rec)
    return list(out.values())


def diagnose(recordings: Sequence[Recording], select: set[str] | None = None) -> list[Finding]:
    """Every enabled diagnosis over every recording; one finding per (model, layer, code) with
    the ranks where it was seen (numbers from the worst rank); the worst first."""
    enabled = runtime_codes() if select is None else runtime_codes() & set(select)
    merged: dict[tuple[str, str, str], Finding] = {}
    for group in groups(recordings):
        for rec in group:
            for finding in _layer_findings(rec, enabled):
                key = (finding.model, finding.layer, finding.code)
                merged[key] = _merge(merged.get(key), finding)
        for code in sorted(enabled & set(GROUP_DIAGNOSES)):
            for finding in GROUP_DIAGNOSES[code](group):
                merged[(finding.model, finding.layer, finding.code)] = finding
    return sorted(merged.values(), key=lambda f: (-f.weight, f.layer, f.code))


def _layer_findings(rec: Recording, enabled: set[str]) -> list[Finding]:
    found: list[Finding] = []
    for layer in rec.layers.values():
        here = []
        for code in sorted(enabled & set(LAYER_DIAGNOSES)):
            finding = LAYER_DIAGNOSES[code](rec, layer)
            if finding is not None:
                here.append(finding)
        codes = {f.code for f in here}
        found.extend(f for f in here if not EXPLAINED_BY.get(f.code, set()) & codes)
    return found


def _merge(old: Finding | None, new: Finding) -> Finding:
    if old is None:
        return new
    worst = new if new.weight > old.weight else old
    ranks = tuple(sorted(set(old.ranks) | set(new.ranks)))
    return Finding(worst.code, worst.layer, worst.message, worst.fix, worst.first_step,
                   worst.last_step, worst.numbers, worst.model, worst.framework, ranks,
                   worst.weight)
