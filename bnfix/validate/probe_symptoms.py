"""Per-rule symptoms over a run's probe log. SYMPTOMS maps a rule code to the function that
measures its symptom in one run; `compare` turns the original's and the fixed run's
observations into a verdict. Adding a rule's symptom is one function and one table entry."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from bnfix.validate.probe_logs import RunLog, Trajectories

GONE, STILL_THERE, NOT_SHOWN, NOT_OBSERVABLE = ("gone", "still there", "not shown",
                                                "not observable")


@dataclass(frozen=True)
class Observation:
    """One run's figure for a symptom; present is None when the probe could not observe it."""

    present: bool | None
    figure: float | None
    text: str


@dataclass(frozen=True)
class Verdict:
    status: str  # GONE, STILL_THERE, NOT_SHOWN (absent from the original too), NOT_OBSERVABLE
    reason: str
    original: Observation | None
    fixed: Observation | None


def _unseen(why: str) -> Observation:
    return Observation(None, None, why)


def _fmt(value: float) -> str:
    return "0" if value == 0 else f"{value:.3g}"


# -- TF1 / Keras / torch: BN state over the steps ------------------------------------------
def _moved(trajectories: Trajectories, variables: tuple[str, ...]
           ) -> tuple[float, str, int, int] | None:
    """max |last - first| over the layers' `variables`: (value, where, layers, steps)."""
    best, where, layers, steps = 0.0, "", 0, 0
    for layer, state in sorted(trajectories.items()):
        for var in variables:
            series = state.get(var)
            if not series or len(series) < 2:
                continue
            layers += var == variables[0]
            steps = max(steps, len(series) - 1)
            change = float(np.max(np.abs(series[-1] - series[0])))
            if change > best or not where:
                best, where = max(best, change), f"{layer}/{var}"
    return (best, where, layers, steps) if steps else None


def affine_frozen(log: RunLog) -> Observation:
    """BN001: gamma and beta never change although BN trains."""
    found = _moved(log.trajectories(), ("gamma", "beta"))
    if found is None:
        return _unseen("no training step with BN gamma/beta was recorded")
    value, where, layers, steps = found
    if value == 0:
        return Observation(True, 0.0, f"gamma/beta of {layers} BN layers unchanged after "
                                      f"{steps} steps (e.g. {where})")
    return Observation(False, value, f"{where} moved by {_fmt(value)} after {steps} steps")


def stats_frozen(log: RunLog) -> Observation:
    """BN003/BN011: the moving statistics stay at their initial values."""
    found = _moved(log.trajectories(), ("moving_mean", "moving_variance"))
    if found is None:
        return _unseen("no training step with BN moving statistics was recorded")
    value, where, layers, steps = found
    if value == 0:
        return Observation(True, 0.0, f"moving_mean/variance of {layers} BN layers stay at "
                                      f"their initial values after {steps} steps")
    return Observation(False, value, f"{where} moved by {_fmt(value)} after {steps} steps")


def stats_stuck_layers(log: RunLog) -> Observation:
    """BN009: BN layers whose moving statistics never move during training (inference mode)."""
    trajectories = log.trajectories()
    stuck = [layer for layer, state in trajectories.items()
             if len(state.get("moving_mean", [])) > 1
             and float(np.max(np.abs(state["moving_mean"][-1] - state["moving_mean"][0]))) == 0]
    if not any(len(s.get("moving_mean", [])) > 1 for s in trajectories.values()):
        return _unseen("no training step with BN moving statistics was recorded")
    names = ", ".join(sorted(stuck)[:3])
    return Observation(bool(stuck), float(len(stuck)),
                       f"{len(stuck)} BN layers never update their moving statistics"
                       + (f" ({names})" if stuck else ""))


# -- TF1 graph facts ---------------------------------------------------------------------
def duplicate_updates(log: RunLog) -> Observation:
    """BN002: several updates of each moving statistic per step (one per tower)."""
    graphs = [g for g in log.of("tf1_graph") if g["updates"]]
    if not graphs:
        ops = max((g["update_ops"] for g in log.of("tf1_graph")), default=0)
        return _unseen(f"no moving-statistic update is reachable from the train op (UPDATE_OPS "
                       f"holds {ops} ops: tf-keras builds none for a BN with trainable=False)")
    updates = graphs[0]["updates"]
    most = max(updates.values())
    return Observation(most > 1, float(most),
                       f"{most} update(s) per step of each moving statistic "
                       f"({sum(updates.values())} updates of {len(updates)} variables)")


def ema_shadows(log: RunLog) -> Observation:
    """BN004: ExponentialMovingAverage shadows of the moving statistics."""
    graphs = log.of("tf1_graph")
    if not graphs:
        return _unseen("no TF1 train op ran")
    count = len(graphs[0]["ema_shadows"])
    return Observation(count > 0, float(count), f"{count} EMA shadows of moving statistics")


# -- BN006: per-device statistics -------------------------------------------------------------
def _tf1_tower_statistics(log: RunLog) -> Observation | None:
    """TF1 towers: with each tower's own statistics, every tower's BN output is centred on
    beta; with the global batch's, the towers' outputs are off-centre by their slice's offset
    (and only their average is centred). Observable when the towers' inputs differ."""
    local, spread, where, seen = 0.0, 0.0, "", 0
    for step in log.of("tf1_step"):
        for layer, towers in step["towers"].items():
            if len(towers) < 2:
                continue
            beta = np.asarray(step["before"].get(f"{layer}/beta", 0.0))
            means = np.asarray([t["mean"] for t in towers])
            spread = max(spread, float(np.max(np.abs(means - means.mean(0)))))
            offset = max(float(np.max(np.abs(np.asarray(t["output_mean"]) - beta)))
                         for t in towers)
            seen += 1
            if offset >= local:
                local, where = offset, layer
    if not seen:
        return None
    if spread < 1e-6:
        return _unseen("the towers' batches have the same mean: per-tower and global "
                       "statistics agree")
    if local < 1e-3:
        return Observation(True, local, f"each tower normalizes with its own slice's "
                                        f"statistics: every tower's output is centred on beta "
                                        f"(within {_fmt(local)}; tower input means differ by "
                                        f"{_fmt(spread)})")
    return Observation(False, local, f"towers normalize with the global batch's statistics: "
                                     f"tower outputs off-centre by up to {_fmt(local)} ({where})")


def _ranks_differ(log: RunLog) -> Observation | None:
    """torch DDP: the ranks' running statistics after the same step."""
    ranks = {r: s for r, s in log.steps_by_rank().items() if r is not None}
    if len(ranks) < 2:
        return None
    last = min(s[-1]["step"] for s in ranks.values())
    states = [next(e for e in s if e["step"] == last)["layers"] for s in ranks.values()]
    worst = 0.0
    for layer, state in states[0].items():
        for other in states[1:]:
            for var in ("moving_mean", "moving_variance"):
                if var in state and var in other.get(layer, {}):
                    worst = max(worst, float(np.max(np.abs(np.asarray(state[var])
                                                           - np.asarray(other[layer][var])))))
    if worst > 1e-6:
        return Observation(True, worst, f"{len(ranks)} ranks' running statistics differ by up "
                                        f"to {_fmt(worst)} after step {last}")
    return Observation(False, worst, f"{len(ranks)} ranks' running statistics identical after "
                                     f"step {last}")


def _keras_replicas(log: RunLog) -> Observation | None:
    fits = log.of("keras_fit")
    if not fits or fits[0]["replicas"] < 2:
        return None
    unsynced = [n for n, s in fits[0]["layers"].items() if not s["synchronized"]]
    return Observation(bool(unsynced), float(len(unsynced)),
                       f"{len(unsynced)} BN layers normalize per replica "
                       f"({fits[0]['replicas']} replicas)")


def per_device_stats(log: RunLog) -> Observation:
    """BN006: BN normalizes (and updates from) each device's slice, not the global batch."""
    for measure in (_tf1_tower_statistics, _ranks_differ, _keras_replicas):
        found = measure(log)
        if found is not None:
            return found
    return _unseen("a single device ran (no towers, ranks or replicas seen)")


# -- torch: running statistics by phase ------------------------------------------------------
def eval_moves_stats(log: RunLog) -> Observation:
    """BN101: forward passes without gradients (evaluation) in train mode move the running
    statistics."""
    calls = [c for c in log.bn_calls() if not c["grad"]]
    if not calls:
        return _unseen("no BN forward pass without gradients (no evaluation) ran")
    moving = [c for c in calls if c["training"]]
    moved = max((c["moved_max"] for c in moving), default=0.0)
    count = sum(c["calls"] for c in calls)
    if moved > 0:
        layers = len({c["layer"] for c in moving})
        return Observation(True, moved, f"running stats moved during evaluation by up to "
                                        f"{_fmt(moved)} ({layers} layers, {count} no-grad calls)")
    train = sum(c["calls"] for c in moving)
    return Observation(False, moved, f"running stats unchanged during evaluation ({count} "
                                     f"no-grad calls, {train} in train mode)")


def frozen_moves_stats(log: RunLog) -> Observation:
    """BN102/BN105: a "frozen" BN (requires_grad=False, or put in eval mode on its own) whose
    running statistics still move."""
    calls = [c for c in log.bn_calls() if c["frozen"] and c["grad"]]
    if not calls:
        return _unseen("no frozen BN (requires_grad=False or .eval() on the BN) ran in training")
    moving = [c for c in calls if c["training"]]
    moved = max((c["moved_max"] for c in moving), default=0.0)
    count = sum(c["calls"] for c in calls)
    if moved > 0:
        layers = ", ".join(sorted({c["layer"] for c in moving})[:3])
        return Observation(True, moved, f"frozen BN running stats moved by up to {_fmt(moved)} "
                                        f"({layers}; {count} calls)")
    return Observation(False, 0.0, f"frozen BN running stats unchanged ({count} calls, "
                                   f"{sum(c['calls'] for c in moving)} in train mode)")


def sync_after_wrap(log: RunLog) -> Observation:
    """BN103: the SyncBN conversion ran after the DDP wrap or after the optimizer was built."""
    converts = log.of("convert")
    if not converts:
        return _unseen("the SyncBN conversion did not run in this command (its code path was "
                       "not taken)")
    late = [c for c in converts if c["after_wrap"] or c["after_optimizer"]]
    wraps = log.of("wrap")
    synced = f"; DDP wrapped {wraps[0]['sync_bn']} SyncBN, {wraps[0]['plain_bn']} plain BN" \
        if wraps else ""
    return Observation(bool(late), float(len(late)),
                       f"{len(late)} of {len(converts)} conversions after the wrap/optimizer"
                       + synced)


def biased_inputs(log: RunLog) -> Observation:
    """BN104: BN layers fed directly by a conv/linear that adds a bias."""
    calls = log.bn_calls()
    if not calls:
        return _unseen("no torch BN forward pass ran")
    layers = sorted({c["layer"] for c in calls if c["biased_input"]})
    return Observation(bool(layers), float(len(layers)),
                       f"{len(layers)} BN layers fed by a biased conv/linear"
                       + (f" ({', '.join(layers[:3])})" if layers else ""))


Measure = Callable[[RunLog], Observation]

SYMPTOMS: dict[str, Measure] = {
    "BN001": affine_frozen,
    "BN002": duplicate_updates,
    "BN003": stats_frozen,
    "BN004": ema_shadows,
    "BN006": per_device_stats,
    "BN009": stats_stuck_layers,
    "BN011": stats_frozen,
    "BN101": eval_moves_stats,
    "BN102": frozen_moves_stats,
    "BN103": sync_after_wrap,
    "BN104": biased_inputs,
    "BN105": frozen_moves_stats,
}

NO_SYMPTOM: dict[str, str] = {
    "BN005": "summed tower gradients scale every update by the tower count; the probe records "
             "BN state only (compare the weights with `bnfix validate tf1`)",
    "BN007": "an API migration to the exact native equivalent: same behaviour by design",
    "BN008": "a momentum convention shows against the batch statistics of each step, which the "
             "probe does not record",
    "BN010": "a hard-coded training flag shows in evaluation runs; the probe records train steps",
}


def compare(code: str, original: RunLog, fixed: RunLog) -> Verdict:
    measure = SYMPTOMS.get(code)
    if measure is None:
        return Verdict(NOT_OBSERVABLE, NO_SYMPTOM.get(code, f"no symptom is defined for {code}"),
                       None, None)
    before, after = measure(original), measure(fixed)
    if before.present is None or after.present is None:
        why = before.text if before.present is None else after.text
        side = "original" if before.present is None else "fixed"
        return Verdict(NOT_OBSERVABLE, f"{side} run: {why}", before, after)
    if after.present:
        return Verdict(STILL_THERE, "the symptom is in the fixed run", before, after)
    if not before.present:
        return Verdict(NOT_SHOWN, "this command does not show the symptom in the original",
                       before, after)
    return Verdict(GONE, "in the original, not in the fixed run", before, after)
