"""bnfix.torch.SyncBatchNorm: equal to plain BN on the concatenated global batch.

The slow tests run real `torch.distributed` process groups (gloo on CPU: 2 and 4 processes,
uneven per-rank batches, empty ranks) for 3 SGD steps and compare outputs, input gradients,
parameter gradients, parameters and running statistics with one plain-BN model fed the global
batch; they also measure the gap left by unsynced BN. Errors are the max abs difference divided
by the reference tensor's max abs value; run with `-s` to see them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import Tensor, nn

import bnfix.torch as bt
from bnfix.torch import functional
from bnfix.torch.functional import local_moments, merge_moments

STEPS = 3
LR = 0.1
# Per-step, per-rank batch sizes: uneven, with empty ranks.
BATCHES = {2: [[3, 5], [6, 0], [2, 4]], 4: [[3, 0, 5, 2], [2, 4, 0, 3], [2, 2, 2, 2]]}
TOLERANCE = {torch.float64: 1e-12, torch.float32: 5e-6}
# fp64 inputs of mean 1e4, spread 2: one ulp of the mean is ~1e-12 of the spread, so plain fp64
# BN (the reference) is itself only that accurate.
LARGE_MEAN_FP64_TOLERANCE = 1e-11


class ScaledBatchNorm2d(nn.BatchNorm2d):
    """A BN subclass with its own attribute and forward override (kept by convert_sync)."""

    def __init__(self, num_features: int) -> None:
        super().__init__(num_features)
        self.scale = 0.5

    def forward(self, x: Tensor) -> Tensor:
        return super().forward(x) * self.scale


def _cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
        nn.Conv2d(4, 4, 3, padding=1, groups=2), ScaledBatchNorm2d(4), nn.ReLU(),
        nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(16, 6), nn.BatchNorm1d(6),
    )


def _bn3d() -> nn.Module:
    return nn.Sequential(nn.Conv3d(2, 3, 2), nn.BatchNorm3d(3), nn.ReLU())


def _bn1d_seq() -> nn.Module:
    return nn.Sequential(nn.Conv1d(3, 3, 1), nn.BatchNorm1d(3, momentum=None), nn.ReLU(),
                         nn.BatchNorm1d(3, affine=False))


def _large_mean() -> nn.Module:
    return nn.Sequential(nn.BatchNorm1d(4, momentum=None), nn.Linear(7, 2))


def _no_running_stats() -> nn.Module:
    return nn.Sequential(nn.BatchNorm2d(3, affine=False, track_running_stats=False),
                         nn.Conv2d(3, 2, 1))


# name -> (model builder, per-sample input shape, per-sample output shape, input offset)
MODELS: dict[str, tuple[Callable[[], nn.Module], tuple[int, ...], tuple[int, ...], float]] = {
    "cnn": (_cnn, (3, 6, 6), (6,), 0.0),
    "bn3d": (_bn3d, (2, 4, 4, 4), (3, 3, 3, 3), 0.0),
    "bn1d_ncl": (_bn1d_seq, (3, 5), (3, 5), 0.0),
    "large_mean": (_large_mean, (4, 7), (4, 2), 1e4),
    "no_running_stats": (_no_running_stats, (3, 4, 4), (2, 4, 4), 0.0),
}
SCENARIOS = [(name, dtype) for name in MODELS for dtype in (torch.float64, torch.float32)]
UNSYNCED = ("cnn", torch.float64)


def _model(name: str, dtype: torch.dtype, device: torch.device) -> nn.Module:
    torch.manual_seed(0)
    return MODELS[name][0]().to(device=device, dtype=dtype)


def _batches(name: str, dtype: torch.dtype, sizes: list[list[int]]) -> list[tuple[Tensor, Tensor]]:
    """Each step's global batch and the weights of its linear loss, rounded to `dtype`: the same
    on every rank and in the reference."""
    _, shape, out_shape, offset = MODELS[name]
    batches = []
    for step, step_sizes in enumerate(sizes):
        gen = torch.Generator().manual_seed(100 * list(MODELS).index(name) + step)
        total = sum(step_sizes)
        x = torch.randn(total, *shape, generator=gen, dtype=torch.float64) * 2 + 0.5 + offset
        weights = torch.randn(total, *out_shape, generator=gen, dtype=torch.float64)
        batches.append((x.to(dtype), weights.to(dtype)))
    return batches


def _train(model: nn.Module, batches: list[tuple[Tensor, Tensor]], sizes: list[list[int]],
           rank: int, reduce_grads: Callable[[list[Tensor]], None]) -> dict:
    """SGD steps on this rank's slice of each global batch (the whole batch for the reference);
    loss = sum(out * w) / global batch size, so summed gradients are the global ones."""
    param = next(model.parameters())
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    record: dict[str, list] = {"out": [], "x_grad": [], "grads": []}
    for (x_all, w_all), step_sizes in zip(batches, sizes, strict=True):
        start = sum(step_sizes[:rank])
        stop = start + step_sizes[rank]
        x = x_all[start:stop].to(param).requires_grad_(True)
        out = model(x)
        loss = (out * w_all[start:stop].to(param)).sum() / len(x_all)
        opt.zero_grad()
        loss.backward()
        grads = [p.grad for p in model.parameters()]
        reduce_grads(grads)
        record["out"].append(out.detach().cpu())
        record["x_grad"].append(x.grad.cpu())
        record["grads"].append([g.cpu().clone() for g in grads])
        opt.step()
    record["state"] = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    return record


def _rank_main(rank: int, world: int, workdir: str) -> None:
    """One gloo (or NCCL) rank: every scenario synced, plus the unsynced baseline."""
    torch.set_num_threads(1)
    backend = bt.default_backend()
    dist.init_process_group(backend, init_method=f"file://{workdir}/store", rank=rank,
                            world_size=world, timeout=timedelta(seconds=60))
    device = torch.device(f"cuda:{rank}") if backend == "nccl" else torch.device("cpu")

    def all_reduce(grads: list[Tensor]) -> None:
        for grad in grads:
            dist.all_reduce(grad)

    results = {}
    for name, dtype in SCENARIOS:
        model = _model(name, dtype, device)
        params_before = list(model.parameters())
        report = bt.ConversionReport()
        bt.convert_sync(model, strict=True, report=report)
        if list(model.parameters()) != params_before or not report.converted:
            raise AssertionError("convert_sync changed the parameters or converted nothing")
        results[name, dtype] = _train(model, _batches(name, dtype, BATCHES[world]),
                                      BATCHES[world], rank, all_reduce)
    model = _model(*UNSYNCED, device)
    results["unsynced"] = _train(model, _batches(*UNSYNCED, BATCHES[world]), BATCHES[world],
                                 rank, all_reduce)
    torch.save(results, Path(workdir) / f"rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


def _run_ranks(world: int, workdir: Path) -> tuple[list[dict], float]:
    ctx = mp.get_context("spawn")
    start = time.perf_counter()
    procs = [ctx.Process(target=_rank_main, args=(rank, world, str(workdir)))
             for rank in range(world)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=300)
    wall = time.perf_counter() - start
    for proc in procs:
        if proc.is_alive():
            proc.kill()
    codes = [proc.exitcode for proc in procs]
    assert codes == [0] * world, f"rank exit codes {codes}"
    ranks = [torch.load(workdir / f"rank{r}.pt", weights_only=False) for r in range(world)]
    return ranks, wall


def _reference(name: str, dtype: torch.dtype, world: int,
               compute: torch.dtype | None = None) -> dict:
    """Plain nn.BatchNorm on one process with the concatenated global batch: the model and data
    of the `dtype` run, computed in `compute` (default: `dtype`)."""
    sizes = [[sum(s)] for s in BATCHES[world]]
    model = _model(name, dtype, torch.device("cpu")).to(compute or dtype)
    return _train(model, _batches(name, dtype, BATCHES[world]), sizes, 0, lambda grads: None)


def _error(got: Tensor, want: Tensor) -> float:
    """Max abs difference relative to the reference's max abs value."""
    if not want.numel():
        return 0.0
    return (got - want).abs().max().item() / want.abs().max().item()


def _errors(ranks: list[dict], key: object, ref: dict) -> dict[str, float]:
    """Max error per quantity over all steps: outputs and input grads concatenated over ranks;
    all parameter grads of a step as one vector (the conv/linear biases right before a BN have an
    exact zero gradient: rounding noise only), on every rank; final state per tensor, every rank."""
    errs = {"out": 0.0, "x_grad": 0.0, "param_grad": 0.0, "state": 0.0}
    for step in range(STEPS):
        for field in ("out", "x_grad"):
            got = torch.cat([r[key][field][step] for r in ranks])
            errs[field] = max(errs[field], _error(got, ref[field][step]))
        want = torch.cat([g.flatten() for g in ref["grads"][step]])
        for r in ranks:
            got = torch.cat([g.flatten() for g in r[key]["grads"][step]])
            errs["param_grad"] = max(errs["param_grad"], _error(got, want))
    for r in ranks:
        for k, want in ref["state"].items():
            got = r[key]["state"][k]
            errs["state"] = max(errs["state"], _error(got.double(), want.double()))
    return errs


@pytest.fixture(scope="module", params=[2, 4], ids=lambda w: f"{w}ranks")
def gloo_run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
             ) -> tuple[int, list[dict], float]:
    world = request.param
    ranks, wall = _run_ranks(world, tmp_path_factory.mktemp(f"gloo{world}"))
    print(f"\n{world} {bt.default_backend()} ranks: {wall:.1f} s wall (spawn + all scenarios)")
    return world, ranks, wall


def _show(label: str, errs: dict[str, float]) -> str:
    return f"{label}: " + "  ".join(f"{k} {v:.1e}" for k, v in errs.items())


@pytest.mark.slow
@pytest.mark.parametrize(("name", "dtype"), SCENARIOS, ids=[f"{n}-{str(d)[6:]}"
                                                              for n, d in SCENARIOS])
def test_synced_matches_global_batch(gloo_run: tuple[int, list[dict], float], name: str,
                                     dtype: torch.dtype) -> None:
    """fp64 against plain fp64 BN; fp32 against plain fp32 BN and against the exact (fp64)
    computation on the same fp32 model and data. With mean 1e4 and spread 2 (large_mean), torch's
    own fp32 BN is off by ~1e-4 from the exact result and bnfix's is not: there the fp32 check is
    against the exact result only."""
    world, ranks, _ = gloo_run
    plain = _reference(name, dtype, world)
    vs_plain = _errors(ranks, (name, dtype), plain)
    print(_show(f"\n{world} ranks {name} {dtype} vs plain BN", vs_plain))
    if dtype == torch.float64:
        tolerance = LARGE_MEAN_FP64_TOLERANCE if name == "large_mean" else TOLERANCE[dtype]
        assert max(vs_plain.values()) < tolerance, vs_plain
        return
    exact = _reference(name, dtype, world, compute=torch.float64)
    vs_exact = _errors(ranks, (name, dtype), exact)
    plain_vs_exact = _errors([{"plain": plain}], "plain", exact)
    print(_show(f"{world} ranks {name} {dtype} vs exact", vs_exact))
    print(_show(f"{world} ranks {name} plain torch fp32 BN vs exact", plain_vs_exact))
    assert max(vs_exact.values()) < TOLERANCE[dtype], vs_exact
    if name == "large_mean":
        assert plain_vs_exact["out"] > 100 * vs_exact["out"]
    else:
        assert max(vs_plain.values()) < TOLERANCE[dtype], vs_plain


@pytest.mark.slow
def test_unsynced_bn_differs_from_global_batch(gloo_run: tuple[int, list[dict], float]) -> None:
    """The gap sync closes: per-rank BN (same data, grads summed) is far from the global batch."""
    world, ranks, _ = gloo_run
    ref = _reference(*UNSYNCED, world)
    unsynced = _errors(ranks, "unsynced", ref)
    synced = _errors(ranks, UNSYNCED, ref)
    print(f"\n{world} ranks unsynced: " + "  ".join(f"{k} {v:.1e}" for k, v in unsynced.items()))
    assert min(unsynced["out"], unsynced["x_grad"], unsynced["param_grad"]) > 1e-2
    assert max(synced.values()) < 1e-12
    # unsynced ranks also drift apart: their running statistics differ
    states = [r["unsynced"]["state"]["1.running_mean"] for r in ranks]
    assert any(not torch.equal(states[0], s) for s in states[1:])


@pytest.mark.parametrize("inner", [(), (2,), (3, 2), (7,), (8,), (4, 4)])
def test_channel_sums_are_the_kernels_on_every_row_length(inner: tuple[int, ...],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows of 2-7 elements per (sample, channel) take two plain reductions instead of torch's
    slow kernel: the same sums (fp64), for the forward's moments and the backward's dot."""
    gen = torch.Generator().manual_seed(0)
    c = torch.randn(5, 3, *inner, generator=gen, dtype=torch.float64)
    dy = torch.randn(c.shape, generator=gen, dtype=torch.float64)
    mean = torch.tensor([0.1, -0.2, 0.3], dtype=torch.float64)
    var = torch.tensor([0.5, 2.0, 1.5], dtype=torch.float64)
    chosen = functional._channel_sums(dy, c, mean, var, 1e-3)
    monkeypatch.setattr(functional, "_CPU_KERNEL_MIN_INNER", 0)  # always the kernel
    kernel = functional._channel_sums(dy, c, mean, var, 1e-3)
    xhat = (c - mean.view(1, -1, *[1] * len(inner))) / (var + 1e-3).sqrt().view(
        1, -1, *[1] * len(inner))
    dims = [0, *range(2, c.dim())]
    for got in (chosen, kernel):
        torch.testing.assert_close(got[0], (dy * xhat).sum(dims), rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(got[1], dy.sum(dims), rtol=1e-12, atol=1e-12)


def test_merge_is_stable_where_sum_of_squares_is_not() -> None:
    """fp32 data with mean 1e4 and spread 2 on 4 "ranks" (one empty): the shifted moments and
    their Chan merge keep the variance to ~1e-7 relative, E[x^2] - E[x]^2 loses it entirely."""
    gen = torch.Generator().manual_seed(0)
    chunks64 = [(torch.randn(n, 4, generator=gen, dtype=torch.float64) * 2 + 1e4).float().double()
                for n in (300, 0, 500, 200)]
    truth = torch.cat(chunks64).var(0, unbiased=False)
    rows = torch.stack([local_moments(chunk.float())[0] for chunk in chunks64])
    _, mean, var = merge_moments(rows, 4)
    merged_err = (var[0] - truth).abs().max().item() / truth.max().item()
    # the mean keeps each rank's rounding residual: exact to far below fp32's ulp at 1e4
    true_mean = torch.cat(chunks64).mean(0)
    assert (mean[0] - true_mean).abs().max().item() < 1e-6 * truth.sqrt().min().item()
    x32 = torch.cat(chunks64).float()
    naive = (x32.square().mean(0) - x32.mean(0).square()).double()
    naive_err = (naive - truth).abs().max().item() / truth.max().item()
    print(f"\nvariance rel. error, fp32, mean 1e4: merge {merged_err:.1e}, E[x2]-E[x]2 {naive_err:.1e}")
    assert merged_err < 1e-6
    assert naive_err > 1e-2


def _compare_with_plain(make: Callable[[type[nn.Module]], nn.Module], shape: tuple[int, ...],
                        dtype: torch.dtype = torch.float64) -> None:
    """Without a process group SyncBatchNorm is exactly plain BN: outputs, grads, buffers."""
    torch.manual_seed(0)
    plain = make(nn.BatchNorm2d).to(dtype)
    synced = make(bt.SyncBatchNorm).to(dtype)
    synced.load_state_dict(plain.state_dict())
    for step in range(STEPS):
        x = torch.randn(*shape, dtype=dtype) + step
        outs = []
        for module in (plain, synced):
            xi = x.clone().requires_grad_(True)
            out = module(xi)
            (out * torch.linspace(-1, 1, out.numel(), dtype=dtype).view_as(out)).sum().backward()
            outs.append((out, xi.grad))
        assert torch.equal(outs[0][0], outs[1][0])
        assert torch.equal(outs[0][1], outs[1][1])
    for (k, a), (k2, b) in zip(plain.state_dict().items(), synced.state_dict().items(),
                               strict=True):
        assert k == k2 and torch.equal(a, b)
    for a, b in zip(plain.parameters(), synced.parameters(), strict=True):
        assert torch.equal(a.grad, b.grad)


@pytest.mark.parametrize("kwargs", [
    {}, {"momentum": None}, {"affine": False}, {"track_running_stats": False},
], ids=["default", "momentum-none", "affine-false", "no-running-stats"])
def test_without_process_group_is_plain_bn(kwargs: dict) -> None:
    assert not dist.is_initialized()
    _compare_with_plain(lambda cls: cls(3, **kwargs), (4, 3, 5, 5))


def test_eval_mode_uses_running_stats() -> None:
    bn = bt.SyncBatchNorm(3, dtype=torch.float64)
    with torch.no_grad():
        bn.running_mean.copy_(torch.tensor([1.0, -2.0, 3.0]))
        bn.running_var.copy_(torch.tensor([0.5, 2.0, 4.0]))
    bn.eval()
    x = torch.randn(2, 3, 4, dtype=torch.float64)
    want = F.batch_norm(x, bn.running_mean, bn.running_var, bn.weight, bn.bias, False, 0.0,
                        bn.eps)
    assert torch.equal(bn(x), want)
    assert int(bn.num_batches_tracked) == 0


def test_state_dict_loads_both_ways() -> None:
    torch.manual_seed(0)
    plain, synced = nn.BatchNorm3d(5), bt.SyncBatchNorm(5)
    plain(torch.randn(3, 5, 2, 2, 2))
    assert list(plain.state_dict()) == list(synced.state_dict())
    synced.load_state_dict(plain.state_dict())
    back = nn.BatchNorm3d(5)
    back.load_state_dict(synced.state_dict())
    for a, b in zip(plain.state_dict().values(), back.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_constructor_matches_torch_signature() -> None:
    assert bt.SyncBatchNorm(4, bias=False).bias is None  # torch 2.13's keyword
    bn = bt.SyncBatchNorm(4, 1e-3, None, False, False, None, "cpu", torch.float64)
    assert (bn.num_features, bn.eps, bn.momentum, bn.affine, bn.track_running_stats) == \
        (4, 1e-3, None, False, False)
    assert bn.process_group is None and bn.weight is None and bn.running_mean is None
    with pytest.raises(ValueError, match="at least 2D"):
        bt.SyncBatchNorm(4)(torch.randn(4))


def test_default_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bt.default_backend() == "gloo"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    assert bt.default_backend() == "nccl"


def test_single_rank_group_is_plain_bn(tmp_path: Path) -> None:
    """An initialised world of one rank takes the plain path (no collective at all)."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0,
                            world_size=1, timeout=timedelta(seconds=60))
    try:
        _compare_with_plain(lambda cls: cls(3, momentum=None), (4, 3, 5, 5))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("kwargs", [
    {}, {"momentum": None}, {"affine": False}, {"bias": False}, {"track_running_stats": False},
], ids=["default", "momentum-none", "affine-false", "bias-false", "no-running-stats"])
def test_synced_path_on_one_rank_is_plain_bn(kwargs: dict) -> None:
    """The synced computation itself (one-rank probe: collectives are identities) against
    torch's BN, fp64: outputs, input and parameter gradients, running statistics; one
    all_gather per forward and one all_reduce per backward, nothing read on the host."""
    from bnfix.torch.functional import probing

    torch.manual_seed(0)
    plain = nn.BatchNorm2d(3, **kwargs).double()
    synced = bt.SyncBatchNorm(3, **kwargs).double()
    synced.load_state_dict(plain.state_dict())
    for step in range(STEPS):
        x = torch.randn(5, 3, 4, 4, dtype=torch.float64) * 3 + step
        results = []
        for module in (plain, synced):
            xi = x.clone().requires_grad_(True)
            with probing() as probe:
                out = module(xi)
                (out * torch.linspace(-1, 1, out.numel(), dtype=torch.float64).view_as(out)
                 ).sum().backward()
            results.append((out, xi.grad, probe.calls))
        assert results[1][2] == ["all_gather", "all_reduce"] and results[0][2] == []
        for got, want in zip(results[1][:2], results[0][:2], strict=True):
            assert (got - want).abs().max().item() < 1e-12 * want.abs().max().item()
    for (name, a), b in zip(plain.state_dict().items(), synced.state_dict().values(),
                            strict=True):
        assert torch.allclose(a.double(), b.double(), rtol=1e-12, atol=1e-14), name
    for a, b in zip(plain.parameters(), synced.parameters(), strict=True):
        assert torch.allclose(a.grad, b.grad, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
def test_synced_path_in_half_precision_is_as_exact_as_plain_bn(dtype: torch.dtype) -> None:
    """Half-precision input (its statistics in float32, from sums of the centred data) against
    an fp64 reference: the synced path's output, input gradient and running statistics are
    within twice torch's own half-precision BN error (statistics rounded to half precision
    would put the running variance off by ~1e-4), on data whose mean is large against its
    spread."""
    from bnfix.torch.functional import probing

    torch.manual_seed(0)
    plain = nn.BatchNorm2d(6)
    synced = bt.SyncBatchNorm(6)
    synced.load_state_dict(plain.state_dict())
    x = (torch.randn(8, 6, 5, 5) * 3 + 100).to(dtype)
    weights = torch.linspace(-1, 1, x.numel()).view_as(x).to(dtype)
    reference = nn.BatchNorm2d(6).double()
    x64 = x.double().requires_grad_(True)
    out64 = reference(x64)
    out64.backward(weights.double())
    errors = []
    for module in (plain, synced):
        xi = x.clone().requires_grad_(True)
        with probing() as probe:
            out = module(xi)
            out.backward(weights)
        errors.append([(got.double() - want).abs().max().item() / want.abs().max().item()
                       for got, want in ((out, out64), (xi.grad, x64.grad),
                                         (module.running_mean, reference.running_mean),
                                         (module.running_var, reference.running_var))])
        assert module.running_var.dtype == torch.float32
    assert probe.calls == ["all_gather", "all_reduce"]
    for synced_error, plain_error in zip(errors[1], errors[0], strict=True):
        assert synced_error <= 2 * plain_error


def test_frozen_constructor_takes_torch_arguments() -> None:
    bn = bt.FrozenBatchNorm(4, 1e-3, None, True, True, "cpu", torch.float64, bias=False)
    assert bn.bias is None and not bn.weight.requires_grad and bn.weight.dtype == torch.float64
    with pytest.raises(ValueError, match="track_running_stats must be True"):
        bt.FrozenBatchNorm(4, track_running_stats=False)
