"""Keras runtime: convert a model's BatchNormalization layers to synchronized BN and back.

`convert_sync(model)` / `revert_sync(model)` return `(model, report)` (a `KerasConversion` named
tuple); see `bnfix.keras.convert` for what is cloned, what is changed in place and what is
refused. Importing this package imports Keras (and TensorFlow).
"""

from bnfix.keras.convert import ConversionRefused, KerasConversion, convert_sync, revert_sync
from bnfix.keras.report import ConversionReport, LayerChange, Refusal

__all__ = ["ConversionRefused", "ConversionReport", "KerasConversion", "LayerChange", "Refusal",
           "convert_sync", "revert_sync"]
