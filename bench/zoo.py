"""bnfix.torch on real model zoos, beside torch's, timm's and torch.fx's own tools.

For every torchvision classification/segmentation/detection model and a broad set of timm models
(weights=None, small inputs; see bench/zoo_models.py for how they import on a CPU torch):

- #BN: BN-like layers (torch _BatchNorm, timm norm-act layers, torchvision FrozenBatchNorm2d).
- sync: layers bnfix.torch.convert_sync converted / refused, whether eval outputs stayed
  identical (`=`) and revert_sync gave back the identical classes and state; torch's
  nn.SyncBatchNorm.convert_sync_batchnorm and timm's convert_sync_batchnorm: layers converted
  and the max relative eval-output change (they drop a norm-act layer's activation).
- freeze: layers frozen / refused, and whether the frozen model in training mode equals the
  original in eval mode.
- fold: BN folded by bnfix.torch.fold, by torch.fx.experimental.optimization.fuse and by
  torch.ao.quantization.fuse_modules on the (conv, bn) pairs adjacent in registration order,
  each with the max relative eval-output change ("-": the tool fails on the model; detection
  models: of the backbone features, their detections after NMS being discontinuous).
- fx: torch.fx.symbolic_trace of the converted (sync) and frozen models runs and gives the same
  outputs.
- times: conversion time of bnfix / torch / timm (median of 3).

    python bench/zoo.py [--only NAME ...] [--library torchvision|timm] [--json OUT]
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

import torch
import torch.fx
from torch import Tensor, nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import zoo_models

import bnfix.torch as bt
from bnfix.torch.swap import bn_sites

_FUSABLE = {(nn.Conv1d, nn.BatchNorm1d), (nn.Conv2d, nn.BatchNorm2d),
            (nn.Conv3d, nn.BatchNorm3d), (nn.Linear, nn.BatchNorm1d)}


def outputs(model: nn.Module, x: Any) -> Tensor:
    """One tensor of everything the model returns (detection: boxes, scores; dicts flattened)."""
    with torch.no_grad():
        out = model(x)
    return _flatten(out)


def fold_outputs(model: nn.Module, x: Any) -> Tensor:
    """What a fold is measured on: the outputs, except for detection models (a list of images)
    their backbone features on the transformed batch: detections after NMS are discontinuous in
    the scores (a 1e-7 change can swap or drop a box), the features are not."""
    if not isinstance(x, list):
        return outputs(model, x)
    with torch.no_grad():
        images, _ = model.transform(x)
        return _flatten(model.backbone(images.tensors))


def _flatten(out: Any) -> Tensor:
    if isinstance(out, Tensor):
        return out.detach().double().flatten()
    if isinstance(out, dict):
        return _flatten(list(out.values()))
    if isinstance(out, (list, tuple)):
        parts = [_flatten(o) for o in out]
        return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.float64)
    return torch.zeros(0, dtype=torch.float64)


def rel_error(got: Tensor, want: Tensor) -> float:
    if got.shape != want.shape:
        return float("inf")
    if not want.numel():
        return 0.0
    return (got - want).abs().max().item() / max(want.abs().max().item(), 1e-30)


def _timed(convert: Callable[[nn.Module], Any], model: nn.Module, runs: int = 3
           ) -> tuple[Any, float]:
    """(result of the last run, median seconds) of `convert` on fresh copies."""
    times, result = [], None
    for _ in range(runs):
        fresh = copy.deepcopy(model)
        start = time.perf_counter()
        result = convert(fresh)
        times.append(time.perf_counter() - start)
        result = fresh if result is None else result
    return result, statistics.median(times)


def _same_state(model: nn.Module, other: nn.Module) -> bool:
    """Same classes, modes and state_dict tensors (values and dtypes), module by module."""
    def classes(m: nn.Module) -> list[Any]:
        return [(p, type(sub), sub.training) for p, sub in m.named_modules()]

    mine, theirs = model.state_dict(), other.state_dict()
    return classes(model) == classes(other) and mine.keys() == theirs.keys() and all(
        a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(mine.values(),
                                                                  theirs.values(), strict=True))


def bnfix_sync(model: nn.Module, x: Any, want: Tensor) -> dict[str, Any]:
    report = bt.ConversionReport()
    synced, seconds = _timed(lambda m: bt.convert_sync(m, report=bt.ConversionReport()), model)
    work = copy.deepcopy(model)
    bt.convert_sync(work, report=report)
    exact = rel_error(outputs(work, x), want) == 0.0
    back = bt.ConversionReport()
    bt.revert_sync(work, report=back)
    return {"converted": len(report.converted), "refused": len(report.refused),
            "refusals": sorted({f"{r.from_class}: {r.reason}" for r in report.refused}),
            "eval_exact": exact, "revert_exact": _same_state(work, model), "seconds": seconds,
            "model": synced}


def torch_sync(model: nn.Module, x: Any, want: Tensor) -> dict[str, Any]:
    synced, seconds = _timed(nn.SyncBatchNorm.convert_sync_batchnorm, model)
    count = sum(isinstance(m, nn.SyncBatchNorm) for m in synced.modules())
    return {"converted": count, "eval_error": rel_error(outputs(synced.eval(), x), want),
            "seconds": seconds}


def timm_sync(model: nn.Module, x: Any, want: Tensor) -> dict[str, Any]:
    timm = zoo_models.import_timm()
    synced, seconds = _timed(timm.layers.convert_sync_batchnorm, model)
    count = sum(isinstance(m, nn.SyncBatchNorm) for m in synced.modules())
    return {"converted": count, "eval_error": rel_error(outputs(synced.eval(), x), want),
            "seconds": seconds}


def bnfix_freeze(model: nn.Module, x: Any, want: Tensor) -> dict[str, Any]:
    """Frozen BN layers in training mode (the rest of the model in eval: no dropout) against
    the original in eval mode."""
    work = copy.deepcopy(model)
    report = bt.ConversionReport()
    bt.freeze(work, report=report)
    frozen = {id(bn) for bn in work.modules() if isinstance(bn, bt.FrozenBatchNorm)}
    work.eval()
    for module in work.modules():
        if id(module) in frozen:
            module.training = True
    before = [b.clone() for b in work.buffers()]
    error = rel_error(outputs(work, x), want)
    kept = all(torch.equal(a, b) for a, b in zip(before, work.buffers(), strict=True))
    back = bt.unfreeze(copy.deepcopy(work).eval())
    return {"frozen": len(report.converted), "refused": len(report.refused),
            "refusals": sorted({f"{r.from_class}: {r.reason}" for r in report.refused}),
            "eval_error": error, "stats_kept": kept,
            "unfreeze_exact": _same_state(back, model), "model": work}


def bnfix_fold(model: nn.Module, x: Any, want: Tensor) -> dict[str, Any]:
    """`want`: fold_outputs of the original."""
    work = copy.deepcopy(model)
    report = bt.ConversionReport()
    bt.fold(work, report=report)
    return {"folded": len(report.converted), "refused": len(report.refused),
            "refusals": sorted({f"{r.from_class}: {r.reason}" for r in report.refused}),
            "eval_error": rel_error(fold_outputs(work, x), want)}


def _bn_calls(graph_module: torch.fx.GraphModule) -> int:
    modules = dict(graph_module.named_modules())
    return sum(node.op == "call_module" and
               isinstance(modules[node.target], nn.modules.batchnorm._BatchNorm)
               for node in graph_module.graph.nodes)


def fx_fuse(model: nn.Module, x: Any, want: Tensor) -> dict[str, Any]:
    """torch.fx.experimental.optimization.fuse: traces the whole model, or fails. Folded: the
    BN calls of the traced graph that the fused graph no longer has (BN layers fx traces into,
    timm's norm-act layers, are not fused by it)."""
    from torch.fx.experimental.optimization import fuse

    try:
        before = _bn_calls(torch.fx.symbolic_trace(copy.deepcopy(model)))
        fused = fuse(copy.deepcopy(model))
    except Exception as exc:  # noqa: BLE001 - the tool's own failure is the measurement
        return {"folded": None, "error": f"{type(exc).__name__}"}
    return {"folded": before - _bn_calls(fused),
            "eval_error": rel_error(fold_outputs(fused, x), want)}


def registration_pairs(model: nn.Module) -> list[list[str]]:
    """(conv, bn) module paths adjacent in registration order, as fuse_modules users list them."""
    leaves = [(p, m) for p, m in model.named_modules() if not list(m.children())]
    return [[a, b] for (a, ma), (b, mb) in pairwise(leaves)
            if (type(ma), type(mb)) in _FUSABLE]


def ao_fuse(model: nn.Module, x: Any, want: Tensor) -> dict[str, Any]:
    from torch.ao.quantization import fuse_modules

    pairs = registration_pairs(model)
    try:
        fused = fuse_modules(copy.deepcopy(model), pairs) if pairs else model
    except Exception as exc:  # noqa: BLE001 - the tool's own failure is the measurement
        return {"folded": None, "error": f"{type(exc).__name__}"}
    return {"folded": len(pairs), "eval_error": rel_error(fold_outputs(fused, x), want)}


def traces(model: nn.Module, x: Any) -> bool | None:
    """torch.fx.symbolic_trace works and gives the same outputs (None: the original model
    itself does not trace, so there is nothing to keep)."""
    try:
        graph = torch.fx.symbolic_trace(model)
    except Exception:  # noqa: BLE001 - untraceable
        return False
    return rel_error(outputs(graph, x), outputs(model, x)) == 0.0


def feature_extractor_works(model: nn.Module, x: Any) -> bool:
    """torchvision's create_feature_extractor builds (it traces in train and eval mode) and its
    last node gives the model's output."""
    from torchvision.models.feature_extraction import (
        create_feature_extractor,
        get_graph_node_names,
    )

    try:
        _, nodes = get_graph_node_names(model)
        extractor = create_feature_extractor(model, return_nodes={nodes[-1]: "out"}).eval()
    except Exception:  # noqa: BLE001 - untraceable
        return False
    return rel_error(outputs(extractor, x), outputs(model.eval(), x)) == 0.0


def original_traces(model: nn.Module) -> bool:
    try:
        torch.fx.symbolic_trace(copy.deepcopy(model))
    except Exception:  # noqa: BLE001 - untraceable
        return False
    return True


@dataclass
class Row:
    model: str
    library: str
    bn: int
    sync: dict[str, Any]
    torch_sync: dict[str, Any]
    timm_sync: dict[str, Any] | None
    freeze: dict[str, Any]
    fold: dict[str, Any]
    fx_fuse: dict[str, Any]
    ao_fuse: dict[str, Any]
    traceable: dict[str, bool | None]


MAX_PARAMETERS = 300_000_000  # regnet_y_128gf (645M): its copies exhaust a 24 GB machine


def measure(entry: zoo_models.ZooModel, with_timm: bool = True) -> Row | str:
    """One row, or why there is none: no BN layer (ViT, Swin, ConvNeXt, ...), or too large."""
    model = entry.build().eval()
    if not bn_sites(model):
        return "without BN"
    size = sum(p.numel() for p in model.parameters())
    if size > MAX_PARAMETERS:
        return f"{size / 1e6:.0f}M parameters: too large for this machine's copies"
    x = entry.inputs(2)
    want = outputs(model, x)
    folded = fold_outputs(model, x)
    sync = bnfix_sync(model, x, want)
    freeze = bnfix_freeze(model, x, want)
    traceable: dict[str, bool | None] = {"original": original_traces(model)}
    if traceable["original"]:
        traceable["sync"] = traces(sync["model"].eval(), x)
        traceable["freeze"] = traces(freeze["model"], x)
    return Row(entry.name, entry.library, len(bn_sites(model)),
               {k: v for k, v in sync.items() if k != "model"}, torch_sync(model, x, want),
               timm_sync(model, x, want) if with_timm else None,
               {k: v for k, v in freeze.items() if k != "model"},
               bnfix_fold(model, x, folded), fx_fuse(model, x, folded),
               ao_fuse(model, x, folded), traceable)


def _fold_cell(result: dict[str, Any]) -> str:
    if result.get("folded") is None:
        return "-"
    return f"{result['folded']} ({result['eval_error']:.0e})"


def table(rows: list[Row]) -> str:
    head = ("| model | #BN | bnfix sync conv/ref | exact eval/revert | torch sync (eval err) | "
            "timm sync (eval err) | bnfix freeze (train=eval) | bnfix fold (err) | fx fuse | "
            "fuse_modules | fx after sync/freeze | ms bnfix/torch/timm |")
    lines = [head, "|" + "---|" * 12]
    for r in rows:
        timm = "-" if r.timm_sync is None else \
            f"{r.timm_sync['converted']} ({r.timm_sync['eval_error']:.0e})"
        trace = "n/a (original untraceable)" if not r.traceable["original"] else \
            f"{'ok' if r.traceable['sync'] else 'FAIL'}/{'ok' if r.traceable['freeze'] else 'FAIL'}"
        ms = "/".join(f"{1000 * t:.0f}" for t in (
            r.sync["seconds"], r.torch_sync["seconds"],
            *(() if r.timm_sync is None else (r.timm_sync["seconds"],))))
        frz = r.freeze
        lines.append(
            f"| {r.library}:{r.model} | {r.bn} | {r.sync['converted']}/{r.sync['refused']} | "
            f"{'=' if r.sync['eval_exact'] else 'DIFF'}/{'=' if r.sync['revert_exact'] else 'DIFF'}"
            f" | {r.torch_sync['converted']} ({r.torch_sync['eval_error']:.0e}) | {timm} | "
            f"{frz['frozen']}/{frz['refused']} ({frz['eval_error']:.0e}) | {_fold_cell(r.fold)} | "
            f"{_fold_cell(r.fx_fuse)} | {_fold_cell(r.ao_fuse)} | {trace} | {ms} |")
    return "\n".join(lines)


def totals(rows: list[Row]) -> str:
    bn = sum(r.bn for r in rows)
    synced = sum(r.sync["converted"] for r in rows)
    frozen = sum(r.freeze["frozen"] for r in rows)
    folded = sum(r.fold["folded"] for r in rows)
    fx = sum(r.fx_fuse["folded"] or 0 for r in rows)
    ao = sum(r.ao_fuse["folded"] or 0 for r in rows)
    worst_fold = max((r.fold["eval_error"] for r in rows), default=0.0)
    refusals = sorted({text for r in rows for part in ("sync", "freeze", "fold")
                       for text in getattr(r, part)["refusals"]})
    summary = (f"{len(rows)} models, {bn} BN layers: synced {synced}, frozen {frozen}, "
               f"folded {folded} (fx fuse {fx}, fuse_modules {ao}); worst fold error "
               f"{worst_fold:.1e}; sync eval exact on "
               f"{sum(r.sync['eval_exact'] for r in rows)}, revert exact on "
               f"{sum(r.sync['revert_exact'] for r in rows)}")
    lines = [summary, "refusal reasons (class: reason):"]
    lines += [f"  {text}" for text in refusals]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="model names (name or library:name)")
    parser.add_argument("--library", choices=("torchvision", "timm"))
    parser.add_argument("--json", type=Path, help="write every measurement as JSON")
    args = parser.parse_args()
    torch.set_num_threads(1)  # the machine's 2 cores are shared: more threads spin-wait
    entries = zoo_models.zoo(args.only)
    if args.library:
        entries = [e for e in entries if e.library == args.library]
    rows, without, skipped = [], [], []
    for entry in entries:
        start = time.perf_counter()
        row = measure(entry)
        if row == "without BN":
            without.append(f"{entry.library}:{entry.name}")
        elif isinstance(row, str):
            skipped.append(f"{entry.library}:{entry.name} ({row})")
        else:
            rows.append(row)
        print(f"{entry.library}:{entry.name}: {time.perf_counter() - start:.1f} s",
              file=sys.stderr, flush=True)
    print(f"torch {torch.__version__}, {len(rows)} models with BN, weights=None, batch 2; "
          f"without BN: {', '.join(without) or 'none'}; not measured: "
          f"{', '.join(skipped) or 'none'}")
    print(table(rows))
    print(totals(rows))
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=1, default=str))


if __name__ == "__main__":
    main()
