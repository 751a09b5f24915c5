"""Keras 3 BatchNormalization ↔ synchronized BatchNormalization, weights kept.

Keras 3.15 reads `synchronized` only when `call` computes the batch moments
(`BatchNormalization._moments` → `ops.moments(..., synchronized=...)`, an all-reduce over the
replicas of the current `tf.distribute` strategy); the variables and their aggregation do not
depend on it. So the flag can be changed on a built layer and takes effect at the next trace:
subclassed models (which `clone_model` cannot rebuild) are converted in place, with their
compiled train/test/predict functions dropped so they retrace. Functional and Sequential models
(nested ones included, `keras.ops` nodes too) are cloned with `clone_model(recursive=True)` —
each BN rebuilt from its config with the new flag, so it is saved with the model — and every
layer's weights (moving statistics included) are copied from the layer it was cloned from; a
layer used twice stays one layer. A compiled model's clone is compiled the same way and its
optimizer state (iteration count, momenta) is carried over. BN layers inside a custom layer that
`clone_model` treats as a leaf are set in place in the clone ("attribute" in the report: whether
they survive saving depends on that layer's config).

Both functions return the model (the clone, or the model itself when converted in place), so
`model = bnfix.keras.convert_sync(model)` is a drop-in; what was done goes into `report=`.

Refused: BN subclasses that override `_moments` (where synchronization happens), models that
are not Keras 3 models, `synchronized=True` on a backend other than TensorFlow, and a model
converted in place under a `tf.distribute` strategy whose variables were created outside that
strategy's scope (Keras would fail in `fit` with a bare AssertionError). Keras ignores
`synchronized` for masked inputs: those statistics stay per replica.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import keras
from keras.src.models.functional import Functional

from bnfix.keras.report import ConversionReport, LayerChange, Refusal


class ConversionRefused(ValueError):
    """The model as a whole cannot be converted faithfully."""


def convert_sync(model: keras.Model, *, report: ConversionReport | None = None) -> keras.Model:
    """Every BatchNormalization in `model` → `synchronized=True`; returns the converted model
    (a clone for Functional/Sequential models, `model` itself for subclassed ones). What was
    converted, left alone and refused is added to `report` when one is given."""
    return _convert(model, True, report if report is not None else ConversionReport())


def revert_sync(model: keras.Model, *, report: ConversionReport | None = None) -> keras.Model:
    """Every BatchNormalization in `model` → `synchronized=False`; returns the model, as
    `convert_sync` does."""
    return _convert(model, False, report if report is not None else ConversionReport())


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


def _active_strategy() -> Any | None:
    """The tf.distribute strategy whose scope we are in (None: the default one)."""
    import tensorflow as tf

    return tf.distribute.get_strategy() if tf.distribute.has_strategy() else None


def _strategy_of(variable: Any) -> Any | None:
    return getattr(getattr(variable, "value", None), "_distribute_strategy", None)


def _check_in_place(model: keras.Model) -> None:
    """A model changed in place keeps its variables: under a strategy they must be its."""
    strategy = _active_strategy()
    if strategy is None or not model.weights:
        return
    outside = [v.path for v in model.weights if _strategy_of(v) is not strategy]
    if outside:
        raise ConversionRefused(
            f"{type(model).__name__} was built outside this tf.distribute strategy's scope "
            f"({len(outside)} of its {len(model.weights)} variables, e.g. `{outside[0]}`, are "
            "not mirrored), and a subclassed model cannot be rebuilt by bnfix: create (or load) "
            "it inside `with strategy.scope():`, then convert it there")


def _convert(model: keras.Model, synchronized: bool, report: ConversionReport) -> keras.Model:
    if not isinstance(model, keras.Model):
        raise ConversionRefused(
            f"{type(model).__module__}.{type(model).__name__} is not a Keras 3 model "
            "(tf-keras models are not supported)")
    if synchronized and keras.backend.backend() != "tensorflow":
        raise ConversionRefused(f"{type(model).__name__}: synchronized=True needs the TensorFlow "
                                f"backend (this is {keras.backend.backend()})")
    before = layer_paths(model)
    in_place = type(model) not in (Functional, keras.Sequential)
    if in_place:
        _check_in_place(model)
        result = model
    else:
        result = _clone(model, synchronized, report)
    report.synchronized, report.in_place = synchronized, in_place
    seen: dict[int, int] = {}  # layer id -> its index in report.converted
    start = len(report.converted)
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
    if in_place and len(report.converted) > start:
        # compiled functions traced the old flag
        model.train_function = model.test_function = model.predict_function = None
    return result


def _clone(model: keras.Model, synchronized: bool, report: ConversionReport) -> keras.Model:
    pairs: list[tuple[keras.Layer, keras.Layer]] = []

    def clone_layer(layer: Any) -> Any:
        # `keras.ops` calls in a functional graph (Add, Multiply, ...) are Operations, not
        # Layers: stateless, cloned from their config like Keras does by default.
        config = layer.get_config()
        if isinstance(layer, keras.layers.BatchNormalization) and _refusal(layer) is None:
            config["synchronized"] = synchronized
        clone = type(layer).from_config(config)
        if isinstance(layer, keras.Layer):
            pairs.append((layer, clone))
        return clone

    result = keras.models.clone_model(model, clone_function=clone_layer, recursive=True)
    for layer, clone in pairs:
        if layer.weights:
            clone.set_weights(layer.get_weights())
    report.notes.extend(_carry_compile(model, result, pairs))
    return result


def _carry_compile(model: keras.Model, clone: keras.Model,
                   pairs: list[tuple[keras.Layer, keras.Layer]]) -> list[str]:
    """Compile the clone as the original was (clone_model returns it uncompiled), and give its
    optimizer the original's state: the slots of each variable go to that variable's clone."""
    config = model.get_compile_config() if getattr(model, "compiled", False) else None
    if not config:
        return []
    clone.compile_from_config(config)
    settings = "compiled like the original (loss, metrics, optimizer settings)"
    old = getattr(model, "optimizer", None)
    if old is None or not getattr(old, "built", False):
        return [f"{settings}; the optimizer had no state yet"]
    twin = {id(v): c for layer, copy in pairs for v, c in zip(layer.weights, copy.weights,
                                                               strict=True)}
    tracked = old._trainable_variables
    if any(id(v) not in twin for v in tracked):
        return [(f"{settings}; the optimizer's state starts fresh (it tracks variables the "
                 "clone does not have)")]
    new = clone.optimizer
    new.build([twin[id(v)] for v in tracked])
    if len(new.variables) != len(old.variables) or any(
            tuple(a.shape) != tuple(b.shape) for a, b in zip(new.variables, old.variables)):
        return [f"{settings}; the optimizer's state starts fresh (its variables do not line up)"]
    for target, source in zip(new.variables, old.variables, strict=True):
        target.assign(source.value)
    return [(f"{settings}; optimizer state carried over ({len(old.variables)} variables, "
             f"iterations = {int(old.iterations.numpy())})")]
