"""Which `torch.distributed` backend to use, and which group a synced BN layer reduces over."""

from __future__ import annotations

import torch
import torch.distributed as dist

from bnfix.torch.functional import GROUPS, active_probe

ProcessGroup = dist.ProcessGroup


def default_backend() -> str:
    """NCCL when CUDA (and an NCCL build) is present, gloo otherwise (CPU processes)."""
    if torch.cuda.is_available() and dist.is_nccl_available():
        return "nccl"
    return "gloo"


def sync_group(process_group: ProcessGroup | None) -> str | None:
    """The name of the group a training-mode synced BN reduces over (the default group when
    `process_group` is None), or None when there is nothing to sync with: outside an
    initialised process group, or in a group of one rank (plain BN then). A name, not the
    group object: it is what functional collectives take, and a constant torch.fx can record.
    Under `bnfix.torch.functional.probing` it is the probe's one-rank stand-in."""
    if active_probe() is not None:
        return "bnfix-probe"
    if not (dist.is_available() and dist.is_initialized()):
        return None
    group = dist.group.WORLD if process_group is None else process_group
    if dist.get_world_size(group) < 2:
        return None
    name = group.group_name
    GROUPS.setdefault(name, group)
    return name
