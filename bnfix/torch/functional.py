"""The synced batch-norm computation: one collective in forward, one in backward.

Forward: every rank computes, per channel, its count n, a shift s (its local mean, rounded to
the working dtype), d = mean(x - s) and M2 = sum((x - s)^2) - n d^2 (sum of squared deviations
from the local mean; no cancellation since x - s is centred), and ONE `all_gather` exchanges
those 3C+1 numbers. Every rank then merges them in float64 with Chan's parallel formula

    mean_i = s_i + d_i,  N = sum n_i,  mean = sum n_i mean_i / N,
    M2 = sum M2_i + sum n_i (mean_i - mean)^2

which is count-weighted (uneven and empty per-rank batches are exact: an empty rank sends n = 0)
and numerically stable: no E[x^2] - E[x]^2 cancellation when the mean is large relative to the
spread. The global mean is applied as a hi + lo pair of the working dtype, so x - mean keeps
its precision even where the mean itself is not representable (fp32 data around 1e4).
Backward: ONE `all_reduce` of [sum dy, sum dy*xhat] per channel gives the global terms of the
input gradient. Weight and bias gradients stay local (this rank's share), as with torch's
`nn.SyncBatchNorm`: DDP (or any SUM all-reduce of gradients) adds them up.

Every rank must call forward and backward the same number of times (a collective each), with
the same `requires_grad` on the input; statistics are computed in at least float32.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor
from torch.autograd.function import FunctionCtx, once_differentiable

from bnfix.torch.distributed import ProcessGroup


def _stat_dtype(dtype: torch.dtype) -> torch.dtype:
    """Half-precision inputs get float32 statistics; float32/float64 keep their own."""
    return torch.promote_types(dtype, torch.float32)


def _reduce_dims(x: Tensor) -> list[int]:
    return [0, *range(2, x.dim())]


def _channel_view(t: Tensor, x: Tensor) -> Tensor:
    """(C,) -> (1, C, 1, ...) so it broadcasts against an (N, C, ...) input."""
    return t.view(1, -1, *([1] * (x.dim() - 2)))


def _local_moments(x: Tensor) -> Tensor:
    """[n, shift s (C), d = mean(x - s) (C), M2 (C)] of this rank's batch; zeros when empty."""
    channels = x.shape[1]
    count = x.numel() // channels
    if count == 0:
        return x.new_zeros(3 * channels + 1)
    dims = _reduce_dims(x)
    shift = x.mean(dims)
    centred = x - _channel_view(shift, x)
    delta = centred.mean(dims)
    m2 = centred.square().sum(dims) - count * delta.square()
    return torch.cat([shift.new_tensor([count]), shift, delta, m2])


def _merge_moments(gathered: Tensor, channels: int) -> tuple[float, Tensor, Tensor]:
    """Chan's parallel merge, in float64, of per-rank rows [n, s, d, M2] -> (N, mean, M2)."""
    rows = gathered.double()
    counts = rows[:, :1]
    means = rows[:, 1 : 1 + channels] + rows[:, 1 + channels : 1 + 2 * channels]
    m2s = rows[:, 1 + 2 * channels :]
    total = float(counts.sum())
    if total <= 1:
        raise ValueError(
            f"Expected more than 1 value per channel when training, got {int(total)} "
            "over all ranks"
        )
    mean = (counts * means).sum(0) / total
    m2 = m2s.sum(0) + (counts * (means - mean).square()).sum(0)
    return total, mean, m2


def _normalise(x: Tensor, mean_hi: Tensor, mean_lo: Tensor, invstd: Tensor) -> Tensor:
    """(x - mean) * invstd with the mean as a hi + lo pair: x - hi is exact near the mean."""
    return (x - _channel_view(mean_hi, x) - _channel_view(mean_lo, x)) * _channel_view(invstd, x)


class SyncBatchNormFunction(torch.autograd.Function):
    """Differentiable synced BN over `world_size` ranks of `process_group`.

    Returns (output, batch mean, unbiased batch variance), the statistics in float64; they are
    not differentiable and are what the caller folds into the running buffers.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: FunctionCtx,
        x: Tensor,
        weight: Tensor | None,
        bias: Tensor | None,
        eps: float,
        process_group: ProcessGroup | None,
        world_size: int,
    ) -> tuple[Tensor, Tensor, Tensor]:
        xs = x.to(_stat_dtype(x.dtype))
        local = _local_moments(xs)
        gathered = [torch.empty_like(local) for _ in range(world_size)]
        dist.all_gather(gathered, local, group=process_group)
        total, mean, m2 = _merge_moments(torch.stack(gathered), x.shape[1])
        mean_hi = mean.to(xs.dtype)
        mean_lo = (mean - mean_hi.double()).to(xs.dtype)
        invstd = torch.rsqrt(m2 / total + eps).to(xs.dtype)
        out = _normalise(xs, mean_hi, mean_lo, invstd)
        if weight is not None:
            out = out * _channel_view(weight.to(xs.dtype), xs)
        if bias is not None:
            out = out + _channel_view(bias.to(xs.dtype), xs)
        ctx.save_for_backward(x, weight, mean_hi, mean_lo, invstd)
        ctx.total = total  # type: ignore[attr-defined]
        ctx.process_group = process_group  # type: ignore[attr-defined]
        ctx.bias_dtype = None if bias is None else bias.dtype  # type: ignore[attr-defined]
        unbiased_var = m2 / (total - 1)
        ctx.mark_non_differentiable(mean, unbiased_var)
        return out.to(x.dtype), mean, unbiased_var

    @staticmethod
    @once_differentiable
    def backward(  # type: ignore[override]
        ctx: FunctionCtx, grad_out: Tensor, _grad_mean: Tensor, _grad_var: Tensor
    ) -> tuple[Tensor | None, ...]:
        x, weight, mean_hi, mean_lo, invstd = ctx.saved_tensors  # type: ignore[attr-defined]
        dims = _reduce_dims(x)
        xs = x.to(invstd.dtype)
        dy = grad_out.to(invstd.dtype)
        xhat = _normalise(xs, mean_hi, mean_lo, invstd)
        sum_dy = dy.sum(dims)
        sum_dy_xhat = (dy * xhat).sum(dims)
        grad_input = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:  # type: ignore[attr-defined]
            global_sums = torch.cat([sum_dy, sum_dy_xhat])
            dist.all_reduce(global_sums, group=ctx.process_group)  # type: ignore[attr-defined]
            total = ctx.total  # type: ignore[attr-defined]
            mean_dy, mean_dy_xhat = (global_sums / total).split(x.shape[1])
            scale = invstd if weight is None else invstd * weight.to(invstd.dtype)
            grad_input = (
                (dy - _channel_view(mean_dy, xs) - xhat * _channel_view(mean_dy_xhat, xs))
                * _channel_view(scale, xs)
            ).to(x.dtype)
        if weight is not None and ctx.needs_input_grad[1]:  # type: ignore[attr-defined]
            grad_weight = sum_dy_xhat.to(weight.dtype)
        bias_dtype = ctx.bias_dtype  # type: ignore[attr-defined]
        if bias_dtype is not None and ctx.needs_input_grad[2]:  # type: ignore[attr-defined]
            grad_bias = sum_dy.to(bias_dtype)
        return grad_input, grad_weight, grad_bias, None, None, None


def sync_batch_norm(
    x: Tensor,
    running_mean: Tensor | None,
    running_var: Tensor | None,
    weight: Tensor | None,
    bias: Tensor | None,
    momentum: float,
    eps: float,
    process_group: ProcessGroup | None,
    world_size: int,
) -> Tensor:
    """Training-mode BN over the global batch of all ranks; updates the running buffers (when
    given) with the global mean and the unbiased global variance, as `F.batch_norm` does."""
    out, mean, var = SyncBatchNormFunction.apply(
        x, weight, bias, eps, process_group, world_size
    )
    if running_mean is not None and running_var is not None:
        with torch.no_grad():
            running_mean.mul_(1 - momentum).add_(mean.to(running_mean.dtype), alpha=momentum)
            running_var.mul_(1 - momentum).add_(var.to(running_var.dtype), alpha=momentum)
    return out
