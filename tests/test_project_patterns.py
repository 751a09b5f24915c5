"""Patterns of real repositories that the corpus harness (bench/corpus) found bnfix missing or
misreading, each reduced to a small project: the judged finding is back, and its false twin
stays away."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import run_bnfix, write_tree

from bnfix import check_paths

TF1 = "import tensorflow.compat.v1 as tf\n"


def rows(root: Path, select: list[str]) -> set[tuple[str, str, int]]:
    report = check_paths([root], select=select)
    return {(Path(d.path).relative_to(root).as_posix(), d.code, d.span.start.row)
            for d in report.remaining}


def test_a_folder_that_requires_tensorflow_unpinned_is_not_held_to_the_roots_tf1_pin(
        tmp_path: Path):
    """simclr: TF1 code pinned to tensorflow==1.15 at the root, a TF2 port in tf2/ whose
    requirements.txt asks for `tensorflow` (the current release, where Keras 3 has no
    experimental SyncBatchNormalization)."""
    sync = ("import tensorflow as tf\n\n\ndef norm():\n"
            "    return tf.keras.layers.experimental.SyncBatchNormalization(axis=-1)\n")
    write_tree(tmp_path, {
        "requirements.txt": "absl-py\ntensorflow==1.15.4\n",
        "tf2/requirements.txt": "tensorflow\ntensorflow-datasets\n",
        "tf2/resnet.py": sync,
        "tf2/run.py": "import resnet\n\nbn = resnet.norm()\n",
        "tf1/resnet.py": sync,
        "tf1/run.py": "import resnet\n\nbn = resnet.norm()\n",
    })
    assert rows(tmp_path, ["BN007"]) == {("tf2/resnet.py", "BN007", 5)}


def test_a_nested_pin_overrides_the_root_one(tmp_path: Path):
    sync = ("import tensorflow as tf\n\n\ndef norm():\n"
            "    return tf.keras.layers.experimental.SyncBatchNormalization(axis=-1)\n")
    write_tree(tmp_path, {
        "requirements.txt": "tensorflow==2.5.0\n",
        "new/requirements.txt": "tensorflow==2.16.1\n",
        "new/model.py": sync,
        "new/train.py": "import model\n\nbn = model.norm()\n",
        "old/model.py": sync,
        "old/train.py": "import model\n\nbn = model.norm()\n",
    })
    assert rows(tmp_path, ["BN007"]) == {("new/model.py", "BN007", 5)}


def test_a_custom_bn_registering_through_a_local_collections_list(tmp_path: Path):
    """AmoebaNet (tpu): its own batch_norm creates moving_mean/variance with
    `collections=moving_collections`, a local list naming MOVING_AVERAGE_VARIABLES; the
    estimator in another file averages `tf.moving_average_variables()` with an EMA."""
    write_tree(tmp_path, {
        "network_utils.py": TF1 + (
            "\n\ndef batch_norm(inputs, decay=0.999, is_training=True):\n"
            "    shape = inputs.get_shape()[-1:]\n"
            "    moving_collections = ['moving_vars', tf.GraphKeys.MOVING_AVERAGE_VARIABLES,\n"
            "                          tf.GraphKeys.GLOBAL_VARIABLES]\n"
            "    mean = tf.get_variable('moving_mean', shape, trainable=False,\n"
            "                           collections=moving_collections)\n"
            "    var = tf.get_variable('moving_variance', shape, trainable=False,\n"
            "                          collections=moving_collections)\n"
            "    return tf.nn.batch_normalization(inputs, mean, var, None, None, 1e-3)\n"),
        "model.py": TF1 + (
            "import network_utils\n\n\n"
            "def model_fn(features):\n"
            "    net = network_utils.batch_norm(features)\n"
            "    loss = tf.reduce_mean(net)\n"
            "    train_op = tf.train.GradientDescentOptimizer(0.1).minimize(loss)\n"
            "    ema = tf.train.ExponentialMovingAverage(0.999)\n"
            "    averaged = tf.trainable_variables() + tf.moving_average_variables()\n"
            "    with tf.control_dependencies([train_op]):\n"
            "        train_op = ema.apply(averaged)\n"
            "    return train_op\n"),
    })
    assert rows(tmp_path, ["BN004"]) == {("model.py", "BN004", 12)}


def test_unparsable_files_that_use_first_party_bn_code_are_reported(tmp_path: Path):
    """tensorflow-resnet: Python 2 scripts. One builds `resnet.inference` (BN900: its BN code
    goes unchecked); one names nothing of the project's BN code, only a string and a comment
    that happen to contain the module's name (no BN900: no rule reads it)."""
    write_tree(tmp_path, {
        "resnet.py": TF1 + (
            "\n\ndef bn(x, is_training):\n"
            "    return tf.layers.batch_normalization(x, training=is_training)\n\n\n"
            "def inference(x, is_training):\n"
            "    return bn(x, is_training)\n"),
        "convert.py": "import resnet\n\nprint 'converting'\n"
                      "logits = resnet.inference(images, is_training=False)\n",
        "viewer.py": "import numpy\n\n# shows resnet inference results\n"
                     "print 'see resnet/inference.png'\n",
    })
    assert rows(tmp_path, ["BN900"]) == {("convert.py", "BN900", 3)}


def test_stdin_with_a_file_name_is_checked_with_its_project(tmp_path: Path):
    """`bnfix check --stdin-filename train.py -` (editors, pre-commit-style pipes) sees the BN
    wrapper in another file as `bnfix check train.py` does, and with --fix prints the fixed
    text without writing the file."""
    root = write_tree(tmp_path / "repo", {
        "pyproject.toml": "[tool.bnfix]\n",
        "models/__init__.py": "",
        "models/layers.py": """
            import tensorflow as tf


            def bn(x, is_training, trainable=True):
                return tf.compat.v1.layers.batch_normalization(
                    x, training=is_training, trainable=trainable)
        """,
        "train.py": """
            from models.layers import bn


            def model(x):
                return bn(x, is_training=True, trainable=False)
        """,
    })
    text = (root / "train.py").read_text()
    on_disk = run_bnfix("check", "--no-cache", "--output-format", "json", "train.py", cwd=root)
    piped = run_bnfix("check", "--no-cache", "--output-format", "json", "--stdin-filename",
                      "train.py", "-", cwd=root, stdin=text)
    assert on_disk.returncode == piped.returncode == 1, piped.stderr
    found = [(r["code"], r["location"]["row"]) for r in json.loads(piped.stdout)]
    assert found == [(r["code"], r["location"]["row"]) for r in json.loads(on_disk.stdout)]
    assert found == [("BN001", 5)]
    alone = run_bnfix("check", "--no-cache", "--output-format", "json", "-", cwd=root,
                      stdin=text)  # no file name: the text alone knows nothing of `bn`
    assert json.loads(alone.stdout) == []
    unsaved = text.replace("trainable=False", "trainable=True")  # the editor's text counts
    assert run_bnfix("check", "--no-cache", "--stdin-filename", "train.py", "-", cwd=root,
                     stdin=unsaved).returncode == 0
    fixed = run_bnfix("check", "--fix", "--unsafe-fixes", "--no-cache", "--stdin-filename",
                      "train.py", "-", cwd=root, stdin=text)
    assert fixed.returncode == 0, fixed.stderr
    assert fixed.stdout == unsaved and (root / "train.py").read_text() == text
