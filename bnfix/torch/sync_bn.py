"""`SyncBatchNorm`: a synchronized BN layer that works on every `torch.distributed` backend."""

from __future__ import annotations

import torch
import torch.fx
from torch import Tensor
from torch.nn.modules.batchnorm import _BatchNorm

from bnfix.torch.distributed import ProcessGroup, sync_group
from bnfix.torch.functional import sync_batch_norm

torch.fx.wrap("sync_batch_norm")  # one node in a torch.fx graph, not traced into


def bn_kwargs(bias: bool) -> dict[str, bool]:
    """`bias=` for torch's BN constructor, passed only when set (torch < 2.6 lacks it)."""
    return {} if bias else {"bias": False}


def check_input_dim(input: Tensor) -> None:
    """(N, C, ...) of any rank >= 2, as torch's BN says it. Under torch.fx the check is a
    traced `torch._assert` (a branch on a traced value would stop the trace)."""
    if isinstance(input, torch.fx.Proxy):
        torch._assert(input.dim() >= 2, "expected at least 2D input")
    elif input.dim() < 2:
        raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")


class SyncBatchNorm(_BatchNorm):
    """Drop-in for `torch.nn.SyncBatchNorm` that also runs on CPU (gloo) and any other backend.

    In training mode with more than one rank in `process_group` (the default group when None),
    batch statistics are those of the global batch (see `bnfix.torch.functional`). In eval mode,
    outside an initialised process group, or with one rank, it is torch's own BN
    (`_BatchNorm.forward`, bit for bit). Any input of shape (N, C, ...) is accepted; the
    constructor takes what torch's BN classes take; parameters, buffers and `state_dict` keys
    are theirs, so checkpoints load both ways.
    """

    process_group: ProcessGroup | None

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        process_group: ProcessGroup | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        *,
        bias: bool = True,
    ) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats,
                         device=device, dtype=dtype, **bn_kwargs(bias))
        self.process_group = process_group

    def _check_input_dim(self, input: Tensor) -> None:
        check_input_dim(input)

    def forward(self, input: Tensor) -> Tensor:
        group = sync_group(self.process_group) if self.training else None
        if group is None:
            return super().forward(input)
        self._check_input_dim(input)
        track = self.track_running_stats
        return sync_batch_norm(
            input, self.running_mean if track else None, self.running_var if track else None,
            self.weight, self.bias, self.num_batches_tracked if track else None, self.momentum,
            self.eps, group,
        )
