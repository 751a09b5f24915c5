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

from bnfix.rulebook import ModuleSpec, torch_modules
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


def class_name(cls: type) -> str:
    """A class as the catalogue names it: `module.qualname`."""
    return f"{cls.__module__}.{cls.__qualname__}"


def module_spec(module: nn.Module) -> ModuleSpec | None:
    return torch_modules().get(class_name(type(module)))


@functools.cache
def _over(behaviour: type[nn.Module], plain: type[nn.Module]) -> type[nn.Module]:
    """`behaviour` placed before `plain` in an MRO (see `derived_class`)."""
    return type(behaviour.__name__, (behaviour, plain),
                {"__slots__": (), "__module__": __name__, "__doc__": behaviour.__doc__})


def plain_with_forward(cls: type[nn.Module]) -> type[nn.Module] | None:
    """The nearest base of `cls` listed as plain BN that defines its own forward (torch's
    nn.SyncBatchNorm: it syncs with CUDA kernels and skips batch_norm once a group exists)."""
    plain = {name for name, spec in torch_modules().items()
             if spec.outcome("convert_sync") == "plain"}
    for klass in cls.__mro__[1:]:
        if klass is _BatchNorm:
            return None
        if "forward" in vars(klass) and class_name(klass) in plain:
            return klass
    return None


@functools.cache
def derived_class(cls: type[nn.Module], behaviour: type[nn.Module], kind: str,
                  make_forward: Callable[[type[nn.Module]], Callable[..., Any]]
                  ) -> type[nn.Module]:
    """`class <Prefix><Cls>(cls, behaviour)` whose forward is `make_forward(cls)` (one that runs
    cls.forward, see `bnfix.torch.redirect`): a `cls` and a `behaviour` instance at once, every method and
    attribute of `cls` kept, and `super().forward` inside cls.forward reaching
    `behaviour.forward` (when cls derives from a BN class with its own forward, torch's
    nn.SyncBatchNorm, `behaviour` is put before that class in the MRO). Cached per
    (cls, behaviour, kind, make_forward). Raises TypeError when the two cannot be combined."""
    name = behaviour.__name__.removesuffix("BatchNorm") + cls.__name__
    doc = f"{cls.__qualname__} with {behaviour.__qualname__} behaviour (made by bnfix.torch)."
    plain = plain_with_forward(cls)
    base = behaviour if plain is None else _over(behaviour, plain)
    return type(name, (cls, base), {"__slots__": (), "__module__": __name__, "__doc__": doc,
                                    "forward": make_forward(cls)})


@dataclass
class Site:
    """One BN module object and every dotted path it is registered under ("" for the root)."""

    module: nn.Module
    paths: list[str]

    @property
    def path(self) -> str:
        return self.paths[0]


def is_bn(module: nn.Module) -> bool:
    """A torch _BatchNorm, or a class the catalogue lists (torchvision's FrozenBatchNorm2d)."""
    return isinstance(module, _BatchNorm) or module_spec(module) is not None


def bn_sites(root: nn.Module) -> list[Site]:
    sites: dict[int, Site] = {}
    for path, module in root.named_modules(remove_duplicate=False):
        if is_bn(module):
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
