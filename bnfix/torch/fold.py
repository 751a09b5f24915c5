"""Fold eval-mode BN into the conv / linear layer that feeds it, for inference.

"Feeds it" is read from the data flow: the model is traced with torch.fx (BN layers and the
conv/linear layers kept as leaf calls), and a BN folds into the Conv1d/2d/3d,
ConvTranspose1d/2d/3d (grouped included) or Linear whose output is its input. Where a module
cannot be traced (detection models: data-dependent control flow), each of its children is
traced instead, down to the leaves. A fold happens only where it is exact, else the BN is
reported as refused with the reason: its producer also feeds other consumers, a module used
twice, hooks, layer subclasses with their own forward, BN without running stats, channel
mismatches. Norm-act layers (timm's BatchNormAct2d) keep their activation and drop path: their
class becomes one whose batch_norm is the identity (`bnfix.torch.redirect`), checked by a
probe; frozen layers that are not torch BN (torchvision's FrozenBatchNorm2d) fold when a probe
shows them a per-channel affine map of their buffers. Folding changes the layer's weight and
bias in place (a bias Parameter is added when the layer had none) and puts an `nn.Identity`
where a plain BN was; it is not revertible.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch
import torch.fx
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.conv import _ConvTransposeNd
from torch.nn.modules.lazy import LazyModuleMixin

from bnfix.torch import probe
from bnfix.torch.convert import folded_forward, outcome
from bnfix.torch.frozen import FrozenBatchNorm
from bnfix.torch.report import ConversionRecord, ConversionRefused, ConversionReport
from bnfix.torch.swap import Site, bn_sites, derived_class, is_bn, swap_class

FOLD_INTO: tuple[type[nn.Module], ...] = (
    nn.Conv1d, nn.Conv2d, nn.Conv3d,
    nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d,
    nn.Linear,
)
_NOT_TRACED = ("no traced Conv/ConvTranspose/Linear output feeds it (its module and every "
               "parent up to the root failed to trace with torch.fx)")


class _Tracer(torch.fx.Tracer):
    """BN-like and conv/linear modules stay leaf calls, so the graph shows which feeds which;
    so do the `opaque` modules (children that do not trace on their own)."""

    def __init__(self, opaque: frozenset[int] = frozenset()) -> None:
        super().__init__()
        self.opaque = opaque

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return id(m) in self.opaque or is_bn(m) or isinstance(m, FOLD_INTO) or \
            super().is_leaf_module(m, module_qualified_name)


def _trace(root: nn.Module, opaque: frozenset[int] = frozenset()) -> torch.fx.Graph | None:
    try:
        return _Tracer(opaque).trace(root)
    except Exception:  # noqa: BLE001 - user code fails to trace in every way there is
        return None


@dataclass(frozen=True)
class _Source:
    """What feeds a BN: the layer to fold into (None with `problem` when there is none)."""

    layer: nn.Module | None
    problem: str = ""


def _sources(root: nn.Module, found: dict[int, _Source]) -> None:
    """The producer of every BN call in `root`'s traced graph. When `root` does not trace, it
    is traced again with its untraceable children as opaque calls (their insides traced on
    their own); when it still does not, each child is traced instead."""
    graph = _trace(root)
    if graph is None:
        children = [child for child in root.children() if not is_bn(child)]
        opaque = frozenset(id(child) for child in children if _trace(child) is None)
        graph = _trace(root, opaque) if opaque else None
        for child in children if graph is None else [c for c in children if id(c) in opaque]:
            _sources(child, found)
        if graph is None:
            return
    modules = dict(root.named_modules(remove_duplicate=False))
    calls = Counter(node.target for node in graph.nodes if node.op == "call_module")
    for node in graph.nodes:
        if node.op != "call_module" or not is_bn(modules[node.target]):
            continue
        bn = modules[node.target]
        producer = node.args[0] if node.args else None
        if calls[node.target] > 1:
            found[id(bn)] = _Source(None, f"called {calls[node.target]} times in the traced "
                                          "forward: one fold cannot serve every call")
        elif not isinstance(producer, torch.fx.Node) or producer.op != "call_module" or \
                not isinstance(modules[producer.target], FOLD_INTO):
            what = producer.op if isinstance(producer, torch.fx.Node) else "a constant"
            if isinstance(producer, torch.fx.Node) and producer.op == "call_module":
                what = type(modules[producer.target]).__name__
            found[id(bn)] = _Source(None, f"its input is not a Conv/ConvTranspose/Linear "
                                          f"output (it comes from {what})")
        elif len(producer.users) > 1 or calls[producer.target] > 1:
            found[id(bn)] = _Source(None, f"{producer.target} also feeds other consumers (or "
                                          "is called twice): folding would change them")
        else:
            found[id(bn)] = _Source(modules[producer.target])


def _has_hooks(module: nn.Module) -> bool:
    return bool(module._forward_hooks or module._forward_pre_hooks or module._backward_hooks)


def _out_channels(layer: nn.Module) -> int:
    return layer.out_features if isinstance(layer, nn.Linear) else layer.out_channels


def _refusal(bn: nn.Module, layer: nn.Module, uses: Counter[int]) -> str | None:
    if isinstance(bn, LazyModuleMixin) or isinstance(layer, LazyModuleMixin):
        return "a Lazy module that is not materialised: run a forward pass first"
    if type(layer) not in FOLD_INTO:
        return f"the layer before it is a {type(layer).__name__}, not a plain conv/linear"
    if getattr(bn, "running_mean", None) is None or getattr(bn, "running_var", None) is None:
        return "track_running_stats=False: eval mode uses batch statistics, nothing to fold"
    if uses[id(bn)] > 1 or uses[id(layer)] > 1:
        return "the BN or the layer before it is registered more than once (shared)"
    if _has_hooks(bn) or _has_hooks(layer):
        return "the BN or the layer before it has hooks that folding would change"
    if _out_channels(layer) != probe.channels(bn):
        return f"{_out_channels(layer)} output channels before a BN of {probe.channels(bn)}"
    return None


@torch.no_grad()
def _fold_into(layer: nn.Module, scale: Tensor, shift: Tensor) -> None:
    """layer(x) * scale + shift per output channel, folded into the layer, in float64."""
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


def _plan(site: Site, source: _Source | None, uses: Counter[int]) -> tuple[str, str]:
    """(how, problem): how = "identity" or "norm_act"; problem "" when the fold is exact."""
    bn = site.module
    how = outcome(bn, "fold")
    if how.startswith("refuse:"):
        return "", how.removeprefix("refuse:").strip()
    if how == "skip":
        return "", "the catalogue leaves this class alone"
    if source is None:
        return "", _NOT_TRACED
    if source.layer is None:
        return "", source.problem
    problem = _refusal(bn, source.layer, uses)
    if problem is not None:
        return "", problem
    if how == "affine":
        return "identity", probe.check_fold(bn, None) or ""
    if how == "behaviour":
        if not isinstance(bn, _BatchNorm):
            return "", f"{type(bn).__name__} is not a torch _BatchNorm"
        target = derived_class(type(bn), FrozenBatchNorm, "folded", folded_forward)
        return "norm_act", probe.check_fold(bn, lambda twin: swap_class(twin, target, "folded",
                                                                       {})) or ""
    return "identity", ""


def fold(module: nn.Module, *, strict: bool = False,
         report: ConversionReport | None = None) -> nn.Module:
    """Fold each eval-mode BN of `module` into the Conv1d/2d/3d, ConvTranspose1d/2d/3d (grouped
    included) or Linear that feeds it; a plain BN becomes `nn.Identity`, a norm-act layer keeps
    only its activation part. Returns `module` (an `nn.Identity` never replaces the root: a lone
    root BN has nothing before it and is refused). Raises ValueError when any BN is in training
    mode (batch statistics cannot be folded)."""
    sites = bn_sites(module)
    training = [site.path or "(root)" for site in sites
                if isinstance(site.module, _BatchNorm) and site.module.training
                and not isinstance(site.module, FrozenBatchNorm)]
    if training:
        raise ValueError("fold needs eval mode (a BN in training mode normalises with batch "
                         f"statistics): call model.eval() first; in training mode: "
                         f"{', '.join(training)}")
    uses = Counter(id(m) for _, m in module.named_modules(remove_duplicate=False))
    found: dict[int, _Source] = {}
    _sources(module, found)
    converted: list[ConversionRecord] = []
    refused: list[ConversionRecord] = []
    planned: list[tuple[Site, nn.Module, str]] = []
    for site in sites:
        source = found.get(id(site.module))
        how, problem = _plan(site, source, uses)
        name = type(site.module).__name__
        if problem:
            refused.append(ConversionRecord(site.path, name, "", problem, "fold"))
            continue
        assert source is not None and source.layer is not None
        planned.append((site, source.layer, how))
        to = "Identity" if how == "identity" else f"Folded{name}"
        converted.append(ConversionRecord(site.path, name, to,
                                          f"folded into {type(source.layer).__name__}", "fold"))
    if strict and refused:
        raise ConversionRefused("fold", refused)
    for site, layer, how in planned:
        scale, shift = probe.bn_affine(site.module, torch.float64)
        _fold_into(layer, scale, shift)
        if how == "norm_act":
            swap_class(site.module, derived_class(type(site.module), FrozenBatchNorm, "folded",
                                                  folded_forward), "folded", {})
            continue
        parent_path, _, name = site.path.rpartition(".")
        setattr(module.get_submodule(parent_path), name, nn.Identity())
    if report is not None:
        report.converted.extend(converted)
        report.refused.extend(refused)
    return module
