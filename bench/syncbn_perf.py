"""Per-step time of synced BN: bnfix.torch.SyncBatchNorm vs plain (unsynced) BN vs a naive
all-reduce SyncBN (detectron2's NaiveSyncBatchNorm) vs torch.nn.SyncBatchNorm (CUDA only).

Each rank runs a torchvision resnet18 / resnet50 (weights=None) on its shard: forward, backward,
one SUM all-reduce of the gradients, SGD step; the time is the median over --steps steps after
--warmup, of the slowest rank; the variants' steps are interleaved so they share the machine's
load alike. gloo on CPU (one thread per rank) by default; `--backend nccl`
puts one rank on each GPU and adds torch.nn.SyncBatchNorm (scripts/gpu-check runs that).
`--one-rank` (one GPU: NCCL refuses two ranks on one device): every synced variant on one rank
with its synced code path forced (each falls back to plain BN on one rank otherwise): bnfix's,
the naive one's and torch's own autograd function, each with its real collectives on the
one-rank group; what the synced computations cost on the device against plain BN (cuDNN's on
CUDA), without a peer to wait for.

`--graphs` (CUDA): also plain BN, the naive SyncBN and bnfix with forward and backward
captured as CUDA graphs (`torch.cuda.make_graphed_callables`): a step with no kernel launches
from the host, which bnfix's synced path allows (it never synchronises with the host) and
torch's does not (its forward reads which ranks are empty on the host).

`--count-ops`: instead, the aten calls one BN layer's training step dispatches (forward,
backward and the loss's own; counted with a TorchDispatchMode), plain BN against bnfix's synced
path under the one-rank probe: what an eager GPU step pays a kernel launch for, roughly.

    python bench/syncbn_perf.py [--models resnet18 resnet50] [--batch 16] [--size 64]
                                [--world 2] [--backend gloo|nccl] [--steps 10] [--one-rank]
                                [--graphs] [--count-ops]
"""

from __future__ import annotations

import argparse
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
    all_reduce, var = E[x^2] - E[x]^2; autograd does the backward (equal batches assumed).
    `force`: the synced path on one rank too (`--one-rank`)."""

    force = False

    def forward(self, input: Tensor) -> Tensor:
        if not self.training or (dist.get_world_size() == 1 and not self.force):
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


class OneRankTorchSyncBatchNorm(nn.SyncBatchNorm):
    """torch.nn.SyncBatchNorm whose training forward always takes torch's synced autograd
    function (torch's own forward falls back to plain BN on a one-rank group)."""

    def forward(self, input: Tensor) -> Tensor:
        if not self.training:
            return super().forward(input)
        self.num_batches_tracked.add_(1)
        return torch.nn.modules._functions.SyncBatchNorm.apply(
            input, self.weight, self.bias, self.running_mean, self.running_var, self.eps,
            self.momentum, dist.group.WORLD, 1)


def _force_bnfix_one_rank() -> None:
    """bnfix's layers take their synced path on the one-rank WORLD group (they are plain BN
    there otherwise): the group is named where bnfix's synced layers look it up."""
    from bnfix.torch import convert, functional, sync_bn

    group = dist.group.WORLD
    functional.GROUPS[group.group_name] = group
    sync_bn.sync_group = convert.sync_group = lambda _process_group: group.group_name


def _naive(module: nn.Module) -> nn.Module:
    for name, child in module.named_children():
        if type(child) is nn.BatchNorm2d:
            naive = NaiveSyncBatchNorm(child.num_features)
            naive.load_state_dict(child.state_dict())
            setattr(module, name, naive)
        else:
            _naive(child)
    return module


def _variant(name: str, model: nn.Module, one_rank: bool) -> nn.Module:
    import bnfix.torch as bt

    if name == "bnfix":
        return bt.convert_sync(model, strict=True)
    if name == "naive":
        model = _naive(model)
        for module in model.modules():
            if isinstance(module, NaiveSyncBatchNorm):
                module.force = one_rank
        return model
    if name == "torch":
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
        if one_rank:
            for module in model.modules():
                if isinstance(module, nn.SyncBatchNorm):
                    module.__class__ = OneRankTorchSyncBatchNorm
        return model
    return model


def _rank(rank: int, args: argparse.Namespace, workdir: str) -> None:
    import zoo_models

    torch.set_num_threads(1)
    backend = args.backend
    dist.init_process_group(backend, init_method=f"file://{workdir}/store", rank=rank,
                            world_size=args.world, timeout=timedelta(seconds=600))
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(device)
    if args.one_rank:
        _force_bnfix_one_rank()
    tv = zoo_models.import_torchvision()
    variants = ["plain", "naive", "bnfix"] + (["torch"] if backend == "nccl" else [])
    if args.graphs and backend == "nccl":
        variants += ["plain+graph", "naive+graph", "bnfix+graph"]
    results: dict[tuple[str, str], float | str] = {}
    gen = torch.Generator().manual_seed(rank)
    x = torch.randn(args.batch, 3, args.size, args.size, generator=gen).to(device)
    for model_name in args.models:
        runs = {}
        for variant in variants:
            torch.manual_seed(0)
            model = _variant(variant.removesuffix("+graph"),
                             tv.models.get_model(model_name, weights=None, num_classes=10),
                             args.one_rank).to(device).train()
            parameters = list(model.parameters())
            if variant.endswith("+graph"):
                try:
                    model = torch.cuda.make_graphed_callables(model, (x.clone(),))
                except RuntimeError as exc:  # recorded in the table; the others go on
                    results[model_name, variant] = f"capture failed: {str(exc).splitlines()[0]}"
                    continue
            runs[variant] = (model, parameters, torch.optim.SGD(parameters, lr=0.01), [])
        for step in range(args.warmup + args.steps):  # variants interleaved: same load
            for variant, (model, parameters, opt, times) in runs.items():
                if backend == "nccl":
                    torch.cuda.synchronize()
                dist.barrier()
                start = time.perf_counter()
                loss = model(x).square().mean()
                opt.zero_grad()
                loss.backward()
                flat = torch.cat([p.grad.flatten() for p in parameters])
                dist.all_reduce(flat)
                opt.step()
                if backend == "nccl":
                    torch.cuda.synchronize()
                elapsed = torch.tensor([time.perf_counter() - start], device=device)
                dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
                if step >= args.warmup:
                    times.append(elapsed.item())
        for variant, (_, _, _, times) in runs.items():
            results[model_name, variant] = statistics.median(times)
    if rank == 0:
        torch.save(results, Path(workdir) / "results.pt")
    dist.barrier()
    dist.destroy_process_group()


def count_ops() -> dict[str, int]:
    """aten calls of one BN2d layer's training step (see --count-ops), plain vs bnfix."""
    from torch.utils._python_dispatch import TorchDispatchMode

    import bnfix.torch as bt
    from bnfix.torch.functional import probing

    class _Count(TorchDispatchMode):
        calls = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            self.calls += 1
            return func(*args, **(kwargs or {}))

    counts = {}
    for name in ("plain", "bnfix"):
        layer = nn.Sequential(nn.BatchNorm2d(8)).train()
        if name == "bnfix":
            layer = bt.convert_sync(layer, strict=True)
        x = torch.randn(4, 8, 3, 3, requires_grad=True)
        with probing(), _Count() as counter:
            layer(x).sum().backward()
        counts[name] = counter.calls
    return counts


def _cell(result: float | str, plain: float) -> str:
    if isinstance(result, str):
        return result
    return f"{1000 * result:.0f} ({result / plain:.2f}x)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["resnet18", "resnet50"])
    parser.add_argument("--batch", type=int, default=16, help="samples per rank")
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--graphs", action="store_true",
                        help="also CUDA-graph captured plain BN, naive SyncBN and bnfix (nccl)")
    parser.add_argument("--one-rank", action="store_true",
                        help="one rank, every variant's synced path forced (one GPU)")
    parser.add_argument("--count-ops", action="store_true",
                        help="print the aten calls of one layer's training step and stop")
    args = parser.parse_args()
    if args.count_ops:
        counts = count_ops()
        print("aten calls of one BN layer's training step (forward, backward, the loss's): "
              + ", ".join(f"{name} {calls}" for name, calls in counts.items()))
        return
    if args.one_rank:
        args.world = 1
    with tempfile.TemporaryDirectory() as workdir:
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        mp.spawn(_rank, args=(args, workdir), nprocs=args.world)
        results = torch.load(Path(workdir) / "results.pt")
    order = ["plain", "naive", "bnfix", "torch", "plain+graph", "naive+graph", "bnfix+graph"]
    variants = sorted({v for _, v in results}, key=order.index)
    what = " (synced paths forced)" if args.one_rank else ""
    print(f"{args.world} {args.backend} ranks{what}, {args.batch}x3x{args.size}x{args.size} per rank, "
          f"torch {torch.__version__}; median ms per step (slowest rank), x plain BN")
    print("| model | " + " | ".join(variants) + " |")
    print("|---|" + "---|" * len(variants))
    for model_name in args.models:
        plain = results[model_name, "plain"]
        assert isinstance(plain, float)
        cells = [_cell(results.get((model_name, v), "-"), plain) for v in variants]
        print(f"| {model_name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
