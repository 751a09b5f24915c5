"""The cost of `bnfix.torch.monitor` on a ResNet-18 training step (CPU).

The model is ResNet-18's layout (BasicBlocks [2, 2, 2, 2], 64-512 channels, 20 BatchNorm2d)
built here, so torchvision is not needed. Each configuration trains --steps SGD steps on random
data; configurations are interleaved round by round (plain, every=10, every=1) so that machine
load hits them alike. Times are this process's CPU time (`time.process_time`: with one torch
thread, the step's compute, which other processes on a shared machine do not inflate the way
they inflate wall time; `--wall` for wall-clock time). The table gives each configuration's
mean time per step (sampled steps included: that is what a run pays), the median over the
rounds, its overhead against the plain run, and the median time of a sampled step on its own.

    python bench/monitor_overhead.py [--steps 40] [--rounds 3] [--batch 16] [--size 64]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from torch import nn

from bnfix.torch import monitor


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                            nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(out)) + identity)


def resnet18(classes: int = 10) -> nn.Module:
    layers: list[nn.Module] = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64),
                               nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        layers += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
        cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, classes)]
    return nn.Sequential(*layers)


def run(every: int | None, steps: int, batch: int, size: int,
        clock: Callable[[], float]) -> list[float]:
    """Per-step seconds of one training run (the first step, a warm-up, is dropped)."""
    torch.manual_seed(0)
    model = resnet18()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    images = torch.randn(batch, 3, size, size)
    labels = torch.randint(0, 10, (batch,))
    watcher = monitor(model, every=every) if every else None
    times = []
    for _ in range(steps + 1):
        start = clock()
        loss = nn.functional.cross_entropy(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        times.append(clock() - start)
    if watcher is not None:
        watcher.close()
    return times[1:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--wall", action="store_true", help="wall-clock time, not CPU time")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    clock = time.perf_counter if args.wall else time.process_time
    configs = [None, 10, 1]
    per_step: dict[int | None, list[float]] = {c: [] for c in configs}
    sampled: dict[int | None, list[float]] = {c: [] for c in configs}
    for _ in range(args.rounds):
        for every in configs:
            times = run(every, args.steps, args.batch, args.size, clock)
            per_step[every].append(statistics.mean(times))
            if every:  # the sampled steps are 1, 1+every, ...; index 0 (step 1) is dropped
                sampled[every] += [t for i, t in enumerate(times, start=2)
                                   if (i - 1) % every == 0]
    base = statistics.median(per_step[None])
    print(f"ResNet-18 (20 BatchNorm2d), batch {args.batch}, {args.size}x{args.size}, "
          f"{torch.get_num_threads()} threads, {args.steps} steps x {args.rounds} rounds, "
          f"{'wall' if args.wall else 'CPU'} time")
    print(f"{'configuration':<22} {'mean ms/step':>15} {'overhead':>9} {'sampled step ms':>16}")
    for every in configs:
        median = statistics.median(per_step[every])
        name = "plain" if every is None else f"monitor every={every}"
        cost = f"{statistics.median(sampled[every]) * 1e3:16.1f}" if sampled[every] else \
            f"{'-':>16}"
        print(f"{name:<22} {median * 1e3:15.1f} {100 * (median / base - 1):8.1f}% {cost}")
    print("rounds (mean ms/step): " + "; ".join(
        f"{'plain' if c is None else f'every={c}'} "
        + " ".join(f"{t * 1e3:.0f}" for t in per_step[c]) for c in configs))


if __name__ == "__main__":
    main()
