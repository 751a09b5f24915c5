"""`bnfix.tf1.batch_norm`: a graph-mode BN for TF1 tower code that synchronizes itself inside
`sync_towers` — for code that cannot use `tf.compat.v1.layers` (no tf-keras) or wants one BN
whose update semantics are stated rather than inherited."""

from __future__ import annotations

import tensorflow as tf

from bnfix.tf1 import stats
from bnfix.tf1.towers import active_sync


def batch_norm(x: tf.Tensor, training: bool, *, axis: int = -1, momentum: float = 0.99,
               epsilon: float = 1e-3, center: bool = True, scale: bool = True,
               name: str | None = None, reuse: bool | None = None) -> tf.Tensor:
    """Batch normalization over every axis of `x` but `axis`.

    Creates `gamma`, `beta`, `moving_mean`, `moving_variance` with `tf.compat.v1.get_variable`
    under the variable scope `name` (default `batch_norm`), so towers share them through
    `reuse`/`AUTO_REUSE` like any TF1 layer (the moving statistics are not put in
    MOVING_AVERAGE_VARIABLES: an EMA over them would average twice). `training` is a Python bool: True normalizes with the
    batch statistics and adds two moving-average update ops to UPDATE_OPS (the variance stored
    unbiased, like TF1's fused BN); False uses the moving statistics.

    Inside `bnfix.tf1.sync_towers`, the batch statistics are those of every tower's batch
    together and the update ops are added once per layer, by one tower (see `sync_towers`).
    """
    if not isinstance(training, bool):
        raise TypeError("bnfix.tf1.batch_norm: `training` must be a Python bool (build the "
                        "training and the evaluation graphs separately)")
    channels = x.shape[axis]
    if channels is None:
        raise ValueError("bnfix.tf1.batch_norm: the channel axis of the input must be known")
    with tf.compat.v1.variable_scope(name, default_name="batch_norm", reuse=reuse) as scope:
        param = x.dtype.base_dtype if x.dtype.base_dtype != tf.float16 else tf.float32

        def variable(var_name: str, init: float, trainable: bool) -> tf.Variable:
            return tf.compat.v1.get_variable(
                var_name, [channels], param, tf.compat.v1.constant_initializer(init),
                trainable=trainable)

        gamma = variable("gamma", 1.0, True) if scale else None
        beta = variable("beta", 0.0, True) if center else None
        moving_mean = variable("moving_mean", 0.0, False)
        moving_variance = variable("moving_variance", 1.0, False)
        inputs = tf.cast(x, param)
        if not training:
            y = stats.normalize(inputs, moving_mean, moving_variance, beta, gamma, epsilon, axis)
            return tf.cast(y, x.dtype)
        sync = active_sync()
        if sync is not None:
            moments = sync.moments(inputs, axis, scope.name)
            mean, variance = moments.mean, moments.variance
            unbiased, updates = moments.unbiased_variance(), moments.owns_updates
        else:
            rank = x.shape.rank
            mean, variance = tf.nn.moments(inputs, [a for a in range(rank) if a != axis % rank])
            count = tf.cast(tf.size(inputs) // channels, param)
            unbiased, updates = variance * count / tf.maximum(count - 1.0, 1.0), True
        if updates:
            stats.moving_average_updates(moving_mean, moving_variance, mean, unbiased, momentum)
        y = stats.normalize(inputs, mean, variance, beta, gamma, epsilon, axis)
        return tf.cast(y, x.dtype)
