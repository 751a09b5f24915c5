"""Patterns of real repositories that the corpus harness (bench/corpus) found bnfix missing or
misreading, each reduced to a small project: the judged finding is back, and its false twin
stays away."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import run_bnfix, write_tree

from bnfix import check_paths
from bnfix.findings import Applicability

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


# tf-pose-estimation: the network's BN is built by `setup()`, which the base class's `__init__`
# calls on the instance and each network class overrides, as fluent `self.feed(...).convb(...)`
# chains of methods a same-module decorator (`@layer`) makes return the instance
POSE_BASE = TF1 + """slim = tf.contrib.slim


def layer(op):
    def layer_decorated(self, *args, **kwargs):
        output = op(self, self.terminals[0], *args, **kwargs)
        self.feed(output)
        return self
    return layer_decorated


class BaseNetwork(object):
    def __init__(self, inputs, trainable=True):
        self.terminals = [inputs]
        self.trainable = trainable
        self.setup()

    def setup(self):
        raise NotImplementedError('Must be implemented by the subclass.')

    def feed(self, *args):
        self.terminals = list(args)
        return self

    def get_output(self):
        return self.terminals[-1]

    @layer
    def convb(self, input, k, c_o, name):
        with slim.arg_scope([slim.batch_norm], decay=0.999, is_training=self.trainable):
            return slim.conv2d(input, c_o, k, normalizer_fn=slim.batch_norm, scope=name)

    @layer
    def conv(self, input, k, c_o, name):
        return slim.conv2d(input, c_o, k, scope=name)
"""
POSE_TRAIN = TF1 + """from pose.networks import get_network

outputs = []
for gpu_id in range(4):
    with tf.device('/gpu:%d' % gpu_id):
        with tf.variable_scope(tf.get_variable_scope(), reuse=(gpu_id > 0)):
            net = get_network(inputs[gpu_id])
            outputs.append(net.get_output())
"""


def _pose(tmp_path: Path, setup: str, init: str = "base.BaseNetwork.__init__(self, inputs)"
          ) -> Path:
    return write_tree(tmp_path, {
        "pose/__init__.py": "",
        "pose/base.py": POSE_BASE,
        "pose/mobile.py": (
            "from pose import base\n\n\nclass MobileNetwork(base.BaseNetwork):\n"
            "    def __init__(self, inputs, width=1.0):\n"
            "        self.width = width\n"
            f"        {init}\n\n"
            "    def setup(self):\n"
            f"{setup}"),
        "pose/networks.py": ("from pose.mobile import MobileNetwork\n\n\n"
                             "def get_network(placeholder):\n"
                             "    return MobileNetwork(placeholder)\n"),
        "pose/train.py": POSE_TRAIN,
    })


def test_bn_built_by_a_method_the_base_init_calls_on_the_instance(tmp_path: Path):
    """The tower loop builds BN: `get_network` -> `MobileNetwork.__init__` -> the base's
    `__init__` (called with `self`) -> `self.setup()`, dispatched to the subclass's override
    -> `self.feed(...).convb(...)`."""
    root = _pose(tmp_path, "        (self.feed('image')\n"
                           "         .conv(3, 16, name='stem')\n"
                           "         .convb(3, 32, name='Conv2d_0'))\n")
    assert rows(root, ["BN006"]) == {("pose/train.py", "BN006", 5)}
    (finding,) = check_paths([root], select=["BN006"]).remaining
    assert [r.path.rsplit("/", 2)[-2:] for r in finding.related] == [["pose", "base.py"]]


def test_super_init_runs_the_base_init_on_the_instance(tmp_path: Path):
    root = _pose(tmp_path, "        self.feed('image').convb(3, 32, name='Conv2d_0')\n",
                 init="super().__init__(inputs)")
    assert rows(root, ["BN006"]) == {("pose/train.py", "BN006", 5)}
    old_style = _pose(tmp_path / "old", "        self.feed('image').convb(3, 32, name='c')\n",
                      init="super(MobileNetwork, self).__init__(inputs)")
    assert rows(old_style, ["BN006"]) == {("pose/train.py", "BN006", 5)}


def test_super_init_in_the_same_file_passes_its_arguments(tmp_path: Path):
    """The in-file analysis leaves `super()` to the index: the `False` the subclass passes
    reaches the base's BN; the base built directly keeps its default."""
    write_tree(tmp_path, {"one.py": TF1 + (
        "\n\nclass Base(object):\n"
        "    def __init__(self, inputs, trainable=True):\n"
        "        self.out = tf.layers.batch_normalization(inputs, training=True,\n"
        "                                                 trainable=trainable)\n\n\n"
        "class Sub(Base):\n"
        "    def __init__(self, inputs):\n"
        "        super().__init__(inputs, False)\n\n\n"
        "net = Sub(x)\nbase = Base(x)\n")})
    assert rows(tmp_path, ["BN001"]) == {("one.py", "BN001", 12)}


def test_no_bn_when_the_chain_leaves_the_instance_or_the_override_builds_none(tmp_path: Path):
    """`get_output()` returns a tensor, not the instance: `.convb` after it is no method of the
    network; an override without BN layers builds none, whatever the base's other methods do."""
    leaves = _pose(tmp_path / "leaves", "        self.get_output().convb(3, 32, name='c')\n")
    assert rows(leaves, ["BN006"]) == set()
    plain = _pose(tmp_path / "plain", "        self.feed('image').conv(3, 32, name='c')\n")
    assert rows(plain, ["BN006"]) == set()
    # the base's own `setup` builds no BN: without the subclass, nothing is reached
    never = _pose(tmp_path / "never", "        self.feed('image').convb(3, 32, name='c')\n",
                  init="pass  # the base's __init__ never runs")
    assert rows(never, ["BN006"]) == set()


def test_a_base_method_called_through_its_class_binds_self_explicitly(tmp_path: Path):
    """`Base.__init__(self, inputs, False)` passes `self` as the first argument: `False` is the
    base's `trainable`, not its `inputs` (a classmethod binds its class; a staticmethod
    nothing)."""
    base = TF1 + (
        "\n\nclass Base(object):\n"
        "    def __init__(self, inputs, trainable=True):\n"
        "        self.out = tf.layers.batch_normalization(inputs, training=True,\n"
        "                                                 trainable=trainable)\n\n"
        "    @staticmethod\n"
        "    def norm(inputs, trainable=True):\n"
        "        return tf.layers.batch_normalization(inputs, training=True,\n"
        "                                             trainable=trainable)\n\n"
        "    @classmethod\n"
        "    def make(cls, inputs, trainable=True):\n"
        "        return cls(inputs, trainable)\n")
    write_tree(tmp_path, {
        "nets/__init__.py": "",
        "nets/base.py": base,
        "nets/frozen.py": ("from nets.base import Base\n\n\nclass Frozen(Base):\n"
                           "    def __init__(self, inputs):\n"
                           "        Base.__init__(self, inputs, False)\n"),
        "nets/open.py": ("from nets.base import Base\n\n\nclass Open(Base):\n"
                         "    def __init__(self, inputs, flag=False):\n"
                         "        Base.__init__(self, inputs)\n"),
        "use.py": ("from nets.base import Base\n\n"
                   "a = Base.norm(x, False)\n"
                   "b = Base.make(x, False)\n"
                   "c = Base.norm(x, True)\n"),
    })
    found = rows(tmp_path, ["BN001"])
    assert ("nets/frozen.py", "BN001", 6) in found
    assert ("use.py", "BN001", 3) in found and ("use.py", "BN001", 4) in found
    assert not any(path in ("nets/open.py",) for path, _, _ in found)
    assert ("use.py", "BN001", 5) not in found


def test_a_fluent_chain_in_one_file(tmp_path: Path):
    """The in-file analysis follows `self.feed(x).convb(...)` as the index does across files;
    a chain whose first method returns something else (`self.output(x)`) leaves the instance."""
    net = POSE_BASE.replace(
        "    def setup(self):\n        raise NotImplementedError('Must be implemented by the "
        "subclass.')\n",
        "    def setup(self):\n        self.feed('image').convb(3, 32, name='Conv2d_0')\n")
    loop = POSE_TRAIN.split("from pose.networks import get_network\n")[1].replace(
        "get_network(", "BaseNetwork(")
    write_tree(tmp_path, {"one.py": net + loop,
                          "two.py": net.replace("self.feed('image').convb",
                                                "self.get_output().convb") + loop})
    assert rows(tmp_path, ["BN006"]) == {("one.py", "BN006", 39)}


def test_editing_the_override_rechecks_the_tower_loop(tmp_path: Path):
    """The cache: train.py's findings depend on the subclass's `setup()` two imports away;
    an edit there (its BN taken out, then put back) changes them on the next warm run as a
    run without the cache finds."""
    root = _pose(tmp_path, "        self.feed('image').convb(3, 32, name='Conv2d_0')\n")
    (root / "pyproject.toml").write_text("[tool.bnfix]\n")
    args = ("check", "--select", "BN006", "--output-format", "concise", ".")
    assert "train.py:5:1: BN006" in run_bnfix(*args, cwd=root).stdout
    mobile = root / "pose/mobile.py"
    mobile.write_text(mobile.read_text().replace(".convb(", ".conv("))
    warm = run_bnfix(*args, cwd=root)
    assert warm.returncode == 0 and warm.stdout == run_bnfix(*args, "--no-cache", cwd=root).stdout
    mobile.write_text(mobile.read_text().replace(".conv(", ".convb("))
    assert "train.py:5:1: BN006" in run_bnfix(*args, cwd=root).stdout


INHERITED = TF1 + (
    "\n\nclass Base(object):\n"
    "    def __init__(self, inputs, trainable=True):\n"
    "        self.out = tf.layers.batch_normalization(inputs, training=True,\n"
    "                                                 trainable=trainable)\n\n\n"
    "class Sub(Base):\n"
    "    pass\n")


def test_a_subclass_without_its_own_init_builds_its_bases_bn(tmp_path: Path):
    """`Sub(x, False)` runs the `__init__` `Sub` inherits: in another file (which mentions
    only `Sub`, so the pre-filter must know that constructing it builds BN) and in the same
    file (the in-file analysis follows the inheritance too)."""
    write_tree(tmp_path, {"nets.py": INHERITED, "use.py": "from nets import Sub\n\nnet = Sub(x, False)\n",
                          "one.py": INHERITED + "\n\nnet = Sub(x, False)\nok = Sub(x)\n"})
    assert rows(tmp_path, ["BN001"]) == {("use.py", "BN001", 3), ("one.py", "BN001", 14)}


SUBCLASSES = '''import tensorflow as tf


class BatchNormalization(tf.keras.layers.BatchNormalization):
    """trainable=False also means inference mode."""

    def call(self, x, training=False):
        if not training:
            training = tf.constant(False)
        training = tf.logical_and(training, self.trainable)
        return super().call(x, training)


class Named(tf.keras.layers.BatchNormalization):
    def __init__(self, name="tpu_batch_normalization", **kwargs):
        super().__init__(name=name, **kwargs)


class CrossReplica(tf.keras.layers.BatchNormalization):
    def _moments(self, inputs, axes, keep_dims):
        mean, variance = super()._moments(inputs, axes, keep_dims)
        context = tf.distribute.get_replica_context()
        return context.all_reduce("mean", mean), context.all_reduce("mean", variance)


def conv_bn(x):
    return BatchNormalization()(tf.keras.layers.Conv2D(8, 3, use_bias=False)(x))
'''


def test_bn_subclasses_of_the_project_that_only_reroute_arguments(tmp_path: Path):
    """tensorflow-yolov4-tflite (and the other TF2 YOLO ports): BN is built through the
    project's `BatchNormalization`, whose `call` ANDs `training` with `trainable`; its test step
    runs the model with training=True. Constructed in another file too, and with the keyword
    arguments an `__init__` of its own passes on; a subclass with its own moments (synchronized
    across replicas) is not plain BN."""
    write_tree(tmp_path, {
        "core/__init__.py": "",
        "core/common.py": SUBCLASSES,
        "train.py": (
            "import tensorflow as tf\n"
            "from core.common import BatchNormalization, CrossReplica, Named, conv_bn\n\n"
            "inputs = tf.keras.Input((32, 32, 3))\n"
            "model = tf.keras.Model(inputs, conv_bn(inputs))\n\n\n"
            "def test_step(images):\n"
            "    return model(images, training=True)\n\n\n"
            "strategy = tf.distribute.MirroredStrategy()\n"
            "with strategy.scope():\n"
            "    a = BatchNormalization(momentum=0.9)\n"
            "    b = Named(synchronized=True)\n"
            "    c = BatchNormalization(synchronized=True)\n"
            "    d = CrossReplica()\n"
            "    e = Named()\n"),
    })
    assert rows(tmp_path, ["BN006", "BN010"]) == {
        ("train.py", "BN010", 9), ("train.py", "BN006", 14), ("train.py", "BN006", 18)}


HAND_WRITTEN_BN = TF1 + '''

def bn(x, is_train, decay=0.9):
    mean, var = tf.nn.moments(x, [0, 1, 2])
    mu = tf.get_variable("mu", mean.get_shape(), trainable=False)
    sigma = tf.get_variable("sigma", var.get_shape(), trainable=False)
    tf.add_to_collection(tf.GraphKeys.UPDATE_OPS, mu.assign_sub((1 - decay) * (mu - mean)))
    tf.add_to_collection(tf.GraphKeys.UPDATE_OPS, sigma.assign_sub((1 - decay) * (sigma - var)))
    mean, var = tf.cond(is_train, lambda: (mean, var), lambda: (mu, sigma))
    return tf.nn.batch_normalization(x, mean, var, None, None, 1e-5)
'''

TWO_LOOPS = TF1 + '''import utils


def train(images, num_gpus, opt, is_train):
    losses = []
    for i in range(num_gpus):
        with tf.device("/GPU:%d" % i), tf.name_scope("tower_%d" % i):
            if i > 0:
                tf.get_variable_scope().reuse_variables()
            losses.append(tf.reduce_mean(utils.bn(images[i], is_train)))
    grads = []
    for i in range(num_gpus):
        with tf.device("/GPU:%d" % i), tf.name_scope("tower_%d" % i) as scope:
            if i > 0:
                tf.get_variable_scope().reuse_variables()
            grads.append(opt.compute_gradients(losses[i]))
    apply_op = opt.apply_gradients(grads[0])
    update_ops = tf.get_collection(tf.GraphKeys.UPDATE_OPS)
    return tf.group(*(update_ops + [apply_op]))
'''


def test_a_hand_written_bn_publishes_its_update_ops_and_the_fix_needs_the_loop_that_builds_it(
        tmp_path: Path):
    """resnet-18-tensorflow: its own BN adds the moving-average updates to UPDATE_OPS with
    `tf.add_to_collection` (in utils.py); the towers are built in one loop, their gradients
    in a second one (name scopes `tower_i_1`), and UPDATE_OPS is collected, unscoped, after
    the second: every tower's updates run. Scoping by the second loop's `scope` would collect
    nothing, so the fix is display-only."""
    write_tree(tmp_path, {"utils.py": HAND_WRITTEN_BN, "model.py": TWO_LOOPS})
    report = check_paths([tmp_path], select=["BN002"])
    [finding] = report.remaining
    assert (Path(finding.path).name, finding.span.start.row) == ("model.py", 19)
    assert finding.fix.applicability is Applicability.DISPLAY_ONLY
    assert "loop that builds the BN" in finding.fix.message


FROZEN_NET = '''import torch.nn as nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm2d(8)
        self.freeze_bn()

    def freeze_bn(self):
        for m in self.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.eval()
'''


def test_bn102_re_applies_a_freeze_through_the_wrapper_only_where_every_path_wraps(
        tmp_path: Path):
    """pytorch-retinanet wraps the model in DataParallel in both branches of an `if`; the
    re-freeze must go through `.module` (the wrapper has no `freeze_bn`). Where only a flag's
    branch wraps it, neither spelling works on both paths: the fix is display-only."""
    write_tree(tmp_path, {"models/__init__.py": "", "models/net.py": FROZEN_NET, "train.py": (
        "import torch\nfrom models.net import Net\n\n\n"
        "def both(data):\n"
        "    model = Net()\n"
        "    if torch.cuda.is_available():\n"
        "        model = torch.nn.DataParallel(model).cuda()\n"
        "    else:\n"
        "        model = torch.nn.DataParallel(model)\n"
        "    model.train()\n"
        "    for x in data:\n"
        "        model(x)\n\n\n"
        "def maybe(data, parallel):\n"
        "    model = Net()\n"
        "    if parallel:\n"
        "        model = torch.nn.DataParallel(model)\n"
        "    model.train()\n"
        "    for x in data:\n"
        "        model(x)\n")})
    report = check_paths([tmp_path], select=["BN102"])
    fixes = {d.span.start.row: d.fix for d in report.remaining}
    assert set(fixes) == {11, 20}
    assert fixes[11].applicability is Applicability.UNSAFE
    assert [e.content.strip() for e in fixes[11].edits] == ["model.module.freeze_bn()"]
    assert fixes[20].applicability is Applicability.DISPLAY_ONLY
    assert "`model.module.freeze_bn()` where it is wrapped" in fixes[20].message


DARKNET = '''import tensorflow.contrib.slim as slim


def body(inputs, is_training):
    params = {'decay': 0.9, 'is_training': True}
    return slim.conv2d(inputs, 32, 3, normalizer_fn=slim.batch_norm, normalizer_params=params)
'''


def test_bn010_does_not_turn_on_moving_statistics_that_no_code_of_the_project_updates(
        tmp_path: Path):
    """RotationDetection: DarkNet's slim BN is hard-wired to `is_training: True`, and the
    project's one train op (another file) never runs UPDATE_OPS. Passing the flag makes
    inference read moving statistics that stay at 0 and 1: the fix is display-only and names
    the train op. Once any code runs the update ops, the fix is applied again."""
    train = (TF1 + "from models.darknet import body\n\n\n"
             "def train(images, is_training, opt):\n"
             "    loss = body(images, is_training)\n"
             "    train_op = opt.minimize(loss)\n"
             "    return train_op\n")
    write_tree(tmp_path, {"models/__init__.py": "", "models/darknet.py": DARKNET,
                          "train.py": train})
    [finding] = check_paths([tmp_path], select=["BN010"]).remaining
    assert finding.fix.applicability is Applicability.DISPLAY_ONLY
    assert "train.py:7 does not; see BN003" in finding.fix.message
    (tmp_path / "train.py").write_text(train.replace(
        "    train_op = opt.minimize(loss)\n",
        "    with tf.control_dependencies(tf.get_collection(tf.GraphKeys.UPDATE_OPS)):\n"
        "        train_op = opt.minimize(loss)\n"))
    [finding] = check_paths([tmp_path], select=["BN010"]).remaining
    assert finding.fix.applicability is Applicability.UNSAFE
    assert [e.content for e in finding.fix.edits] == ["is_training"]


SAME_PADDING = '''import torch.nn as nn
import torch.nn.functional as F


class Conv2dStaticSamePadding(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride=1, bias=True):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, stride=stride, bias=bias)

    def forward(self, x):
        x = F.pad(x, [1, 1, 1, 1])
        x = self.conv(x)
        return x
'''


def test_a_conv_wrapper_without_bn_words_is_summarised_for_the_bn_next_to_it_also_after_edits(
        tmp_path: Path, monkeypatch):
    """EfficientDet: `Conv2dStaticSamePadding` (efficientnet/utils_extra.py, no BN word, so no
    summary of its own) feeds BNs in efficientdet/model.py. The module is summarised because a
    BN-building function calls into it, and again after it changes (warm runs equal cold)."""
    write_tree(tmp_path, {
        "efficientnet/__init__.py": "", "efficientnet/utils_extra.py": SAME_PADDING,
        "efficientdet/__init__.py": "",
        "efficientdet/model.py": (
            "import torch.nn as nn\n"
            "from efficientnet.utils_extra import Conv2dStaticSamePadding\n\n\n"
            "def down(c):\n"
            "    return nn.Sequential(Conv2dStaticSamePadding(c, c, 1), nn.BatchNorm2d(c))\n")})
    monkeypatch.chdir(tmp_path)

    def found() -> set[tuple[str, str, int]]:
        report = check_paths([tmp_path], select=["BN104"], cache=True)
        for d in report.remaining:
            assert [r.path for r in d.related] == [str(tmp_path / "efficientnet/utils_extra.py")]
        return {(Path(d.path).name, d.code, d.span.start.row) for d in report.remaining}

    bug = {("model.py", "BN104", 6)}
    assert found() == bug and found() == bug
    wrapper = tmp_path / "efficientnet/utils_extra.py"
    wrapper.write_text(SAME_PADDING.replace("stride=1, bias=True", "stride=1, bias=False"))
    assert found() == set()
    wrapper.write_text(SAME_PADDING)
    assert found() == bug


def test_a_readme_that_loads_released_weights_makes_bn104_display_only(tmp_path: Path,
                                                                        monkeypatch):
    """rexnet: the model files load nothing, the README shows
    `model.load_state_dict(torch.load('./rexnetv1_1.0.pth'))`. Dropping the bias would break
    loading those checkpoints: the fix is display-only and cites the README; editing the README
    re-checks the files (the cache key holds the README's weight loads)."""
    readme = ("# ReXNet\n\n```python\nmodel = rexnetv1.ReXNetV1(width_mult=1.0)\n"
              "model.load_state_dict(torch.load('./rexnetv1_1.0.pth'))\n```\n")
    write_tree(tmp_path, {
        "pyproject.toml": "[tool.bnfix]\n", "README.md": readme,
        "rexnetv1.py": ("import torch.nn as nn\n\n\n"
                        "def se(c):\n    return nn.Sequential(nn.Conv2d(c, c, 1), nn.BatchNorm2d(c))\n")})
    monkeypatch.chdir(tmp_path)

    def fix() -> Applicability:
        [finding] = check_paths([tmp_path], select=["BN104"], cache=True).remaining
        return finding.fix.applicability

    assert fix() is Applicability.DISPLAY_ONLY
    [finding] = check_paths([tmp_path], select=["BN104"], cache=True).remaining
    assert "README.md:5" in finding.fix.message
    (tmp_path / "README.md").write_text("# ReXNet\n\nTrain it yourself.\n")
    assert fix() is Applicability.UNSAFE
    (tmp_path / "README.md").write_text(readme)
    assert fix() is Applicability.DISPLAY_ONLY


def test_a_function_handed_to_a_helper_runs_where_the_helper_is_called(tmp_path: Path):
    """slim's train_image_classifier: the model is built in a `clone_fn` that
    `model_deploy.create_clones` calls back. The callback runs with its defaults, so the BN it
    builds trains frozen (BN001); the helper's call is not the callback's call, so the fix names
    the place and edits nothing there."""
    write_tree(tmp_path, {"train.py": (
        TF1 + "\n\ndef block(x, training=True, trainable=False):\n"
        "    return tf.layers.batch_normalization(x, training=training, trainable=trainable)\n"
        "\n\ndef evaluate(x):\n    return block(x, False)\n"
        "\n\ndef build(make, x):\n    return make(x)\n"
        "\n\ndef train(x):\n    return build(block, x)\n")})
    [finding] = check_paths([tmp_path], select=["BN001"]).remaining
    assert "at the call on line 17" in finding.message
    assert finding.fix.applicability is Applicability.DISPLAY_ONLY
    assert finding.fix.message == "Pass `trainable=True` where this BN trains (on line 17)"


def test_bn104_does_not_drop_the_bias_of_a_conv_also_chained_without_a_bn(tmp_path: Path):
    """bearpaw's VGG: `conv2d` goes before a BN when `batch_norm`, and straight into a ReLU
    otherwise; `bias=False` would also strip the plain VGG's biases. With a BN on both paths
    the fix edits the conv."""
    make = ("import torch.nn as nn\n\n\ndef make_layers(cfg, batch_norm=False):\n"
            "    layers = []\n    for v in cfg:\n"
            "        conv2d = nn.Conv2d(3, v, kernel_size=3, padding=1)\n"
            "        if batch_norm:\n"
            "            layers += [conv2d, nn.BatchNorm2d(v), nn.ReLU(inplace=True)]\n"
            "        else:\n"
            "            layers += [conv2d, nn.ReLU(inplace=True)]\n"
            "    return nn.Sequential(*layers)\n")
    write_tree(tmp_path, {"vgg.py": make})
    [finding] = check_paths([tmp_path], select=["BN104"]).remaining
    assert finding.fix.applicability is Applicability.DISPLAY_ONLY
    assert "also used without one (line 11)" in finding.fix.message
    (tmp_path / "vgg.py").write_text(make.replace("[conv2d, nn.ReLU", "[conv2d, nn.BatchNorm2d(v), nn.ReLU"))
    [finding] = check_paths([tmp_path], select=["BN104"]).remaining
    assert finding.fix.applicability is Applicability.UNSAFE


def test_a_script_that_does_not_parse_still_counts_as_loading_weights(tmp_path: Path,
                                                                       monkeypatch):
    """mean-teacher: `main.py` resumes checkpoints (`model.load_state_dict(...)`) but does not
    parse on Python 3 (`cuda(async=True)`): its weight loads are read from its text, so BN104's
    fix stays display-only, cold and warm, and is applied again once the load is gone."""
    main = ("import torch\nfrom architectures import Net\n\nmodel = Net()\n"
            "model.load_state_dict(torch.load(path)['state_dict'])\n"
            "target = target.cuda(async=True)\n")
    write_tree(tmp_path, {
        "pyproject.toml": "[tool.bnfix]\n", "main.py": main,
        "architectures.py": ("import torch.nn as nn\n\n\n"
                             "def Net():\n    return nn.Sequential(nn.Conv2d(3, 8, 1), nn.BatchNorm2d(8))\n")})
    monkeypatch.chdir(tmp_path)

    def bn104(cache: bool) -> Applicability:
        report = check_paths([tmp_path], select=["BN104", "BN900"], cache=cache)
        assert {d.code for d in report.remaining} == {"BN104", "BN900"}
        [finding] = [d for d in report.remaining if d.code == "BN104"]
        return finding.fix

    assert bn104(False).applicability is Applicability.DISPLAY_ONLY
    assert "main.py:5" in bn104(False).message
    assert bn104(True).applicability is bn104(True).applicability is Applicability.DISPLAY_ONLY
    (tmp_path / "main.py").write_text(main.replace(
        "model.load_state_dict(torch.load(path)['state_dict'])\n", ""))
    assert bn104(True).applicability is Applicability.UNSAFE


def test_bn104_in_module_lists_names_the_container_and_edits_nothing(tmp_path: Path):
    """powerful-gnns: `self.linears` holds the hidden layers (each before a BN) and the output
    layer (before none): `bias=False` on the first one built would be a partial fix at best."""
    write_tree(tmp_path, {"mlp.py": (
        "import torch.nn as nn\n\n\nclass MLP(nn.Module):\n"
        "    def __init__(self, n, d):\n        super().__init__()\n"
        "        self.linears = nn.ModuleList()\n        self.batch_norms = nn.ModuleList()\n"
        "        for layer in range(n):\n            self.linears.append(nn.Linear(d, d))\n"
        "            self.batch_norms.append(nn.BatchNorm1d(d))\n"
        "        self.linears.append(nn.Linear(d, 1))\n\n"
        "    def forward(self, h):\n        for i in range(len(self.batch_norms)):\n"
        "            h = self.batch_norms[i](self.linears[i](h))\n"
        "        return self.linears[-1](h)\n")})
    [finding] = check_paths([tmp_path], select=["BN104"]).remaining
    assert finding.span.start.row == 10
    assert finding.fix.applicability is Applicability.DISPLAY_ONLY
    assert "layers of `self.linears`" in finding.fix.message


def test_bn104_cites_a_weight_load_outside_the_tests(tmp_path: Path):
    """keras-hub: BN104's display-only fix named a save/load round trip in `tests/` as where the
    project loads trained weights while a script loads them too: the script is the example."""
    write_tree(tmp_path, {
        "net.py": ("import torch.nn as nn\n\n\nclass Net(nn.Module):\n"
                   "    def __init__(self):\n        super().__init__()\n"
                   "        self.features = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8))\n"),
        "tests/test_net.py": ("import torch\nfrom net import Net\n\n\ndef test_round_trip(path):\n"
                              "    Net().load_state_dict(torch.load(path))\n"),
        "zoo/finetune.py": ("import torch\nfrom net import Net\n\nmodel = Net()\n"
                        "model.load_state_dict(torch.load('published.pth'))\n"),
    })
    [finding] = check_paths([tmp_path], select=["BN104"]).remaining
    assert finding.fix.applicability is Applicability.DISPLAY_ONLY
    assert "zoo/finetune.py:5" in finding.fix.message


def test_bn006_cites_the_isinstance_test_the_wrapped_model_meets(tmp_path: Path):
    """RepVGG: `_fuse_bn_tensor` asserts `isinstance(branch, nn.BatchNorm2d)` in the model's own
    module (re-parameterising a model trained with SyncBatchNorm fails there), and a stand-alone
    script tests BN too. The fix names the assert in the module the training script calls,
    not the script that never sees its model."""
    write_tree(tmp_path, {
        "zoo/__init__.py": "",
        "zoo/repvgg.py": ("import torch.nn as nn\n\n\nclass Block(nn.Module):\n"
                      "    def __init__(self):\n        super().__init__()\n"
                      "        self.conv = nn.Conv2d(3, 8, 3, bias=False)\n"
                      "        self.bn = nn.BatchNorm2d(8)\n\n"
                      "    def fuse(self):\n        branch = self.bn\n"
                      "        assert isinstance(branch, nn.BatchNorm2d)\n"
                      "        return branch.weight\n\n\n"
                      "def create():\n    return Block()\n"),
        "tools/verify.py": ("import torch.nn as nn\nfrom zoo.repvgg import create\n\n"
                            "for m in create().modules():\n"
                            "    if isinstance(m, nn.BatchNorm2d):\n"
                            "        nn.init.uniform_(m.running_mean, 0, 0.1)\n"),
        "train.py": ("import torch\nfrom zoo.repvgg import create\n\n\ndef main(rank):\n"
                     "    model = create().cuda()\n"
                     "    model = torch.nn.parallel.DistributedDataParallel(model, "
                     "device_ids=[rank])\n"),
    })
    [finding] = check_paths([tmp_path], select=["BN006"]).remaining
    assert finding.fix.applicability is Applicability.DISPLAY_ONLY
    assert "zoo/repvgg.py:12)" in finding.fix.message.replace("\\", "/")
