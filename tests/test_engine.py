"""The engine: one pass of all rules, suppressions, and fix application that never writes a
file that does not parse and never touches what it does not fix."""

from __future__ import annotations

import textwrap

from bnfix import check_source, fix_source, load_rulebook
from bnfix.engine import Engine
from bnfix.findings import Applicability, Edit, Fix, Pos, Span, WrapStatements
from bnfix.source.text import SourceText
from bnfix.source.writer import UNBUILDABLE, apply_fixes, buildable, lower

SEED = textwrap.dedent('''
    import tensorflow as tf

    def bn(x, training, trainable=False):
        return tf.layers.batch_normalization(x, training=training, trainable=trainable)

    net = bn(images, training=True)
    ema = tf.train.ExponentialMovingAverage(0.99)
    op = ema.apply(tf.global_variables())
    train_op = opt.minimize(loss)
''').lstrip()


def codes(source: str) -> list[str]:
    return [d.code for d in check_source(source, "m.py")]


def test_all_rules_in_one_pass():
    assert codes(SEED) == ["BN001", "BN004", "BN003"]


def test_safe_fixes_only_by_default():
    result = fix_source(SEED, "m.py")
    assert result.text == SEED and not result.fixed
    assert {d.fix.applicability for d in result.remaining} == {Applicability.UNSAFE}


def test_fix_changes_only_what_it_fixes_and_is_idempotent():
    result = fix_source(SEED, "m.py", unsafe_fixes=True)
    assert [d.code for d in result.fixed] == ["BN001", "BN004", "BN003"]
    assert result.remaining == []
    changed = [(a, b) for a, b in zip(SEED.splitlines(), result.text.splitlines()) if a != b]
    assert changed[0] == ("def bn(x, training, trainable=False):", "def bn(x, training, trainable=True):")
    assert "op = ema.apply(tf.trainable_variables())" in result.text
    assert result.text.endswith(
        "with tf.control_dependencies(tf.get_collection(tf.GraphKeys.UPDATE_OPS)):\n"
        "    train_op = opt.minimize(loss)\n")
    assert fix_source(result.text, "m.py", unsafe_fixes=True).text == result.text


def test_crlf_line_endings_and_tabs_are_kept():
    source = SEED.replace("\n", "\r\n").replace("    ", "\t")
    result = fix_source(source, "m.py", unsafe_fixes=True)
    assert "\n" not in result.text.replace("\r\n", "")
    assert "\r\n\ttrain_op = opt.minimize(loss)\r\n" in result.text
    assert "def bn(x, training, trainable=True):\r\n\treturn" in result.text


def test_wrapping_never_reindents_a_multiline_string():
    source = textwrap.dedent('''
        import tensorflow as tf

        net = tf.layers.batch_normalization(x, training=is_training)
        train_op = opt.minimize(loss, name="""step
        with a long
        name""")
    ''').lstrip()
    result = fix_source(source, "m.py", unsafe_fixes=True)
    assert '    train_op = opt.minimize(loss, name="""step\nwith a long\nname""")' in result.text


def test_overlapping_fixes_are_applied_in_later_passes():
    text = SourceText("a = 1\n")
    first = Fix(Applicability.SAFE, "one", (Edit(Span(Pos(1, 4), Pos(1, 5)), "2"),))
    second = Fix(Applicability.SAFE, "two", (Edit(Span(Pos(1, 0), Pos(1, 5)), "b = 3"),))
    applied = apply_fixes(text, [second, first])
    assert applied.applied == [0] or applied.applied == [1]
    assert len(applied.applied) == 1


def test_a_fix_that_would_not_parse_is_dropped_and_reported():
    text = SourceText("x = 1\ny = 2\n")
    good = Fix(Applicability.SAFE, "good", (Edit(Span(Pos(1, 4), Pos(1, 5)), "10"),))
    bad = Fix(Applicability.SAFE, "bad", (Edit(Span(Pos(2, 4), Pos(2, 5)), "(("),))
    applied = apply_fixes(text, [good, bad])
    assert applied.text == "x = 10\ny = 2\n"
    assert applied.applied == [0] and 1 in applied.rejected
    assert "SyntaxError" in applied.rejected[1] or "parse" in applied.rejected[1]


def test_engine_reports_a_dropped_fix(monkeypatch):
    book = load_rulebook()
    engine = Engine(book, frozenset({"BN004"}))
    broken = Fix(Applicability.UNSAFE, "broken", (Edit(Span(Pos(4, 0), Pos(4, 2)), "(("),))
    check = engine.checks["BN004"]

    def with_broken_fix(module):
        for finding in check(module):
            yield type(finding)(finding.code, finding.span, finding.message, broken)

    monkeypatch.setitem(engine.checks, "BN004", with_broken_fix)
    source = ("import tensorflow as tf\nnet = tf.layers.batch_normalization(x, training=t)\n"
              "ema = tf.train.ExponentialMovingAverage(0.9)\nop = ema.apply(tf.global_variables())\n")
    result = engine.fix_text(source, "m.py", unsafe=True)
    assert result.new_text is None, "nothing is written"
    assert [d.code for d in result.diagnostics] == ["BN004"]
    assert result.notes and "fix for BN004 dropped" in result.notes[0]


def test_lower_wraps_rows_with_the_file_indentation():
    text = SourceText("if x:\n  a = 1\n  b = [\n    2]\n")
    fix = lower(Fix(Applicability.SAFE, "w", (WrapStatements(2, 4, "with s:"),)), text)
    (edit,) = fix.edits
    assert edit.content == "  with s:\n    a = 1\n    b = [\n      2]"


def test_noqa_line_and_file_level():
    line = SEED.replace("op = ema.apply(tf.global_variables())",
                        "op = ema.apply(tf.global_variables())  # noqa: BN004")
    assert codes(line) == ["BN001", "BN003"]
    blanket = SEED.replace("train_op = opt.minimize(loss)", "train_op = opt.minimize(loss)  # noqa")
    assert codes(blanket) == ["BN001", "BN004"]
    other = SEED.replace("train_op = opt.minimize(loss)", "train_op = opt.minimize(loss)  # noqa: BN001")
    assert codes(other) == ["BN001", "BN004", "BN003"]
    assert codes("# bnfix: noqa: BN001, BN003\n" + SEED) == ["BN004"]
    assert codes("# bnfix: noqa\n" + SEED) == []
    in_string = SEED.replace("train_op = opt.minimize(loss)", "train_op = opt.minimize(loss, name='# noqa')")
    assert codes(in_string) == ["BN001", "BN004", "BN003"], "a `# noqa` inside a string is not a comment"


def test_python2_and_syntax_errors_are_bn900():
    (py2,) = check_source("import tensorflow as tf\nprint 'bn', tf.layers.batch_normalization\n", "p.py")
    assert py2.code == "BN900" and "Python 2 source" in py2.message and py2.span.start.row == 2
    (err,) = check_source("import tensorflow as tf\nbn = tf.layers.batch_normalization(x\n", "e.py")
    assert err.code == "BN900" and "syntax error" in err.message
    # improved-gan's imagenet/model.py: a tab-indented line among space-indented ones
    (tabs,) = check_source("import tensorflow as tf\nif tf:\n        bn = 1\n\tx = tf.layers."
                           "batch_normalization(bn)\n", "t.py")
    assert tabs.code == "BN900" and "Python 2 source (tabs and spaces mixed" in tabs.message
    (long,) = check_source("import tensorflow as tf\nx = tf.layers.batch_normalization\n"
                           "assert n == 3217920L, 0xFFL\n", "t.py")  # slim's mobilenet_v1_test
    assert long.code == "BN900" and "Python 2 source (a `long` literal" in long.message
    # kenshohara's video-classification-3d-cnn-pytorch: torch 0.3 code on Python 3.6
    (old,) = check_source("import torch\nbn = torch.nn.BatchNorm2d(8)\n"
                          "targets = targets.cuda(async=True)\n", "train.py")
    assert old.code == "BN900" and old.span.start.row == 3
    assert old.message.startswith("Python 3.6 source (`async` or `await` as a name")
    assert "`.cuda(non_blocking=True)`" in old.message
    (keyword,) = check_source("import torch\nbn = torch.nn.BatchNorm2d(8)\n"
                              "x = (async == 1 +)\n", "k.py")  # a comparison: no such hint
    assert keyword.message.startswith("syntax error (parsed as Python")


def test_files_without_bn_are_not_parsed():
    assert check_source("this is not python (((", "x.py") == []


def test_select_and_ignore():
    assert [d.code for d in check_source(SEED, "m.py", select=["BN00"], ignore=["BN001"])] == \
        ["BN004", "BN003"]
    assert [d.code for d in check_source(SEED, "m.py", select=["double-ema-of-bn-stats"])] == ["BN004"]


def test_final_libcst_check_rejects_the_whole_file(monkeypatch):
    import bnfix.source.writer as writer_module

    monkeypatch.setattr(writer_module, "final_check",
                        lambda text, original=None: "LibCST: simulated refusal")
    engine = Engine(load_rulebook(), frozenset({"BN004"}))
    source = ("import tensorflow as tf\nnet = tf.layers.batch_normalization(x, training=t)\n"
              "ema = tf.train.ExponentialMovingAverage(0.9)\nop = ema.apply(tf.global_variables())\n")
    result = engine.fix_text(source, "m.py", unsafe=True)
    assert result.new_text is None and result.fixed == []
    assert [d.code for d in result.diagnostics] == ["BN004"]
    assert "LibCST cannot round-trip" in result.notes[0]


def test_a_fix_whose_own_edits_overlap_is_shown_not_counted_fixable():
    """A fix with overlapping edits can never be applied: offered as fixable it would keep
    `bnfix fix` (and a pre-commit hook) failing forever (BN002 once did this on a real tower
    loop)."""
    text = SourceText("a = 1\n")
    clash = Fix(Applicability.UNSAFE, "clash", (Edit(Span(Pos(1, 0), Pos(1, 3)), "b ="),
                                                 Edit(Span(Pos(1, 2), Pos(1, 5)), "= 2")))
    shown = buildable(lower(clash, text))
    assert shown.applicability is Applicability.DISPLAY_ONLY and not shown.edits
    assert UNBUILDABLE in shown.message
    fine = Fix(Applicability.UNSAFE, "fine", (Edit(Span(Pos(1, 4), Pos(1, 5)), "2"),))
    assert buildable(fine) is fine


def test_no_rule_example_or_fixture_offers_a_fix_whose_edits_overlap():
    """Every fix the rule examples and the fixtures produce can be built (see above)."""
    from conftest import FIXTURES

    from bnfix import check_paths

    book = load_rulebook()
    seen = 0
    for rule in book.rules.values():
        for example in rule.examples:
            if example.source is None:
                continue
            for d in check_source(example.source, "example.py", select=[rule.code]):
                seen += 1
                assert d.fix is None or UNBUILDABLE not in d.fix.message, (rule.code, example.name)
    report = check_paths([FIXTURES], select=["ALL"])
    for d in report.remaining:
        seen += 1
        assert d.fix is None or UNBUILDABLE not in d.fix.message, (d.path, d.code)
    assert seen > 100


def test_a_rule_with_required_words_concerns_texts_holding_both_kinds():
    """BN005 needs a transposition of the towers (`zip(*` or an index loop) and a sum: a text
    with only one of the two is not parsed for it; one with both is (also `xrange`)."""
    engine = Engine(load_rulebook(), frozenset({"BN005"}))
    loop = "for i in xrange(len(grads[0])):\n    pass\n"
    assert engine.relevant(loop, "a.py") == set()
    assert engine.relevant("x = tf.add_n(xs)\n", "a.py") == set()
    assert engine.relevant(loop + "y = tf.reduce_sum(g, 0)\n", "a.py") == {"BN005"}
    assert engine.relevant("for gv in zip(*tg):\n    tf.add_n(gv)\n", "a.py") == {"BN005"}
    words = engine.summary_triggers  # what makes a file worth summarising: the same test
    assert not words.concerns(loop) and words.concerns(loop + "y = tf.reduce_sum(g, 0)\n")
