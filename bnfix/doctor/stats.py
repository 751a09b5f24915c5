"""The monitors' summaries computed on the host from per-channel arrays (numpy), for the monitors
that read variables back (Keras, TF1); the torch monitor computes the same numbers on the
device. Summaries only: no judgement here."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

import numpy as np

from bnfix.doctor.record import FinalStats, Sample

FOLLOW = 4  # updates of γ/β followed after a sampled step (as the torch monitor)
WINDOW = 8  # sampled steps averaged for the end-of-run comparison


def fill_sample(sample: Sample, mean: np.ndarray, var: np.ndarray,
                running_mean: np.ndarray | None, running_var: np.ndarray | None,
                gamma: np.ndarray | None, beta: np.ndarray | None, eps: float) -> None:
    """Batch vs running statistics and γ/β summaries into `sample` (the STATS of
    `bnfix.torch.monitor`)."""
    mean, var = np.asarray(mean, np.float64), np.asarray(var, np.float64)
    bad = int((~np.isfinite(mean)).sum() + (~np.isfinite(var)).sum())
    sample.batch_mean, sample.batch_var = float(mean.mean()), float(var.mean())
    lows, highs = [var.min()], [var.max()]
    if running_mean is not None and running_var is not None:
        rm, rv = np.asarray(running_mean, np.float64), np.asarray(running_var, np.float64)
        sample.mean_gap = float(np.sqrt(np.mean((mean - rm) ** 2 / (rv + eps))))
        sample.var_ratio = float(np.sqrt(np.mean(np.log((var + eps) / (rv + eps)) ** 2)))
        sample.running_mean, sample.running_var = float(rm.mean()), float(rv.mean())
        lows.append(rv.min())
        highs.append(rv.max())
        bad += int((~np.isfinite(rm)).sum() + (~np.isfinite(rv)).sum())
    sample.var_min, sample.var_max = float(min(lows)), float(max(highs))
    sample.nonfinite = bad
    if gamma is not None:
        g = np.asarray(gamma, np.float64)
        sample.gamma_mean, sample.gamma_min, sample.gamma_max = \
            float(g.mean()), float(g.min()), float(g.max())
        sample.gamma_abs_median = float(np.median(np.abs(g)))
    if beta is not None:
        b = np.asarray(beta, np.float64)
        sample.beta_mean, sample.beta_min, sample.beta_max = \
            float(b.mean()), float(b.min()), float(b.max())
        if gamma is not None:
            sample.beta_over_gamma = float(np.median(np.abs(b) / np.maximum(np.abs(g), 1e-12)))


def fill_path(sample: Sample, gammas: list[np.ndarray | None], betas: list[np.ndarray | None]
              ) -> None:
    """Mean update size (in units of ‖γ‖) and path straightness of γ and β over snapshots
    taken after consecutive steps."""
    first = gammas[0]
    unit = float(np.linalg.norm(first)) if first is not None else None
    for key, points in (("gamma", gammas), ("beta", betas)):
        if any(p is None for p in points) or len(points) < 2:
            continue
        arrays = [np.asarray(p, np.float64) for p in points]
        scale = max(unit if unit is not None else float(np.sqrt(arrays[0].size)), 1e-12)
        length = sum(float(np.linalg.norm(b - a)) for a, b in pairwise(arrays))
        setattr(sample, f"{key}_step", length / (len(arrays) - 1) / scale)
        if length > 0:
            setattr(sample, f"{key}_path",
                    float(np.linalg.norm(arrays[-1] - arrays[0])) / length)


@dataclass
class Window:
    """The last WINDOW sampled batch statistics of one layer."""

    items: deque = field(default_factory=lambda: deque(maxlen=WINDOW))

    def add(self, mean: np.ndarray, var: np.ndarray) -> None:
        self.items.append((np.asarray(mean, np.float64), np.asarray(var, np.float64)))

    def final(self, running_mean: Any, running_var: Any, gamma: Any, beta: Any
              ) -> FinalStats | None:
        if not self.items:
            return None
        means = np.stack([m for m, _ in self.items])
        variances = np.stack([v for _, v in self.items])
        var = variances.mean(0) + (means.var(0) if len(means) > 1 else 0.0)
        return FinalStats(len(self.items), means.mean(0).tolist(), var.tolist(),
                          _list(running_mean), _list(running_var), _list(gamma), _list(beta))


def _list(value: Any) -> list[float] | None:
    return None if value is None else np.asarray(value, np.float64).reshape(-1).tolist()
