"""The towers of one `sync_towers` context: which tower a BN call belongs to, which layer it is,
and the batch statistics of that layer over all towers."""

from __future__ import annotations

from dataclasses import dataclass, field

import tensorflow as tf

from bnfix.tf1.collective import Reduction, new_key, tower_sum


class TowerError(ValueError):
    """BN calls inside `sync_towers` that cannot be paired across towers."""


@dataclass(frozen=True)
class Moments:
    """One tower's view of a layer's statistics over every tower's batch."""

    mean: tf.Tensor
    variance: tf.Tensor  # biased (divided by the global count), as used to normalize
    count: tf.Tensor  # the global number of values per channel
    tower: int
    owns_updates: bool  # this tower's call builds the layer's moving-statistics updates

    def unbiased_variance(self) -> tf.Tensor:
        return self.variance * self.count / tf.maximum(self.count - 1.0, 1.0)


@dataclass
class Layer:
    """The k-th BN call of every tower: one layer, paired by call order."""

    index: int
    name: str
    channels: int
    sums: Reduction
    squares: Reduction


@dataclass
class TowerSync:
    """State of one `sync_towers(num_towers)` context (see bnfix.tf1.sync)."""

    num_towers: int
    update_tower: int
    group_key: int = field(default_factory=new_key)
    devices: list[str] = field(default_factory=list)
    calls: list[int] = field(default_factory=list)
    layers: list[Layer] = field(default_factory=list)

    def moments(self, x: tf.Tensor, channel_axis: int, name: str) -> Moments:
        """Mean and variance of `x` over every axis but `channel_axis`, over all towers' batches.

        `name` identifies the layer (its variables' scope); the k-th call of each tower must be
        the same layer, which this checks."""
        if tf.executing_eagerly() or not hasattr(x, "graph"):
            raise TowerError("bnfix.tf1.sync_towers works on TF1 graphs (tf.compat.v1 with "
                             "eager execution disabled, or inside tf.Graph().as_default())")
        rank = x.shape.rank
        if rank is None:
            raise TowerError(f"{name}: synchronized BN needs an input of known rank")
        channel_axis %= rank
        channels = x.shape[channel_axis]
        if channels is None:
            raise TowerError(f"{name}: synchronized BN needs a known channel count")
        axes = [a for a in range(rank) if a != channel_axis]
        local_sum = tf.reduce_sum(x, axes)
        tower = self._tower_of(local_sum.op.device, name)
        layer = self._layer_for(tower, name, channels)
        device = self.devices[tower]
        count = tf.cast(tf.reduce_prod(tf.gather(tf.shape(x), axes)), x.dtype)
        total = tower_sum(tf.concat([local_sum, count[None]], 0), layer.sums, tower, device)
        global_count = total[-1]
        mean = total[:-1] / global_count
        broadcast = [1] * rank
        broadcast[channel_axis] = channels
        # d var / d mean is 0 at the exact mean (as in tf.nn.moments): no gradient through it.
        centred = x - tf.reshape(tf.stop_gradient(mean), broadcast)
        squares = tf.reduce_sum(tf.square(centred), axes)
        variance = tower_sum(squares, layer.squares, tower, device) / global_count
        return Moments(mean, variance, global_count, tower, tower == self.update_tower)

    def _tower_of(self, device: str, name: str) -> int:
        if not device:
            raise TowerError(
                f"{name}: BN call inside sync_towers but outside a tower: build each tower "
                "under its own `with tf.device(...)` (one device per tower)")
        device = tf.DeviceSpec.from_string(device).to_string()
        if device not in self.devices:
            if len(self.devices) == self.num_towers:
                raise TowerError(
                    f"{name}: a BN call on {device}, but sync_towers({self.num_towers}) already "
                    f"has its towers on {', '.join(self.devices)}")
            self.devices.append(device)
            self.calls.append(0)
        return self.devices.index(device)

    def _layer_for(self, tower: int, name: str, channels: int) -> Layer:
        k = self.calls[tower]
        self.calls[tower] += 1
        if k == len(self.layers):
            self.layers.append(Layer(k, name, channels,
                                     Reduction(self.num_towers, self.group_key),
                                     Reduction(self.num_towers, self.group_key)))
        layer = self.layers[k]
        if (layer.name, layer.channels) != (name, channels):
            raise TowerError(
                f"BN call {k + 1} of tower {tower} is `{name}` ({channels} channels) but call "
                f"{k + 1} of the first tower to reach it was `{layer.name}` ({layer.channels} "
                "channels): every tower must call the same BN layers in the same order")
        return layer

    def unfinished(self) -> str | None:
        """Why the towers built so far cannot run (their collectives would wait forever), or
        None."""
        if len(self.devices) < self.num_towers and self.layers:
            return (f"sync_towers({self.num_towers}) saw BN calls on {len(self.devices)} "
                    f"device(s) ({', '.join(self.devices)}): every tower needs its own device")
        short = [i for i, n in enumerate(self.calls) if n != len(self.layers)]
        if short:
            counts = ", ".join(f"tower {i}: {n}" for i, n in enumerate(self.calls))
            return f"the towers made different numbers of BN calls ({counts})"
        return None


_ACTIVE: list[TowerSync] = []


def active_sync() -> TowerSync | None:
    """The innermost `sync_towers` context being built, or None."""
    return _ACTIVE[-1] if _ACTIVE else None


def enter(sync: TowerSync) -> None:
    if _ACTIVE:
        raise TowerError("sync_towers contexts do not nest")
    _ACTIVE.append(sync)


def leave(sync: TowerSync) -> None:
    _ACTIVE.remove(sync)
