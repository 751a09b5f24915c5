"""The synthetic batches of the TensorFlow runs (numpy: the same in every process).

Shard r of each global batch is shifted by r/2, as in the torch runs: non-identically
distributed shards (unshuffled data, per-device data sources) make the unsynced gap plain."""

from __future__ import annotations

from itertools import pairwise

import numpy as np


def shards(batch: int, count: int) -> list[slice]:
    """The global batch split into `count` contiguous shards, the first ones one larger."""
    base, extra = divmod(batch, count)
    bounds = [0]
    for r in range(count):
        bounds.append(bounds[-1] + base + (1 if r < extra else 0))
    return [slice(a, b) for a, b in pairwise(bounds)]


def inputs(seed: int, step: int, shape: tuple[int, ...], count: int, dtype: str) -> np.ndarray:
    x = np.random.default_rng([seed, step, 1]).normal(size=shape)
    for r, part in enumerate(shards(shape[0], count)):
        x[part] += 0.5 * r
    return x.astype(dtype)


def targets(seed: int, step: int, kind: str, batch: int, out_shape: tuple[int, ...],
            dtype: str) -> np.ndarray:
    """Class indices (batch, *spatial) for `classes`, normal values for `regression`."""
    rng = np.random.default_rng([seed, step, 2])
    if kind == "classes":
        return rng.integers(0, out_shape[-1], size=(batch, *out_shape[:-1])).astype(np.int32)
    return rng.normal(size=(batch, *out_shape)).astype(dtype)
