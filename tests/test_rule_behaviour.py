"""Behaviour of the migration-era rules beyond their examples: which fixes are refused (and
say why), what the target TensorFlow version changes, and layout-preserving rewrites."""

from __future__ import annotations

import textwrap

from conftest import run_bnfix

from bnfix import check_source, fix_source
from bnfix.engine import Engine
from bnfix.findings import Applicability
from bnfix.rulebook import load_rulebook


def diagnostics(source: str, codes: list[str], tensorflow: tuple[int, ...] | None = None):
    source = textwrap.dedent(source).lstrip("\n")
    if tensorflow is None:
        return [d for d in check_source(source, "m.py", select=codes) if d.code in codes]
    engine = Engine(load_rulebook(), frozenset(codes), {"tensorflow": tensorflow})
    engine.target_explicit = True  # as `target-tensorflow` or the project's pins set it
    return engine.diagnose(source, "m.py")


def test_bn007_refusals_are_display_only_and_say_why():
    found = diagnostics("""
        import tensorflow as tf
        slim = tf.contrib.slim
        tf.compat.v1.disable_eager_execution()

        def model(net, params, is_training):
            with slim.arg_scope([slim.batch_norm], decay=0.99):
                net = slim.batch_norm(net, is_training=is_training)
            net = tf.contrib.layers.batch_norm(net, **params)
            net = tf.contrib.layers.batch_norm(net, activation_fn=tf.nn.relu)
            net = tf.contrib.layers.batch_norm(net, updates_collections=None)
            return tf.contrib.layers.batch_norm(net, zero_debias_moving_mean=True)
    """, ["BN007"])
    assert all(d.fix.applicability is Applicability.DISPLAY_ONLY and not d.fixable for d in found)
    # the arg_scope's list names the removed API without calling it: reported on its own
    named = [d for d in found if "every use of it must change" in d.message]
    assert [(d.span.start.row, d.span.start.col) for d in named] == [(6, 25)]
    reasons = [d.message.split("not rewritten: ")[1] for d in found if d not in named]
    assert "arg_scope" in reasons[0]
    assert "* or **" in reasons[1]
    assert "applies no activation" in reasons[2]
    assert "updates_collections=None" in reasons[3]
    assert "zero-debiased" in reasons[4]


def test_bn007_needs_an_import_to_spell_the_replacement():
    (d,) = diagnostics("""
        from tensorflow.contrib.layers import batch_norm
        net = batch_norm(net, is_training=True)
    """, ["BN007"], (2, 21))
    assert d.fix.applicability is Applicability.DISPLAY_ONLY and "import its module" in d.fix.message


def test_bn007_realigns_continuation_rows():
    source = textwrap.dedent("""
        import tensorflow as tf
        x = tf.keras.layers.experimental.SyncBatchNormalization(axis=-1,
                                                                momentum=0.9)
    """).lstrip("\n")
    fixed = fix_source(source, "m.py", unsafe_fixes=True).text
    assert fixed.splitlines()[1:] == [
        "x = tf.keras.layers.BatchNormalization(axis=-1,",
        "                                       momentum=0.9, synchronized=True)",
    ]


def test_target_tensorflow_decides_what_applies():
    source = """
        import tensorflow as tf
        tf.compat.v1.disable_eager_execution()
        a = tf.contrib.layers.batch_norm(x, is_training=True)
        b = tf.keras.layers.experimental.SyncBatchNormalization()
        c = tf.keras.layers.BatchNormalization(trainable=False)
    """
    codes = ["BN007", "BN009", "BN011"]
    current = [d.code for d in diagnostics(source, codes, (2, 21))]
    assert current == ["BN007", "BN007", "BN011", "BN011", "BN009"]
    tf_2_10 = [d.code for d in diagnostics(source, codes, (2, 10))]
    assert tf_2_10 == ["BN007", "BN009"]  # no synchronized=True yet, tf.keras is Keras 2
    tf_1_15 = [d.code for d in diagnostics(source, codes, (1, 15))]
    assert tf_1_15 == []  # contrib exists; trainable=False did not mean inference


def test_target_tensorflow_in_pyproject(tree):
    root = tree({
        "pyproject.toml": '[tool.bnfix]\ntarget-tensorflow = "1.15"\n',
        "m.py": "import tensorflow as tf\nx = tf.contrib.layers.batch_norm(x)\n",
    })
    assert run_bnfix("check", ".", cwd=root).returncode == 0
    (root / "pyproject.toml").write_text('[tool.bnfix]\ntarget-tensorflow = "two"\n')
    bad = run_bnfix("check", ".", cwd=root)
    assert bad.returncode == 2 and "target-tensorflow" in bad.stderr


def test_bn008_fix_converges_and_bn010_leaves_constants_alone():
    source = textwrap.dedent("""
        import torch.nn as nn
        bn = nn.BatchNorm2d(8, momentum=0.9)
    """).lstrip("\n")
    once = fix_source(source, "m.py", unsafe_fixes=True).text
    assert "momentum=1 - 0.9" in once
    assert fix_source(once, "m.py", unsafe_fixes=True).text == once
    assert diagnostics("""
        import tensorflow as tf
        TRAIN = True
        def f(x, training):
            return tf.layers.batch_normalization(x, training=TRAIN)
    """, ["BN010"]) == []


def test_bn005_per_tower_loss_scaling_in_the_module_silences_it():
    body = """
        import tensorflow as tf
        def tower(images, num_gpus):
            loss = compute(images)
            return loss{scale}
        def combine(tower_grads):
            return [(tf.add_n([g for g, _ in gv]), gv[0][1]) for gv in zip(*tower_grads)]
    """
    assert [d.code for d in diagnostics(body.format(scale=""), ["BN005"])] == ["BN005"]
    assert diagnostics(body.format(scale=" / num_gpus"), ["BN005"]) == []


def test_rules_marked_not_in_tests_skip_test_modules(tree):
    source = "import torch.nn as nn\nbn = nn.BatchNorm2d(8, momentum=0.99)\n"
    root = tree({"model.py": source, "tests/test_model.py": source, "model_test.py": source})
    run = run_bnfix("check", "--output-format", "concise", ".", cwd=root)
    flagged = sorted(line.split(":")[0] for line in run.stdout.splitlines() if ": BN008" in line)
    assert flagged == ["model.py"]


def test_bn102_condition_is_rewritten_through_self_or_the_fix_is_display_only():
    template = """
        import torch.nn as nn

        class Net(nn.Module):
            def freeze_bn(self):
                for m in self.modules():
                    if isinstance(m, nn.BatchNorm2d):
                        m.eval()

        class Trainer:
            def __init__(self, args, freeze):
                {store}
                self.model = Net()
                if {condition}:
                    self.model.freeze_bn()

            def epoch(self):
                self.model.train()
    """
    stored = diagnostics(template.format(store="self.opts = args", condition="args.freeze"), ["BN102"])
    assert stored[0].fix.applicability is Applicability.UNSAFE
    assert "if self.opts.freeze:" in stored[0].fix.edits[0].content
    unstored = diagnostics(template.format(store="pass", condition="freeze"), ["BN102"])
    assert unstored[0].fix.applicability is Applicability.DISPLAY_ONLY


def test_bn103_is_display_only_when_the_steps_are_in_different_blocks():
    (d,) = diagnostics("""
        import torch
        import torch.nn as nn

        def setup(model, distributed):
            if distributed:
                model = nn.parallel.DistributedDataParallel(model)
            model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
            return model
    """, ["BN103"])
    assert d.fix.applicability is Applicability.DISPLAY_ONLY


def test_bn104_keras_sequential_and_torch_sequential_in_a_list():
    found = diagnostics("""
        import tensorflow as tf
        import torch.nn as nn

        model = tf.keras.Sequential([tf.keras.layers.Dense(64), tf.keras.layers.BatchNormalization()])
        mixed = nn.Sequential(nn.Linear(4, 4), tf.keras.layers.BatchNormalization())
    """, ["BN104"])
    assert [(d.span.start.row, d.fix.edits[0].content) for d in found] == [(4, ", use_bias=False")]


def test_bn101_model_used_for_training_in_the_same_no_grad_free_function_is_not_evaluation():
    assert diagnostics("""
        import torch

        def train(model, x):
            model.train()
            return model(x)
    """, ["BN101"]) == []


def test_bn002_after_a_tower_loop_on_one_branch_only_is_display_only():
    """PoseEstimationForMobile: the tower loop runs in the `else` of a CPU path, the read after
    both: a scope name bound in the loop would be unbound on the CPU path (NameError)."""
    book = load_rulebook()
    (example,) = [e for e in book.rules["BN002"].examples if "one branch only" in e.name]
    (finding,) = check_source(example.source, "train.py", select=["BN002"])
    assert finding.fix.applicability is Applicability.DISPLAY_ONLY
    assert "does not run on every path" in finding.fix.message
    assert fix_source(example.source, "train.py", unsafe_fixes=True,
                      select=["BN002"]).text == example.source
    # the same loop at the read's own level (no CPU branch): the scope name is always bound
    (fixable,) = diagnostics("""
        import tensorflow as tf


        def train(num_gpus, opt):
            grads = []
            for i in range(num_gpus):
                with tf.device('/gpu:%d' % i):
                    with tf.name_scope('GPU_%d' % i):
                        with tf.variable_scope('model', reuse=(i > 0)):
                            grads.append(opt.compute_gradients(tower_loss(i)))
            update_ops = tf.get_collection(tf.GraphKeys.UPDATE_OPS)
            return update_ops, grads
    """, ["BN002"])
    assert fixable.fix.applicability is Applicability.UNSAFE


def test_bn104_fix_is_display_only_where_biases_are_looked_up_by_name():
    """few-shot's MAML: `functional_forward` reads `weights[f'conv{block}.0.bias']`; dropping
    the conv's bias made it raise KeyError (a wrong fix of the eighteenth survey)."""
    book = load_rulebook()
    (example,) = [e for e in book.rules["BN104"].examples if "looks the bias up by name" in e.name]
    (finding,) = check_source(example.source, "models.py", select=["BN104"])
    assert finding.fix.applicability is Applicability.DISPLAY_ONLY
    assert "reads bias parameters by name (for instance at line 14)" in finding.fix.message
    plain = example.source.split("\n\ndef functional_conv_block", 1)[0] + "\n"
    (fixable,) = check_source(plain, "models.py", select=["BN104"])
    assert fixable.fix.applicability is Applicability.UNSAFE


def test_bn006_conversion_is_display_only_where_the_project_tests_plain_bn_classes():
    """bts: `bn_init_as_tf` freezes `isinstance(m, nn.BatchNorm2d)` modules after each
    evaluation; converted to SyncBatchNorm they no longer pass the test and the frozen BN
    trains again (a wrong fix of the twentieth survey). The `isinstance` in `__init__` (run
    before any conversion) alone leaves the fix unsafe."""
    book = load_rulebook()
    (example,) = [e for e in book.rules["BN006"].examples if "bn_init_as_tf" in e.name]
    (finding,) = check_source(example.source, "train.py", select=["BN006"])
    assert finding.fix.applicability is Applicability.DISPLAY_ONLY
    assert "`isinstance` tests of plain BN classes (for instance at line 17)" in finding.fix.message
    construction_only = example.source.replace("    if isinstance(m, nn.BatchNorm2d):\n        m.eval()",
                                               "    m.eval()")
    (fixable,) = check_source(construction_only, "train.py", select=["BN006"])
    assert fixable.fix.applicability is Applicability.UNSAFE
    assert fixable.fix.message.startswith("Convert BN to SyncBatchNorm before the wrap (")


def test_bn104_fix_is_display_only_where_biases_are_used_unchecked():
    """solo-learn's SimSiam: `self.projector[6].bias.requires_grad = False` raised
    AttributeError once the fix dropped that bias (a wrong fix of the twenty-first survey); the
    same for `nn.init.constant_(m.bias, 0)` under `isinstance(m, nn.Conv2d)`. A use under a
    None check, or on a module narrowed to a BN class, keeps the fix."""
    book = load_rulebook()
    (example,) = [e for e in book.rules["BN104"].examples if "solo-learn's SimSiam" in e.name]
    (finding,) = check_source(example.source, "simsiam.py", select=["BN104"])
    assert finding.fix.applicability is Applicability.DISPLAY_ONLY
    assert "without checking that they exist (for instance at line 14" in finding.fix.message
    model = """
        import torch.nn as nn


        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.conv = nn.Conv2d(3, 8, 3)
                self.bn = nn.BatchNorm2d(8)
                for m in self.modules():
                    if isinstance(m, nn.Conv2d):
                        {init}

            def forward(self, x):
                return self.bn(self.conv(x))
    """
    unchecked = model.format(init="nn.init.constant_(m.bias, 0)")
    (finding,) = diagnostics(unchecked, ["BN104"])
    assert finding.fix.applicability is Applicability.DISPLAY_ONLY
    checked = model.format(init="if m.bias is not None:\n                            "
                                "nn.init.constant_(m.bias, 0)")
    (fixable,) = diagnostics(checked, ["BN104"])
    assert fixable.fix.applicability is Applicability.UNSAFE
    on_bn = model.format(init="pass").replace(
        "if isinstance(m, nn.Conv2d):\n                        pass",
        "if isinstance(m, nn.BatchNorm2d):\n                        m.bias.data.zero_()")
    (fixable,) = diagnostics(on_bn, ["BN104"])
    assert fixable.fix.applicability is Applicability.UNSAFE
