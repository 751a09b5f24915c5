"""Which `torch.distributed` backend to use, and whether a BN layer has peers to sync with."""

from __future__ import annotations

import torch
import torch.distributed as dist

ProcessGroup = dist.ProcessGroup


def default_backend() -> str:
    """NCCL when CUDA (and an NCCL build) is present, gloo otherwise (CPU processes)."""
    if torch.cuda.is_available() and dist.is_nccl_available():
        return "nccl"
    return "gloo"


def sync_world_size(process_group: ProcessGroup | None) -> int:
    """Ranks a synced BN reduces over: 1 outside an initialised process group (plain BN then)."""
    if not (dist.is_available() and dist.is_initialized()):
        return 1
    return dist.get_world_size(process_group)
