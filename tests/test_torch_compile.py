"""torch.compile(fullgraph=True) of a model converted by bnfix.torch.convert_sync, on 2 gloo ranks.

fullgraph=True makes any graph break an error, so a compiled step that runs at all has zero
breaks (the default backend here is aot_eager: dynamo's capture and AOTAutograd's joint
forward/backward graph, without inductor's code generation, which is slow on CPU and set by
BNFIX_COMPILE_BACKEND); the test also asks torch._dynamo.explain for the count and compares the compiled steps
(outputs, input and parameter gradients, running statistics) with the same steps in eager mode.
The model has plain BN (1d and 2d), a BN subclass and a norm-act layer calling F.batch_norm
itself (timm's BatchNormAct2d pattern), so both the SyncBatchNorm forward and the redirected
derived classes are compiled, and the collectives are the functional ones (one all_gather in
forward, one all_reduce in backward per layer).
"""

from __future__ import annotations

import copy
import os
import time
from datetime import timedelta
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import Tensor, nn

import bnfix.torch as bt

STEPS = 2
# BNFIX_COMPILE_BACKEND=inductor compiles to code as well (~2.5 min on 2 CPU cores; the
# capture, the part that breaks graphs, is the same): scripts/gpu-check runs it on CUDA.
BACKEND = os.environ.get("BNFIX_COMPILE_BACKEND", "aot_eager")
TOLERANCE = 1e-4  # inductor fuses and reorders fp32 arithmetic; a missing sync is O(1)


class NormAct2d(nn.BatchNorm2d):
    """timm's BatchNormAct2d pattern: F.batch_norm called directly, then an activation."""

    def __init__(self, channels: int) -> None:
        super().__init__(channels)
        self.act = nn.ReLU()

    def forward(self, x: Tensor) -> Tensor:
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training:
            self.num_batches_tracked.add_(1)
        x = F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                         self.training, factor, self.eps)
        return self.act(x)


class HalfBatchNorm2d(nn.BatchNorm2d):
    def forward(self, x: Tensor) -> Tensor:
        return super().forward(x) * 0.5


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1), NormAct2d(8),
        nn.Conv2d(8, 8, 1), HalfBatchNorm2d(8),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 6), nn.BatchNorm1d(6),
    )


def _step_records(model: nn.Module, rank: int) -> list[dict[str, Tensor]]:
    records = []
    for step in range(STEPS):
        gen = torch.Generator().manual_seed(10 * step + rank)
        x = (torch.randn(4 + rank, 3, 6, 6, generator=gen) + rank).requires_grad_(True)
        out = model(x)
        (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
        record = {"out": out.detach().clone(), "x_grad": x.grad.clone()}
        module = getattr(model, "_orig_mod", model)  # names without torch.compile's prefix
        for name, p in module.named_parameters():
            record[f"{name}.grad"] = p.grad.clone()
            p.grad = None
        record.update({n: b.clone() for n, b in module.named_buffers()})
        records.append(record)
    return records


def _rank_main(rank: int, world: int, workdir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{workdir}/store", rank=rank,
                            world_size=world, timeout=timedelta(seconds=300))
    model = bt.convert_sync(_model(), strict=True)
    compiled_model = copy.deepcopy(model)
    explained = torch._dynamo.explain(copy.deepcopy(model))(torch.randn(4, 3, 6, 6))
    start = time.perf_counter()
    compiled = torch.compile(compiled_model, fullgraph=True, backend=BACKEND)
    got = _step_records(compiled, rank)
    compile_seconds = time.perf_counter() - start
    want = _step_records(model, rank)
    torch.save({"got": got, "want": want, "breaks": explained.graph_break_count,
                "graphs": explained.graph_count, "seconds": compile_seconds},
               Path(workdir) / f"rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.slow
def test_compiled_synced_model_has_no_graph_break_and_matches_eager(tmp_path: Path) -> None:
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_rank_main, args=(rank, 2, str(tmp_path))) for rank in range(2)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=600)
    for proc in procs:
        if proc.is_alive():
            proc.kill()
    assert [proc.exitcode for proc in procs] == [0, 0]
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    worst = 0.0
    for record in ranks:
        assert record["breaks"] == 0 and record["graphs"] == 1
        for got, want in zip(record["got"], record["want"], strict=True):
            assert got.keys() == want.keys()
            for key, value in want.items():
                scale = max(value.double().abs().max().item(), 1e-6)
                error = (got[key].double() - value.double()).abs().max().item() / scale
                assert error <= TOLERANCE, (key, error)
                worst = max(worst, error)
    print(f"\ncompiled ({BACKEND}) vs eager, 2 gloo ranks: worst rel error {worst:.1e}, "
          f"compile + {STEPS} steps {ranks[0]['seconds']:.0f} s")
