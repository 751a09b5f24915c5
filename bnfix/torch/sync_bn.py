"""`SyncBatchNorm`: a synchronized BN layer that works on every `torch.distributed` backend."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.modules.batchnorm import _BatchNorm

from bnfix.torch.distributed import ProcessGroup, sync_world_size
from bnfix.torch.functional import sync_batch_norm


class SyncBatchNorm(_BatchNorm):
    """Drop-in for `torch.nn.SyncBatchNorm` that also runs on CPU (gloo) and any other backend.

    In training mode with more than one rank in `process_group` (the default group when None),
    batch statistics are those of the global batch (see `bnfix.torch.functional`). In eval mode,
    outside an initialised process group, or with one rank, it is exactly plain BN
    (`F.batch_norm`). Any input of shape (N, C, ...) is accepted; parameters, buffers and
    `state_dict` keys are those of torch's BN classes, so checkpoints load both ways.
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
    ) -> None:
        super().__init__(
            num_features, eps, momentum, affine, track_running_stats, device=device, dtype=dtype
        )
        self.process_group = process_group

    def _check_input_dim(self, input: Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input: Tensor) -> Tensor:
        self._check_input_dim(input)
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:  # cumulative moving average
                factor = 1.0 / float(self.num_batches_tracked)
        use_batch_stats = self.training or (self.running_mean is None and self.running_var is None)
        keep_buffers = not self.training or self.track_running_stats
        running_mean = self.running_mean if keep_buffers else None
        running_var = self.running_var if keep_buffers else None
        world_size = sync_world_size(self.process_group) if self.training else 1
        if world_size > 1:
            return sync_batch_norm(
                input, running_mean, running_var, self.weight, self.bias, factor, self.eps,
                self.process_group, world_size,
            )
        return F.batch_norm(
            input, running_mean, running_var, self.weight, self.bias, use_batch_stats, factor,
            self.eps,
        )
