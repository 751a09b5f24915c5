"""The rank side of `bnfix validate torch`: join the process group, run the converted (synced)
and the plain (unsynced) copy of the same model on this rank's shard, gather to rank 0."""

from __future__ import annotations

import copy
import gc
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

import bnfix.torch as bt
from bnfix.validate.torch_training import TorchJob, train


def device_for(job: TorchJob, local_rank: int) -> torch.device:
    if job.backend == "nccl":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")


def exact_math() -> None:
    """No TF32 and deterministic cuDNN: ranks and the reference run different batch sizes, and
    TF32 convolutions (on by default) would differ by ~1e-3 for reasons unrelated to BN."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False


def join(job: TorchJob, rank: int, init_method: str) -> None:
    """init_process_group with the job's timeout: a collective a peer never joins raises after
    `timeout` seconds instead of hanging."""
    dist.init_process_group(job.backend, init_method=init_method, rank=rank,
                            world_size=job.world, timeout=timedelta(seconds=job.timeout))


def share_initial_state(model: nn.Module, initial: dict[str, Tensor] | None) -> None:
    """Every rank starts from the same weights and buffers: the parent's (local ranks) or
    rank 0's, broadcast (torchrun, where no file is shared between nodes)."""
    if initial is not None:
        model.load_state_dict(initial)
        return
    with torch.no_grad():
        for value in model.state_dict().values():
            dist.broadcast(value, src=0)


def _all_reduce(tensor: Tensor) -> None:
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)


def rank_runs(job: TorchJob, rank: int, model: nn.Module, device: torch.device
              ) -> dict[str, Any]:
    """This rank's records of the synced run (`bnfix.torch.convert_sync` of `model`) and the
    unsynced run (a copy of `model` left as it is), K steps each from the same state."""
    plain = copy.deepcopy(model)
    bt.convert_sync(model)
    synced = train(job, model, rank, device, _all_reduce)
    unsynced = train(job, plain, rank, device, _all_reduce)
    return {"synced": synced, "unsynced": unsynced}


def gather(records: dict[str, Any], rank: int) -> list[dict[str, Any]] | None:
    """Every rank's records on rank 0, in rank order (None on the other ranks)."""
    gathered: list[Any] | None = [None] * dist.get_world_size() if rank == 0 else None
    dist.gather_object(records, gathered, dst=0)
    return gathered


def leave() -> None:
    """Barrier, then destroy: nobody leaves the group while a peer still needs it (a rank
    leaving early makes the others' shutdown abort). The caller drops the model of the synced
    run first, and it is collected here, before the group goes: torch 2.13 on gloo aborts a
    rank now and then ("terminate called without an active exception", SIGABRT) when modules
    that ran collectives are freed at the interpreter's exit after `destroy_process_group`
    (seen once in a CI rehearsal of `validate` joining a torchrun job; the fixtures' DDP
    scripts free their model the same way)."""
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()
