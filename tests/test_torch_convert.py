"""bnfix.torch conversions: convert_sync / revert_sync, freeze / unfreeze, fold, the report."""

from __future__ import annotations

from collections.abc import Callable

import pytest

torch = pytest.importorskip("torch")
from torch import Tensor, nn

import bnfix.torch as bt


class ShiftedBatchNorm2d(nn.BatchNorm2d):
    """A BN subclass with an attribute, a helper method and a forward override using super()."""

    def __init__(self, num_features: int) -> None:
        super().__init__(num_features)
        self.shift = 2.0

    def describe(self) -> str:
        return f"shift {self.shift}"

    def forward(self, x: Tensor) -> Tensor:
        return super().forward(x) + self.shift


class FunctionalBatchNorm2d(nn.BatchNorm2d):
    """A BN subclass whose forward calls F.batch_norm itself, never super().forward."""

    def forward(self, x: Tensor) -> Tensor:
        return nn.functional.batch_norm(x, self.running_mean, self.running_var, self.weight,
                                        self.bias, self.training, 0.1, self.eps)


class EvalSuperBatchNorm2d(nn.BatchNorm2d):
    """super().forward in eval mode only, F.batch_norm in training: a name check is fooled."""

    def forward(self, x: Tensor) -> Tensor:
        if not self.training:
            return super().forward(x)
        return nn.functional.batch_norm(x, None, None, self.weight, self.bias, True)


class ManualBatchNorm2d(nn.BatchNorm2d):
    """Computes its statistics by hand (and calls super().forward in eval): nothing to sync."""

    def forward(self, x: Tensor) -> Tensor:
        if not self.training:
            return super().forward(x)
        mean = x.mean((0, 2, 3), keepdim=True)
        var = x.var((0, 2, 3), unbiased=False, keepdim=True)
        return (x - mean) / (var + self.eps).sqrt() * self.weight.view(1, -1, 1, 1) + \
            self.bias.view(1, -1, 1, 1)


def _hook(module: nn.Module, args: tuple, out: Tensor) -> Tensor:
    return out


def _pre_hook(module: nn.Module, args: tuple) -> None:
    return None


def _model() -> nn.Module:
    torch.manual_seed(0)
    shared = nn.BatchNorm2d(4)
    model = nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1), shared, nn.ReLU(),
        nn.Sequential(nn.Conv2d(4, 4, 1), ShiftedBatchNorm2d(4), shared),
        nn.Flatten(2), nn.BatchNorm1d(4, momentum=None),
        nn.Sequential(nn.Unflatten(2, (2, 2, 2)), nn.BatchNorm3d(4, affine=False)),
    )
    model[5].register_forward_hook(_hook)
    model[3][1].register_forward_pre_hook(_pre_hook)
    model[6][1].eval()
    model[5].weight.requires_grad_(False)
    return model


def _snapshot(model: nn.Module) -> list:
    """Everything a faithful round trip must keep, with object identities."""
    rows = []
    for path, module in model.named_modules(remove_duplicate=False):
        rows.append((path, type(module), id(module), module.training, sorted(vars(module)),
                     list(module._forward_hooks.values()),
                     list(module._forward_pre_hooks.values())))
        for name, p in module.named_parameters(recurse=False):
            rows.append((path, name, id(p), p.requires_grad, p.dtype, p.device, p.tolist()))
        for name, b in module.named_buffers(recurse=False):
            rows.append((path, name, id(b), b.dtype, b.tolist()))
    return rows


def test_convert_then_revert_gives_back_the_identical_tree() -> None:
    model = _model()
    before = _snapshot(model)
    report = bt.ConversionReport()
    assert bt.convert_sync(model, report=report) is model
    assert [type(m).__name__ for m in (model[1], model[3][1], model[5], model[6][1])] == \
        ["SyncBatchNorm", "SyncShiftedBatchNorm2d", "SyncBatchNorm", "SyncBatchNorm"]
    assert len(report.converted) == 4 and not report.refused
    assert model[1] is model[3][2]
    bt.revert_sync(model, report=report)
    assert _snapshot(model) == before
    assert [r.action for r in report.converted] == ["convert_sync"] * 4 + ["revert_sync"] * 4


def test_convert_keeps_state_training_flags_and_hooks() -> None:
    model = _model().double()
    model(torch.randn(2, 3, 2, 4, dtype=torch.float64))
    params = {n: p for n, p in model.named_parameters()}
    tracked = int(model[5].num_batches_tracked)
    bt.convert_sync(model)
    assert {n: p for n, p in model.named_parameters()} == params
    assert all(p.dtype == torch.float64 for p in model.parameters())
    assert int(model[5].num_batches_tracked) == tracked
    assert not model[6][1].training and model[1].training
    assert not model[5].weight.requires_grad
    assert list(model[5]._forward_hooks.values()) == [_hook]
    assert list(model[3][1]._forward_pre_hooks.values()) == [_pre_hook]
    assert model[1].process_group is None


def test_subclass_is_kept_and_its_super_forward_is_synced() -> None:
    bn = ShiftedBatchNorm2d(3)
    bt.convert_sync(bn)
    assert isinstance(bn, ShiftedBatchNorm2d) and isinstance(bn, bt.SyncBatchNorm)
    assert bn.describe() == "shift 2.0"
    mro = type(bn).__mro__
    assert mro.index(ShiftedBatchNorm2d) < mro.index(bt.SyncBatchNorm)
    # the override runs first, and its super().forward resolves to the synced forward
    assert super(ShiftedBatchNorm2d, bn).forward.__func__ is bt.SyncBatchNorm.forward
    x = torch.randn(4, 3, 2, 2)
    reference = nn.BatchNorm2d(3)
    assert torch.allclose(bn(x), reference(x) + 2.0)
    # one synced class per original class
    other = ShiftedBatchNorm2d(5)
    bt.convert_sync(other)
    assert type(other) is type(bn)


def _synced_calls(module: nn.Module, x: Tensor) -> list[str]:
    """The collectives one training step of `module` makes (one-rank probe)."""
    from bnfix.torch.functional import probing

    with probing() as probe:
        module.train()(x.requires_grad_(True)).sum().backward()
    return probe.calls


def test_subclasses_are_judged_by_what_their_forward_does() -> None:
    """Not by whether the code says super().forward: F.batch_norm callers are synced, a
    forward that computes its own statistics is refused."""
    model = nn.Sequential(FunctionalBatchNorm2d(3), EvalSuperBatchNorm2d(3),
                          ManualBatchNorm2d(3))
    report = bt.ConversionReport()
    bt.convert_sync(model, report=report)
    assert [r.path for r in report.converted] == ["0", "1"]
    assert isinstance(model[0], FunctionalBatchNorm2d) and isinstance(model[0], bt.SyncBatchNorm)
    for layer in model[:2]:
        assert _synced_calls(layer, torch.randn(4, 3, 2, 2)) == ["all_gather", "all_reduce"]
    assert type(model[2]) is ManualBatchNorm2d
    [refused] = report.refused
    assert (refused.path, refused.from_class) == ("2", "ManualBatchNorm2d")
    assert "0 synced batch_norm calls" in refused.reason
    assert "refused" in str(report) and "ManualBatchNorm2d" in str(report)


def test_the_probe_runs_where_the_module_lives() -> None:
    """A model on another device (CUDA on a GPU machine; the meta device here) is probed on
    that device: a probe input built on the CPU made every BN subclass of a model on CUDA look
    unconvertible (found by scripts/gpu-check on an H200)."""
    from bnfix.torch.probe import probe_input

    x = probe_input(ShiftedBatchNorm2d(3).to("meta"))
    assert isinstance(x, Tensor) and x.device.type == "meta" and x.dtype == torch.float32
    assert probe_input(ShiftedBatchNorm2d(3).double()).device.type == "cpu"


def test_strict_refuses_atomically() -> None:
    model = nn.Sequential(nn.BatchNorm2d(3), ManualBatchNorm2d(3), nn.LazyBatchNorm1d())
    with pytest.raises(bt.ConversionRefused) as info:
        bt.convert_sync(model, strict=True)
    message = str(info.value)
    assert "2 module(s) refused" in message
    assert "1 (ManualBatchNorm2d)" in message and "2 (LazyBatchNorm1d)" in message
    assert [r.path for r in info.value.records] == ["1", "2"]
    assert type(model[0]) is nn.BatchNorm2d  # nothing converted


def test_lazy_batchnorm() -> None:
    lazy = nn.Sequential(nn.LazyBatchNorm2d())
    report = bt.ConversionReport()
    bt.convert_sync(lazy, report=report)
    assert isinstance(lazy[0], nn.LazyBatchNorm2d)
    assert "not materialised" in report.refused[0].reason
    lazy(torch.randn(2, 5, 3, 3))
    bt.convert_sync(lazy)
    assert type(lazy[0]) is bt.SyncBatchNorm and lazy[0].num_features == 5
    bt.revert_sync(lazy)
    assert type(lazy[0]) is nn.BatchNorm2d


def test_optimizer_built_before_conversion_still_trains() -> None:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    bt.convert_sync(model)
    out = model(torch.randn(3, 3, 2, 4))
    (out * torch.randn_like(out)).sum().backward()
    opt.step()
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert {"1.weight", "3.1.weight", "3.1.bias", "5.bias"} <= changed
    assert "5.weight" not in changed  # requires_grad=False was kept


def test_root_module_and_torch_sync_batchnorm() -> None:
    group_marker = object()
    torch_sync = nn.SyncBatchNorm(3, process_group=group_marker)  # type: ignore[arg-type]
    report = bt.ConversionReport()
    assert bt.convert_sync(torch_sync, report=report) is torch_sync
    assert type(torch_sync) is bt.SyncBatchNorm and torch_sync.process_group is None
    assert report.converted[0].where == "(root)"
    bt.revert_sync(torch_sync)
    assert type(torch_sync) is nn.SyncBatchNorm and torch_sync.process_group is group_marker


def test_per_layer_process_groups() -> None:
    model = nn.Sequential(nn.BatchNorm1d(2), nn.Sequential(nn.BatchNorm1d(2)))
    groups = {"0": None, "1.0": "head-group"}
    bt.convert_sync(model, process_group=lambda path: groups[path])  # type: ignore[arg-type,return-value]
    assert model[0].process_group is None and model[1][0].process_group == "head-group"


def test_revert_refuses_what_it_did_not_convert() -> None:
    native = nn.Sequential(bt.SyncBatchNorm(2), nn.BatchNorm1d(2))
    report = bt.ConversionReport()
    bt.revert_sync(native, report=report)
    assert type(native[0]) is bt.SyncBatchNorm
    assert [r.path for r in report.refused] == ["0"] and not report.converted
    synced_then_frozen = bt.freeze(bt.convert_sync(nn.BatchNorm1d(2)))
    with pytest.raises(bt.ConversionRefused, match="unfreeze|undo that conversion first"):
        bt.revert_sync(synced_then_frozen, strict=True)
    bt.revert_sync(bt.unfreeze(synced_then_frozen))
    assert type(synced_then_frozen) is nn.BatchNorm1d


def _trained_bn(bn: nn.Module, shape: tuple[int, ...]) -> nn.Module:
    bn.train()
    for _ in range(3):
        bn(torch.randn(*shape) * 3 + 1)
    with torch.no_grad():
        for p in bn.parameters():
            p.copy_(torch.randn_like(p))
    return bn


@pytest.mark.parametrize(("make", "shape"), [
    (lambda: nn.BatchNorm1d(3), (4, 3)),
    (lambda: nn.BatchNorm2d(3), (4, 3, 2, 2)),
    (lambda: nn.BatchNorm3d(3, affine=False), (4, 3, 2, 2, 2)),
    (lambda: ShiftedBatchNorm2d(3), (4, 3, 2, 2)),
], ids=["1d", "2d", "3d-no-affine", "subclass"])
def test_freeze_round_trip(make: Callable[[], nn.Module], shape: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(_trained_bn(make(), shape))
    before = _snapshot(model)
    x = torch.randn(*shape)
    expected = model.eval()(x)
    model.train()
    bt.freeze(model)
    frozen = model[0]
    assert isinstance(frozen, bt.FrozenBatchNorm) and frozen.training
    stats = [b.clone() for b in frozen.buffers()]
    xg = x.clone().requires_grad_(True)
    out = model(xg)
    assert torch.equal(out, expected)  # train mode, yet running stats: equals eval-mode BN
    out.sum().backward()
    assert xg.grad is not None
    assert all(torch.equal(a, b) for a, b in zip(stats, frozen.buffers(), strict=True))
    assert not any(p.requires_grad for p in frozen.parameters())
    bt.unfreeze(model)
    assert _snapshot(model) == before


def test_freeze_refuses_bn_without_running_stats() -> None:
    report = bt.ConversionReport()
    bn = bt.freeze(nn.BatchNorm2d(3, track_running_stats=False), report=report)
    assert type(bn) is nn.BatchNorm2d
    assert "no running statistics" in report.refused[0].reason


def _randomise(model: nn.Module) -> nn.Module:
    torch.manual_seed(1)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.running_mean is not None:
                m.running_mean.copy_(torch.randn_like(m.running_mean))
                m.running_var.copy_(torch.rand_like(m.running_var) + 0.5)
                if m.affine:
                    m.weight.copy_(torch.randn_like(m.weight))
                    m.bias.copy_(torch.randn_like(m.bias))
    return model.eval()


@pytest.mark.parametrize(("layers", "shape"), [
    ((nn.Conv2d(4, 6, 3, groups=2, bias=False), nn.BatchNorm2d(6)), (2, 4, 5, 5)),
    ((nn.ConvTranspose2d(4, 6, 3, groups=2), nn.BatchNorm2d(6)), (2, 4, 5, 5)),
    ((nn.Linear(5, 3), nn.BatchNorm1d(3)), (4, 5)),
    ((nn.Conv3d(2, 3, 2), nn.BatchNorm3d(3, affine=False)), (2, 2, 3, 3, 3)),
    ((nn.Conv1d(2, 4, 3, groups=2), nn.BatchNorm1d(4)), (2, 2, 6)),
    ((nn.ConvTranspose3d(2, 4, 2, groups=2, bias=False), nn.BatchNorm3d(4)), (2, 2, 2, 2, 2)),
], ids=["conv2d-grouped", "convtranspose2d-grouped", "linear", "conv3d", "conv1d-grouped",
        "convtranspose3d-grouped"])
def test_fold_keeps_eval_outputs(layers: tuple[nn.Module, nn.Module],
                                 shape: tuple[int, ...]) -> None:
    model = _randomise(nn.Sequential(nn.Sequential(*layers), nn.ReLU()))
    x = torch.randn(*shape)
    expected = model(x)
    report = bt.ConversionReport()
    bt.fold(model, report=report)
    assert isinstance(model[0][1], nn.Identity)
    assert report.converted[0].path == "0.1" and not report.refused
    assert (model(x) - expected).abs().max().item() < 1e-5 * max(1.0, expected.abs().max().item())


def test_fold_in_train_mode_raises() -> None:
    model = nn.Sequential(nn.Conv2d(3, 3, 1), nn.BatchNorm2d(3))
    with pytest.raises(ValueError, match=r"model\.eval\(\)"):
        bt.fold(model)
    assert isinstance(model[1], nn.BatchNorm2d)


class _Functional(nn.Module):
    """conv -> bn in a hand-written forward: found by tracing, not by Sequential order."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 1)
        self.bn = nn.BatchNorm2d(3)

    def forward(self, x: Tensor) -> Tensor:
        return self.bn(self.conv(x))


class _Branching(nn.Module):
    """The conv output feeds the BN and a residual add: folding would change the add."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 1)
        self.bn = nn.BatchNorm2d(3)

    def forward(self, x: Tensor) -> Tensor:
        y = self.conv(x)
        return self.bn(y) + y


class _Untraceable(nn.Module):
    """Python control flow on a tensor value: torch.fx cannot trace it."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 1)
        self.bn = nn.BatchNorm2d(3)

    def forward(self, x: Tensor) -> Tensor:
        return self.bn(self.conv(x)) if x.sum() > -1e9 else x


def test_fold_follows_the_traced_graph_and_refuses_what_is_not_exact() -> None:
    shared = nn.BatchNorm2d(3)
    model = _randomise(nn.Sequential(
        _Functional(),  # 0: hand-written forward: traced, folded
        nn.Conv2d(3, 3, 1), shared, nn.Conv2d(3, 3, 1), shared,  # 2, 4: one BN called twice
        nn.Conv2d(3, 3, 1), nn.BatchNorm2d(3, track_running_stats=False),  # 6
        nn.Conv2d(3, 3, 1), ShiftedBatchNorm2d(3),  # 8: its shift kept after folding
        nn.Conv2d(3, 3, 1), nn.BatchNorm2d(3),  # 10: hooked
        _Branching(),  # 11.bn: the conv output is used twice
        _Untraceable(),  # 12.bn: not traced
        nn.ReLU(), nn.BatchNorm2d(3),  # 14: after a ReLU
    ))
    model[10].register_forward_hook(_hook)
    x = torch.randn(2, 3, 4, 4)
    with torch.no_grad():
        expected = model(x)
    report = bt.ConversionReport()
    bt.fold(model, report=report)
    reasons = {r.path: r.reason for r in report.refused}
    assert {r.path for r in report.converted} == {"0.bn", "8"}, reasons
    assert isinstance(model[0].bn, nn.Identity)
    assert isinstance(model[8], ShiftedBatchNorm2d) and model[8].shift == 2.0
    assert "called 2 times" in reasons["2"]
    assert "track_running_stats=False" in reasons["6"]
    assert "hooks" in reasons["10"]
    assert "feeds other consumers" in reasons["11.bn"]
    assert "failed to trace" in reasons["12.bn"]
    assert "comes from ReLU" in reasons["14"]
    with torch.no_grad():
        got = model(x)
    assert (got - expected).abs().max().item() < 1e-5 * expected.abs().max().item()
    with pytest.raises(bt.ConversionRefused, match="fold: 6 module"):
        bt.fold(_randomise(nn.Sequential(nn.Conv2d(3, 3, 1), shared, nn.Conv2d(3, 3, 1), shared,
                                         _Branching(), _Untraceable(), nn.ReLU(),
                                         nn.BatchNorm2d(3), nn.BatchNorm2d(3,
                                         track_running_stats=False), nn.Conv2d(3, 3, 1),
                                         ManualEval(3))), strict=True)


class ManualEval(nn.BatchNorm2d):
    """Ignores its statistics in eval mode: no per-channel affine map of them to fold."""

    def forward(self, x: Tensor) -> Tensor:
        return x * 2


def test_report_table_lists_every_record() -> None:
    report = bt.ConversionReport()
    bt.convert_sync(nn.Sequential(nn.BatchNorm1d(2), ManualBatchNorm2d(2)), report=report)
    lines = str(report).splitlines()
    assert lines[0].split() == ["action", "status", "module", "from", "to", "note"]
    assert lines[1].split()[:5] == ["convert_sync", "converted", "0", "BatchNorm1d",
                                    "SyncBatchNorm"]
    assert lines[2].split()[:4] == ["convert_sync", "refused", "1", "ManualBatchNorm2d"]
    assert lines[-1] == "1 converted, 1 refused"
