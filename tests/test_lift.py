"""The source front-end's analyses, asserted on the IR it produces."""

from __future__ import annotations

import ast
import textwrap

from bnfix.findings import Pos, Span
from bnfix.ir import Binding, Const, FromParam, Unknown, bindings, is_const
from bnfix.rulebook import load_rulebook
from bnfix.source.lift import lift
from bnfix.source.text import SourceText

CATALOGUE = load_rulebook().catalogue


def module(source: str):
    source = textwrap.dedent(source).lstrip("\n")
    return lift(SourceText(source), ast.parse(source), "m.py", CATALOGUE)


def test_wrapper_default_flows_into_trainable_and_call_sites_bind_the_training_flag():
    m = module("""
        import tensorflow as tf

        class Net(object):
            def _batch_norm(self, x, name, is_training, trainable=False):
                return tf.contrib.layers.batch_norm(x, is_training=is_training,
                                                    trainable=trainable, scope=name)

            def build(self, x):
                a = self._batch_norm(x, 'bn1', self.is_training)
                return self._batch_norm(a, 'bn2', is_training=False, trainable=True)
    """)
    (site,) = m.bn_sites
    trainable, training = site.value("trainable"), site.value("training")
    assert isinstance(trainable, FromParam) and trainable.name == "trainable"
    assert isinstance(training, FromParam) and training.name == "is_training"
    wrapper = trainable.function
    assert [cs.span.start.row for cs in wrapper.call_sites] == [9, 10]
    contexts = [(b.value(trainable), b.value(training)) for b in bindings(site.function)]
    first, second = contexts
    assert is_const(first[0], False) and isinstance(first[1], Unknown)
    assert first[1].text == "self.is_training"
    assert is_const(second[0], True) and is_const(second[1], False)


def test_positional_call_site_skips_self_and_star_args_make_values_unknown():
    m = module("""
        import tensorflow as tf

        def bn(x, training, trainable=False):
            return tf.layers.batch_normalization(x, training=training, trainable=trainable)

        bn(images, True)
        bn(*args)
        bn(images, **options)
    """)
    (site,) = m.bn_sites
    fn = site.function
    args = [cs.args for cs in fn.call_sites]
    assert is_const(args[0]["training"], True) and "trainable" not in args[0]
    assert isinstance(args[1]["training"], Unknown) and isinstance(args[1]["trainable"], Unknown)
    assert isinstance(args[2]["trainable"], Unknown)


def test_module_constants_and_single_local_assignments_are_followed():
    m = module("""
        import torch.nn as nn
        BN_MOMENTUM = 0.99

        def block(c):
            eps = 1e-3
            return nn.BatchNorm2d(c, eps=eps, momentum=BN_MOMENTUM)
    """)
    (site,) = m.bn_sites
    assert is_const(site.value("momentum"), 0.99)
    assert is_const(site.value("epsilon"), 1e-3)
    assert site.value("epsilon").span.start.row == 5  # the literal's own position
    assert is_const(site.value("affine"), True)  # catalogue default


def test_reassigned_name_is_unknown():
    m = module("""
        import tensorflow as tf
        flag = False
        flag = compute()
        tf.layers.batch_normalization(x, training=flag)
    """)
    assert isinstance(m.bn_sites[0].value("training"), Unknown)


def test_tower_loop_needs_a_device_per_iteration_and_shared_variables():
    m = module("""
        import tensorflow as tf

        with tf.variable_scope(tf.get_variable_scope()):
            for i in range(n):
                with tf.device('/gpu:%d' % i):
                    with tf.name_scope('tower_%d' % i) as scope:
                        build()
                        tf.get_variable_scope().reuse_variables()

        for j in range(3):
            with tf.device('/gpu:%d' % j):
                heads.append(head(j))

        with tf.variable_scope('m', reuse=tf.AUTO_REUSE):
            for k, dev in enumerate(devices):
                with tf.device(dev):
                    build()
    """)
    towers = m.tower_loops
    assert [t.loop_var for t in towers] == ["i", "k"]
    first, second = towers
    assert first.starts_at_zero and first.name_scope.as_name == "scope"
    assert first.device_block.first_row == 6 and first.device_block.last_row == 8
    assert second.name_scope is None and second.starts_at_zero


def test_collection_gets_know_their_tower_and_usage():
    m = module("""
        import tensorflow as tf
        ops = []
        for i in range(2):
            with tf.device('/gpu:%d' % i), tf.variable_scope('v', reuse=i > 0):
                ops.extend(tf.get_collection(tf.GraphKeys.UPDATE_OPS))
                last = tf.get_collection("update_ops", scope='tower_%d' % i)
        after = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)
        other = tf.get_collection(tf.GraphKeys.REGULARIZATION_LOSSES)
    """)
    gets = {g.call.span.start.row: g for g in m.collection_gets}
    assert gets[5].inside_tower and gets[5].usage == "accumulate" and not gets[5].scoped
    assert gets[6].key == "UPDATE_OPS" and gets[6].scoped and gets[6].usage == "assign"
    assert gets[7].tower is not None and not gets[7].inside_tower
    assert gets[8].key == "REGULARIZATION_LOSSES"


def test_train_ops_see_control_dependencies_through_locals_and_groups():
    m = module("""
        import tensorflow as tf
        import tensorflow.contrib.slim as slim

        update_ops = tf.get_collection(tf.GraphKeys.UPDATE_OPS)
        deps = update_ops + [counter]
        with tf.control_dependencies(deps):
            a = opt.minimize(loss)
        b = opt.minimize(loss)
        b = tf.group(b, *update_ops)
        c = opt.apply_gradients(grads)
        d = slim.learning.create_train_op(loss, opt)
        e = slim.learning.create_train_op(loss, opt, update_ops=[])
    """)
    ops = {op.call.span.start.row: op for op in m.train_ops}
    assert "UPDATE_OPS" in ops[7].control_keys
    assert ops[8].adds_update_ops and not ops[8].under_control_deps
    assert not ops[10].adds_update_ops and ops[10].statement.wrappable
    assert ops[11].adds_update_ops
    assert not ops[12].adds_update_ops


def test_ema_apply_traced_through_a_local_variable():
    m = module("""
        import tensorflow as tf
        import tensorflow.contrib.slim as slim

        def averages(step):
            ema = tf.train.ExponentialMovingAverage(0.999, step)
            to_average = tf.trainable_variables() + tf.moving_average_variables()
            op1 = ema.apply(to_average)
            op2 = ema.apply(slim.get_model_variables())
            op3 = ema.apply([v for v in tf.global_variables() if 'bn' not in v.name])
            return op1, op2, op3
    """)
    first, second, third = m.ema_applies
    assert first.var_list.local_name == "to_average" and first.var_list.local_uses == 1
    assert [sorted(t.tags) for t in first.var_list.terms] == [["trainable"],
                                                              ["stats:moving_average"]]
    assert first.var_list.span.start.row == 6  # the definition is what the fix edits
    assert "stats:model" in second.var_list.tags
    assert third.var_list.tags == frozenset()  # filtered: unknown, not reported


def test_call_info_anchors_for_edits():
    source = "f = g(a,\n      b,  # trailing\n)\nh()\n"
    m = lift(SourceText(source), ast.parse(source), "m.py", CATALOGUE)
    assert m.bn_sites == []
    from bnfix.source.resolve import call_info
    tree = ast.parse(source)
    info = call_info(SourceText(source), tree.body[0].value)
    assert info.trailing_comma and info.multiline
    assert (info.args_end.row, info.args_end.col) == (2, 7)
    assert (info.close_paren.row, info.close_paren.col) == (3, 0)
    empty = call_info(SourceText(source), tree.body[1].value)
    assert empty.args_end is None and (empty.close_paren.row, empty.close_paren.col) == (4, 2)


def test_non_ascii_columns_are_characters():
    source = "import torch.nn as nn\nnom = 'é'; bn = nn.BatchNorm2d(3)\n"
    m = lift(SourceText(source), ast.parse(source), "m.py", CATALOGUE)
    assert m.bn_sites[0].span.start.col == source.splitlines()[1].index("nn.BatchNorm2d")


def test_a_span_that_ends_on_a_row_with_non_ascii_text_counts_characters_there():
    source = "f(1,\n  'é', 2)\n'é'; g(\n 3)\n"
    text = SourceText(source)
    first, second = (stmt.value for stmt in ast.parse(source).body[::2])
    assert text.span(first) == Span(Pos(1, 0), Pos(2, 9))  # its end: 10 bytes, 9 characters
    assert text.span(second) == Span(Pos(3, 5), Pos(4, 3))  # its start: 6 bytes, 5 characters


def test_binding_defaults_when_function_has_no_call_sites():
    m = module("""
        import tensorflow as tf
        def bn(x, training=True, trainable=False):
            return tf.layers.batch_normalization(x, training=training, trainable=trainable)
    """)
    site = m.bn_sites[0]
    (only,) = list(bindings(site.function))
    assert only.chain == ()
    assert is_const(only.value(site.value("trainable")), False)
    assert is_const(Binding().value(site.value("training")), True)
    assert isinstance(site.value("training"), FromParam)
    assert isinstance(Const(1, "1", None), Const)


def test_bn_subclasses_that_only_reroute_arguments_are_the_bn_they_extend():
    m = module("""
        import tensorflow as tf
        import torch.nn as nn

        class FrozenAware(tf.keras.layers.BatchNormalization):
            '''trainable=False also means inference mode.'''
            def call(self, x, training=False):
                if not training:
                    training = tf.constant(False)
                training = tf.logical_and(training, self.trainable)
                return super().call(x, training)

        class Named(FrozenAware):
            def __init__(self, name='tpu_batch_normalization', **kwargs):
                super(Named, self).__init__(name=name, **kwargs)

        class PassThrough(nn.BatchNorm2d):
            def forward(self, input):
                return super(PassThrough, self).forward(input)

        class CrossReplica(tf.keras.layers.BatchNormalization):
            def _moments(self, inputs, axes, keep_dims):
                return super()._moments(inputs, axes, keep_dims)

        class NaiveSync(nn.BatchNorm2d):
            def forward(self, input):
                if not self.training:
                    return super().forward(input)
                return sync(input)

        class V1(tf.keras.layers.BatchNormalization):
            _USE_V2_BEHAVIOR = False

        a = FrozenAware(momentum=0.9)
        b = Named(0.5, momentum=0.9)
        c = PassThrough(64, momentum=0.1)
        d = CrossReplica()
        e = NaiveSync(64)
        f = V1()
    """)
    sites = {s.call.callee: s for s in m.bn_sites}
    assert set(sites) == {"FrozenAware", "Named", "PassThrough"}
    assert sites["FrozenAware"].api.id == "keras.layers.BatchNormalization"
    assert sites["FrozenAware"].via_class == "FrozenAware"
    assert is_const(sites["FrozenAware"].value("momentum"), 0.9)
    # its own __init__: the positional 0.5 is its `name`, not the base's `axis`
    assert "axis" not in sites["Named"].args and sites["Named"].unpacked
    assert sites["PassThrough"].api.framework == "torch"
    assert is_const(sites["PassThrough"].value("num_features"), 64)
