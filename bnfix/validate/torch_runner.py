"""`bnfix validate torch MODULE:FACTORY`: the parent side.

Local (default): this process builds the model once and saves its state; N worker processes
(`bnfix.validate.torch_worker`) meet in a FileStore, load that state and run the synced and the
unsynced copy; meanwhile this process runs the reference (plain BN, one device, the whole
global batch, the same state) and the conversion-fidelity checks on the trained reference.

Under torchrun (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set): this process IS a rank. It joins
that job (env://), rank 0's initial state is broadcast, rank 0 gathers the records, runs the
reference and reports; its verdict is broadcast so every rank exits with the same code.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import tempfile
import time
import traceback
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

import bnfix.torch as bt
from bnfix.validate import processes, torch_ranks
from bnfix.validate.comparison import (
    Fidelity,
    NotReporting,
    Refusal,
    Validation,
    compare,
    output_error,
    tolerance_for,
)
from bnfix.validate.errors import RunFailed, ValidateUsageError
from bnfix.validate.progress import Progress
from bnfix.validate.side_by_side import check_arguments
from bnfix.validate.torch_training import (
    TorchJob,
    build_model,
    inputs,
    layer_kinds,
    to_trace,
    train,
)

TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
LR = 0.1


def under_torchrun() -> bool:
    return all(name in os.environ for name in TORCHRUN_VARIABLES)


def _backend(choice: str, ranks_here: int) -> str:
    """gloo on CPU or NCCL on CUDA; `auto` takes NCCL when every local rank gets its own GPU
    (NCCL refuses two ranks on one device)."""
    if choice in ("gloo", "cpu"):
        return "gloo"
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if choice in ("nccl", "gpu"):
        if not dist.is_nccl_available() or gpus < ranks_here:
            raise ValidateUsageError(f"--backend {choice}: {ranks_here} local ranks need as many "
                                     f"CUDA devices with NCCL, this machine has {gpus}")
        return "nccl"
    return "nccl" if dist.is_nccl_available() and gpus >= ranks_here > 0 else "gloo"


def make_job(args: argparse.Namespace) -> TorchJob:
    world = args.world_size
    joined = under_torchrun()
    if joined:
        launched = int(os.environ["WORLD_SIZE"])
        if world is not None and world != launched:
            raise ValidateUsageError(f"--world-size {world} but torchrun started {launched} "
                                     "ranks: leave --world-size out under torchrun")
        world = launched
    world = 2 if world is None else world
    check_arguments(args, world)
    ranks_here = int(os.environ.get("LOCAL_WORLD_SIZE", world)) if joined else world
    return TorchJob(factory=args.factory, cwd=str(Path.cwd()),
                    input_shape=tuple(args.input_shape), world=world, steps=args.steps,
                    dtype=args.dtype, target=args.target, seed=args.seed,
                    lr=args.lr if args.lr is not None else LR,
                    backend=_backend(args.backend, ranks_here), timeout=args.timeout,
                    tolerance=tolerance_for(args.dtype, args.tolerance))


def run_torch(args: argparse.Namespace, progress: Progress) -> Validation | NotReporting:
    job = make_job(args)
    torch_ranks.exact_math()
    if under_torchrun():
        return _run_joined(job, progress)
    return _run_local(job, progress)


def _reference_device(job: TorchJob) -> torch.device:
    return torch.device("cuda", 0) if job.backend == "nccl" else torch.device("cpu")


def _run_local(job: TorchJob, progress: Progress) -> Validation:
    device = _reference_device(job)
    progress.phase("building the model")
    model = build_model(job, device)
    with tempfile.TemporaryDirectory(prefix="bnfix-validate-") as tmp:
        workdir = Path(tmp)
        torch.save(model.state_dict(), workdir / "initial.pt")
        (workdir / "job.json").write_text(json.dumps(asdict(job)), encoding="utf-8")
        progress.phase(f"starting {job.world} {job.backend} ranks")
        children = [
            processes.start(f"rank {rank}", "bnfix.validate.torch_worker", [tmp], workdir,
                            workdir / f"rank{rank}.error", _rank_env(job, rank), Path(job.cwd))
            for rank in range(job.world)]
        try:
            kinds = layer_kinds(model)
            reference, fidelity = _reference_and_fidelity(job, model, device, progress)
            progress.phase(f"waiting for {job.world} ranks (synced, then unsynced)")
            # ranks may spend `timeout` on one collective; 3x leaves room for the K steps
            processes.wait_all(children, time.monotonic() + 3 * job.timeout + 60)
        finally:
            processes.kill_all(children)
        gathered = torch.load(workdir / "ranks.pt", weights_only=True)
    return _validation(job, "local processes", kinds, reference, gathered, fidelity)


def _rank_env(job: TorchJob, rank: int) -> dict[str, str]:
    return {"RANK": str(rank), "WORLD_SIZE": str(job.world), "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(job.world), "OMP_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1"}


def _run_joined(job: TorchJob, progress: Progress) -> Validation | NotReporting:
    rank = int(os.environ["RANK"])
    if rank != 0:
        progress.enabled = False  # rank 0 alone talks
    device = torch_ranks.device_for(job, int(os.environ.get("LOCAL_RANK", rank)))
    progress.phase(f"joining the torchrun job ({job.world} {job.backend} ranks)")
    torch_ranks.join(job, rank, "env://")
    progress.phase("building the model")
    model = build_model(job, device)
    torch_ranks.share_initial_state(model, None)
    initial = copy.deepcopy(model)
    progress.phase("synced, then unsynced training")
    gathered = torch_ranks.gather(torch_ranks.rank_runs(job, rank, model, device), rank)
    del model  # freed before the group goes (torch_ranks.leave)
    outcome: list[Any] = [2]  # what the others get if rank 0 fails
    validation: Validation | None = None
    if gathered is not None:
        try:
            reference, fidelity = _reference_and_fidelity(job, initial, device, progress)
            validation = _validation(job, "torchrun", layer_kinds(initial), reference,
                                     gathered, fidelity)
            outcome = [0 if validation.passed else 1]
        finally:
            dist.broadcast_object_list(outcome, src=0)  # the others wait for the verdict
            torch_ranks.leave()
    else:
        dist.broadcast_object_list(outcome, src=0)
        torch_ranks.leave()
    return validation if validation is not None else NotReporting(int(outcome[0]))


def _reference_and_fidelity(job: TorchJob, model: nn.Module, device: torch.device,
                            progress: Progress) -> tuple[dict[str, Any], tuple[Fidelity, ...]]:
    """The reference run trains `model` in place; the fidelity checks then use its trained
    weights and moved running statistics (initial statistics 0/1 would hide a lost buffer)."""
    progress.phase("reference run (plain BN, one device, global batch)")
    try:
        reference = train(job, model, None, device, lambda _tensor: None)
    except Exception as exc:  # noqa: BLE001 - the user's model failed in training
        raise RunFailed(f"the reference run failed: {type(exc).__name__}: {exc}",
                        traceback.format_exc()) from None
    progress.phase("conversion fidelity (eval mode)")
    return reference, conversion_fidelity(model, inputs(job, 0).to(device))


def _refusals(report: bt.ConversionReport) -> tuple[Refusal, ...]:
    return tuple(Refusal(r.where, r.from_class, r.reason) for r in report.refused)


def refusal_problem(report: bt.ConversionReport) -> str:
    """What refusals of a sync conversion mean for the synced run ("" when there are none)."""
    refused = len(report.refused)
    if not refused:
        return ""
    if not report.converted:
        return (f"refused every BN layer ({refused} refused, 0 converted): nothing is synced, "
                "the synced run is the unsynced one")
    return (f"{refused} of {refused + len(report.converted)} BN layers refused: they stay "
            "unsynced in the synced run")


def _classes(model: nn.Module) -> list[str]:
    return [f"{path}:{type(m).__qualname__}" for path, m in model.named_modules()]


@torch.no_grad()
def conversion_fidelity(model: nn.Module, x: torch.Tensor) -> tuple[Fidelity, ...]:
    """convert_sync, revert_sync (of the converted copy) and fold, each in eval mode on a copy
    with the same weights, against the original's outputs on `x`."""
    model.eval()
    want = model(x).cpu().numpy()
    synced, to_sync = copy.deepcopy(model), bt.ConversionReport()
    bt.convert_sync(synced, report=to_sync)
    results = [Fidelity("convert_sync", *output_error(synced.eval()(x).cpu().numpy(), want),
                        len(to_sync.converted), _refusals(to_sync),
                        problem=refusal_problem(to_sync))]
    back = bt.ConversionReport()
    bt.revert_sync(synced, report=back)
    same = _classes(synced) == _classes(model)
    problems = ([] if same else ["the reverted model's classes differ from the original's"]) + \
        ([f"{len(back.refused)} synced layers not reverted"] if back.refused else [])
    results.append(Fidelity(
        "revert_sync", *output_error(synced.eval()(x).cpu().numpy(), want), len(back.converted),
        _refusals(back), "exact original classes restored" if same else "", "; ".join(problems)))
    folded, fold_report = copy.deepcopy(model), bt.ConversionReport()
    bt.fold(folded, report=fold_report)
    results.append(Fidelity("fold", *output_error(folded(x).cpu().numpy(), want),
                            len(fold_report.converted), _refusals(fold_report),
                            "BN folded into the conv/linear before it"))
    model.train()
    return tuple(results)


def _validation(job: TorchJob, launcher: str, kinds: dict[str, str], reference: dict[str, Any],
                gathered: list[dict[str, Any]], fidelity: tuple[Fidelity, ...]) -> Validation:
    ref = to_trace([reference])
    settings = {"input_shape": list(job.input_shape), "devices": job.world,
                "replica_word": "ranks", "backend": job.backend,
                "device": "cuda" if job.backend == "nccl" else "cpu", "launcher": launcher,
                "steps": job.steps, "lr": job.lr, "dtype": job.dtype, "target": job.target,
                "seed": job.seed, "timeout": job.timeout,
                "loss": "sum of per-sample losses / global batch per rank, gradients SUM "
                        "all-reduced"}
    return Validation(
        "torch", job.factory, settings, job.tolerance, fidelity,
        compare("synced", ref, to_trace([g["synced"] for g in gathered]), kinds),
        compare("unsynced", ref, to_trace([g["unsynced"] for g in gathered]), kinds), {})
