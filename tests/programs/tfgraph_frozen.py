"""Write the inference graphs the TF graph tests read (TF1 graph mode, constant values):

- frozen_train_mode.pb: conv -> FusedBatchNormV3(is_training=True) frozen for serving (BN206);
- frozen_unfolded.pb: conv -> bias -> FusedBatchNormV3(is_training=False), not folded (BN208);
- saved_model/: the same unfolded network as a TF1 SavedModel (serve tag, variables checkpoint).

    python tfgraph_frozen.py OUT_DIR
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf

v1 = tf.compat.v1
GAMMA = np.array([1.5, 0.5, 2.0, 1.0], np.float32)
BETA = np.array([0.1, -0.2, 0.3, 0.0], np.float32)
MEAN = np.array([0.25, -0.5, 1.0, 2.0], np.float32)
VAR = np.array([1.0, 4.0, 0.25, 9.0], np.float32)


def network(training: bool):
    x = v1.placeholder(tf.float32, [None, 8, 8, 3], name="images")
    kernel = v1.get_variable("conv1/kernel", initializer=np.ones((3, 3, 3, 4), np.float32))
    y = tf.nn.conv2d(x, kernel, 1, "SAME", name="conv1/Conv2D")
    if not training:
        y = tf.nn.bias_add(y, v1.get_variable("conv1/bias", initializer=np.zeros(4, np.float32)))
    with v1.variable_scope("bn1"):
        gamma = v1.get_variable("gamma", initializer=GAMMA)
        beta = v1.get_variable("beta", initializer=BETA)
        mean = v1.get_variable("moving_mean", initializer=MEAN, trainable=False)
        var = v1.get_variable("moving_variance", initializer=VAR, trainable=False)
        if training:
            out, _, _ = v1.nn.fused_batch_norm(y, gamma, beta, is_training=True)
        else:
            out, _, _ = v1.nn.fused_batch_norm(y, gamma, beta, mean, var, is_training=False)
    return x, tf.identity(out, name="output")


def freeze(training: bool, path: str) -> None:
    with tf.Graph().as_default(), v1.Session() as sess:
        network(training)
        sess.run(v1.global_variables_initializer())
        frozen = v1.graph_util.convert_variables_to_constants(
            sess, sess.graph.as_graph_def(), ["output"])
    with open(path, "wb") as f:
        f.write(frozen.SerializeToString())


def saved_model(path: str) -> None:
    with tf.Graph().as_default(), v1.Session() as sess:
        x, out = network(training=False)
        sess.run(v1.global_variables_initializer())
        v1.saved_model.simple_save(sess, path, {"images": x}, {"output": out})


if __name__ == "__main__":
    v1.disable_eager_execution()
    out_dir = sys.argv[1]
    freeze(True, os.path.join(out_dir, "frozen_train_mode.pb"))
    freeze(False, os.path.join(out_dir, "frozen_unfolded.pb"))
    saved_model(os.path.join(out_dir, "saved_model"))
    print("wrote frozen graphs and a SavedModel to", out_dir)
