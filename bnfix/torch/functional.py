"""The synced batch-norm computation: one collective in forward, one in backward, no host sync.

Forward. Each rank centres its batch on a per-channel shift s (its own mean, rounded to the
input dtype): c = x - s. One fused reduction (torch's BN-backward reduction kernel, used as a
dot product: accumulated in double on CPU; two plain reductions where that kernel is slow)
gives sum c and sum c^2 per channel; ONE `all_gather` exchanges [n, s, sum c, sum c^2]
(3C+1 numbers) and every rank merges them in float64 with Chan's parallel formula: with
m_i = s_i + sum c_i / n_i, v_i = (sum c_i^2 - (sum c_i)^2 / n_i) / n_i and w_i = n_i / N,

    mean = sum w_i m_i,  var = sum w_i (v_i + (m_i - mean)^2),

count-weighted (uneven and empty per-rank batches are exact: an empty rank sends n = 0 and
contributes nothing) and stable (no E[x^2] - E[x]^2 cancellation: the data are centred, and
sum c keeps the mean exact where it is large against the spread). The output is torch's own
eval-mode `batch_norm` of c with the global statistics relative to s (mean - s is small, so
nothing is lost there): one pass.

Backward. The same reduction kernel gives sum dy and sum dy * xhat in one pass; ONE
`all_reduce` makes them global; the input gradient k (dy - mean dy - xhat mean dy xhat),
k = weight / std, is one eval-mode `batch_norm` of c (the per-channel affine part) and one
in-place `addcmul`. Weight and bias gradients stay local (this rank's share), as with torch's
`nn.SyncBatchNorm`: DDP (or any SUM all-reduce of gradients) adds them up.

The per-channel work is a few whole-vector operations (one float64 row per rank, Chan's merge
as two small matrix products, one cast back, the running statistics as two foreach calls): 62
aten calls for a BN layer's training step against plain BN's 10. On a GPU an eager step is
bound by launching them (docs/torch.md, "On a GPU"); captured as a CUDA graph it is not.

Nothing here reads a tensor value on the host (no `.item()`, `float()` or branch on data), so
CUDA never synchronises with the host and `torch.compile(fullgraph=True)` traces it whole; the
collectives are torch's functional collectives, which eager and compiled code both run. The
only branch is on an empty local batch (a shape, fixed in a compiled graph), where torch's
reduction kernels cannot run. Every rank must call forward and backward the same number of
times with the same `requires_grad` on the input (a collective each).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as fc
from torch import Tensor
from torch.autograd.function import FunctionCtx

# statistics dtype by input dtype: half precision gets float32, float32/float64 keep their own
_STAT_DTYPES = {torch.float16: torch.float32, torch.bfloat16: torch.float32,
                torch.float32: torch.float32, torch.float64: torch.float64}


def _stat_dtype(dtype: torch.dtype) -> torch.dtype:
    """Half-precision inputs get float32 statistics; float32/float64 keep their own."""
    stat = _STAT_DTYPES.get(dtype)
    return torch.promote_types(dtype, torch.float32) if stat is None else stat


def _reduce_dims(x: Tensor) -> list[int]:
    return [0, *range(2, x.dim())]


def _channel_view(t: Tensor, x: Tensor) -> Tensor:
    """(C,) -> (1, C, 1, ...) so it broadcasts against an (N, C, ...) input."""
    return t.view(1, -1, *([1] * (x.dim() - 2)))


# torch's CPU kernel runs a scalar loop, ~10x slower than two plain reductions, when each
# (sample, channel) row is 2-7 elements long (a 2x2 feature map: resnet's last stage on a 64x64
# input took 0.35 ms a layer instead of 0.09 ms).
_CPU_KERNEL_MIN_INNER = 8


def _channel_sums(dy: Tensor, c: Tensor, mean: Tensor, var: Tensor, eps: float,
                  weight: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """(sum dy (c - mean) / sqrt(var + eps), sum dy) per channel, in one fused pass: the
    reduction torch's eval-mode BN backward computes for its weight and bias gradients (two
    plain reductions where that kernel is slow, see `_CPU_KERNEL_MIN_INNER`). `weight`, when
    given, only shapes the kernel's unused weight gradient (CUDA's kernel wants one)."""
    if c.numel() == 0:  # the kernel cannot run on an empty batch; the sums are 0
        zeros = mean.new_zeros(mean.shape)
        return zeros, zeros
    if c.device.type == "cpu" and 1 < math.prod(c.shape[2:]) < _CPU_KERNEL_MIN_INNER:
        dims = _reduce_dims(c)
        total = dy.sum(dims, dtype=mean.dtype)
        dot = (dy * c).sum(dims, dtype=mean.dtype)
        return (dot - mean * total) * torch.rsqrt(var + eps), total
    # eval mode reads the running statistics; CUDA's kernel wants the saved ones defined
    # (empty: not used), where an undefined one fails an internal assert, and a weight to
    # shape the weight gradient on (the sums do not depend on it; CPU's takes None)
    unused = mean.new_empty(0)
    if c.is_cuda and weight is None:
        weight = mean.new_ones(mean.shape)
    _, dot, total = torch.ops.aten.native_batch_norm_backward(
        dy, c, weight, mean, var, unused, unused, False, eps, [False, True, True])
    return dot, total


@dataclass
class Probe:
    """Stands in for the collectives while `bnfix.torch` checks what a module's forward does:
    one rank (the collectives are identities) whose calls are counted."""

    world: int = 1
    calls: list[str] = field(default_factory=list)


_PROBE: list[Probe] = []  # the active probe, if any (pushed and popped by `probing`)


def active_probe() -> Probe | None:
    return _PROBE[-1] if _PROBE else None


@contextmanager
def probing() -> Iterator[Probe]:
    """`with probing() as probe:` routes every synced BN through `probe` (see `Probe`)."""
    _PROBE.append(Probe())
    try:
        yield _PROBE[-1]
    finally:
        _PROBE.pop()


GROUPS: dict[str, dist.ProcessGroup] = {}  # by name, filled by bnfix.torch.distributed
# torch's functional all-gather along dim 0: `all_gather_single` since torch 2.12, before it
# `all_gather_tensor` (deprecated since, with a warning outside compiled code)
_gather_single = getattr(fc, "all_gather_single", None) or fc.all_gather_tensor
# c10d's in-place one likewise: `all_gather_single` since 2.12 (the old name warns there)
_gather_into = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _all_gather(t: Tensor, group: str) -> Tensor:
    """Every rank's `t`, concatenated. Compiled code: torch's functional collective (traced
    into the graph); eager code: c10d's in-place one, which skips the functional wrapper's
    per-call bookkeeping (~0.3 ms a call on gloo)."""
    probe = active_probe()
    if probe is not None:
        if not torch.compiler.is_compiling():  # counting is for eager probes; compiled
            probe.calls.append("all_gather")  # code must have no Python side effects
        return t.clone()
    if torch.compiler.is_compiling() or group not in GROUPS:
        return _gather_single(t, 0, group)
    process_group = GROUPS[group]
    out = t.new_empty(dist.get_world_size(process_group) * t.numel())
    _gather_into(out, t, group=process_group)
    return out


def _all_reduce(t: Tensor, group: str) -> Tensor:
    """SUM over the ranks; functional when compiled, c10d in place in eager code."""
    probe = active_probe()
    if probe is not None:
        if not torch.compiler.is_compiling():
            probe.calls.append("all_reduce")
        return t.clone()
    if torch.compiler.is_compiling() or group not in GROUPS:
        return fc.all_reduce(t, "sum", group)
    dist.all_reduce(t, group=GROUPS[group])
    return t


def local_moments(x: Tensor) -> tuple[Tensor, Tensor]:
    """This rank's float64 row [n, s (C), sum c (C), sum c^2 (C)] and the centred input
    c = x - s, s = this rank's mean rounded to x's dtype."""
    channels = x.shape[1]
    count = x.numel() // channels
    stat = _stat_dtype(x.dtype)
    zeros = torch.zeros(channels, dtype=stat, device=x.device)
    shift = (x.mean(_reduce_dims(x), dtype=stat) if count else zeros).to(x.dtype)
    centred = x - _channel_view(shift, x)
    # mean 0, variance 0 and eps 1: the kernel's dot product is sum c^2 (1 / sqrt(0 + 1) = 1)
    squares, sums = _channel_sums(centred, centred, zeros, zeros, 1.0)
    count_row = x.new_full((1,), count, dtype=torch.float64)
    return torch.cat([count_row, shift, sums, squares]), centred  # cat promotes to float64


def merge_moments(rows: Tensor, channels: int) -> tuple[Tensor, Tensor, Tensor]:
    """Chan's parallel merge, in float64, of per-rank rows [n, s, sum c, sum c^2]
    -> (N, mean, var): the global count (0-dim), mean and biased variance (each 1 x C)."""
    counts, shifts, sums, squares = rows.split_with_sizes(
        [1, channels, channels, channels], dim=1)
    present = counts.clamp(min=1)  # an empty rank's sums are 0: its terms vanish
    residuals = sums / present  # mean of c: m_i - s_i
    means = shifts + residuals
    variances = torch.addcmul(squares, sums, residuals, value=-1).div_(present)
    total = counts.sum()
    weights = (counts / total).mT  # 1 x ranks
    mean = weights @ means
    spread = means - mean
    return total, mean, weights @ torch.addcmul(variances, spread, spread)


class SyncBatchNormFunction(torch.autograd.Function):
    """Differentiable synced BN over the ranks of the process group named `group`.

    Returns (output, batch mean, unbiased batch variance), the statistics in the statistics
    dtype (float32 for half-precision input, else the input's), merged in float64; they are not
    differentiable and are what the caller folds into the running buffers.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: FunctionCtx,
        x: Tensor,
        weight: Tensor | None,
        bias: Tensor | None,
        eps: float,
        group: str,
    ) -> tuple[Tensor, Tensor, Tensor]:
        channels = x.shape[1]
        local, centred = local_moments(x)
        gathered = _all_gather(local, group).view(-1, local.numel())
        total, mean, var = merge_moments(gathered, channels)
        shift = local[1 : 1 + channels]
        torch._assert_async(total > 1, "Expected more than 1 value per channel when training "
                                       "(over all ranks)")
        unbiased = var * (total / (total - 1))
        # one cast back for all four: the global mean relative to this rank's shift, the
        # variance, and the mean and unbiased variance for the running statistics
        offset, var, mean, unbiased = torch.cat([mean - shift, var, mean, unbiased]).to(
            _stat_dtype(x.dtype)).unbind()
        out = torch.batch_norm(centred, weight, bias, offset, var, False, 0.0, eps,
                               torch.backends.cudnn.enabled)
        # no None among the saved tensors: torch.compile before 2.12 cannot trace one
        ctx.save_for_backward(centred, offset, var, total, *([] if weight is None else [weight]))
        ctx.eps = eps  # type: ignore[attr-defined]
        ctx.group = group  # type: ignore[attr-defined]
        ctx.has_bias = bias is not None  # type: ignore[attr-defined]
        ctx.mark_non_differentiable(mean, unbiased)
        return out, mean, unbiased

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: FunctionCtx, grad_out: Tensor, _grad_mean: Tensor, _grad_var: Tensor
    ) -> tuple[Tensor | None, ...]:
        centred, offset, var, total, *rest = ctx.saved_tensors  # type: ignore[attr-defined]
        weight = rest[0] if rest else None
        eps = ctx.eps  # type: ignore[attr-defined]
        sum_dy_xhat, sum_dy = _channel_sums(grad_out, centred, offset, var, eps, weight)
        grad_input = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:  # type: ignore[attr-defined]
            sums = _all_reduce(torch.cat([sum_dy, sum_dy_xhat]),
                               ctx.group)  # type: ignore[attr-defined]
            scale = torch.rsqrt(var + eps)  # k = weight / std
            if weight is not None:
                scale = scale.mul_(weight)
            # -k (mean dy, mean dy xhat); torch's eval-mode BN as the affine pass gives
            # -k (xhat mean dy xhat + mean dy), then + k dy in place
            mean_dy, mean_dy_xhat = sums.view(2, -1).mul(scale).div_(-total).unbind()
            grad_input = torch.batch_norm(centred, mean_dy_xhat, mean_dy, offset, var, False,
                                          0.0, eps, torch.backends.cudnn.enabled)
            grad_input = grad_input.addcmul_(grad_out, _channel_view(scale, centred)
                                             ).to(grad_out.dtype)
        if weight is not None and ctx.needs_input_grad[1]:  # type: ignore[attr-defined]
            grad_weight = sum_dy_xhat.to(weight.dtype)
        if ctx.has_bias and ctx.needs_input_grad[2]:  # type: ignore[attr-defined]
            grad_bias = sum_dy.to(grad_out.dtype if weight is None else weight.dtype)
        return grad_input, grad_weight, grad_bias, None, None


def sync_batch_norm(
    x: Tensor,
    running_mean: Tensor | None,
    running_var: Tensor | None,
    weight: Tensor | None,
    bias: Tensor | None,
    num_batches_tracked: Tensor | None,
    momentum: float | None,
    eps: float,
    group: str,
) -> Tensor:
    """Training-mode BN over the global batch of all ranks of `group` (a process-group name).

    Updates the running buffers (when given) with the global mean and unbiased variance as
    `F.batch_norm` does; counts the step in `num_batches_tracked` (when given), whose value is
    the cumulative-average factor when `momentum` is None (a tensor: no host read)."""
    out, mean, var = SyncBatchNormFunction.apply(x, weight, bias, eps, group)
    if num_batches_tracked is not None:
        num_batches_tracked.add_(1)
    if running_mean is None or running_var is None:
        return out
    buffers = [running_mean, running_var]
    stats = [mean.to(running_mean.dtype), var.to(running_var.dtype)]
    with torch.no_grad():
        if momentum is not None:  # torch's update: (1 - momentum) running + momentum batch
            torch._foreach_mul_(buffers, 1 - momentum)
            torch._foreach_add_(buffers, stats, alpha=momentum)
        elif num_batches_tracked is not None:  # cumulative average: factor 1 / steps
            factor = 1.0 / num_batches_tracked.double()
            for buffer, stat in zip(buffers, stats, strict=True):
                buffer.mul_(1 - factor).add_(stat * factor)
    return out
