"""`bnfix.keras.to_group_norm(model, groups=32)` and `bnfix convert MODEL.keras --to groupnorm`:
every BatchNormalization → `GroupNormalization`, what the small-batch diagnosis (BN301)
recommends when the batch cannot grow and BN cannot be synced.

A recipe change, not a weight-preserving conversion: GroupNorm normalizes each sample over
groups of channels, has no moving statistics, and the model must be trained again; γ/β are
copied as a starting point, every other layer's weights too. Functional and Sequential models
(nested ones included) are rebuilt from their serialized config with each BatchNormalization
entry rewritten; subclassed models cannot be rebuilt from a config and are refused. The group count per layer is `groups` when it divides the
channels, else the largest divisor below it; a layer with no divisor between 2 and `groups`, or
a BN over several axes, is refused with the reason (the conversion then changes nothing).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import keras
import numpy as np
from keras.src.models.functional import Functional

from bnfix.doctor.remedies import group_count
from bnfix.keras.convert import ConversionRefused, layer_paths


@dataclass
class GroupNormReport:
    converted: list[tuple[str, int, int]] = field(default_factory=list)  # path, channels, groups
    refused: list[tuple[str, str]] = field(default_factory=list)  # path, reason

    def table(self) -> str:
        lines = [f"  {path}  BatchNormalization({channels}) -> GroupNormalization(groups="
                 f"{groups})" for path, channels, groups in self.converted]
        lines += [f"  {path}  refused: {reason}" for path, reason in self.refused]
        lines.append(f"{len(self.converted)} BatchNormalization layers converted to "
                     f"GroupNormalization in a copy of the model (a recipe change: no moving "
                     f"statistics, retrain); {len(self.refused)} refused.")
        return "\n".join(lines)

    __str__ = table


def _axis(layer: keras.layers.BatchNormalization) -> int | None:
    axis = layer.axis
    if isinstance(axis, (list, tuple)):
        return int(axis[0]) if len(axis) == 1 else None
    return int(axis)


def _refusal(layer: keras.layers.BatchNormalization, groups: int) -> str | None:
    if _axis(layer) is None:
        return f"normalizes over several axes {layer.axis}: GroupNormalization takes one"
    channels = int(layer.moving_mean.shape[0])
    if group_count(channels, groups) is None:
        return (f"{channels} channels have no divisor between 2 and {groups}: pass "
                f"groups={channels} or convert this layer by hand")
    return None


def to_group_norm(model: keras.Model, groups: int = 32) -> tuple[keras.Model, GroupNormReport]:
    """A copy of `model` with GroupNormalization for BatchNormalization; (copy, report).
    Raises ConversionRefused when the model cannot be cloned or a layer is refused."""
    if type(model) not in (Functional, keras.Sequential):
        raise ConversionRefused(
            f"{type(model).__name__} is a subclassed model: it cannot be rebuilt from its config; "
            "replace BatchNormalization by GroupNormalization in its code")
    report = GroupNormReport()
    bns = {path: layer for path, layer in layer_paths(model).items()
           if isinstance(layer, keras.layers.BatchNormalization)}
    for path, layer in bns.items():
        reason = _refusal(layer, groups)
        if reason is not None:
            report.refused.append((path, reason))
    names = [layer.name for layer in bns.values()]
    if len(set(names)) < len(names):
        report.refused.append((", ".join(sorted({n for n in names if names.count(n) > 1})),
                               "two BatchNormalization layers share a name (in nested models)"))
    if report.refused:
        raise ConversionRefused("; ".join(f"{p}: {r}" for p, r in report.refused))
    channels = {layer.name: int(layer.moving_mean.shape[0]) for layer in bns.values()}
    config = _rewrite(keras.saving.serialize_keras_object(model), channels, groups)
    result = keras.saving.deserialize_keras_object(config)
    paths = layer_paths(result)
    for path, layer in layer_paths(model).items():
        clone = paths.get(path)
        if isinstance(layer, keras.layers.BatchNormalization):
            if isinstance(clone, keras.layers.GroupNormalization):
                clone.set_weights(([layer.gamma.numpy()] if layer.scale else [])
                                  + ([layer.beta.numpy()] if layer.center else []))
                report.converted.append((path, channels[layer.name], clone.groups))
        elif clone is not None and layer.weights and not layer._flatten_layers(
                include_self=False, recursive=False):
            clone.set_weights(layer.get_weights())
    return result, report


def _rewrite(config: Any, channels: dict[str, int], groups: int) -> Any:
    """The model's serialized config with each BatchNormalization as a GroupNormalization
    (same name, axis, epsilon, center/scale and their initializers; its call's `mask` argument
    dropped: GroupNormalization takes none)."""
    if isinstance(config, list):
        return [_rewrite(item, channels, groups) for item in config]
    if not isinstance(config, dict):
        return config
    if config.get("class_name") == "BatchNormalization" and isinstance(config.get("config"),
                                                                        dict):
        bn = config["config"]
        gn = {key: bn[key] for key in ("name", "trainable", "dtype", "epsilon", "center", "scale",
                                       "beta_initializer", "gamma_initializer",
                                       "beta_regularizer", "gamma_regularizer",
                                       "beta_constraint", "gamma_constraint") if key in bn}
        axis = bn.get("axis", -1)
        gn["axis"] = axis[0] if isinstance(axis, list) else axis
        gn["groups"] = group_count(channels[bn["name"]], groups)
        out = {**config, "module": "keras.layers", "class_name": "GroupNormalization",
               "registered_name": None, "config": gn}
        if "inbound_nodes" in config:
            out["inbound_nodes"] = [
                {**node, "kwargs": {k: v for k, v in node.get("kwargs", {}).items()
                                    if k != "mask"}} if isinstance(node, dict) else node
                for node in config["inbound_nodes"]]
        return out
    return {key: _rewrite(value, channels, groups) for key, value in config.items()}


def convert_keras_file(path: str, output: str, groups: int = 32) -> str:
    """`bnfix convert MODEL.keras --to groupnorm -o OUT.keras`: convert, then check that the
    written file loads, holds GroupNormalization where BN was, and gives finite outputs of the
    original's shapes on a random batch (values differ: a recipe change)."""
    from bnfix.convert import ConversionError
    from bnfix.keras.files import _load

    if not output.endswith(".keras"):
        raise ConversionError(f"{output}: the output must be a .keras file")
    original = _load(path)
    try:
        result, report = to_group_norm(original, groups)
    except ConversionRefused as exc:
        raise ConversionError(f"refused, nothing written: {exc}") from exc
    if not report.converted:
        raise ConversionError("no BatchNormalization layer in the model: nothing to convert, "
                              "nothing written")
    if getattr(original, "compiled", False) and original.get_compile_config():
        result.compile_from_config(original.get_compile_config())

    def check(written: keras.Model) -> None:
        kinds = layer_paths(written)
        missing = [p for p, _, _ in report.converted
                   if not isinstance(kinds.get(p), keras.layers.GroupNormalization)]
        if missing:
            raise ConversionError(f"GroupNormalization missing after saving at "
                                  f"{', '.join(missing)}: nothing written")
        _check_outputs(original, written)

    _write_checked(result, output, check)
    return (f"{report.table()}\nCheck: the written model loads, has GroupNormalization at "
            f"every converted layer and gives finite outputs of the original's shapes (values "
            f"differ: retrain).\nWrote {output}")


def _write_checked(model: keras.Model, output: str, check: Callable[[keras.Model], None]
                   ) -> None:
    """Save to a temporary file beside `output`, load it back, check it, then rename."""
    from bnfix.keras.files import _load

    folder = Path(output).resolve().parent
    handle, temporary = tempfile.mkstemp(suffix=".keras", dir=folder, prefix=".bnfix-")
    os.close(handle)
    try:
        model.save(temporary)
        check(_load(temporary))
        os.replace(temporary, output)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)


def _check_outputs(reference: keras.Model, candidate: keras.Model) -> None:
    from bnfix.convert import ConversionError

    rng = np.random.default_rng(0)
    batch = [rng.normal(size=[2 if d is None else d for d in spec.shape]).astype("float32")
             for spec in reference.inputs]
    feed = batch[0] if len(batch) == 1 else batch
    expected = keras.tree.flatten(reference(feed, training=False))
    got = keras.tree.flatten(candidate(feed, training=False))
    for a, b in zip(expected, got, strict=True):
        b = np.asarray(b)
        if np.asarray(a).shape != b.shape or not np.all(np.isfinite(b)):
            raise ConversionError("check failed: the converted model's outputs have another "
                                  "shape or are not finite: nothing written")
