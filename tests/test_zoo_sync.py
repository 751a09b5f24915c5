"""One training step of converted zoo models on 2 gloo ranks equals the global batch on one process.

A representative subset (bench/zoo.py has the rest): torchvision resnet18 (plain BN2d),
timm efficientnet_b0 (BatchNormAct2d: the redirected derived class), fastvit_t8 (norm-act
inside reparameterisable blocks) and levit_128s (BN1d after Linear in attention). Each rank
converts the model with bnfix.torch.convert_sync, runs one SGD step on its half of the batch
(uneven halves: 3 and 5 samples, float64), loss = sum over its samples / global batch, gradients SUM
all-reduced; the reference is the unconverted model fed the whole batch. Errors are relative to
each tensor's largest reference value, gradients and running statistics floored at 1e-3 of
the model's largest of their kind. Dropout and drop path
are off (they draw different numbers on a rank than in the reference). How torchvision and timm
import on a CPU torch: see tests/test_zoo.py and bench/zoo_models.py.
"""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import Tensor, nn

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))
import zoo_models

try:
    zoo_models.import_timm()
except ImportError as exc:  # pragma: no cover - dev extras not installed
    pytest.skip(f"torchvision / timm not installed ({exc}): pip install -e '.[dev]'",
                allow_module_level=True)

MODELS = ["torchvision:resnet18", "timm:efficientnet_b0", "timm:fastvit_t8", "timm:levit_128s"]
# efficientnet_b0 after timm.layers.convert_sync_batchnorm: its SyncBatchNormAct layers are
# torch SyncBatchNorm subclasses (CUDA-only sync), converted by bnfix to run on gloo
TIMM_SYNCED = "timm-sync:efficientnet_b0"
SHARDS = (3, 5)
TOLERANCE = 1e-9  # float64: rounding is ~1e-13 of each tensor's scale


def _timm_synced() -> nn.Module:
    timm = zoo_models.import_timm()
    [entry] = zoo_models.timm_models(["efficientnet_b0"])
    return timm.layers.convert_sync_batchnorm(entry.build())


def _entries() -> list[zoo_models.ZooModel]:
    entries = zoo_models.zoo(MODELS)
    assert len(entries) == len(MODELS)
    base = next(e for e in entries if e.name == "efficientnet_b0")
    return [*entries, zoo_models.ZooModel("efficientnet_b0 (timm SyncBatchNormAct)",
                                          "timm-sync", base.kind, _timm_synced, base.size)]


def _no_dropout(model: nn.Module) -> nn.Module:
    model.train()
    for module in model.modules():
        if isinstance(module, nn.Dropout) or "DropPath" in type(module).__name__:
            module.eval()
    return model


def _step(model: nn.Module, x: Tensor, total: int) -> dict[str, Tensor]:
    """One SGD step on x: outputs, input grad, parameter grads (before any reduction) and the
    running statistics after it."""
    x = x.clone().requires_grad_(True)
    out = model(x)
    gen = torch.Generator().manual_seed(7)
    weights = torch.randn(total, out.shape[1], generator=gen, dtype=out.dtype)
    start = 0 if len(x) == total else (0 if dist.get_rank() == 0 else SHARDS[0])
    (out * weights[start:start + len(x)]).sum().div(total).backward()
    record = {"out": out.detach(), "x_grad": x.grad}
    record.update({f"{n}.grad": p.grad for n, p in model.named_parameters()
                   if p.grad is not None})
    return record


def _rank_main(rank: int, world: int, workdir: str) -> None:
    sys.path.insert(0, str(BENCH))
    import bnfix.torch as bt

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{workdir}/store", rank=rank,
                            world_size=world, timeout=timedelta(seconds=300))
    results = {}
    for entry in _entries():
        model = _no_dropout(entry.build().double())
        report = bt.ConversionReport()
        bt.convert_sync(model, strict=True, report=report)
        x = entry.inputs(sum(SHARDS), seed=3).double()
        start = sum(SHARDS[:rank])
        record = _step(model, x[start:start + SHARDS[rank]], sum(SHARDS))
        for key, value in record.items():
            if key.endswith(".grad") and key != "x_grad":
                dist.all_reduce(value)
        record.update({n: b.clone() for n, b in model.named_buffers()})
        results[entry.name] = {"record": record, "converted": len(report.converted)}
    torch.save(results, Path(workdir) / f"rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    workdir = tmp_path_factory.mktemp("zoo_sync")
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_rank_main, args=(rank, 2, str(workdir))) for rank in range(2)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=600)
    for proc in procs:
        if proc.is_alive():
            proc.kill()
    assert [proc.exitcode for proc in procs] == [0, 0]
    return [torch.load(workdir / f"rank{r}.pt", weights_only=False) for r in range(2)]


@pytest.mark.slow
@pytest.mark.parametrize("key", [*MODELS, TIMM_SYNCED])
def test_two_gloo_ranks_equal_the_global_batch(ranks: list[dict], key: str) -> None:
    torch.set_num_threads(1)
    entry = next(e for e in _entries() if f"{e.library}:{e.name}".startswith(key))
    model = _no_dropout(entry.build().double())
    x = entry.inputs(sum(SHARDS), seed=3).double()
    want = _step(model, x, sum(SHARDS))
    want.update({n: b.clone() for n, b in model.named_buffers()})
    got = {key_: torch.cat([r[entry.name]["record"][key_] for r in ranks])
           if key_ in ("out", "x_grad") else ranks[0][entry.name]["record"][key_]
           for key_ in want}
    worst = 0.0
    def category(name: str) -> str:
        return "grad" if name.endswith(".grad") else "running" if "running" in name else name

    top: dict[str, float] = {}
    for name, value in want.items():
        top[category(name)] = max(top.get(category(name), 0.0), value.abs().max().item())
    for name, value in want.items():
        # floored at 1e-3 of the model's largest of the kind (as `bnfix validate`): a BN bias
        # before a conv and a BN has a gradient, the BN after it a running mean, that is
        # rounding noise in exact arithmetic (2e-9 where the running variances are ~1)
        floor = 1e-3 * top[category(name)] if category(name) != name else 1e-6
        scale = max(value.double().abs().max().item(), floor)
        error = (got[name].double() - value.double()).abs().max().item() / scale
        worst = max(worst, error)
        assert error <= TOLERANCE, (name, error)
    for name in want:  # both ranks ended with the same running statistics
        if "running" in name:
            assert torch.equal(ranks[0][entry.name]["record"][name],
                               ranks[1][entry.name]["record"][name])
    print(f"\n{key}: {ranks[0][entry.name]['converted']} BN synced, 2 ranks (3+5) vs the "
          f"global batch: worst rel error {worst:.1e} over outputs, grads and running stats")
