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

from bnfix.artifacts.model import BNLayer

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
                 names: Mapping[str, str] | None = None) -> list[BNLayer]:
    """Load the arrays of each group through `fetch` (key -> array) into `BNLayer`s.

    Groups whose statistics are not matching vectors (a custom module that happens to keep
    `running_mean`) are dropped; a gamma/beta of another shape is not this layer's affine.
    `names` renames layers (stored path -> the name the user knows)."""
    layers = []
    for group in groups:
        mean = _vector(fetch(group.keys["mean"]))
        var = _vector(fetch(group.keys["var"]))
        if mean is None or var is None or mean.shape != var.shape:
            continue
        layer = BNLayer(name=(names or {}).get(group.name, group.name), framework=framework,
                        mean=mean, var=var, keys=dict(group.keys))
        for role in ("gamma", "beta"):
            if role in group.keys:
                value = _vector(fetch(group.keys[role]))
                if value is not None and value.shape == mean.shape:
                    setattr(layer, role, value)
                else:
                    del layer.keys[role]
        if "num_batches_tracked" in group.keys:
            count = np.asarray(fetch(group.keys["num_batches_tracked"]))
            if count.size == 1:
                layer.num_batches_tracked = int(count.reshape(()))
        layers.append(layer)
    return layers


def _vector(value: object) -> np.ndarray | None:
    array = np.asarray(value)
    if array.ndim > 1 or not np.issubdtype(array.dtype, np.number):
        return None
    return array.astype(np.float64).reshape(-1)
