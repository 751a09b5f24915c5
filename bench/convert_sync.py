"""Time bnfix.torch.convert_sync / revert_sync against nn.SyncBatchNorm.convert_sync_batchnorm.

A model of 1000 BN layers (1d/2d/3d mixed, in Sequentials nested three deep); each timing is
the median of --runs conversions of a fresh copy of the model (copying is not timed).

    python bench/convert_sync.py [--layers 1000] [--runs 7]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from collections.abc import Callable

import torch
from torch import nn

import bnfix.torch as bt

BN_CLASSES = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


def build(layers: int) -> nn.Module:
    """`layers` BNs in blocks of 10, grouped by 10 blocks into stages."""
    bns = [BN_CLASSES[i % 3](8 + i % 5) for i in range(layers)]
    blocks = [nn.Sequential(*bns[i : i + 10]) for i in range(0, layers, 10)]
    return nn.Sequential(*[nn.Sequential(*blocks[i : i + 10]) for i in range(0, len(blocks), 10)])


def median_seconds(model: nn.Module, prepare: Callable[[nn.Module], nn.Module],
                   convert: Callable[[nn.Module], object], runs: int) -> float:
    times = []
    for _ in range(runs):
        fresh = prepare(copy.deepcopy(model))
        start = time.perf_counter()
        convert(fresh)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = build(args.layers)

    def same(m: nn.Module) -> nn.Module:
        return m

    rows = [
        ("nn.SyncBatchNorm.convert_sync_batchnorm", same,
         nn.SyncBatchNorm.convert_sync_batchnorm),
        ("bnfix.torch.convert_sync", same, bt.convert_sync),
        ("bnfix.torch.revert_sync", bt.convert_sync, bt.revert_sync),
        ("bnfix.torch.freeze", same, bt.freeze),
        ("bnfix.torch.unfreeze", bt.freeze, bt.unfreeze),
    ]
    print(f"{args.layers} BN layers, torch {torch.__version__}, median of {args.runs} runs")
    print(f"| {'conversion':<42} | {'ms':>8} |")
    print(f"|{'-' * 44}|{'-' * 10}|")
    for label, prepare, convert in rows:
        ms = 1000 * median_seconds(model, prepare, convert, args.runs)
        print(f"| {label:<42} | {ms:>8.1f} |")


if __name__ == "__main__":
    main()
