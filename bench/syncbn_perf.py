"""Per-step time of synced BN: bnfix.torch.SyncBatchNorm vs plain (unsynced) BN vs a naive
all-reduce SyncBN (detectron2's NaiveSyncBatchNorm) vs torch.nn.SyncBatchNorm (CUDA only).

Each rank runs a torchvision resnet18 / resnet50 (weights=None) on its shard: forward, backward,
one SUM all-reduce of the gradients, SGD step; the time is the median over --steps steps after
--warmup, of the slowest rank; the variants' steps are interleaved so they share the machine's
load alike. gloo on CPU (one thread per rank) by default; `--backend nccl`
puts one rank on each GPU and adds torch.nn.SyncBatchNorm (scripts/gpu-check runs that).
`--probe` (one rank, one GPU): bnfix's synced path under the one-rank probe, whose collectives
are identities: what the synced computation itself costs on the device against plain BN
(cuDNN's on CUDA); the naive SyncBN and torch's are plain BN on one rank and are left out.

    python bench/syncbn_perf.py [--models resnet18 resnet50] [--batch 16] [--size 64]
                                [--world 2] [--backend gloo|nccl] [--steps 10] [--probe]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import Tensor, nn

sys.path.insert(0, str(Path(__file__).resolve().parent))


class _AllReduce(torch.autograd.Function):
    """SUM all_reduce whose gradient is the SUM all_reduce of the gradient (detectron2's
    differentiable_all_reduce)."""

    @staticmethod
    def forward(ctx: object, x: Tensor) -> Tensor:  # type: ignore[override]
        out = x.clone()
        dist.all_reduce(out)
        return out

    @staticmethod
    def backward(ctx: object, grad: Tensor) -> Tensor:  # type: ignore[override]
        out = grad.clone()
        dist.all_reduce(out)
        return out


class NaiveSyncBatchNorm(nn.BatchNorm2d):
    """detectron2's NaiveSyncBatchNorm (stats_mode=""): per-rank mean and mean of squares, one
    all_reduce, var = E[x^2] - E[x]^2; autograd does the backward (equal batches assumed)."""

    def forward(self, input: Tensor) -> Tensor:
        if not self.training or dist.get_world_size() == 1:
            return super().forward(input)
        channels = input.shape[1]
        mean = torch.mean(input, dim=[0, 2, 3])
        meansqr = torch.mean(input * input, dim=[0, 2, 3])
        vec = _AllReduce.apply(torch.cat([mean, meansqr])) * (1.0 / dist.get_world_size())
        mean, meansqr = torch.split(vec, channels)
        var = meansqr - mean * mean
        self.running_mean += self.momentum * (mean.detach() - self.running_mean)
        self.running_var += self.momentum * (var.detach() - self.running_var)
        invstd = torch.rsqrt(var + self.eps)
        scale = self.weight * invstd
        bias = self.bias - mean * scale
        return input * scale.reshape(1, -1, 1, 1) + bias.reshape(1, -1, 1, 1)


def _naive(module: nn.Module) -> nn.Module:
    for name, child in module.named_children():
        if type(child) is nn.BatchNorm2d:
            naive = NaiveSyncBatchNorm(child.num_features)
            naive.load_state_dict(child.state_dict())
            setattr(module, name, naive)
        else:
            _naive(child)
    return module


def _variant(name: str, model: nn.Module) -> nn.Module:
    import bnfix.torch as bt

    if name == "bnfix":
        return bt.convert_sync(model, strict=True)
    if name == "naive":
        return _naive(model)
    if name == "torch":
        return nn.SyncBatchNorm.convert_sync_batchnorm(model)
    return model


def _rank(rank: int, args: argparse.Namespace, workdir: str) -> None:
    import zoo_models

    from bnfix.torch.functional import probing

    torch.set_num_threads(1)
    backend = args.backend
    dist.init_process_group(backend, init_method=f"file://{workdir}/store", rank=rank,
                            world_size=args.world, timeout=timedelta(seconds=600))
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(device)
    tv = zoo_models.import_torchvision()
    variants = ["plain", "bnfix"] if args.probe else \
        ["plain", "naive", "bnfix"] + (["torch"] if backend == "nccl" else [])
    results: dict[tuple[str, str], float] = {}
    gen = torch.Generator().manual_seed(rank)
    x = torch.randn(args.batch, 3, args.size, args.size, generator=gen).to(device)
    for model_name in args.models:
        runs = {}
        for variant in variants:
            torch.manual_seed(0)
            model = _variant(variant, tv.models.get_model(model_name, weights=None,
                                                          num_classes=10)).to(device).train()
            runs[variant] = (model, torch.optim.SGD(model.parameters(), lr=0.01), [])
        for step in range(args.warmup + args.steps):  # variants interleaved: same load
            for variant, (model, opt, times) in runs.items():
                if backend == "nccl":
                    torch.cuda.synchronize()
                dist.barrier()
                start = time.perf_counter()
                with probing() if args.probe and variant == "bnfix" else contextlib.nullcontext():
                    loss = model(x).square().mean()
                    opt.zero_grad()
                    loss.backward()
                flat = torch.cat([p.grad.flatten() for p in model.parameters()])
                dist.all_reduce(flat)
                opt.step()
                if backend == "nccl":
                    torch.cuda.synchronize()
                elapsed = torch.tensor([time.perf_counter() - start], device=device)
                dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
                if step >= args.warmup:
                    times.append(elapsed.item())
        for variant, (_, _, times) in runs.items():
            results[model_name, variant] = statistics.median(times)
    if rank == 0:
        torch.save(results, Path(workdir) / "results.pt")
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["resnet18", "resnet50"])
    parser.add_argument("--batch", type=int, default=16, help="samples per rank")
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--probe", action="store_true",
                        help="one rank: bnfix's synced path with identity collectives")
    args = parser.parse_args()
    if args.probe:
        args.world = 1
    with tempfile.TemporaryDirectory() as workdir:
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        mp.spawn(_rank, args=(args, workdir), nprocs=args.world)
        results = torch.load(Path(workdir) / "results.pt")
    variants = sorted({v for _, v in results}, key=["plain", "naive", "bnfix", "torch"].index)
    what = " (bnfix under the one-rank probe)" if args.probe else ""
    print(f"{args.world} {args.backend} ranks{what}, {args.batch}x3x{args.size}x{args.size} per rank, "
          f"torch {torch.__version__}; median ms per step (slowest rank), x plain BN")
    print("| model | " + " | ".join(variants) + " |")
    print("|---|" + "---|" * len(variants))
    for model_name in args.models:
        plain = results[model_name, "plain"]
        cells = [f"{1000 * results[model_name, v]:.0f} ({results[model_name, v] / plain:.2f}x)"
                 for v in variants]
        print(f"| {model_name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
