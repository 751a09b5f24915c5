"""In-place class swaps that can be undone: how bnfix converts BN modules without copying them.

Assigning `module.__class__` (instead of building a new module and copying state into it, as
`nn.SyncBatchNorm.convert_sync_batchnorm` does) keeps everything a copy loses: the module object
itself (a BN registered under two names or shared by two parents stays one), its hooks, its
parameters and buffers (the same tensor objects: an optimizer built before still works),
`training`, device, dtype, `num_batches_tracked`, and the attributes and methods of a BN subclass.
The original class and every instance attribute a conversion overwrote are recorded on the module
(a stack of `Origin`s) so that an undo restores them exactly.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from bnfix.torch.report import ConversionRecord, ConversionRefused, ConversionReport

ORIGINS_ATTR = "_bnfix_origins"


@dataclass(frozen=True)
class Origin:
    """What one conversion changed on a module: `kind` ("sync", "frozen"), the class before,
    instance attributes it overwrote (old values) or added, and the parameters' requires_grad."""

    kind: str
    cls: type[nn.Module]
    saved_attrs: dict[str, Any]
    added_attrs: tuple[str, ...]
    requires_grad: dict[str, bool]


def origins(module: nn.Module) -> tuple[Origin, ...]:
    return module.__dict__.get(ORIGINS_ATTR, ())


def swap_class(module: nn.Module, target: type[nn.Module], kind: str,
               attrs: dict[str, Any]) -> None:
    """Turn `module` into a `target` in place, setting plain (non-tensor) instance `attrs`."""
    state = module.__dict__
    origin = Origin(
        kind=kind,
        cls=type(module),
        saved_attrs={name: state[name] for name in attrs if name in state},
        added_attrs=tuple(name for name in attrs if name not in state),
        requires_grad={n: p.requires_grad for n, p in module.named_parameters(recurse=False)},
    )
    state[ORIGINS_ATTR] = (*origins(module), origin)
    state.update(attrs)
    module.__class__ = target


def undo_swap(module: nn.Module) -> None:
    """Undo the latest `swap_class` on `module`: class, attributes, requires_grad flags."""
    *rest, origin = origins(module)
    state = module.__dict__
    for name in origin.added_attrs:
        del state[name]
    state.update(origin.saved_attrs)
    for name, param in module.named_parameters(recurse=False):
        param.requires_grad_(origin.requires_grad[name])
    if rest:
        state[ORIGINS_ATTR] = tuple(rest)
    else:
        del state[ORIGINS_ATTR]
    module.__class__ = origin.cls


@functools.cache
def derived_class(cls: type[nn.Module], behaviour: type[_BatchNorm]) -> type[nn.Module]:
    """`class <Prefix><Cls>(cls, behaviour)`: the MRO is Cls, Cls's torch base (BatchNorm2d, which
    defines no forward), then `behaviour`, so a subclass's own forward still runs and its
    `super().forward(x)` reaches `behaviour.forward`. Cached: one class per (cls, behaviour).
    Raises TypeError when the two cannot be combined (metaclass or layout conflicts)."""
    name = behaviour.__name__.removesuffix("BatchNorm") + cls.__name__
    doc = f"{cls.__qualname__} with {behaviour.__qualname__} behaviour (made by bnfix.torch)."
    return type(name, (cls, behaviour), {"__slots__": (), "__module__": __name__, "__doc__": doc})


def forward_bypass(target: type[nn.Module], behaviour: type[_BatchNorm]) -> str | None:
    """Why `target` would not run `behaviour.forward`: the first class before `behaviour` in the
    MRO whose forward does not call `super().forward` (a heuristic on its code: it must mention
    both `super` and `forward`); None when every override delegates."""
    for klass in target.__mro__[1:]:
        if klass is behaviour:
            return None
        forward = vars(klass).get("forward")
        code = getattr(forward, "__code__", None)
        if forward is not None and (code is None or not {"super", "forward"} <= set(code.co_names)):
            return (f"{klass.__qualname__}.forward does not call super().forward(), so it would "
                    f"bypass {behaviour.__name__}")
    raise TypeError(f"{behaviour.__name__} is not in the MRO of {target.__name__}")


@dataclass
class Site:
    """One BN module object and every dotted path it is registered under ("" for the root)."""

    module: _BatchNorm
    paths: list[str]

    @property
    def path(self) -> str:
        return self.paths[0]


def bn_sites(root: nn.Module) -> list[Site]:
    sites: dict[int, Site] = {}
    for path, module in root.named_modules(remove_duplicate=False):
        if isinstance(module, _BatchNorm):
            sites.setdefault(id(module), Site(module, [])).paths.append(path)
    return list(sites.values())


@dataclass(frozen=True)
class Step:
    """A planned conversion of one site: `target` class, or None with `note` saying why not."""

    site: Site
    target: type[nn.Module] | None
    note: str = ""

    def record(self, action: str) -> ConversionRecord:
        note = self.note
        if len(self.site.paths) > 1:
            shared = "one module, also at " + ", ".join(p or "(root)" for p in self.site.paths[1:])
            note = f"{note}; {shared}" if note else shared
        to = "" if self.target is None else self.target.__name__
        return ConversionRecord(self.site.path, type(self.site.module).__name__, to, note, action)


def convert_sites(root: nn.Module, action: str, plan: Callable[[Site], Step | None],
                  apply: Callable[[Site, type[nn.Module]], None], strict: bool,
                  report: ConversionReport | None) -> None:
    """Plan every BN site first (None: not concerned, left alone), refuse atomically under
    `strict`, then apply the planned steps and record them in `report`."""
    steps = [step for site in bn_sites(root) if (step := plan(site)) is not None]
    refused = [step.record(action) for step in steps if step.target is None]
    if strict and refused:
        raise ConversionRefused(action, refused)
    converted = []
    for step in steps:
        if step.target is not None:
            converted.append(step.record(action))
            apply(step.site, step.target)
    if report is not None:
        report.converted.extend(converted)
        report.refused.extend(refused)
