"""The model zoo of bench/zoo.py and tests/test_zoo.py: torchvision and timm models, weights=None.

How torchvision and timm import next to the CPU torch. torchvision on the package index is a
CUDA build (torchvision 0.28.0 requires torch==2.13.0, which the CPU wheel 2.13.0+cpu
satisfies); its compiled ops (torchvision/_C.so) link libtorch_cuda and do not load on a CPU
torch, and `import torchvision` then fails in torchvision/_meta_registrations.py, which
registers fake kernels for the ops `torchvision::nms` and `torchvision::qnms` unconditionally.
The model code is pure Python. `import_torchvision()` therefore, only when _C does not load,
defines those two op schemas itself before importing torchvision, gives `nms` a CPU kernel
written in plain torch (detection models call it in eval mode; `roi_align` already falls back
to torchvision's pure-Python version when _C is missing) and lets torchvision.ops.nms call it.
Nothing else of torchvision or torch is changed; with a working _C (a CUDA torch, or a CPU
torchvision build) it is a plain import. timm imports after it. Install both without
dependencies' surprises with `pip install -c constraints.txt -e ".[dev]"` (the dev extra pins
torchvision==0.28.0 and timm==1.0.31).
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import Tensor, nn

_LIBRARY: list[torch.library.Library] = []  # keeps the op definitions alive


def _nms(dets: Tensor, scores: Tensor, iou_threshold: float) -> Tensor:
    """torchvision's greedy NMS: indices of kept boxes (x1, y1, x2, y2), best score first."""
    order = scores.argsort(descending=True)
    boxes = dets[order].double()
    area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    low = torch.maximum(boxes[:, None, :2], boxes[None, :, :2])
    high = torch.minimum(boxes[:, None, 2:], boxes[None, :, 2:])
    inter = (high - low).clamp(min=0).prod(2)
    over = (inter / (area[:, None] + area[None, :] - inter) > iou_threshold).triu(1)
    removed = torch.zeros(len(boxes), dtype=torch.bool)
    keep = []
    for i in range(len(boxes)):
        if not removed[i]:
            keep.append(i)
            removed |= over[i]
    return order[torch.tensor(keep, dtype=torch.long)]


def _compiled_ops_load() -> bool:
    spec = importlib.util.find_spec("torchvision")
    if spec is None or spec.origin is None:
        raise ImportError("torchvision is not installed")
    for lib in Path(spec.origin).parent.glob("_C.*"):
        try:
            torch.ops.load_library(str(lib))
        except OSError:
            return False
        return True
    return False


def import_torchvision() -> ModuleType:
    """torchvision, importable on a CPU torch (see the module docstring). ImportError when it
    is not installed."""
    if not _compiled_ops_load() and not _LIBRARY:
        lib = torch.library.Library("torchvision", "DEF")
        lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        lib.impl("nms", _nms, "CPU")
        _LIBRARY.append(lib)
        boxes = importlib.import_module("torchvision.ops.boxes")
        boxes._assert_has_ops = lambda: None  # the nms defined above is there
    return importlib.import_module("torchvision")


def import_timm() -> ModuleType:
    import_torchvision()
    return importlib.import_module("timm")


@dataclass(frozen=True)
class ZooModel:
    """One model of the zoo: `build()` makes it (seeded, weights=None), `inputs(batch)` a batch
    it accepts; `kind` is classification / segmentation / detection."""

    name: str
    library: str
    kind: str
    build: Callable[[], nn.Module]
    size: int = 32

    def inputs(self, batch: int, seed: int = 0) -> Any:
        gen = torch.Generator().manual_seed(seed)
        x = torch.randn(batch, 3, self.size, self.size, generator=gen)
        return list(x) if self.kind == "detection" else x


# torchvision models whose smallest input is larger than 64 (or that need an exact size)
_TV_SIZE = {"inception_v3": 96, "vit_b_16": 224, "vit_b_32": 224, "vit_l_16": 224,
            "vit_l_32": 224, "vit_h_14": 224, "maxvit_t": 224}
_TV_DETECTION_KW: dict[str, Any] = {"weights": None, "weights_backbone": None,
                                    "num_classes": 5, "min_size": 96, "max_size": 128}


def torchvision_models(kinds: tuple[str, ...] = ("classification", "segmentation",
                                                 "detection")) -> list[ZooModel]:
    tv = import_torchvision()
    modules = {"classification": tv.models, "segmentation": tv.models.segmentation,
               "detection": tv.models.detection}
    zoo = []
    for kind in kinds:
        for name in tv.models.list_models(module=modules[kind]):
            def build(name: str = name, kind: str = kind) -> nn.Module:
                torch.manual_seed(0)
                if kind == "detection":
                    kwargs = dict(_TV_DETECTION_KW)
                    if name.startswith(("ssd", "ssdlite")):
                        kwargs = {"weights": None, "weights_backbone": None, "num_classes": 5}
                    elif name.startswith(("fasterrcnn", "maskrcnn", "keypointrcnn")):
                        kwargs.update(rpn_pre_nms_top_n_test=100, rpn_post_nms_top_n_test=50)
                    else:  # retinanet, fcos
                        kwargs.update(topk_candidates=100)
                    return tv.models.get_model(name, **kwargs)
                extra = {"aux_loss": False, "weights_backbone": None} if \
                    kind == "segmentation" else {}
                if name in ("googlenet", "inception_v3"):
                    extra = {"aux_logits": False, "init_weights": True}
                return tv.models.get_model(name, weights=None, num_classes=10 if kind ==
                                           "classification" else 5, **extra)
            size = _TV_SIZE.get(name, 32)
            if kind == "detection":
                size = 320 if name.startswith("ssd300") else 96
            zoo.append(ZooModel(name, "torchvision", kind, build, size))
    return zoo


# A broad timm set: every family with BN or BN+act layers the original trial had, and more.
TIMM_MODELS: dict[str, int] = {
    "resnet18": 32, "resnet50": 32, "resnext50_32x4d": 32, "seresnet50": 32,
    "efficientnet_b0": 32, "efficientnet_lite0": 32, "tf_efficientnet_b0": 32,
    "mobilenetv2_100": 32, "mobilenetv3_large_100": 32, "mobilenetv3_small_100": 32,
    "mixnet_s": 32, "mnasnet_100": 32, "fbnetc_100": 32, "spnasnet_100": 32,
    "ghostnet_100": 32, "lcnet_050": 32, "tinynet_a": 32, "hardcorenas_a": 32,
    "regnetx_002": 32, "regnety_002": 32, "repvgg_a0": 32, "mobileone_s0": 32,
    "fastvit_t8": 32, "levit_128s": 64, "convnext_atto": 32, "densenet121": 32,
    "dla34": 32, "dpn68": 32, "hrnet_w18_small": 32, "cspresnet50": 32,
    "cspdarknet53": 32, "darknet53": 32, "rexnet_100": 32, "vgg11_bn": 32,
    "inception_v3": 96, "res2net50_14w_8s": 32, "selecsls42b": 32, "efficientvit_b0": 32,
    "mobilevit_xxs": 32, "resnetv2_50": 32, "ese_vovnet19b_dw": 32, "gernet_s": 32,
}


_TIMM_KW: dict[str, dict[str, Any]] = {"levit_128s": {"img_size": 64}}


def timm_models(names: list[str] | None = None) -> list[ZooModel]:
    timm = import_timm()
    zoo = []
    for name in names or list(TIMM_MODELS):
        def build(name: str = name) -> nn.Module:
            torch.manual_seed(0)
            return timm.create_model(name, pretrained=False, num_classes=10,
                                     **_TIMM_KW.get(name, {}))
        zoo.append(ZooModel(name, "timm", "classification", build, TIMM_MODELS.get(name, 64)))
    return zoo


def zoo(names: list[str] | None = None) -> list[ZooModel]:
    """Every model (or those named, as `library:name` or `name`)."""
    models = torchvision_models() + timm_models()
    if not names:
        return models
    chosen = [m for m in models if m.name in names or f"{m.library}:{m.name}" in names]
    return chosen
