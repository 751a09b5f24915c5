"""Fold eval-mode BN into the conv / linear layer right before it, for inference.

"Right before" means the previous child of an `nn.Sequential` (whose forward is torch's own):
that order is the data flow. BNs used from a hand-written `forward` (functional graphs) are not
traced and are reported as refused, as is every pair whose fold would not be exact: shared
modules, hooks, BN subclasses or layer subclasses with their own behaviour, BN without running
stats, channel mismatches. Folding changes the layer's weight and bias in place (a bias Parameter
is added when the layer had none) and puts an `nn.Identity` where the BN was; it is not revertible.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from itertools import pairwise

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.conv import _ConvTransposeNd
from torch.nn.modules.lazy import LazyModuleMixin

from bnfix.torch.frozen import FrozenBatchNorm
from bnfix.torch.report import ConversionRecord, ConversionRefused, ConversionReport
from bnfix.torch.sync_bn import SyncBatchNorm

FOLD_INTO: tuple[type[nn.Module], ...] = (
    nn.Conv1d, nn.Conv2d, nn.Conv3d,
    nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d,
    nn.Linear,
)
FOLDABLE_BN: tuple[type[_BatchNorm], ...] = (
    nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm, SyncBatchNorm,
    FrozenBatchNorm,
)
_NOT_TRACED = ("no Conv/ConvTranspose/Linear right before it in an nn.Sequential (fold follows "
               "Sequential order only; BNs called from a hand-written forward are not traced)")


@dataclass(frozen=True)
class _Pair:
    parent: nn.Sequential
    name: str
    layer: nn.Module
    bn: _BatchNorm
    path: str


def _has_hooks(module: nn.Module) -> bool:
    return bool(module._forward_hooks or module._forward_pre_hooks or module._backward_hooks)


def _out_channels(layer: nn.Module) -> int:
    return layer.out_features if isinstance(layer, nn.Linear) else layer.out_channels


def _refusal(pair: _Pair, uses: Counter[int]) -> str | None:
    bn, layer = pair.bn, pair.layer
    if isinstance(bn, LazyModuleMixin) or isinstance(layer, LazyModuleMixin):
        return "a Lazy module that is not materialised: run a forward pass first"
    if type(bn) not in FOLDABLE_BN:
        return f"{type(bn).__name__} is a BN subclass with its own behaviour"
    if type(layer) not in FOLD_INTO:
        return f"the layer before it is a {type(layer).__name__}, not a plain conv/linear"
    if bn.running_mean is None or bn.running_var is None:
        return "track_running_stats=False: eval mode uses batch statistics, nothing to fold"
    if uses[id(bn)] > 1 or uses[id(layer)] > 1:
        return "the BN or the layer before it is registered more than once (shared)"
    if _has_hooks(bn) or _has_hooks(layer):
        return "the BN or the layer before it has hooks that folding would change"
    if _out_channels(layer) != bn.num_features:
        return f"{_out_channels(layer)} output channels before a BN of {bn.num_features}"
    return None


def _sequential_pairs(root: nn.Module) -> dict[int, _Pair]:
    pairs: dict[int, _Pair] = {}
    for path, parent in root.named_modules():
        if not isinstance(parent, nn.Sequential) or type(parent).forward is not nn.Sequential.forward:
            continue
        for (_, layer), (name, bn) in pairwise(parent.named_children()):
            if isinstance(bn, _BatchNorm) and isinstance(layer, FOLD_INTO):
                full = f"{path}.{name}" if path else name
                pairs.setdefault(id(bn), _Pair(parent, name, layer, bn, full))
    return pairs


@torch.no_grad()
def _fold_pair(layer: nn.Module, bn: _BatchNorm, mean: torch.Tensor, var: torch.Tensor) -> None:
    """y = (layer(x) - mean) * g / sqrt(var + eps) + b folded into the layer, in float64."""
    scale = torch.rsqrt(var.double() + bn.eps)
    if bn.weight is not None:
        scale = scale * bn.weight.double()
    shift = -mean.double() * scale
    if bn.bias is not None:
        shift = shift + bn.bias.double()
    weight = layer.weight.double()
    if isinstance(layer, _ConvTransposeNd):  # weight (in, out / groups, *k): out is dim 1
        groups = layer.groups
        grouped = weight.view(groups, -1, *weight.shape[1:])
        folded = grouped * scale.view(groups, 1, -1, *([1] * (weight.dim() - 2)))
    else:  # weight (out, in / groups, *k) or (out, in)
        folded = weight * scale.view(-1, *([1] * (weight.dim() - 1)))
    layer.weight.copy_(folded.view_as(weight))
    if layer.bias is None:
        layer.bias = nn.Parameter(shift.to(layer.weight.dtype),
                                  requires_grad=layer.weight.requires_grad)
    else:
        layer.bias.copy_(layer.bias.double() * scale + shift)


def fold(module: nn.Module, *, strict: bool = False,
         report: ConversionReport | None = None) -> nn.Module:
    """Fold each eval-mode BN of `module` into the Conv1d/2d/3d, ConvTranspose1d/2d/3d (grouped
    included) or Linear right before it; the BN becomes `nn.Identity`. Returns `module` (an
    `nn.Identity` never replaces the root: a lone root BN has nothing before it and is refused).
    Raises ValueError when any BN is in training mode (batch statistics cannot be folded)."""
    uses = Counter(id(m) for _, m in module.named_modules(remove_duplicate=False))
    bns = [(path, m) for path, m in module.named_modules() if isinstance(m, _BatchNorm)]
    training = [path or "(root)" for path, bn in bns
                if bn.training and not isinstance(bn, FrozenBatchNorm)]
    if training:
        raise ValueError("fold needs eval mode (a BN in training mode normalises with batch "
                         f"statistics): call model.eval() first; in training mode: "
                         f"{', '.join(training)}")
    pairs = _sequential_pairs(module)
    converted: list[ConversionRecord] = []
    refused: list[ConversionRecord] = []
    planned: list[_Pair] = []
    for path, bn in bns:
        pair = pairs.get(id(bn))
        reason = _NOT_TRACED if pair is None else _refusal(pair, uses)
        if pair is None or reason is not None:
            refused.append(ConversionRecord(path, type(bn).__name__, "", reason or "", "fold"))
            continue
        planned.append(pair)
        converted.append(ConversionRecord(pair.path, type(bn).__name__, "Identity",
                                          f"folded into {type(pair.layer).__name__}", "fold"))
    if strict and refused:
        raise ConversionRefused("fold", refused)
    for pair in planned:
        _fold_pair(pair.layer, pair.bn, pair.bn.running_mean, pair.bn.running_var)
        setattr(pair.parent, pair.name, nn.Identity())
    if report is not None:
        report.converted.extend(converted)
        report.refused.extend(refused)
    return module
