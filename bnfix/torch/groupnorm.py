"""`bnfix.torch.to_group_norm(model, groups=32)`: every BatchNorm → `nn.GroupNorm`, what the
small-batch diagnosis (BN301) recommends when the batch cannot grow and BN cannot be synced.

A recipe change, not a weight-preserving conversion: GroupNorm normalizes each sample over
groups of channels instead of each channel over the batch, so it has no running statistics and
the converted model must be trained (fine-tuned) again; γ/β are copied as a starting point.
The group count per layer is `groups` when it divides the channels, else the largest divisor
of the channel count below it (reported); a layer whose channels have no divisor between 2 and
`groups` (a prime count above `groups`) or a lazy BN not yet initialized is refused with the
reason. BatchNorm1d keeps at least 2 channels per group (its input may have no length: one
channel per group would normalize a single value). A module shared under two names gets one GroupNorm at both; the parent modules are the
same objects (the model is changed in place).
"""

from __future__ import annotations

from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm, _LazyNormBase

from bnfix.doctor.remedies import group_count
from bnfix.torch.report import ConversionReport
from bnfix.torch.swap import Site, Step, convert_sites

ACTION = "to_group_norm"


def _limit(module: _BatchNorm, groups: int) -> int:
    """BatchNorm1d may see (N, C) inputs: a group of one channel would normalize one value."""
    if isinstance(module, (nn.BatchNorm1d, nn.LazyBatchNorm1d)):
        return min(groups, int(module.num_features) // 2)
    return groups


def _plan(groups: int):
    def plan(site: Site) -> Step:
        module = site.module
        if isinstance(module, _LazyNormBase) and module.has_uninitialized_params():
            return Step(site, None, "lazy BN not initialized yet: run one forward first")
        channels = int(module.num_features)
        count = group_count(channels, _limit(module, groups))
        if count is None:
            return Step(site, None, f"{channels} channels have no divisor between 2 and "
                                    f"{groups}: pass groups={channels} (InstanceNorm-like) or "
                                    f"convert this layer by hand")
        note = f"groups={count}" + ("" if count == groups else
                                    f" ({groups} does not divide {channels})"
                                    if count == group_count(channels, groups) else
                                    " (BatchNorm1d: 2 channels per group at least)")
        return Step(site, nn.GroupNorm, note + "; recipe change: retrain")
    return plan


def to_group_norm(model: nn.Module, groups: int = 32, *, strict: bool = False,
                  report: ConversionReport | None = None) -> nn.Module:
    """Replace every BN module of `model` (the root included) by a GroupNorm; returns the
    model (the root itself is returned replaced when it is a BN). `strict=True` raises
    `ConversionRefused` before changing anything when a layer is refused; otherwise refused
    layers stay BN and are listed in `report`."""
    if groups < 1:
        raise ValueError(f"groups must be at least 1 (got {groups})")
    replaced: dict[int, nn.Module] = {}

    def apply(site: Site, target: type[nn.Module]) -> None:
        module = site.module
        norm = nn.GroupNorm(group_count(int(module.num_features), _limit(module, groups)) or 1,
                            int(module.num_features), eps=module.eps, affine=module.affine)
        if module.affine:
            norm.weight.data.copy_(module.weight.detach())
            norm.bias.data.copy_(module.bias.detach())
        norm.to(device=module.weight.device if module.affine else None,
                dtype=module.weight.dtype if module.affine else None)
        norm.train(module.training)
        replaced[id(module)] = norm
        for path in site.paths:
            if path:
                parent_path, _, name = path.rpartition(".")
                setattr(model.get_submodule(parent_path), name, norm)

    convert_sites(model, ACTION, _plan(groups), apply, strict, report)
    if isinstance(model, _BatchNorm) and id(model) in replaced:
        return replaced[id(model)]
    return model
