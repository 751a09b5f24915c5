"""Which stored tensors form one BatchNorm layer, across the naming schemes of the frameworks.

A BN layer is recognised by its *moving statistics*: a name prefix holding both a moving mean
and a moving variance (torch `running_mean`/`running_var`, TF/Keras `moving_mean`/
`moving_variance`). Names alone would confuse BN with LayerNorm/GroupNorm, whose `weight`/`bias`
(`gamma`/`beta`) look the same but which keep no statistics.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from bnfix.artifacts.limits import check_elements
from bnfix.artifacts.model import BNLayer

# key -> (declared shape, bytes per value), read from the file's metadata without the data
ShapeOf = Callable[[str], tuple[tuple[int, ...], int]]

# last name component -> role (torch names, then TF1 / Keras names)
ROLES = {
    "weight": "gamma", "bias": "beta", "running_mean": "mean", "running_var": "var",
    "num_batches_tracked": "num_batches_tracked",
    "gamma": "gamma", "beta": "beta", "moving_mean": "mean", "moving_variance": "var",
}
# an EMA of a moving statistic is stored under it: `bn/moving_mean/ExponentialMovingAverage`
SHADOW_ROLES = {"moving_mean": "mean_shadow", "moving_variance": "var_shadow"}
TF2_VALUE = "/.ATTRIBUTES/VARIABLE_VALUE"  # TF2 object-based checkpoints append this
TF2_SLOT = "/.OPTIMIZER_SLOT/"


def clean_name(key: str) -> str:
    """A stored key without the storage decorations: TF2's `/.ATTRIBUTES/VARIABLE_VALUE` and
    Keras' `:0`."""
    key = key.removesuffix(TF2_VALUE)
    key = key.removesuffix(":0")
    return key


@dataclass
class Group:
    """The stored keys of one candidate BN layer, by role."""

    name: str
    keys: dict[str, str] = field(default_factory=dict)

    @property
    def is_bn(self) -> bool:
        return "mean" in self.keys and "var" in self.keys


def group_keys(keys: Iterable[str]) -> list[Group]:
    """BN layers among stored keys, in first-seen order. Optimizer slots are skipped."""
    groups: dict[str, Group] = {}
    for key in keys:
        if TF2_SLOT in key:
            continue
        name = clean_name(key)
        sep = "/" if "/" in name else "."
        prefix, _, leaf = name.rpartition(sep)
        if leaf in ROLES and prefix:
            groups.setdefault(prefix, Group(prefix)).keys.setdefault(ROLES[leaf], key)
            continue
        # `<layer>/moving_mean/<EMA name>`: a shadow variable of a moving statistic
        layer, _, stat = prefix.rpartition("/")
        if sep == "/" and stat in SHADOW_ROLES and layer:
            groups.setdefault(layer, Group(layer)).keys.setdefault(SHADOW_ROLES[stat], key)
    return [g for g in groups.values() if g.is_bn]


def build_layers(groups: Iterable[Group], fetch: Callable[[str], np.ndarray], framework: str,
                 names: Mapping[str, str] | None = None,
                 shape_of: ShapeOf | None = None) -> list[BNLayer]:
    """Load the arrays of each group through `fetch` (key -> array) into `BNLayer`s.

    Groups whose statistics are not matching vectors (a custom module that happens to keep
    `running_mean`) are dropped; a gamma/beta of another shape is not this layer's affine.
    `names` renames layers (stored path -> the name the user knows). With `shape_of`, a tensor
    that is not a vector is never read, and one whose declared size is over the budget
    (`bnfix.artifacts.limits`) raises ArtifactError before it is read."""

    def readable(key: str) -> bool:
        if shape_of is None:
            return True
        shape, itemsize = shape_of(key)
        if len(shape) > 1:
            return False
        check_elements(f"`{key}`", int(np.prod(shape, dtype=np.int64)), itemsize)
        return True

    layers = []
    for group in groups:
        if not (readable(group.keys["mean"]) and readable(group.keys["var"])):
            continue
        mean = as_vector(fetch(group.keys["mean"]))
        var = as_vector(fetch(group.keys["var"]))
        if mean is None or var is None or mean.shape != var.shape:
            continue
        layer = BNLayer(name=(names or {}).get(group.name, group.name), framework=framework,
                        mean=mean, var=var, keys=dict(group.keys))
        for role in ("gamma", "beta"):
            if role in group.keys:
                value = as_vector(fetch(group.keys[role])) if readable(group.keys[role]) else None
                if value is not None and value.shape == mean.shape:
                    setattr(layer, role, value)
                else:
                    del layer.keys[role]
        if "num_batches_tracked" in group.keys and readable(group.keys["num_batches_tracked"]):
            count = np.asarray(fetch(group.keys["num_batches_tracked"]))
            if count.size == 1 and np.issubdtype(count.dtype, np.integer):
                layer.num_batches_tracked = int(count.reshape(()))
        layers.append(layer)
    return layers


def as_vector(value: object) -> np.ndarray | None:
    """A BN parameter as a float64 vector; None when it is not a numeric vector (or None)."""
    if value is None:
        return None
    array = np.asarray(value)
    if array.ndim > 1 or not np.issubdtype(array.dtype, np.number):
        return None
    return array.astype(np.float64).reshape(-1)


def moved_affine(layers: Iterable[BNLayer]) -> str:
    """Evidence that gamma/beta were trained ('' when none): a layer whose gamma or beta
    differs across channels. Every framework initialises them to one constant per layer (1 and
    0; zero-init residual gammas are 0), so only an optimizer step makes them differ."""
    moved = [layer.name for layer in layers
             if any(value is not None and value.size > 1 and not np.all(value == value[0])
                    for value in (layer.gamma, layer.beta))]
    if not moved:
        return ""
    shown = ", ".join(moved[:2]) + (f" and {len(moved) - 2} more" if len(moved) > 2 else "")
    return f"gamma/beta moved from their initial values ({shown})"
