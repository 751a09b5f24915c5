"""BN <-> synced BN and BN <-> frozen BN conversions of a module tree, reversible and in place.

Each function converts every BN module of `module` (the root included) by an in-place class swap
(see `bnfix.torch.swap`), returns `module`, and appends what it converted and refused to `report`
when one is given. With `strict=True` any refusal raises `ConversionRefused` before anything is
changed. Modules a function is not concerned with are left alone without a record (convert_sync
skips modules already synced or frozen; revert_sync skips modules that are not synced).

What happens to each class is data (rules/catalogue/torch_modules.toml): torch's BN classes and
others with no behaviour of their own become bnfix's class itself; any other BN class (a
subclass, timm's BatchNormAct2d and its relatives) becomes a derived class that runs its own
forward with its batch_norm calls redirected (`bnfix.torch.redirect`), kept only when a probe of
that forward shows the conversion exact (`bnfix.torch.probe`); the rest are refused with the
catalogue's reason.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch.fx
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.lazy import LazyModuleMixin

from bnfix.torch import probe
from bnfix.torch.distributed import ProcessGroup, sync_group
from bnfix.torch.frozen import FrozenBatchNorm
from bnfix.torch.functional import sync_batch_norm
from bnfix.torch.redirect import BatchNormCall, eval_forward, redirected_forward
from bnfix.torch.report import ConversionReport
from bnfix.torch.swap import (
    Site,
    Step,
    convert_sites,
    derived_class,
    module_spec,
    origins,
    swap_class,
    undo_swap,
)
from bnfix.torch.sync_bn import SyncBatchNorm

torch.fx.wrap("sync_batch_norm")  # one node in a torch.fx graph, not traced into

GroupChoice = ProcessGroup | Callable[[str], ProcessGroup | None] | None

_LAZY = ("is not materialised (its num_features is unknown until the first forward): run a "
         "forward pass on a sample input before converting")


def _synced_call(module: nn.Module, call: BatchNormCall) -> Tensor:
    """A redirected batch_norm call of a synced module: synced in training with peers."""
    group = sync_group(module.process_group) if call.training else None  # type: ignore[arg-type]
    if group is None:
        return call.run()
    return sync_batch_norm(call.input, call.running_mean, call.running_var, call.weight,
                           call.bias, None, call.momentum, call.eps, group)


def _identity(module: nn.Module, call: BatchNormCall) -> Tensor:
    """A redirected batch_norm call of a module whose BN was folded into the layer before."""
    return call.input


synced_forward = functools.partial(redirected_forward, handler=_synced_call)
folded_forward = functools.partial(redirected_forward, handler=_identity)


def outcome(module: nn.Module, action: str) -> str:
    """What the catalogue says `action` does with this module's class ("behaviour" for a BN
    subclass it does not list)."""
    spec = module_spec(module)
    if spec is not None:
        return spec.outcome(action)
    return "behaviour" if isinstance(module, _BatchNorm) else "skip"


def _target_for(site: Site, action: str, behaviour: type[_BatchNorm], kind: str,
                make_forward: Callable[[type[nn.Module]], Callable[..., object]],
                check: Callable[[nn.Module, Callable[[nn.Module], None], type[nn.Module]],
                                str | None],
                attrs: dict[str, object]) -> Step | None:
    """`behaviour` itself for a plain BN class; a derived class when its probe is exact; else a
    refusal with the catalogue's or the probe's reason."""
    module = site.module
    cls = type(module)
    if isinstance(module, LazyModuleMixin):
        return Step(site, None, f"{cls.__name__} {_LAZY}")
    how = outcome(module, action)
    if how == "skip":
        return None
    if how.startswith("refuse:"):
        return Step(site, None, how.removeprefix("refuse:").strip())
    if how == "plain":
        return Step(site, behaviour)
    if not isinstance(module, _BatchNorm):
        return Step(site, None, f"{cls.__name__} is not a torch _BatchNorm: no {kind} "
                                "conversion keeps its class")
    try:
        target = derived_class(cls, behaviour, kind, make_forward)
    except TypeError as exc:
        return Step(site, None, f"cannot combine {cls.__name__} with {behaviour.__name__}: {exc}")
    problem = check(module, lambda twin: swap_class(twin, target, kind, attrs), target)
    if problem is not None:
        return Step(site, None, problem)
    return Step(site, target, f"derived class: {cls.__name__}'s own forward and attributes "
                              f"kept, its batch_norm {kind} (probe exact)")


def _undo_plan(kind: str, behaviour: type[_BatchNorm], undo_name: str
               ) -> Callable[[Site], Step | None]:
    def plan(site: Site) -> Step | None:
        stack = origins(site.module)
        if not stack:
            if isinstance(site.module, behaviour):
                return Step(site, None, f"no original class recorded (not made by {undo_name})")
            return None
        if stack[-1].kind != kind:
            if any(origin.kind == kind for origin in stack):
                return Step(site, None, f"converted again ({stack[-1].kind}) after {undo_name}: "
                                        "undo that conversion first")
            return None
        return Step(site, stack[-1].cls)
    return plan


def convert_sync(module: nn.Module, process_group: GroupChoice = None, *, strict: bool = False,
                 report: ConversionReport | None = None) -> nn.Module:
    """Make every BN of `module` a `bnfix.torch.SyncBatchNorm` (in place; returns `module`).

    `process_group`: one group for all layers (None: the default group), or a function of the
    module's dotted path giving each layer its group. BN subclasses and norm-act layers (timm's
    BatchNormAct2d, SyncBatchNormAct) become a derived class that keeps their forward, its
    batch_norm synced, when a probe shows that exact; otherwise they are refused, as are
    un-materialised Lazy BN and what the catalogue refuses (frozen-by-construction layers).
    """
    def group_for(path: str) -> ProcessGroup | None:
        return process_group(path) if callable(process_group) else process_group

    def plan(site: Site) -> Step | None:
        if isinstance(site.module, (SyncBatchNorm, FrozenBatchNorm)):
            return None
        return _target_for(site, "convert_sync", SyncBatchNorm, "sync", synced_forward,
                           probe.check_sync, {"process_group": None})

    def apply(site: Site, target: type[nn.Module]) -> None:
        swap_class(site.module, target, "sync", {"process_group": group_for(site.path)})

    convert_sites(module, "convert_sync", plan, apply, strict, report)
    return module


def revert_sync(module: nn.Module, *, strict: bool = False,
                report: ConversionReport | None = None) -> nn.Module:
    """Give every BN made by `convert_sync` back its exact original class and attributes."""
    convert_sites(module, "revert_sync", _undo_plan("sync", SyncBatchNorm, "convert_sync"),
                  lambda site, _target: undo_swap(site.module), strict, report)
    return module


def freeze(module: nn.Module, *, strict: bool = False,
           report: ConversionReport | None = None) -> nn.Module:
    """Make every BN of `module` a `FrozenBatchNorm` (running stats used and kept in train mode
    too; weight and bias stop requiring grad). BN subclasses and norm-act layers become a
    derived class that runs their forward with their running statistics, when a probe shows
    that equal to their eval mode. BNs without running stats are refused."""
    def plan(site: Site) -> Step | None:
        bn = site.module
        if isinstance(bn, FrozenBatchNorm):
            return None
        if isinstance(bn, _BatchNorm) and bn.running_mean is None:
            return Step(site, None, "track_running_stats=False: no running statistics to freeze")
        if type(bn) is SyncBatchNorm:
            return Step(site, FrozenBatchNorm)
        if isinstance(bn, SyncBatchNorm):
            return Step(site, None, "a synced BN subclass: revert_sync it before freezing")
        return _target_for(site, "freeze", FrozenBatchNorm, "frozen", eval_forward,
                           probe.check_frozen, {})

    def apply(site: Site, target: type[nn.Module]) -> None:
        swap_class(site.module, target, "frozen", {})
        for param in site.module.parameters(recurse=False):
            param.requires_grad_(False)

    convert_sites(module, "freeze", plan, apply, strict, report)
    return module


def unfreeze(module: nn.Module, *, strict: bool = False,
             report: ConversionReport | None = None) -> nn.Module:
    """Give every BN made by `freeze` back its original class and requires_grad flags."""
    convert_sites(module, "unfreeze", _undo_plan("frozen", FrozenBatchNorm, "freeze"),
                  lambda site, _target: undo_swap(site.module), strict, report)
    return module
