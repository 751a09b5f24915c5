"""The project-wide analysis sees across files what the single-file analysis sees in one file:
for generated programs, the findings of the code merged into one module and of the same code
split over modules (each function in its own, importing what it calls) are the same set of
(code, function, line within the function)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bnfix import check_paths

CODES = ["BN001", "BN002", "BN003", "BN004", "BN006", "BN009", "BN101", "BN102", "BN105"]


@dataclass(frozen=True)
class Unit:
    """One top-level definition: its name, source, the names it uses, its header lines."""

    name: str
    source: str
    uses: tuple[str, ...]
    imports: tuple[str, ...]  # third-party imports it needs


TF = ("import tensorflow.compat.v1 as tf",)
TORCH = ("import torch.nn as nn",)


def tf_wrapper(k: int, trainable: bool, registers: bool) -> Unit:
    lines = [f"def bn_{k}(x, is_training, trainable={trainable}):",
             "    out = tf.layers.batch_normalization(x, training=is_training, trainable=trainable)"]
    if registers:  # a custom BN that puts its moving statistics in MOVING_AVERAGE_VARIABLES
        lines += ["    for v in tf.global_variables('bn/moving_'):",
                  "        tf.add_to_collection(tf.GraphKeys.MOVING_AVERAGE_VARIABLES, v)"]
    lines.append("    return out")
    return Unit(f"bn_{k}", "\n".join(lines) + "\n", (), TF)


def tf_block(k: int, callee: str, trainable: bool | None) -> Unit:
    passed = "" if trainable is None else f", trainable={trainable}"
    return Unit(f"block_{k}", f"def block_{k}(x, is_training):\n"
                              f"    return {callee}(x, is_training{passed})\n", (callee,), TF)


def tf_top(k: int, callee: str, training: str, train_op: str, ema: bool) -> Unit:
    lines = [f"def top_{k}(images, labels, flag):",
             f"    logits = {callee}(images, is_training={training})",
             "    loss = tf.reduce_mean(logits)"]
    if train_op == "bare":
        lines.append("    op = tf.train.AdamOptimizer(0.1).minimize(loss)")
    elif train_op == "deps":
        lines += ["    with tf.control_dependencies(tf.get_collection(tf.GraphKeys.UPDATE_OPS)):",
                  "        op = tf.train.AdamOptimizer(0.1).minimize(loss)"]
    else:
        lines.append("    op = loss")
    if ema:
        lines += ["    ema = tf.train.ExponentialMovingAverage(0.99)",
                  "    op = ema.apply(tf.trainable_variables() + tf.moving_average_variables())"]
    lines.append("    return op")
    return Unit(f"top_{k}", "\n".join(lines) + "\n", (callee,), TF)


def torch_model(k: int, freeze_at_init: bool, grads_only: bool) -> Unit:
    lines = [f"class Net{k}(nn.Module):", "    def __init__(self):", "        super().__init__()",
             "        self.bn = nn.BatchNorm2d(8)"]
    if freeze_at_init:
        lines.append("        self.freeze_bn()")
    lines += ["", "    def freeze_bn(self):", "        for m in self.modules():",
              "            if isinstance(m, nn.BatchNorm2d):"]
    if grads_only:
        lines += ["                for p in m.parameters():",
                  "                    p.requires_grad = False"]
    else:
        lines.append("                m.eval()")
    return Unit(f"Net{k}", "\n".join(lines) + "\n", (), TORCH)


def torch_trainer(k: int, model: str, refreeze: bool) -> Unit:
    lines = [f"def train_{k}(loader, opt):", f"    net = {model}()", "    for epoch in range(2):",
             "        net.train()"]
    if refreeze:
        lines.append("        net.freeze_bn()")
    lines += ["        for x in loader:", "            net(x).sum().backward()",
              "            opt.step()"]
    return Unit(f"train_{k}", "\n".join(lines) + "\n", (model,), TORCH)


def tf_towers(k: int, callee: str, collect: bool) -> Unit:
    lines = [f"def towers_{k}(images, num_gpus):",
             "    with tf.variable_scope(tf.get_variable_scope()):",
             "        for i in range(num_gpus):",
             "            with tf.device('/gpu:%d' % i):",
             f"                out = {callee}(images[i], is_training=True)",
             "                tf.get_variable_scope().reuse_variables()"]
    if collect:
        lines.append("    return tf.get_collection(tf.GraphKeys.UPDATE_OPS)")
    else:
        lines.append("    return out")
    return Unit(f"towers_{k}", "\n".join(lines) + "\n", (callee,), TF)


def torch_evaluate(k: int) -> Unit:
    lines = [f"def evaluate_{k}(model, val_loader):", "    with torch.no_grad():",
             "        for x in val_loader:", "            model(x)"]
    return Unit(f"evaluate_{k}", "\n".join(lines) + "\n", (), ("import torch",))


def torch_fit(k: int, evaluate: str, prepared: bool) -> Unit:
    lines = [f"def fit_{k}(model, loader, val_loader, opt):", "    for epoch in range(3):",
             "        model.train()", "        for x in loader:", "            opt.step()"]
    if prepared:
        lines.append("        model.eval()")
    lines.append(f"        {evaluate}(model, val_loader)")
    return Unit(f"fit_{k}", "\n".join(lines) + "\n", (evaluate,), ())


@st.composite
def programs(draw) -> list[Unit]:
    units: list[Unit] = []
    wrappers = []
    for k in range(draw(st.integers(1, 2))):
        unit = tf_wrapper(k, draw(st.booleans()), draw(st.booleans()))
        units.append(unit)
        wrappers.append(unit.name)
    callees = list(wrappers)
    for k in range(draw(st.integers(0, 2))):
        trainable = draw(st.sampled_from([None, True, False]))
        unit = tf_block(k, draw(st.sampled_from(callees)), trainable)
        units.append(unit)
        callees.append(unit.name)
    for k in range(draw(st.integers(1, 2))):
        callee = draw(st.sampled_from([c for c in callees if c.startswith("block_")] or callees))
        training = draw(st.sampled_from(["True", "False", "flag"]))
        units.append(tf_top(k, callee, training, draw(st.sampled_from(["bare", "deps", "none"])),
                            draw(st.booleans())))
    if draw(st.booleans()):
        units.append(tf_towers(0, draw(st.sampled_from(callees)), draw(st.booleans())))
    if draw(st.booleans()):
        model = torch_model(0, draw(st.booleans()), draw(st.booleans()))
        units += [model, torch_trainer(0, model.name, draw(st.booleans()))]
    if draw(st.booleans()):
        evaluate = torch_evaluate(0)
        units += [evaluate, torch_fit(0, evaluate.name, draw(st.booleans()))]
    return units


def merged(units: list[Unit]) -> dict[str, str]:
    imports = sorted({i for u in units for i in u.imports})
    return {"program.py": "\n".join(imports) + "\n\n\n" + "\n\n".join(u.source for u in units)}


def split(units: list[Unit]) -> dict[str, str]:
    files = {}
    for unit in units:
        header = list(unit.imports) + [f"from mod_{name} import {name}" for name in unit.uses]
        files[f"mod_{unit.name}.py"] = "\n".join(header) + "\n\n\n" + unit.source
    return files


def logical(root: Path, files: dict[str, str]) -> set[tuple[str, str, int]]:
    """(code, enclosing top-level definition, row within it) of every finding."""
    for name, text in files.items():
        (root / name).write_text(text, encoding="utf-8")
    report = check_paths([root], select=CODES)
    out = set()
    for d in report.remaining:
        lines = (root / Path(d.path).name).read_text(encoding="utf-8").splitlines()
        row = d.span.start.row
        start = max(r for r in range(1, row + 1)
                    if lines[r - 1].startswith(("def ", "class ")))
        name = lines[start - 1].split()[1].split("(")[0].rstrip(":")
        out.add((d.code, name, row - start))
    return out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(programs())
def test_merged_and_split_programs_have_the_same_findings(tmp_path_factory, units):
    one = logical(tmp_path_factory.mktemp("merged"), merged(units))
    many = logical(tmp_path_factory.mktemp("split"), split(units))
    assert one == many
