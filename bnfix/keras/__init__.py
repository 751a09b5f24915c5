"""Keras runtime: convert a model's BatchNormalization layers to synchronized BN and back.

`model = convert_sync(model)` / `model = revert_sync(model)` return the converted model (pass
`report=ConversionReport()` to learn what was converted, left alone or refused); see
`bnfix.keras.convert` for what is cloned, what is changed in place and what is refused.
`BNMonitor` is a callback that watches BN while `fit` trains (`bnfix doctor` from Python);
`to_group_norm(model)` copies a model with GroupNormalization for BN (retrain). Importing this
package imports Keras (and TensorFlow).
"""

from bnfix.keras.convert import ConversionRefused, convert_sync, revert_sync
from bnfix.keras.groupnorm import GroupNormReport, to_group_norm
from bnfix.keras.monitor import BNMonitor
from bnfix.keras.report import ConversionReport, LayerChange, Refusal

__all__ = ["BNMonitor", "ConversionRefused", "ConversionReport", "GroupNormReport",
           "LayerChange", "Refusal", "convert_sync", "revert_sync", "to_group_norm"]
