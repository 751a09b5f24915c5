"""Qualified-name resolution through real import analysis: every import style of the BN APIs
resolves to the catalogue entry; other frameworks' BatchNorm never does."""

from __future__ import annotations

import ast
import textwrap

import pytest

from bnfix.rulebook import load_rulebook
from bnfix.source.lift import lift
from bnfix.source.text import SourceText

CATALOGUE = load_rulebook().catalogue


def sites(source: str) -> list[tuple[str, str]]:
    source = textwrap.dedent(source)
    module = lift(SourceText(source), ast.parse(source), "m.py", CATALOGUE)
    return [(s.api.id, s.call.callee) for s in module.bn_sites]


@pytest.mark.parametrize(("source", "api"), [
    ("import tensorflow as tf\ntf.layers.batch_normalization(x)", "tf1.layers.batch_normalization"),
    ("import tensorflow.compat.v1 as tf\ntf.layers.batch_normalization(x)", "tf1.layers.batch_normalization"),
    ("import tensorflow as tf\ntf.compat.v1.layers.batch_normalization(x)", "tf1.layers.batch_normalization"),
    ("from tensorflow.compat import v1 as tf1\ntf1.layers.batch_normalization(x)", "tf1.layers.batch_normalization"),
    ("import tensorflow.contrib.slim as slim\nslim.batch_norm(x)", "tf.contrib.layers.batch_norm"),
    ("import tensorflow as tf\nslim = tf.contrib.slim\nslim.batch_norm(x)", "tf.contrib.layers.batch_norm"),
    ("import tf_slim as slim\nslim.layers.batch_norm(x)", "tf.contrib.layers.batch_norm"),
    ("from tensorflow.contrib.layers import batch_norm\nbatch_norm(x)", "tf.contrib.layers.batch_norm"),
    ("import tensorflow as tf\ntf.nn.fused_batch_norm(x, s, o)", "tf.nn.fused_batch_norm"),
    ("from tensorflow.keras.layers import BatchNormalization as BN\nBN()", "keras.layers.BatchNormalization"),
    ("from tensorflow import keras\nkeras.layers.BatchNormalization()", "keras.layers.BatchNormalization"),
    ("import keras\nkeras.layers.BatchNormalization(synchronized=True)", "keras.layers.BatchNormalization"),
    ("import tf_keras\ntf_keras.layers.BatchNormalization()", "keras.layers.BatchNormalization"),
    ("import tensorflow as tf\ntf.keras.layers.experimental.SyncBatchNormalization()",
     "keras.layers.experimental.SyncBatchNormalization"),
    ("from torch import nn as tnn\ntnn.BatchNorm2d(64)", "torch.nn.BatchNormNd"),
    ("import torch.nn as nn\nnn.BatchNorm1d(8)", "torch.nn.BatchNormNd"),
    ("import torch\ntorch.nn.SyncBatchNorm(8)", "torch.nn.SyncBatchNorm"),
    ("from torch.nn.modules.batchnorm import BatchNorm3d\nBatchNorm3d(4)", "torch.nn.BatchNormNd"),
    ("import torch.nn.functional as F\nF.batch_norm(x, m, v)", "torch.nn.functional.batch_norm"),
    ("from detectron2.layers import FrozenBatchNorm2d\nFrozenBatchNorm2d(64)", "detectron2.layers.FrozenBatchNorm2d"),
    ("import horovod.torch as hvd\nhvd.SyncBatchNorm(64)", "horovod.torch.SyncBatchNorm"),
])
def test_import_styles_resolve(source, api):
    assert [s[0] for s in sites(source)] == [api]


@pytest.mark.parametrize("source", [
    "import mindspore.nn as nn\nnn.BatchNorm2d(64)",
    "from mindspore import nn\nnn.BatchNorm2d(64)",
    "import paddle.nn as nn\nnn.BatchNorm2D(64)\nnn.BatchNorm(64)",
    "import paddle\npaddle.nn.BatchNorm2D(64)",
    "import oneflow.nn as nn\nnn.BatchNorm2d(3)",
    "from .layers import BatchNorm2d\nBatchNorm2d(3)",  # the project's own class
    "tf.layers.batch_normalization(x)",  # tf never imported
])
def test_other_frameworks_never_match(source):
    assert sites(source) == []


def test_a_library_star_import_binds_the_names_the_catalogue_knows():
    """image-segmentation-keras: `from keras.layers import *`, then `BatchNormalization()`;
    a later star import wins, a local definition of the name shadows it, and a name the
    catalogue does not know stays unknown."""
    assert sites("from keras.layers import *\nbn = BatchNormalization(momentum=0.1)\n") == [
        ("keras.layers.BatchNormalization", "BatchNormalization")]
    assert sites("from torch.nn import *\nfrom keras.layers import *\n"
                 "bn = BatchNormalization()\n") == [
        ("keras.layers.BatchNormalization", "BatchNormalization")]
    assert sites("from keras.layers import *\n\n\ndef BatchNormalization():\n    return 1\n\n\n"
                 "bn = BatchNormalization()\n") == []
    assert sites("from mylib.layers import *\nbn = BatchNormalization()\n") == []
