"""The BN entry points `sync_towers` reroutes while it is active: `tf.compat.v1.nn.fused_batch_norm`
and the tf-keras layer behind `tf.compat.v1.layers.batch_normalization` /
`tf.compat.v1.layers.BatchNormalization`. In training mode they normalize with the statistics of
every tower's batch; anything else goes to the original code unchanged."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from bnfix.tf1 import stats
from bnfix.tf1.towers import TowerError, active_sync

LEGACY_LAYERS = "tf_keras.src.legacy_tf_layers.normalization"
FUSED_MIN_EPSILON = 1.001e-5  # what FusedBatchNorm clamps epsilon to


def _synced_fused_batch_norm(original: Callable[..., Any]) -> Callable[..., Any]:
    def fused_batch_norm(x, scale, offset, mean=None, variance=None, epsilon=0.001,
                         data_format="NHWC", is_training=True, name=None,
                         exponential_avg_factor=1.0):
        sync = active_sync()
        if sync is None or not is_training:
            return original(x, scale, offset, mean=mean, variance=variance, epsilon=epsilon,
                            data_format=data_format, is_training=is_training, name=name,
                            exponential_avg_factor=exponential_avg_factor)
        with tf.name_scope(name or "FusedBatchNorm"):
            x = tf.convert_to_tensor(x)
            compute = tf.float32 if x.dtype in (tf.float16, tf.bfloat16) else x.dtype
            inputs = tf.cast(x, compute)
            channel_axis = 1 if data_format.startswith("NC") else -1
            layer = scale.name if isinstance(scale, tf.Variable) else "fused_batch_norm"
            moments = sync.moments(inputs, channel_axis, layer)
            y = stats.normalize(inputs, moments.mean, moments.variance, offset, scale,
                                max(epsilon, FUSED_MIN_EPSILON), channel_axis)
            batch_mean, batch_variance = moments.mean, moments.unbiased_variance()
            if exponential_avg_factor != 1.0:
                keep = 1.0 - exponential_avg_factor
                batch_mean = keep * tf.cast(mean, compute) + exponential_avg_factor * batch_mean
                batch_variance = (keep * tf.cast(variance, compute)
                                  + exponential_avg_factor * batch_variance)
            return tf.cast(y, x.dtype), batch_mean, batch_variance

    fused_batch_norm.__doc__ = original.__doc__
    return fused_batch_norm


def _synced_layer_call(original: Callable[..., Any]) -> Callable[..., Any]:
    @tf.autograph.experimental.do_not_convert
    def call(self, inputs, training=False, mask=None):
        sync = active_sync()
        value = training if isinstance(training, bool) else tf.get_static_value(training)
        if sync is None or value is False or (value is None and training is None):
            return original(self, inputs, training=training, mask=mask)
        where = f"{type(self).__name__} `{self.name}`"
        if value is None:
            raise TowerError(f"{where}: inside sync_towers `training` must be a Python bool or "
                             "a constant (build the evaluation graph outside the context)")
        unsupported = [what for what, used in (("renorm", self.renorm),
                                               ("virtual_batch_size", self.virtual_batch_size),
                                               ("adjustment", self.adjustment),
                                               ("a mask", mask is not None),
                                               ("several axes", len(self.axis) != 1)) if used]
        if unsupported:
            raise TowerError(f"{where}: sync_towers cannot synchronize a BN layer with "
                             f"{', '.join(unsupported)}")
        x = tf.cast(inputs, self._param_dtype)
        moments = sync.moments(x, self.axis[0], self.moving_mean.name)
        if moments.owns_updates:
            # The layer's own convention: fused kernels store the unbiased variance.
            variance = moments.unbiased_variance() if self.fused else moments.variance
            stats.moving_average_updates(self.moving_mean, self.moving_variance, moments.mean,
                                         variance, self.momentum)
        y = stats.normalize(x, moments.mean, moments.variance, self.beta, self.gamma,
                            self.epsilon, self.axis[0])
        return tf.cast(y, self.compute_dtype)

    return call


def _legacy_layer_class() -> type | None:
    """tf-keras's TF1 BN layer, if TF1 layers are in use (imported, or enabled by
    TF_USE_LEGACY_KERAS)."""
    if LEGACY_LAYERS not in sys.modules and os.environ.get("TF_USE_LEGACY_KERAS", "0") in (
            "", "0", "false", "False"):
        return None
    return importlib.import_module(LEGACY_LAYERS).BatchNormalization


def install() -> Callable[[], None]:
    """Reroute the entry points; returns the function that restores them."""
    restores: list[Callable[[], None]] = []
    nn = tf.compat.v1.nn
    fused = nn.fused_batch_norm
    nn.fused_batch_norm = _synced_fused_batch_norm(fused)
    restores.append(lambda: setattr(nn, "fused_batch_norm", fused))
    layer = _legacy_layer_class()
    if layer is not None:
        call = layer.__dict__["call"]
        layer.call = _synced_layer_call(call)
        restores.append(lambda: setattr(layer, "call", call))

    def restore() -> None:
        for undo in reversed(restores):
            undo()

    return restore
