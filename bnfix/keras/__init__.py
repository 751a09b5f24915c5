"""Keras runtime: convert a model's BatchNormalization layers to synchronized BN and back.

`convert_sync(model)` / `revert_sync(model)` return `(model, report)` (a `KerasConversion` named
tuple); see `bnfix.keras.convert` for what is cloned, what is changed in place and what is
refused. `BNMonitor` is a callback that watches BN while `fit` trains (`bnfix doctor` from
Python). Importing this package imports Keras (and TensorFlow).
"""

from bnfix.keras.convert import ConversionRefused, KerasConversion, convert_sync, revert_sync
from bnfix.keras.monitor import BNMonitor
from bnfix.keras.report import ConversionReport, LayerChange, Refusal

__all__ = ["BNMonitor", "ConversionRefused", "ConversionReport", "KerasConversion", "LayerChange",
           "Refusal", "convert_sync", "revert_sync"]
