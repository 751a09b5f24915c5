"""Run a BN module's own forward with the batch_norm calls it makes on its own statistics
routed elsewhere.

This is how bnfix converts BN layers whose forward does more than BN without knowing their code:
timm's `BatchNormAct2d` (BN, then drop path and activation, with `F.batch_norm` called directly),
a subclass that calls `super().forward` in eval mode and `F.batch_norm` in training, or one
that calls `super().forward`. A `TorchFunctionMode` active during the forward sees every
`F.batch_norm` / `torch.batch_norm` call; the ones on the module's own running statistics (or,
without them, its own affine parameters) go to a handler (synced BN, identity after a fold),
everything else runs as written. Eager, torch.fx and torch.compile all honour the mode. Whether
the result is exact is not assumed: `bnfix.torch.probe` runs it and compares.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

_FUNCTIONAL = ("input", "running_mean", "running_var", "weight", "bias", "training", "momentum",
               "eps")
_DEFAULTS: dict[str, Any] = {"weight": None, "bias": None, "training": False, "momentum": 0.1,
                             "eps": 1e-5}
_ATEN = ("input", "weight", "bias", "running_mean", "running_var", "training", "momentum", "eps")


@dataclass(frozen=True)
class BatchNormCall:
    """One batch_norm call, by `F.batch_norm`'s parameter names."""

    input: Tensor
    running_mean: Tensor | None
    running_var: Tensor | None
    weight: Tensor | None
    bias: Tensor | None
    training: bool
    momentum: float | None
    eps: float

    def run(self) -> Tensor:
        """The call as the module made it."""
        return F.batch_norm(self.input, self.running_mean, self.running_var, self.weight,
                            self.bias, self.training, self.momentum, self.eps)


Handler = Callable[[nn.Module, BatchNormCall], Tensor]


def _bind(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> BatchNormCall | None:
    if func is F.batch_norm:
        values = dict(_DEFAULTS)
        values.update(zip(_FUNCTIONAL, args))
        values.update(kwargs)
        return BatchNormCall(**values)
    if func is torch.batch_norm:
        return BatchNormCall(**dict(zip(_ATEN, args)))
    return None


def _owned(call: BatchNormCall, module: nn.Module) -> bool:
    """The call normalises with this module's statistics (or, without them, its parameters)."""
    mean = getattr(module, "running_mean", None)
    if mean is not None:
        return call.running_mean is mean or (call.running_mean is None
                                             and call.weight is getattr(module, "weight", None))
    return call.weight is getattr(module, "weight", None)


class BatchNormRedirect(TorchFunctionMode):
    """While active, `module`'s batch_norm calls go to `handler(module, call)`."""

    def __init__(self, module: nn.Module, handler: Handler) -> None:
        super().__init__()
        self.module = module
        self.handler = handler

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        call = _bind(func, args, kwargs)
        if call is None or not _owned(call, self.module):
            return func(*args, **kwargs)
        return self.handler(self.module, call)


def redirected_forward(cls: type[nn.Module], handler: Handler) -> Callable[..., Any]:
    """A forward for a class derived from `cls`: `cls.forward` under a `BatchNormRedirect`."""
    original = cls.forward

    def forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        with BatchNormRedirect(self, handler):
            return original(self, *args, **kwargs)

    forward.__doc__ = f"{cls.__qualname__}.forward with its batch_norm calls redirected."
    return forward


def eval_forward(cls: type[nn.Module]) -> Callable[..., Any]:
    """A forward for a class derived from `cls`: `cls.forward` run as in eval mode (the module's
    own flag only: its children, e.g. a drop path, keep theirs), so a BN normalises with and
    keeps its running statistics whatever mode the model is in."""
    original = cls.forward

    def forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        training = self.training
        self.training = False
        try:
            return original(self, *args, **kwargs)
        finally:
            self.training = training

    forward.__doc__ = f"{cls.__qualname__}.forward, run with its running statistics."
    return forward
