"""Decide by behaviour, not by class name, whether a conversion of a BN module is exact.

A conversion of a class bnfix does not know (a BN subclass, a norm-act layer) is kept only when
it passes a probe: the original module and the converted one are run on float32 copies (hooks
removed, children in eval mode so a drop path draws nothing) on a small (N, C, ...) input, and
their outputs, input gradients, parameter gradients and buffers compared. (float32: torch's
float64 BN kernels on CPU take ~50 ms on a 3x2x2 batch; the tolerance is far below what a
wrongly routed BN changes and far above rounding.) Verdicts are cached per class and
configuration (the module's plain attributes and its children's), not per layer. A synced conversion
must also make exactly one all_gather in forward and one all_reduce in backward under
`bnfix.torch.functional.probing` (one rank, collectives counted): a forward that computes its
statistics some other way would sync nothing and is refused, whatever its code looks like.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _BatchNorm

from bnfix.torch.functional import probing
from bnfix.torch.swap import derived_class, plain_with_forward

TOLERANCE = 1e-4  # float32 copies: the synced formulas round differently from torch's BN
_RANKS = (4, 3, 2, 5)  # input ranks tried, (N, C, H, W) first


@dataclass
class _Run:
    out: Tensor
    tensors: dict[str, Tensor]


def channels(module: nn.Module) -> int:
    count = getattr(module, "num_features", None)
    if count is None:
        count = module.running_mean.numel()  # type: ignore[union-attr]
    return int(count)


def _copy(module: nn.Module) -> nn.Module:
    twin = copy.deepcopy(module).float()
    for sub in twin.modules():
        for hooks in (sub._forward_hooks, sub._forward_pre_hooks, sub._backward_hooks,
                      sub._backward_pre_hooks):
            hooks.clear()
    return twin


def _set_mode(module: nn.Module, training: bool) -> nn.Module:
    module.eval()
    module.training = training
    return module


def probe_input(module: nn.Module) -> Tensor | str:
    """A float32 (3, C, 2, 2, ...) input the module's float32 copy accepts in eval mode, on
    the module's device (a model on CUDA is probed there), or why none is."""
    twin = _set_mode(_copy(module), False)
    gen = torch.Generator().manual_seed(0)
    device = _device(module)
    error = ""
    for rank in _RANKS:
        x = (torch.randn(3, channels(module), *([2] * (rank - 2)), generator=gen) * 2 + 0.5
             ).to(device)
        try:
            with torch.no_grad():
                twin(x)
        except Exception as exc:  # noqa: BLE001 - any failure means: not this rank
            error = error or f"{type(exc).__name__}: {exc}"
            continue
        return x
    return f"its forward rejects (N, C, ...) inputs of rank 2 to 5 ({error.splitlines()[0]})"


def _device(module: nn.Module) -> torch.device:
    """Where the module's state lives (its first parameter or buffer; CPU without one)."""
    for tensor in (*module.parameters(), *module.buffers()):
        return tensor.device
    return torch.device("cpu")


@torch.enable_grad()  # conversions may be called under no_grad
def _run(module: nn.Module, x: Tensor, training: bool) -> _Run | str:
    _set_mode(module, training)
    xg = x.clone().requires_grad_(True)
    try:
        out = module(xg)
    except Exception as exc:  # noqa: BLE001 - the module's own failure is the verdict
        return f"its forward failed on the probe input: {type(exc).__name__}: {exc}"
    if not isinstance(out, Tensor) or out.shape[:2] != x.shape[:2]:
        return "its forward does not return one (N, C, ...) tensor"
    weights = torch.linspace(-1, 1, out.numel(), dtype=out.dtype, device=out.device)
    weights = weights.view_as(out)
    (out * weights).sum().backward()
    tensors = {"input grad": xg.grad if xg.grad is not None else torch.zeros_like(x)}
    tensors.update({f"{n} grad": p.grad for n, p in module.named_parameters()
                    if p.grad is not None})
    tensors.update({n: b.detach().clone() for n, b in module.named_buffers()})
    return _Run(out.detach(), tensors)


def _difference(got: _Run, want: _Run) -> str | None:
    pairs = [("output", got.out, want.out)]
    pairs += [(name, got.tensors.get(name), value) for name, value in want.tensors.items()]
    for name, a, b in pairs:
        if a is None or a.shape != b.shape:
            return f"{name} missing or of another shape"
        scale = max(b.abs().max().item() if b.numel() else 0.0, 1e-6)
        error = (a.double() - b.double()).abs().max().item() / scale if b.numel() else 0.0
        if not error <= TOLERANCE:
            return f"{name} differs by {error:.1e} (relative)"
    return None


class _OneRank(_BatchNorm):
    """torch's plain BN forward: what torch's nn.SyncBatchNorm computes on one rank."""

    forward = _BatchNorm.forward


def _own_forward(cls: type[nn.Module]) -> Callable[..., object]:
    return cls.forward


def _one_rank(module: nn.Module) -> nn.Module:
    """The reference for a synced probe is the original on one rank. Inside a process group
    torch's nn.SyncBatchNorm (a base of timm's SyncBatchNormAct) syncs with CUDA kernels and
    fails on CPU, so the copy of such a class gets torch's plain BN forward in its place."""
    if plain_with_forward(type(module)) is not None:
        module.__class__ = derived_class(type(module), _OneRank, "one-rank", _own_forward)
    return module


def _compare(module: nn.Module, convert: Callable[[nn.Module], None], training_ref: bool,
             training_new: bool) -> tuple[str | None, list[str]]:
    x = probe_input(module)
    if isinstance(x, str):
        return x, []
    want = _run(_one_rank(_copy(module)), x, training_ref)
    if isinstance(want, str):
        return want, []
    twin = _copy(module)
    convert(twin)
    with probing() as probe:
        got = _run(twin, x, training_new)
    if isinstance(got, str):
        return got, probe.calls
    return _difference(got, want), probe.calls


def _plain(module: nn.Module) -> tuple[tuple[str, object], ...]:
    return tuple(sorted((k, v) for k, v in vars(module).items()
                        if isinstance(v, (bool, int, float, str, type(None)))
                        and k != "num_features"))


def signature(module: nn.Module) -> tuple[object, ...]:
    """What a probe verdict depends on: class, plain attributes (not the channel count),
    parameters and buffers present, and each child's name, class and plain attributes."""
    tensors = tuple((n, t is None) for n, t in (*module._parameters.items(),
                                                 *module._buffers.items()))
    children = tuple((n, type(c), _plain(c)) for n, c in module.named_children())
    return type(module), _plain(module), tensors, children


def cached(check: Callable[[nn.Module, Callable[[nn.Module], None]], str | None]
           ) -> Callable[[nn.Module, Callable[[nn.Module], None], type[nn.Module]], str | None]:
    """`check` once per (module signature, conversion target)."""
    verdicts: dict[tuple[object, ...], str | None] = {}

    def run(module: nn.Module, convert: Callable[[nn.Module], None],
            target: type[nn.Module]) -> str | None:
        key = (signature(module), target)
        if key not in verdicts:
            verdicts[key] = check(module, convert)
        return verdicts[key]

    return run


@cached
def check_sync(module: nn.Module, convert: Callable[[nn.Module], None]) -> str | None:
    """Why the synced conversion `convert` (applied in place to a copy) is not exact, or None."""
    problem, calls = _compare(module, convert, True, True)
    if calls != ["all_gather", "all_reduce"]:
        return (f"its training forward made {calls.count('all_gather')} synced batch_norm calls "
                "on its own statistics instead of 1: it computes them some other way, so "
                "syncing would change nothing or the wrong thing")
    return None if problem is None else f"the synced forward is not the original: {problem}"


@cached
def check_frozen(module: nn.Module, convert: Callable[[nn.Module], None]) -> str | None:
    """Why the frozen conversion is not the original in eval mode (or changes a buffer)."""
    problem, _ = _compare(module, convert, False, True)
    return None if problem is None else f"in training mode it is not the eval-mode original: {problem}"


def bn_affine(module: nn.Module, dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor]:
    """(a, b), computed in float64, with eval-mode BN(x) = x * a + b per channel."""
    scale = torch.rsqrt(module.running_var.double() + module.eps)  # type: ignore[union-attr]
    weight = getattr(module, "weight", None)
    bias = getattr(module, "bias", None)
    if weight is not None:
        scale = scale * weight.double()
    shift = -module.running_mean.double() * scale  # type: ignore[union-attr]
    if bias is not None:
        shift = shift + bias.double()
    return scale.detach().to(dtype), shift.detach().to(dtype)


def _affine(x: Tensor, scale: Tensor, shift: Tensor) -> Tensor:
    view = (1, -1, *([1] * (x.dim() - 2)))
    return x * scale.view(view) + shift.view(view)


def check_fold(module: nn.Module, convert: Callable[[nn.Module], None] | None) -> str | None:
    """Folding moves BN(x) = x * a + b into the layer before: exact when the module, fed that
    already, computes what it computed on x. `convert` makes the folded module (None: it
    becomes an identity, for a per-channel affine map that is all the module does)."""
    x = probe_input(module)
    if isinstance(x, str):
        return x
    try:
        scale, shift = bn_affine(_copy(module))
    except (AttributeError, TypeError):
        return "no running_mean / running_var / eps to fold"
    with torch.no_grad():
        want = _set_mode(_copy(module), False)(x)
        folded_in = _affine(x, scale, shift)
        if convert is None:
            got = folded_in
        else:
            twin = _copy(module)
            convert(twin)
            got = _set_mode(twin, False)(folded_in)
    if not isinstance(want, Tensor) or got.shape != want.shape:
        return "its forward does not return one (N, C, ...) tensor"
    error = (got - want).abs().max().item() / max(want.abs().max().item(), 1e-6)
    if not error <= TOLERANCE:
        what = "a per-channel affine map" if convert is None else "BN then the rest"
        return f"it is not {what} of its statistics (folded output differs by {error:.1e})"
    return None
