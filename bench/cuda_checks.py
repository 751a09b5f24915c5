"""CUDA checks of bnfix.torch.SyncBatchNorm that CPU machines cannot run (scripts/gpu-check).

1. CUDA-graph capture: a converted model's training step (forward, backward) is captured in a
   torch.cuda.CUDAGraph and replayed; capture fails on any device-to-host synchronisation
   (`.item()`, `float()`, a branch on a tensor value), so a replay equal to eager mode proves
   there is none. With 2+ GPUs on 2 NCCL ranks; with one GPU on one rank under
   `bnfix.torch.functional.probing` (the synced code path with one-rank collectives).
2. torch.compile(fullgraph=True, inductor) of the converted model on CUDA, equal to eager.
3. The synced path against torch's plain BN on CUDA (one rank: the probe's identity
   collectives; the global batch is the local one): output, input, weight and bias gradients
   and running statistics, for BN1d (N, C) and (N, C, L), BN2d contiguous and channels-last,
   BN3d, affine=False, float64 and float16 inputs.

    python bench/cuda_checks.py            # exit 0 when every check passes, 1 otherwise
"""

from __future__ import annotations

import contextlib
import copy
import sys
import tempfile
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import Tensor, nn

import bnfix.torch as bt
from bnfix.torch.functional import probing

TOLERANCE = 1e-4


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                         nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 8),
                         nn.BatchNorm1d(8))


def _error(a: Tensor, b: Tensor) -> float:
    return (a.double() - b.double()).abs().max().item() / max(b.abs().max().item(), 1e-12)


@contextlib.contextmanager
def _synced_path(world: int) -> Iterator[None]:
    """With one rank, the probe takes the synced code path; with a group, the group does."""
    if world > 1:
        yield
        return
    with probing():
        yield


def _graph_step(model: nn.Module, x: Tensor, world: int) -> float:
    """Capture forward + backward in a CUDA graph, replay, compare with an eager step."""
    eager = copy.deepcopy(model)
    static_x = x.clone().requires_grad_(True)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), _synced_path(world):
        for _ in range(3):  # warm-up on a side stream, as CUDA graphs require
            model(static_x).sum().backward()
    torch.cuda.current_stream().wait_stream(stream)
    model.load_state_dict(eager.state_dict())
    for p in model.parameters():
        p.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), _synced_path(world):
        static_out = model(static_x)
        static_out.sum().backward()
    model.load_state_dict(eager.state_dict())
    graph.replay()
    torch.cuda.synchronize()
    xe = x.clone().requires_grad_(True)
    with _synced_path(world):
        out = eager(xe)
        out.sum().backward()
    return max(_error(static_out, out), _error(static_x.grad, xe.grad))


def _compiled_step(model: nn.Module, x: Tensor, world: int) -> float:
    eager = copy.deepcopy(model)
    compiled = torch.compile(model, fullgraph=True)
    with _synced_path(world):
        got = compiled(x)
        want = eager(x)
    return _error(got, want)


def _against_plain(device: torch.device) -> float:
    """Worst relative error of the synced path (one-rank probe) against plain BN, over the
    layouts and dtypes above, each after two training steps (the second sees the running
    statistics the first left)."""
    cases = [(nn.BatchNorm1d(6), (32, 6), torch.float32, False),
             (nn.BatchNorm1d(6), (8, 6, 10), torch.float32, False),
             (nn.BatchNorm2d(5), (8, 5, 7, 9), torch.float32, False),
             (nn.BatchNorm2d(5), (8, 5, 7, 9), torch.float32, True),
             (nn.BatchNorm3d(4), (4, 4, 3, 5, 6), torch.float32, False),
             (nn.BatchNorm2d(5, affine=False), (8, 5, 4, 4), torch.float32, False),
             (nn.BatchNorm2d(5).double(), (8, 5, 4, 4), torch.float64, False),
             (nn.BatchNorm2d(5), (16, 5, 8, 8), torch.float16, False)]
    worst = 0.0
    for i, (plain, shape, dtype, channels_last) in enumerate(cases):
        torch.manual_seed(i)
        plain = plain.to(device).train()
        if plain.affine:
            with torch.no_grad():
                plain.weight.uniform_(0.5, 1.5)
                plain.bias.uniform_(-0.5, 0.5)
        synced = bt.convert_sync(copy.deepcopy(plain), strict=True)
        for _ in range(2):
            x = (torch.randn(shape, device=device) * 3 + 1).to(dtype)
            if channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            weights = torch.randn(shape, device=device).to(dtype)
            results = []
            for module in (synced, plain):
                xg = x.clone().requires_grad_(True)
                with _synced_path(1) if module is synced else contextlib.nullcontext():
                    out = module(xg)
                    (out.float() * weights.float()).sum().backward()
                grads = [p.grad.clone() for p in module.parameters()]
                results.append([out, xg.grad, *grads, module.running_mean, module.running_var])
                for p in module.parameters():
                    p.grad = None
            scale = 50.0 if dtype == torch.float16 else 1.0  # half rounding, either way
            worst = max(worst, *(_error(a, b) / scale for a, b in zip(*results)))
    return worst


def _checks(rank: int, world: int) -> list[str]:
    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    model = bt.convert_sync(_model(), strict=True).to(device).train()
    gen = torch.Generator().manual_seed(rank)
    x = torch.randn(8, 3, 16, 16, generator=gen).to(device)
    lines = []
    if world == 1:
        try:
            error = _against_plain(device)
            verdict = "ok" if error <= TOLERANCE else "FAIL"
            lines.append(f"synced path vs plain BN (8 layouts and dtypes, 2 steps): worst rel "
                         f"error {error:.1e} {verdict}")
        except Exception as exc:  # noqa: BLE001 - report every check, then fail
            lines.append(f"synced path vs plain BN: FAIL {type(exc).__name__}: "
                         f"{str(exc).splitlines()[0]}")
    for name, check in (("CUDA graph capture + replay", _graph_step),
                        ("torch.compile(fullgraph=True, inductor)", _compiled_step)):
        try:
            error = check(copy.deepcopy(model), x, world)
            verdict = "ok" if error <= TOLERANCE else "FAIL"
            lines.append(f"{name}: rel error vs eager {error:.1e} {verdict}")
        except Exception as exc:  # noqa: BLE001 - report every check, then fail
            lines.append(f"{name}: FAIL {type(exc).__name__}: {str(exc).splitlines()[0]}")
    return lines


def _rank(rank: int, world: int, workdir: str) -> None:
    dist.init_process_group("nccl", init_method=f"file://{workdir}/store", rank=rank,
                            world_size=world, timeout=timedelta(seconds=300))
    lines = _checks(rank, world)
    if rank == 0:
        (Path(workdir) / "lines.txt").write_text("\n".join(lines))
    dist.barrier()
    dist.destroy_process_group()


def main() -> int:
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus == 0:
        print("cuda_checks: no CUDA GPU: nothing to check")
        return 0
    if gpus >= 2 and dist.is_nccl_available():
        with tempfile.TemporaryDirectory() as workdir:
            mp.spawn(_rank, args=(2, workdir), nprocs=2)
            lines = (Path(workdir) / "lines.txt").read_text().splitlines()
        where = "2 NCCL ranks"
    else:
        lines = _checks(0, 1)
        where = "1 GPU, synced path under a one-rank probe"
    for line in lines:
        print(f"cuda_checks ({where}): {line}")
    return 0 if all(line.endswith(" ok") for line in lines) else 1


if __name__ == "__main__":
    sys.exit(main())
