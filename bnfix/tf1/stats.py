"""The BN arithmetic shared by every entry point: normalize with given statistics, and the
moving-average updates (the TF1 `assign_moving_average` form, registered in UPDATE_OPS)."""

from __future__ import annotations

import tensorflow as tf


def normalize(x: tf.Tensor, mean: tf.Tensor, variance: tf.Tensor, offset: tf.Tensor | None,
              scale: tf.Tensor | None, epsilon: float, channel_axis: int) -> tf.Tensor:
    """(x - mean) / sqrt(variance + epsilon) * scale + offset, per channel of `channel_axis`."""
    rank = x.shape.rank
    shape = [1] * rank
    shape[channel_axis % rank] = -1

    def per_channel(t: tf.Tensor | None) -> tf.Tensor | None:
        return None if t is None else tf.reshape(tf.cast(t, x.dtype), shape)

    return tf.nn.batch_normalization(x, per_channel(mean), per_channel(variance),
                                     per_channel(offset), per_channel(scale), epsilon)


def moving_average_updates(moving_mean: tf.Variable, moving_variance: tf.Variable,
                           mean: tf.Tensor, variance: tf.Tensor,
                           momentum: float) -> list[tf.Operation]:
    """moving -= (moving - batch) * (1 - momentum) for the mean and the variance, added to
    UPDATE_OPS."""
    updates = []
    for moving, value in ((moving_mean, mean), (moving_variance, variance)):
        with tf.name_scope("AssignMovingAvg"):
            value = tf.cast(tf.stop_gradient(value), moving.dtype)
            updates.append(tf.compat.v1.assign_sub(moving, (moving - value) * (1.0 - momentum)).op)
    for op in updates:
        tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.UPDATE_OPS, op)
    return updates
