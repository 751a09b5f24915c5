"""BN <-> synced BN and BN <-> frozen BN conversions of a module tree, reversible and in place.

Each function converts every BN module of `module` (the root included) by an in-place class swap
(see `bnfix.torch.swap`), returns `module`, and appends what it converted and refused to `report`
when one is given. With `strict=True` any refusal raises `ConversionRefused` before anything is
changed. Modules a function is not concerned with are left alone without a record (convert_sync
skips modules already synced or frozen; revert_sync skips modules that are not synced).
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.lazy import LazyModuleMixin

from bnfix.torch.distributed import ProcessGroup
from bnfix.torch.frozen import FrozenBatchNorm
from bnfix.torch.report import ConversionReport
from bnfix.torch.swap import (
    Site,
    Step,
    convert_sites,
    derived_class,
    forward_bypass,
    origins,
    swap_class,
    undo_swap,
)
from bnfix.torch.sync_bn import SyncBatchNorm

# Classes whose behaviour the targets reproduce entirely: converted to the target class itself.
PLAIN_BN: tuple[type[_BatchNorm], ...] = (
    nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm, SyncBatchNorm,
)
GroupChoice = ProcessGroup | Callable[[str], ProcessGroup | None] | None

_LAZY = ("is not materialised (its num_features is unknown until the first forward): run a "
         "forward pass on a sample input before converting")


def _target_for(site: Site, behaviour: type[_BatchNorm]) -> Step:
    """`behaviour` itself for plain BN classes, else a derived subclass that keeps the class's
    own methods and attributes, or a refusal when its forward would bypass `behaviour`."""
    cls = type(site.module)
    if isinstance(site.module, LazyModuleMixin):
        return Step(site, None, f"{cls.__name__} {_LAZY}")
    if cls in PLAIN_BN:
        return Step(site, behaviour)
    try:
        target = derived_class(cls, behaviour)
    except TypeError as exc:
        return Step(site, None, f"cannot combine {cls.__name__} with {behaviour.__name__}: {exc}")
    bypass = forward_bypass(target, behaviour)
    if bypass is not None:
        return Step(site, None, bypass)
    return Step(site, target, f"subclass kept: {cls.__name__}'s own methods and attributes stay")


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
    module's dotted path giving each layer its group. BN subclasses become a derived synced
    subclass (their forward override still runs; its `super().forward` is synced) or are refused
    when their forward does not call `super().forward`; un-materialised Lazy BN is refused.
    """
    def group_for(path: str) -> ProcessGroup | None:
        return process_group(path) if callable(process_group) else process_group

    def plan(site: Site) -> Step | None:
        if isinstance(site.module, (SyncBatchNorm, FrozenBatchNorm)):
            return None
        return _target_for(site, SyncBatchNorm)

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
    too; weight and bias stop requiring grad). BNs without running stats are refused."""
    def plan(site: Site) -> Step | None:
        bn = site.module
        if isinstance(bn, FrozenBatchNorm):
            return None
        if bn.running_mean is None:
            return Step(site, None, "track_running_stats=False: no running statistics to freeze")
        if isinstance(bn, SyncBatchNorm) and type(bn) is not SyncBatchNorm:
            return Step(site, None, "a synced BN subclass: revert_sync it before freezing")
        return _target_for(site, FrozenBatchNorm)

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
