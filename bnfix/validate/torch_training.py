"""The model, the data and the SGD loop shared by the reference run and every rank.

Loss scaling. The reference minimises L = sum_i l_i / B over the global batch of B samples. A
rank holding the shard S_r computes L_r = sum_{i in S_r} l_i / B (a sum over its shard divided
by the GLOBAL batch size) and the gradients are all-reduced with SUM, so sum_r grad L_r = grad L
exactly, whatever the shard sizes (uneven shards included). DDP is not used: it AVERAGES
gradients (right only for mean losses over equal shards) and by default broadcasts rank 0's
buffers before every forward, which would overwrite the unsynced ranks' running statistics and
hide the drift this command measures. Input gradients need no scaling: with synced BN, each
rank's backward already holds the terms that flow through the other ranks' statistics.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bnfix.validate.comparison import MODEL, Key, Trace
from bnfix.validate.errors import ValidateUsageError
from bnfix.validate.loading import call_user, load_callable

Reduce = Callable[[Tensor], None]  # in-place SUM over the ranks (identity for the reference)


@dataclass(frozen=True)
class TorchJob:
    """Everything a rank needs to rebuild the run (written as JSON for local ranks)."""

    factory: str
    cwd: str
    input_shape: tuple[int, ...]
    world: int
    steps: int
    dtype: str
    target: str
    seed: int
    lr: float
    backend: str  # "gloo" or "nccl"
    timeout: float
    tolerance: float

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    def shard(self, rank: int) -> slice:
        """Rank r's samples of the global batch (the first ranks get one more when uneven)."""
        base, extra = divmod(self.input_shape[0], self.world)
        start = rank * base + min(rank, extra)
        return slice(start, start + base + (1 if rank < extra else 0))


def build_model(job: TorchJob, device: torch.device) -> nn.Module:
    """The user's model, seeded, in the job's dtype, Lazy modules materialised by a dry run."""
    factory = load_callable(job.factory, Path(job.cwd))
    torch.manual_seed(job.seed)
    model = call_user(job.factory, factory)
    if not isinstance(model, nn.Module):
        raise ValidateUsageError(f"{job.factory} returned a {type(model).__name__}, not an "
                                 "nn.Module")
    model = model.to(device=device, dtype=job.torch_dtype)
    output_shape(job, model, device)
    return model.train()


def output_shape(job: TorchJob, model: nn.Module, device: torch.device) -> tuple[int, ...]:
    """The per-sample output shape, from an eval-mode forward on one step's global batch
    (eval mode leaves the running statistics alone)."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            out = model(inputs(job, 0).to(device))
    except Exception as exc:  # noqa: BLE001 - the user's model: one line
        raise ValidateUsageError(
            f"{job.factory}: the model rejects --input-shape "
            f"{','.join(map(str, job.input_shape))}: {type(exc).__name__}: {exc}") from None
    finally:
        model.train(was_training)
    if not isinstance(out, Tensor) or out.dim() < 1 or out.shape[0] != job.input_shape[0]:
        raise ValidateUsageError(f"{job.factory}: the model must return one tensor with the "
                                 "batch as its first dimension")
    if job.target == "classes" and (out.dim() < 2 or out.shape[1] < 2):
        raise ValidateUsageError(f"{job.factory}: --target classes needs outputs of shape "
                                 "(batch, classes, ...): use --target regression")
    return tuple(out.shape[1:])


def inputs(job: TorchJob, step: int) -> Tensor:
    """Step `step`'s global batch: normal samples, shard r shifted by r/2 (non-identically
    distributed shards, as from unshuffled data, make the unsynced gap plain)."""
    gen = torch.Generator().manual_seed(job.seed * 100_003 + step)
    x = torch.randn(*job.input_shape, generator=gen, dtype=torch.float64)
    for rank in range(job.world):
        x[job.shard(rank)] += 0.5 * rank
    return x.to(job.torch_dtype)


def targets(job: TorchJob, step: int, out_shape: tuple[int, ...]) -> Tensor:
    gen = torch.Generator().manual_seed(job.seed * 100_003 + step + 50_000)
    batch = job.input_shape[0]
    if job.target == "classes":
        return torch.randint(out_shape[0], (batch, *out_shape[1:]), generator=gen)
    return torch.randn(batch, *out_shape, generator=gen, dtype=torch.float64).to(job.torch_dtype)


def per_sample_loss(job: TorchJob, out: Tensor, target: Tensor) -> Tensor:
    """Cross-entropy or squared error, averaged over each sample's positions: shape (batch,)."""
    if job.target == "classes":
        loss = F.cross_entropy(out, target, reduction="none")
    else:
        loss = (out - target).square()
    return loss.reshape(len(out), -1).mean(1)


def _layer_key(name: str, suffix: str = "") -> Key:
    layer, _, leaf = name.rpartition(".")
    return layer or "(root)", leaf + suffix


def layer_kinds(model: nn.Module) -> dict[str, str]:
    return {path or "(root)": type(module).__name__ for path, module in model.named_modules()}


def train(job: TorchJob, model: nn.Module, rank: int | None, device: torch.device,
          reduce: Reduce) -> dict[str, Any]:
    """K SGD steps on this rank's shard (the whole batch when `rank` is None); returns plain
    tensors per step: outputs, the global loss, input gradients, summed parameter gradients,
    then the final running statistics."""
    params = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    optimizer = torch.optim.SGD([p for _, p in params], lr=job.lr)
    shard = slice(None) if rank is None else job.shard(rank)
    out_shape: tuple[int, ...] | None = None
    steps = []
    model.train()
    for step in range(job.steps):
        x = inputs(job, step)[shard].to(device).requires_grad_(True)
        out = model(x)
        out_shape = out_shape or tuple(out.shape[1:])
        target = targets(job, step, out_shape)[shard].to(device)
        loss = per_sample_loss(job, out, target).sum() / job.input_shape[0]
        optimizer.zero_grad(set_to_none=False)
        loss.backward()
        grads = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten()
                           for _, p in params] + [loss.detach().reshape(1)])
        reduce(grads)  # one SUM all-reduce: parameter gradients and the loss
        offset = 0
        record = {"output": out.detach().cpu(), "input_grad": x.grad.detach().cpu(),
                  "loss": grads[-1].cpu(), "grads": {}}
        for name, p in params:
            size = p.numel()
            reduced = grads[offset:offset + size].view_as(p)
            offset += size
            record["grads"][name] = reduced.cpu().clone()
            if p.grad is None:
                p.grad = reduced.clone()
            else:
                p.grad.copy_(reduced)
        steps.append(record)
        optimizer.step()
    state = {name: buf.detach().cpu().clone() for name, buf in model.named_buffers()
             if buf.is_floating_point()}
    return {"steps": steps, "state": state}


def to_trace(records: list[dict[str, Any]]) -> Trace:
    """One run's records, one per rank in rank order (a single one for the reference)."""
    trace = Trace()
    for step in range(len(records[0]["steps"])):
        per_rank = [r["steps"][step] for r in records]
        values: dict[Key, np.ndarray] = {
            (MODEL, "output"): torch.cat([r["output"] for r in per_rank]).double().numpy(),
            (MODEL, "loss"): per_rank[0]["loss"].double().numpy(),
            (MODEL, "input_grad"): torch.cat([r["input_grad"] for r in per_rank]).double().numpy(),
        }
        for name, grad in per_rank[0]["grads"].items():
            values[_layer_key(name, ".grad")] = grad.double().numpy()
        trace.steps.append(values)
    trace.final = [{_layer_key(name): buf.double().numpy() for name, buf in r["state"].items()}
                   for r in records]
    return trace

