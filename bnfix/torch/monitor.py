"""`bnfix.torch.monitor(model, every=10)`: watch every BatchNorm of a model while it trains.

Forward pre/post hooks on each BN (and on the model, to count steps) record, every `every`
training steps, the batch statistics against the running ones, the per-channel sample count,
γ/β summaries and gradient norms, the fraction of channels dead after a ReLU, and the next
FOLLOW updates of γ/β (their size and how straight their path is: oscillation). The reductions run on the model's device and are read back once
per sampled step; between samples a hook only checks a few flags. On every step it notes whether
a BN ran in eval mode while training and whether running statistics were updated during
evaluation. Every `probe_every` samples, and when the monitor closes, a fixed probe batch (the
first training inputs) is run twice without gradients — all BN in eval mode, then BN in train
mode with momentum 0 (running statistics untouched) — to measure each layer's train/eval gap.

A training step is a forward of the model with gradients enabled; a forward without gradients
(`torch.no_grad()`, `inference_mode`) is evaluation. The recording is framework-neutral
(`bnfix.doctor.record`); `diagnose()` judges it with the BN3xx rules.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _BatchNorm

from bnfix.doctor.record import FinalStats, LayerTrace, Recording, Sample, add_step
from bnfix.doctor.stats import FOLLOW, WINDOW

PROBE_SAMPLES = 64  # most inputs kept for the train/eval probe
PROBE_MIN = 32  # a probe batch smaller than this is topped up with the next training batches
# the scalars of one sample, in the order `_stats` stacks them
STATS = ("mean_gap", "var_ratio", "batch_mean", "running_mean", "batch_var", "running_var",
         "var_min", "var_max", "nonfinite", "gamma_mean", "gamma_min", "gamma_max",
         "gamma_abs_median", "beta_mean", "beta_min", "beta_max", "beta_over_gamma")


@dataclass
class _Pending:
    """A sample whose numbers are still tensors on the device."""

    sample: Sample
    stats: Tensor | None = None
    extra: dict[str, Tensor] = field(default_factory=dict)  # dead, grads, γ/β paths


@dataclass
class _Layer:
    module: _BatchNorm
    trace: LayerTrace
    window: deque = field(default_factory=lambda: deque(maxlen=WINDOW))  # (mean, var)
    pending: dict[int, _Pending] = field(default_factory=dict)  # by step
    want_grad: dict[str, int] = field(default_factory=dict)  # parameter -> step of its sample
    probe_io: tuple[Tensor, Tensor] | None = None  # input and eval-mode output on the probe


def _is_synced(module: _BatchNorm) -> bool:
    return isinstance(module, nn.SyncBatchNorm) or "Sync" in type(module).__name__


def _world() -> tuple[int | None, int]:
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return None, 1


def _name(path: str) -> str:
    return path.removeprefix("module.") or "(root)"


class TorchMonitor:
    """Hooks on one model's BN layers; use `monitor()` to make one. Context manager: leaving
    the block closes it (final probe, hooks removed). `recording` is the data so far."""

    def __init__(self, model: nn.Module, every: int = 10, *, probe_every: int = 5,
                 probe: bool = True) -> None:
        if every < 1:
            raise ValueError(f"every must be at least 1 (got {every})")
        self.model = model
        self.every = every
        self.probe_every = probe_every
        self.probe_enabled = probe
        rank, world = _world()
        self.recording = Recording("torch", type(model).__name__, every, rank=rank, world=world)
        self.layers: dict[int, _Layer] = {}
        self.step = 0
        self.sampling = False
        self.evaluating = False
        self.probing = False
        self.samples = 0  # sampled steps so far
        self.closed = False
        self.probe_input: Tensor | None = None
        self.snapshots: dict[int, list[tuple[Tensor | None, Tensor | None]]] = {}
        self.awaiting: list[int] = []  # sampled steps whose γ/β follow-up updates are pending
        self.handles: list[Any] = []

    # -- lifecycle -----------------------------------------------------------------------------
    def attach(self) -> TorchMonitor:
        seen: set[int] = set()
        for path, module in self.model.named_modules():
            if not isinstance(module, _BatchNorm) or id(module) in seen:
                continue
            seen.add(id(module))
            self._attach_layer(_name(path), module)
        if not self.layers:
            self.recording.notes.append("no BatchNorm layer in the model")
        self.handles.append(self.model.register_forward_pre_hook(self._root_pre))
        return self

    def _attach_layer(self, name: str, module: _BatchNorm) -> None:
        track = module.track_running_stats and module.running_mean is not None
        weight = module.weight
        trace = LayerTrace(
            name=name, cls=type(module).__name__, channels=int(module.num_features),
            momentum=(None if module.momentum is None else float(module.momentum))
            if track else None,
            synced=_is_synced(module), affine=weight is not None,
            trainable=any(p.requires_grad for p in module.parameters(recurse=False)),
            dtype=str(module.running_var.dtype if track else (weight.dtype if weight is not None
                                                               else torch.float32)
                      ).removeprefix("torch."))
        layer = self.layers[id(module)] = _Layer(module, trace)
        self.recording.layers[name] = trace
        self.handles.append(module.register_forward_pre_hook(self._bn_pre))
        self.handles.append(module.register_forward_hook(self._bn_post))
        for attr in ("weight", "bias"):
            param = getattr(module, attr)
            if isinstance(param, nn.Parameter) and param.requires_grad:
                self.handles.append(param.register_post_accumulate_grad_hook(
                    self._grad_hook(layer, attr)))

    def close(self) -> Recording:
        """Final probe, numbers read back, hooks removed; returns the recording."""
        if not self.closed:
            self.closed = True
            if self.probe_enabled:
                self._probe()
            self._finish()
            for handle in self.handles:
                handle.remove()
            self.handles.clear()
        return self.recording

    def snapshot(self) -> Recording:
        """The recording so far with its numbers read back (the monitor keeps going; the samples
        of the last FOLLOW steps wait for their γ/β follow-up updates)."""
        self._flush(everything=False)
        self._final_stats()
        return self.recording

    def diagnose(self, select: set[str] | None = None) -> list[Any]:
        """The BN3xx findings for what was recorded so far (`bnfix.doctor.diagnose`)."""
        from bnfix.doctor.diagnose import diagnose

        return diagnose([self.snapshot()], select=select)

    def __enter__(self) -> TorchMonitor:  # noqa: PYI034 - Python 3.10 has no typing.Self
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- hooks ---------------------------------------------------------------------------------
    def _root_pre(self, module: nn.Module, args: tuple) -> None:
        if self.probing:
            return
        self.evaluating = not torch.is_grad_enabled()
        if self.evaluating:
            return
        self.step += 1
        self.recording.steps = self.step
        self.sampling = (self.step - 1) % self.every == 0
        if self.probe_enabled:
            self._keep_probe_input(args)
        if self.sampling:
            self._flush(everything=False)
            if self.probe_enabled and self.samples and self.samples % self.probe_every == 0:
                self._probe()
            self.samples += 1
        self._follow_up()

    def _bn_pre(self, module: _BatchNorm, args: tuple) -> None:
        if self.probing or self.evaluating:
            if self.evaluating and not self.probing and module.training and \
                    module.track_running_stats and module.running_mean is not None:
                trace = self.layers[id(module)].trace
                trace.eval_updates += 1
                add_step(trace.eval_update_steps, self.step)
            return
        layer = self.layers[id(module)]
        trace = layer.trace
        if not module.training:
            if trace.trainable:
                add_step(trace.eval_mode_steps, self.step)
        elif module.track_running_stats and module.running_mean is not None:
            trace.updates += 1
        if self.sampling and args and isinstance(args[0], Tensor) and args[0].dim() >= 2:
            self._sample(layer, args[0].detach())

    def _bn_post(self, module: _BatchNorm, args: tuple, output: Any) -> None:
        layer = self.layers[id(module)]
        if self.probing:
            if module.training and args and isinstance(args[0], Tensor) and \
                    isinstance(output, Tensor) and args[0].dim() >= 2:
                layer.probe_io = (args[0].detach(), output.detach())
            return
        pending = layer.pending.get(self.step)
        if self.sampling and not self.evaluating and pending is not None and \
                isinstance(output, Tensor) and output.dim() >= 2:
            dims = [0, *range(2, output.dim())]
            pending.extra["dead"] = (output.detach().amax(dim=dims) <= 0).float().mean()

    def _grad_hook(self, layer: _Layer, attr: str) -> Any:
        def hook(param: nn.Parameter) -> None:
            step = layer.want_grad.pop(attr, None)
            if step is not None and param.grad is not None and step in layer.pending:
                key = "gamma_grad" if attr == "weight" else "beta_grad"
                layer.pending[step].extra[key] = param.grad.detach().float().norm()
        return hook

    # -- measurements --------------------------------------------------------------------------
    def _sample(self, layer: _Layer, x: Tensor) -> None:
        module = layer.module
        trace = layer.trace
        channels = x.shape[1]
        count = x.numel() // max(channels, 1)
        sample = Sample(step=self.step, count=int(count), batch=int(x.shape[0]))
        if trace.synced and self.recording.world > 1:
            sample.global_count = int(count) * self.recording.world
        if trace.input_dtype is None:
            trace.input_dtype = str(x.dtype).removeprefix("torch.")
        layer.pending[self.step] = _Pending(sample, self._stats(layer, x))
        for attr in ("weight", "bias"):
            if getattr(module, attr) is not None:
                layer.want_grad[attr] = self.step

    def _stats(self, layer: _Layer, x: Tensor) -> Tensor:
        """Every scalar of STATS as one tensor on the device (no host sync here)."""
        module = layer.module
        dims = [0, *range(2, x.dim())]
        count = x.numel() // max(x.shape[1], 1)
        var, mean = torch.var_mean(x.float(), dim=dims, correction=1 if count > 1 else 0)
        layer.window.append((mean, var))
        nan = torch.full((), float("nan"), device=x.device)
        eps = module.eps
        if module.running_mean is not None and module.running_var is not None:
            rm, rv = module.running_mean.detach().float(), module.running_var.detach().float()
            gap = ((mean - rm) ** 2 / (rv + eps)).mean().sqrt()
            ratio = (torch.log((var + eps) / (rv + eps)) ** 2).mean().sqrt()
            run_mean, run_var = rm.mean(), rv.mean()
            vmin, vmax = torch.minimum(var.min(), rv.min()), torch.maximum(var.max(), rv.max())
            bad = (~torch.isfinite(rm)).sum() + (~torch.isfinite(rv)).sum()
        else:
            gap = ratio = run_mean = run_var = nan
            vmin, vmax, bad = var.min(), var.max(), torch.zeros((), device=x.device)
        bad = bad + (~torch.isfinite(mean)).sum() + (~torch.isfinite(var)).sum()
        gamma = module.weight.detach().float() if module.weight is not None else None
        beta = module.bias.detach().float() if module.bias is not None else None
        g = [gamma.mean(), gamma.min(), gamma.max(), gamma.abs().median()] if gamma is not None \
            else [nan] * 4
        b = [beta.mean(), beta.min(), beta.max()] if beta is not None else [nan] * 3
        ratio_bg = (beta.abs() / gamma.abs().clamp_min(1e-12)).median() \
            if gamma is not None and beta is not None else nan
        values = [gap, ratio, mean.mean(), run_mean, var.mean(), run_var, vmin, vmax,
                  bad.float(), *g, *b, ratio_bg]
        return torch.stack([v.to(torch.float32) for v in values])

    def _follow_up(self) -> None:
        """Snapshots of γ/β at a sampled step and the FOLLOW steps after it: the updates between
        them give the mean relative step size and how straight the path is (oscillation)."""
        needed = self.sampling or any(0 < self.step - s <= FOLLOW for s in self.awaiting)
        if needed:
            self.snapshots[self.step] = [
                (_copy(layer.module.weight), _copy(layer.module.bias))
                for layer in self.layers.values()]
        for first in list(self.awaiting):
            if self.step == first + FOLLOW and \
                    all(first + k in self.snapshots for k in range(FOLLOW + 1)):
                self._path(first)
            if self.step >= first + FOLLOW:
                self.awaiting.remove(first)
        for old in [s for s in self.snapshots if s < self.step - FOLLOW]:
            del self.snapshots[old]
        if self.sampling:
            self.awaiting.append(self.step)

    def _path(self, first: int) -> None:
        series = [self.snapshots[first + k] for k in range(FOLLOW + 1)]
        for index, layer in enumerate(self.layers.values()):
            pending = layer.pending.get(first)
            if pending is None:
                continue
            gamma = series[0][index][0]
            # both in units of ‖γ‖ (the channels' output scale); β starts at 0
            unit = gamma.norm().clamp_min(1e-12) if gamma is not None else None
            for slot, key in ((0, "gamma"), (1, "beta")):
                points = [snap[index][slot] for snap in series]
                if points[0] is None:
                    continue
                scale = unit if unit is not None else \
                    torch.tensor(float(points[0].numel()) ** 0.5, device=points[0].device)
                length = sum((b - a).norm() for a, b in pairwise(points))
                net = (points[-1] - points[0]).norm()
                pending.extra[f"{key}_step"] = length / FOLLOW / scale
                pending.extra[f"{key}_path"] = torch.where(
                    length > 0, net / length.clamp_min(1e-30),
                    torch.full((), float("nan"), device=net.device))

    def _keep_probe_input(self, args: tuple) -> None:
        if not args or not isinstance(args[0], Tensor) or args[0].dim() < 2:
            return
        x = args[0].detach()
        if self.probe_input is None:
            self.probe_input = x[:PROBE_SAMPLES].clone()
        elif len(self.probe_input) < PROBE_MIN and x.shape[1:] == self.probe_input.shape[1:]:
            room = PROBE_SAMPLES - len(self.probe_input)
            self.probe_input = torch.cat([self.probe_input, x[:room]])

    # -- the train/eval probe ------------------------------------------------------------------
    def _probe(self) -> None:
        """The probe batch through the model twice without gradients, every module but BN in
        eval mode: BN in eval mode, then BN in train mode at momentum 0 (running statistics
        untouched). The model outputs' difference is the output gap; each BN's own gap compares
        its train-mode output with what its running statistics make of the same input (so an
        upstream layer's gap is not counted again downstream)."""
        x = self.probe_input
        if x is None or not self.layers:
            if x is None and self.layers:
                self._note("no probe batch (the model's first input is not one tensor): "
                           "train/eval gap not measured")
            return
        modes = {m: m.training for m in self.model.modules()}
        saved = {id(l.module): (l.module.momentum, _copy(l.module.num_batches_tracked))
                 for l in self.layers.values()}
        self.probing = True
        try:
            with torch.no_grad():
                self.model.eval()
                eval_out = self.model(x)
                for layer in self.layers.values():
                    if not layer.trace.synced:  # a synced BN would wait for the other ranks
                        layer.module.train()
                        layer.module.momentum = 0.0
                train_out = self.model(x)
                for layer in self.layers.values():
                    self._layer_gap(layer)
        finally:
            self.probing = False
            for module, mode in modes.items():
                module.training = mode
            for layer in self.layers.values():
                momentum, tracked = saved[id(layer.module)]
                layer.module.momentum = momentum
                if tracked is not None:
                    layer.module.num_batches_tracked.copy_(tracked)
                layer.probe_io = None
        gap = _gap(train_out, eval_out)
        if gap is not None:
            self.recording.output_gap.append([self.step, gap])

    def _layer_gap(self, layer: _Layer) -> None:
        if layer.probe_io is None:
            return
        x, y_train = layer.probe_io
        module = layer.module
        if module.running_mean is None or module.running_var is None:
            return
        y_eval = nn.functional.batch_norm(x, module.running_mean, module.running_var,
                                          module.weight, module.bias, False, 0.0, module.eps)
        gap = _gap(y_train, y_eval)
        if gap is not None:
            layer.trace.probes.append([self.step, gap])

    def _note(self, note: str) -> None:
        if note not in self.recording.notes:
            self.recording.notes.append(note)

    # -- reading back --------------------------------------------------------------------------
    def _flush(self, everything: bool) -> None:
        """Read back the samples whose follow-up steps are over (all of them at the end)."""
        due = self.step - FOLLOW
        for layer in self.layers.values():
            for step in sorted(layer.pending):
                if everything or step < due:
                    pending = layer.pending.pop(step)
                    _fill(pending)
                    layer.trace.samples.append(pending.sample)

    def _finish(self) -> None:
        self._flush(everything=True)
        self._final_stats()

    def _final_stats(self) -> None:
        for layer in self.layers.values():
            if not layer.window:
                continue
            means = torch.stack([m for m, _ in layer.window])
            variances = torch.stack([v for _, v in layer.window])
            mean = means.mean(0)
            var = variances.mean(0) + (means.var(0, correction=0) if len(means) > 1 else 0.0)
            module = layer.module
            layer.trace.final = FinalStats(
                window=len(layer.window), batch_mean=_floats(mean), batch_var=_floats(var),
                running_mean=_floats(module.running_mean), running_var=_floats(module.running_var),
                gamma=_floats(module.weight), beta=_floats(module.bias))


def _copy(tensor: Tensor | None) -> Tensor | None:
    return None if tensor is None else tensor.detach().float().clone() \
        if tensor.is_floating_point() else tensor.detach().clone()


def _floats(tensor: Tensor | None) -> list[float] | None:
    return None if tensor is None else tensor.detach().float().cpu().tolist()


def _gap(train: Any, evaluation: Any) -> float | None:
    """‖y_train − y_eval‖ / ‖y_eval‖ over the probe batch."""
    if not isinstance(train, Tensor) or not isinstance(evaluation, Tensor) or \
            train.shape != evaluation.shape or not train.is_floating_point():
        return None
    t, e = train.float(), evaluation.float()
    return float((t - e).norm() / e.norm().clamp_min(1e-12))


def _fill(pending: _Pending) -> None:
    sample = pending.sample
    if pending.stats is not None:
        for name, value in zip(STATS, pending.stats.cpu().tolist()):
            if not math.isnan(value):  # NaN: not measured
                setattr(sample, name, int(value) if name == "nonfinite" else value)
    for name, tensor in pending.extra.items():
        value = float(tensor)
        if not math.isnan(value):
            setattr(sample, name, value)


def monitor(model: nn.Module, every: int = 10, *, probe_every: int = 5,
            probe: bool = True) -> TorchMonitor:
    """Start monitoring `model`'s BN layers, sampling every `every` training steps; use as a
    context manager (or call `.close()`), then read `.recording` or call `.diagnose()`."""
    return TorchMonitor(model, every, probe_every=probe_every, probe=probe).attach()
