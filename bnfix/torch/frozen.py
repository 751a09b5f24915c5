"""`FrozenBatchNorm`: BN with fixed statistics and affine parameters, for any input rank."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.modules.batchnorm import _BatchNorm

from bnfix.torch.sync_bn import bn_kwargs, check_input_dim


class FrozenBatchNorm(_BatchNorm):
    """Normalises with the running statistics in train and eval mode alike and never updates
    them; weight and bias do not require grad. Buffers, parameters and `state_dict` keys are
    those of torch's BN classes (unlike torchvision's FrozenBatchNorm2d, which turns weight and
    bias into buffers), so `bnfix.torch.unfreeze` can hand back the very same tensors. Accepts
    (N, C, ...) inputs of any rank: one class serves 1d, 2d and 3d. The constructor takes what
    torch's BN classes take (`track_running_stats` must stay True: they are what it uses).
    """

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        *,
        bias: bool = True,
    ) -> None:
        if not track_running_stats:
            raise ValueError("FrozenBatchNorm normalises with its running statistics: "
                             "track_running_stats must be True")
        super().__init__(num_features, eps, momentum, affine, True, device=device, dtype=dtype,
                         **bn_kwargs(bias))
        for param in self.parameters(recurse=False):
            param.requires_grad_(False)

    def _check_input_dim(self, input: Tensor) -> None:
        check_input_dim(input)

    def forward(self, input: Tensor) -> Tensor:
        self._check_input_dim(input)
        return F.batch_norm(input, self.running_mean, self.running_var, self.weight, self.bias,
                            False, 0.0, self.eps)
