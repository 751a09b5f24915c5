"""`sync_towers(num_towers)`: synchronized BN across the towers of one TF1 graph, by wrapping the
tower loop — the BN layers themselves stay as they are::

    with bnfix.tf1.sync_towers(2):
        for i in range(2):
            with tf.device(f"/gpu:{i}"), tf.name_scope(f"tower_{i}"):
                loss = model(images[i])            # tf.compat.v1.layers.batch_normalization,
                grads.append(opt.compute_gradients(loss))   # fused_batch_norm, bnfix.tf1.batch_norm

Mechanism. While the context is open, `tf.compat.v1.nn.fused_batch_norm(is_training=True)`, the
tf-keras layer behind `tf.compat.v1.layers.batch_normalization` (training mode) and
`bnfix.tf1.batch_norm(training=True)` compute their batch statistics over every tower's batch:
each tower reduces [sum, count] and then the sum of squared deviations from the global mean
(two passes: no E[x²]−E[x]² cancellation) with a collective all-reduce across the towers'
devices. The all-reduce is wrapped in `tf.custom_gradient` whose backward is the all-reduce of the
upstream gradients, so every tower's `tf.gradients` — taken inside the loop, before the later
towers exist, or once after it — gets the terms that flow through the other towers' statistics:
the tower-averaged gradients equal those of BN on the concatenated batch. Towers pair at run time
through the collectives' keys, which is what lets tower 0 be built before tower 1.

Pairing. A tower is the device its BN ops are placed on (the i-th device seen is tower i). The
k-th BN call of every tower is one layer; the calls must come in the same order in every tower and
name the same variables (towers share variables via `reuse`), which is checked as the graph is
built, and on leaving the context every tower must have made the same calls.

Moving statistics. Each layer gets exactly one pair of update ops in UPDATE_OPS, built by the
tower `update_tower` (default: the last, so both `tf.get_collection(UPDATE_OPS)` and
`tf.get_collection(UPDATE_OPS, last_tower_scope)` — what `bnfix fix` writes for BN002 — run it
once per step; pass `update_tower=0` for code that collects the first tower's scope). They move
towards the global mean and the global variance, unbiased like TF1's fused BN (the tf-keras layer
keeps its own convention: unbiased when it runs fused, biased otherwise).

Limits. One device per tower; every `session.run` that evaluates one tower's training-mode BN must
evaluate all towers (a collective waits for its peers), so build evaluation graphs outside the
context or with `training=False`; `training` must be a Python bool (or constant) inside the
context; tf-keras layers with renorm, virtual_batch_size, adjustment, masks or several axes are
refused; `fused_batch_norm` imported by name before the context (`from ... import
fused_batch_norm`) is not rerouted.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from bnfix.tf1 import patches, towers
from bnfix.tf1.towers import TowerError, TowerSync


@contextmanager
def sync_towers(num_towers: int, *, update_tower: int = -1) -> Iterator[TowerSync]:
    """Synchronize the batch statistics of the BN layers built by `num_towers` towers.

    Yields the context's state (devices seen, layers paired). The patched entry points are
    restored on exit, also when the body raises. Raises TowerError on exit when the towers built
    cannot run together (a device missing, or different BN calls per tower)."""
    if num_towers < 1:
        raise ValueError(f"sync_towers: num_towers must be at least 1, not {num_towers}")
    if not -num_towers <= update_tower < num_towers:
        raise ValueError(f"sync_towers({num_towers}): no tower {update_tower} to hold the updates")
    sync = TowerSync(num_towers, update_tower % num_towers)
    towers.enter(sync)
    restore = patches.install()
    try:
        yield sync
    finally:
        restore()
        towers.leave(sync)
    problem = sync.unfinished()
    if problem is not None:
        raise TowerError(f"sync_towers: {problem}")
