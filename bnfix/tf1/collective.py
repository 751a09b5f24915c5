"""A differentiable sum over the towers of one TF1 graph.

`CollectiveReduce` has no registered gradient, so the sum is wrapped in `tf.custom_gradient`:
y = sum_j x_j gives dL/dx_i = sum_j dL_j/dy_j, which is another all-reduce, this time of the
upstream gradients. Each tower's forward (and each of its backward) reductions pair with the
other towers' at run time by their shared instance key, so the towers can be built, and their
gradients taken, one after the other.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import tensorflow as tf
from tensorflow.python.ops import collective_ops

# Keys are process-wide (a second graph or context must never reuse a live key); start far from
# the small keys tf.distribute allocates for itself.
_KEYS = itertools.count(start=1 << 24)


def new_key() -> int:
    return next(_KEYS)


@dataclass
class Reduction:
    """One all-reduce that every tower joins: its forward key and the keys of its gradients
    (the j-th gradient taken in one tower pairs with the j-th taken in every other)."""

    group_size: int
    group_key: int
    instance_key: int = field(default_factory=new_key)
    backward_keys: list[int] = field(default_factory=list)
    backward_taken: dict[int, int] = field(default_factory=dict)

    def backward_key(self, tower: int) -> int:
        j = self.backward_taken.get(tower, 0)
        self.backward_taken[tower] = j + 1
        while len(self.backward_keys) <= j:
            self.backward_keys.append(new_key())
        return self.backward_keys[j]


def tower_sum(value: tf.Tensor, reduction: Reduction, tower: int, device: str) -> tf.Tensor:
    """sum over towers of `value`, differentiable; run on `device` (the tower's), as is its
    gradient wherever `tf.gradients` is called from."""

    @tf.custom_gradient
    def reduce(local: tf.Tensor):
        total = collective_ops.all_reduce(local, reduction.group_size, reduction.group_key,
                                          reduction.instance_key, merge_op="Add", final_op="Id")

        def grad(upstream: tf.Tensor) -> tf.Tensor:
            with tf.device(device):
                return collective_ops.all_reduce(
                    upstream, reduction.group_size, reduction.group_key,
                    reduction.backward_key(tower), merge_op="Add", final_op="Id")

        return total, grad

    with tf.device(device):
        return reduce(value)
