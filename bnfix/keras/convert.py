"""Keras 3 BatchNormalization ↔ synchronized BatchNormalization, weights kept.

Keras 3.15 reads `synchronized` only when `call` computes the batch moments
(`BatchNormalization._moments` → `ops.moments(..., synchronized=...)`, an all-reduce over the
replicas of the current `tf.distribute` strategy); the variables and their aggregation do not
depend on it. So the flag can be changed on a built layer and takes effect at the next trace:
subclassed models (which `clone_model` cannot rebuild) are converted in place, with their
compiled train/test/predict functions dropped so they retrace. Functional and Sequential models
(nested ones included) are cloned with `clone_model(recursive=True)` — each BN rebuilt from its
config with the new flag, so it is saved with the model — and every layer's weights (moving
statistics included) are copied from the layer it was cloned from; a layer used twice stays one
layer. BN layers inside a custom layer that `clone_model` treats as a leaf are set in place in the
clone ("attribute" in the report: whether they survive saving depends on that layer's config).

Refused: BN subclasses that override `_moments` (where synchronization happens), models that
are not Keras 3 models, and `synchronized=True` on a backend other than TensorFlow. Keras
ignores `synchronized` for masked inputs: those statistics stay per replica.
"""

from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

import keras
from keras.src.models.functional import Functional

from bnfix.keras.report import ConversionReport, LayerChange, Refusal


class ConversionRefused(ValueError):
    """The model as a whole cannot be converted faithfully."""


class KerasConversion(NamedTuple):
    model: keras.Model
    report: ConversionReport


def convert_sync(model: keras.Model) -> KerasConversion:
    """Every BatchNormalization in `model` → `synchronized=True`; returns (model, report)."""
    return _convert(model, True)


def revert_sync(model: keras.Model) -> KerasConversion:
    """Every BatchNormalization in `model` → `synchronized=False`; returns (model, report)."""
    return _convert(model, False)


def layer_paths(model: keras.Layer) -> dict[str, keras.Layer]:
    """Every sublayer under its "/"-joined path of names (a shared layer under each path).
    Input layers are left out: a clone renames them, and they hold nothing to convert."""
    paths: dict[str, keras.Layer] = {}

    def walk(layer: keras.Layer, prefix: str, seen: frozenset[int]) -> None:
        for child in layer._flatten_layers(include_self=False, recursive=False):
            if isinstance(child, keras.layers.InputLayer):
                continue
            path = f"{prefix}/{child.name}" if prefix else child.name
            paths[path] = child
            if id(child) not in seen:
                walk(child, path, seen | {id(child)})

    walk(model, "", frozenset({id(model)}))
    return paths


def _refusal(layer: keras.layers.BatchNormalization) -> str | None:
    base = keras.layers.BatchNormalization
    if type(layer)._moments is not base._moments:
        return (f"{type(layer).__name__} overrides _moments(), where Keras computes the "
                "synchronized statistics")
    return None


def _convert(model: keras.Model, synchronized: bool) -> KerasConversion:
    if not isinstance(model, keras.Model):
        raise ConversionRefused(
            f"{type(model).__module__}.{type(model).__name__} is not a Keras 3 model "
            "(tf-keras models are not supported)")
    if synchronized and keras.backend.backend() != "tensorflow":
        raise ConversionRefused(f"{type(model).__name__}: synchronized=True needs the TensorFlow "
                                f"backend (this is {keras.backend.backend()})")
    before = layer_paths(model)
    if type(model) in (Functional, keras.Sequential):
        result = _clone(model, synchronized)
        notes, in_place = _carry_compile(model, result), False
    else:
        result, notes, in_place = model, [], True
    report = ConversionReport(synchronized, in_place, notes=notes)
    seen: dict[int, int] = {}  # layer id -> its index in report.converted
    for path, layer in layer_paths(result).items():
        if not isinstance(layer, keras.layers.BatchNormalization):
            continue
        if id(layer) in seen:
            first = report.converted[seen[id(layer)]]
            report.converted[seen[id(layer)]] = replace(first, aliases=(*first.aliases, path))
            continue
        was = before[path].synchronized
        refusal = _refusal(layer)
        if refusal is not None and was != synchronized:
            report.refused.append(Refusal(path, refusal))
        elif was == synchronized:
            report.unchanged.append(path)
        else:
            via = "attribute" if in_place or layer.synchronized != synchronized else "config"
            layer.synchronized = synchronized
            seen[id(layer)] = len(report.converted)
            report.converted.append(LayerChange(path, type(layer).__name__, was, synchronized,
                                                via))
    if in_place and report.converted:
        # compiled functions traced the old flag
        model.train_function = model.test_function = model.predict_function = None
    return KerasConversion(result, report)


def _clone(model: keras.Model, synchronized: bool) -> keras.Model:
    pairs: list[tuple[keras.Layer, keras.Layer]] = []

    def clone_layer(layer: keras.Layer) -> keras.Layer:
        config = layer.get_config()
        if isinstance(layer, keras.layers.BatchNormalization) and _refusal(layer) is None:
            config["synchronized"] = synchronized
        clone = type(layer).from_config(config)
        pairs.append((layer, clone))
        return clone

    result = keras.models.clone_model(model, clone_function=clone_layer, recursive=True)
    for layer, clone in pairs:
        if layer.weights:
            clone.set_weights(layer.get_weights())
    return result


def _carry_compile(model: keras.Model, clone: keras.Model) -> list[str]:
    """Compile the clone as the original was (clone_model returns it uncompiled)."""
    config = model.get_compile_config() if getattr(model, "compiled", False) else None
    if not config:
        return []
    clone.compile_from_config(config)
    return [("compiled like the original (loss, metrics, optimizer settings); the optimizer's "
            "state starts fresh")]
