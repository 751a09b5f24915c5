"""A synthetic corpus of ML training code for benchmarks: TF1 multi-tower trainers with the
seed's BatchNorm bugs, PyTorch models, and the plain Python most files in such repositories
are. Deterministic for a given size and seed."""

from __future__ import annotations

import random
from pathlib import Path

TF1_TRAINER = '''\
"""Multi-GPU trainer {n} (TF1)."""
import tensorflow as tf
import tensorflow.contrib.slim as slim

FLAGS = tf.app.flags.FLAGS
BN_DECAY = 0.997


class Model{n}(object):
    def __init__(self, images, is_training):
        self.is_training = is_training
        self.logits = self.build(images)

    def _batch_norm(self, x, name, is_training, activation_fn=None, trainable=False):
        with tf.variable_scope(name + '/BatchNorm') as scope:
            o = tf.contrib.layers.batch_norm(x, decay=BN_DECAY, scale=True, is_training=is_training,
                                             activation_fn=activation_fn, trainable=trainable,
                                             scope=scope)
            return o

    def _conv(self, x, k, c, stride, name):
        return slim.conv2d(x, c, k, stride=stride, activation_fn=None, scope=name)

    def build(self, x):
{blocks}
        return slim.fully_connected(slim.flatten(x), 10, activation_fn=None, scope='fc')


def average_gradients(tower_grads):
    average_grads = []
    for grad_and_vars in zip(*tower_grads):
        grads = [tf.expand_dims(g, 0) for g, _ in grad_and_vars]
        grad = tf.reduce_mean(tf.concat(axis=0, values=grads), 0)
        average_grads.append((grad, grad_and_vars[0][1]))
    return average_grads


def train(images, labels, num_gpus={gpus}):
    global_step = tf.train.get_or_create_global_step()
    opt = tf.train.MomentumOptimizer(0.01, 0.9)
    tower_grads = []
    with tf.variable_scope(tf.get_variable_scope()):
        for i in range(num_gpus):
            with tf.device('/gpu:%d' % i):
                with tf.name_scope('tower_%d' % i):
                    model = Model{n}(images[i], is_training=True)
                    loss = tf.losses.sparse_softmax_cross_entropy(labels[i], model.logits)
                    tf.get_variable_scope().reuse_variables()
                    tower_grads.append(opt.compute_gradients(loss))
    grads = average_gradients(tower_grads)
    update_ops = tf.get_collection(tf.GraphKeys.UPDATE_OPS)
    with tf.control_dependencies(update_ops):
        apply_op = opt.apply_gradients(grads, global_step=global_step)
    ema = tf.train.ExponentialMovingAverage(0.9999, global_step)
    variables_to_average = tf.trainable_variables() + tf.moving_average_variables()
    return tf.group(apply_op, ema.apply(variables_to_average))
'''

TF1_BLOCK = '''\
        x = self._conv(x, 3, {c}, 1, 'conv{i}')
        x = self._batch_norm(x, 'bn{i}', self.is_training, tf.nn.relu)
'''

TORCH_MODEL = '''\
"""ResNet-style model {n} (PyTorch)."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Block{n}(nn.Module):
    def __init__(self, cin, cout, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout, momentum=0.1)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                          nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


def evaluate(model, loader, device):
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for images, labels in loader:
            logits = model(images.to(device))
            correct += (logits.argmax(1).cpu() == labels).sum().item()
            total += labels.numel()
    return correct / max(total, 1)
'''

PLAIN = '''\
"""Utilities {n}."""
import json
import logging
import os
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass
class Record{n}:
    name: str
    value: float
    tags: tuple = ()

    def to_json(self):
        return json.dumps({{"name": self.name, "value": self.value, "tags": list(self.tags)}})


def load_records_{n}(path):
    out = []
    if not os.path.exists(path):
        log.warning("missing %s", path)
        return out
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            name, _, value = line.partition("=")
            out.append(Record{n}(name.strip(), float(value)))
    return out


def summarize_{n}(records):
    total = sum(r.value for r in records)
    return {{"count": len(records), "total": total, "mean": total / max(len(records), 1)}}
'''


def build(root: Path, files: int, seed: int = 0) -> tuple[int, int]:
    """Write `files` modules under `root` (10% TF1 trainers, 15% torch models, the rest plain
    code, each padded to a few hundred lines); returns (files, lines)."""
    rng = random.Random(seed)
    lines = 0
    for n in range(files):
        kind = rng.random()
        folder = root / f"pkg{n // 100}"
        folder.mkdir(parents=True, exist_ok=True)
        if kind < 0.10:
            blocks = "".join(TF1_BLOCK.format(c=16 * (1 + i % 4), i=i) for i in range(rng.randint(4, 16)))
            text = TF1_TRAINER.format(n=n, blocks=blocks, gpus=rng.choice((2, 4, 8)))
        elif kind < 0.25:
            text = TORCH_MODEL.format(n=n)
        else:
            text = PLAIN.format(n=n)
        text += "".join(PLAIN.format(n=f"{n}_{k}").split('"""', 2)[2] for k in range(rng.randint(2, 6)))
        path = folder / f"module_{n}.py"
        path.write_text(text, encoding="utf-8")
        lines += text.count("\n")
    return files, lines
