"""bnfix.torch on real torchvision and timm models (weights=None, 2x3x32x32 inputs).

torchvision and timm are dev extras (pyproject `dev`, pinned in constraints.txt). The
torchvision wheel on the package index is a CUDA build whose compiled ops do not load next to
the CPU torch; bench/zoo_models.py imports it anyway by defining the two op schemas its import
registers fake kernels for (torchvision::nms, ::qnms) and a CPU nms in plain torch, before the
import, only when its _C does not load (see that module's docstring and docs/torch.md). Without
torchvision or timm installed these tests skip, saying so.

Per model: convert_sync leaves eval outputs bit-identical and revert_sync gives back the same
classes and state; frozen BN in training mode equals the original in eval mode with running
statistics untouched, and unfreeze gives back the same classes and state; fold folds at least as many BN as torch.fx's fuse and fuse_modules on the
(conv, bn) pairs adjacent in registration order, within 1e-5; symbolic_trace and
torchvision's create_feature_extractor work after convert_sync and freeze wherever
symbolic_trace works on the original. A subset trains one step on 2 gloo
ranks against the global batch on one process (test_zoo_sync.py). The full zoo runs in
bench/zoo.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import zoo
import zoo_models

try:
    zoo_models.import_timm()
except ImportError as exc:  # pragma: no cover - dev extras not installed
    pytest.skip(f"torchvision / timm not installed ({exc}): pip install -e '.[dev]'",
                allow_module_level=True)

FOLD_TOLERANCE = 1e-5
TORCHVISION = ["resnet18", "mobilenet_v3_small", "googlenet", "shufflenet_v2_x0_5",
               "regnet_x_400mf", "lraspp_mobilenet_v3_large",
               "fasterrcnn_mobilenet_v3_large_320_fpn", "ssdlite320_mobilenet_v3_large"]
TIMM = ["efficientnet_b0", "mobilenetv3_small_100", "repvgg_a0", "mobileone_s0", "fastvit_t8",
        "levit_128s", "dla34", "ghostnet_100"]
MODELS = {f"{m.library}:{m.name}": m
          for m in zoo_models.torchvision_models() + zoo_models.timm_models(TIMM)
          if m.library == "timm" or m.name in TORCHVISION}


def _timm_synced() -> torch.nn.Module:
    """What timm.layers.convert_sync_batchnorm makes: SyncBatchNormAct (torch SyncBatchNorm
    subclasses keeping the activation)."""
    return zoo_models.import_timm().layers.convert_sync_batchnorm(
        MODELS["timm:mobilenetv3_small_100"].build())


MODELS["timm-sync:mobilenetv3_small_100"] = zoo_models.ZooModel(
    "mobilenetv3_small_100", "timm-sync", "classification", _timm_synced,
    MODELS["timm:mobilenetv3_small_100"].size)


@pytest.fixture(autouse=True)
def _one_thread():
    """One intra-op thread: on a loaded 2-core machine OpenMP's spin-waits make a 32x32
    forward 50x slower with 2 threads than with 1."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.slow
@pytest.mark.parametrize("key", list(MODELS))
def test_zoo_model(key: str) -> None:
    entry = MODELS[key]
    model = entry.build().eval()
    x = entry.inputs(2)
    want = zoo.outputs(model, x)
    sync = zoo.bnfix_sync(model, x, want)
    assert sync["eval_exact"] and sync["revert_exact"]
    freeze = zoo.bnfix_freeze(model, x, want)
    assert freeze["eval_error"] == 0.0 and freeze["stats_kept"] and freeze["unfreeze_exact"]
    folded = zoo.fold_outputs(model, x)
    fold = zoo.bnfix_fold(model, x, folded)
    fx = zoo.fx_fuse(model, x, folded)
    ao = zoo.ao_fuse(model, x, folded)
    assert fold["eval_error"] <= FOLD_TOLERANCE
    assert fold["folded"] >= (fx["folded"] or 0)
    assert fold["folded"] >= (ao["folded"] or 0)
    traceable = zoo.original_traces(model)
    if traceable:
        assert zoo.traces(sync["model"].eval(), x)
        assert zoo.traces(freeze["model"], x)
        assert zoo.feature_extractor_works(sync["model"], x)
        assert zoo.feature_extractor_works(freeze["model"], x)
    print(f"\n{key}: {len(zoo.bn_sites(model))} BN; sync {sync['converted']}/"
          f"{sync['refused']} refused; frozen {freeze['frozen']}/{freeze['refused']}; folded "
          f"{fold['folded']} ({fold['eval_error']:.0e}) vs fx {fx['folded']} fuse_modules "
          f"{ao['folded']}; fx-traceable {traceable}")


def test_frozen_by_construction_layers_follow_the_catalogue() -> None:
    """torchvision's FrozenBatchNorm2d is no torch _BatchNorm: rules/catalogue/torch_modules.toml
    says convert_sync refuses it (with its reason), freeze leaves it, fold folds it as the
    per-channel affine map a probe confirms it is."""
    import bnfix.torch as bt
    from bnfix.rulebook import torch_modules

    tv = zoo_models.import_torchvision()
    spec = torch_modules()["torchvision.ops.misc.FrozenBatchNorm2d"]
    torch.manual_seed(0)
    model = tv.models.resnet18(norm_layer=tv.ops.misc.FrozenBatchNorm2d, num_classes=10).eval()
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, tv.ops.misc.FrozenBatchNorm2d):
                module.running_mean.normal_()
                module.running_var.uniform_(0.5, 2)
                module.weight.normal_()
    x = torch.randn(2, 3, 32, 32)
    want = zoo.outputs(model, x)
    report = bt.ConversionReport()
    bt.convert_sync(model, report=report)
    assert not report.converted and len(report.refused) == 20
    assert {r.reason for r in report.refused} == {spec.refusal("convert_sync")}
    frozen = bt.ConversionReport()
    bt.freeze(model, report=frozen)
    assert not frozen.converted and not frozen.refused
    folded = bt.ConversionReport()
    bt.fold(model, report=folded)
    assert len(folded.converted) == 20 and not folded.refused
    assert zoo.rel_error(zoo.outputs(model, x), want) < 1e-5
