"""`bnfix validate keras` and `tf1`: the parent side, which never imports TensorFlow.

TensorFlow fixes its devices when it starts (logical CPU devices must be configured before), so
each run happens in a fresh worker process (`bnfix.validate.keras_worker` / `tf1_worker`) that
sets them up first; this side checks the arguments, waits for the worker (killing it past the
deadline) and turns its JSON back into a Validation. Under TF_CONFIG the worker joins the
multi-worker job; the chief's worker reports, the others exit with the same verdict.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from bnfix.validate.comparison import NotReporting, Validation, tolerance_for
from bnfix.validate.errors import ValidateUsageError
from bnfix.validate.processes import run_worker
from bnfix.validate.progress import Progress
from bnfix.validate.side_by_side import check_arguments

DEFAULT_DEVICES = 2
LR = 0.1
# The worker's deadline, in --timeout units: a Keras validation trains up to nine times (the
# reference and its noise runs, synced, unsynced, and their float64 reruns); TF1's trains three.
DEADLINE_TIMEOUTS = {"bnfix.validate.keras_worker": 6, "bnfix.validate.tf1_worker": 3}


def run_in_worker(module: str, args: argparse.Namespace, devices: int | None,
                  progress: Progress) -> Validation | NotReporting:
    if args.backend in ("gloo", "nccl"):
        raise ValidateUsageError(f"--backend {args.backend} is a torch backend: use auto, cpu "
                                 "or gpu")
    multi_worker = "TF_CONFIG" in os.environ and args.kind == "keras"
    check_arguments(args, devices if devices is not None or multi_worker else DEFAULT_DEVICES)
    job = {"factory": args.factory, "cwd": str(Path.cwd()), "input_shape": args.input_shape,
           "devices": devices, "default_devices": DEFAULT_DEVICES, "steps": args.steps,
           "dtype": args.dtype, "target": args.target, "seed": args.seed,
           "lr": args.lr if args.lr is not None else LR, "backend": args.backend,
           "tolerance": tolerance_for(args.dtype, args.tolerance), "timeout": args.timeout}
    progress.phase("starting TensorFlow")
    result = run_worker(module, job, progress, DEADLINE_TIMEOUTS.get(module, 3) * args.timeout
                        + 120)
    if not result.get("reporting", True):
        return NotReporting(int(result["exit_code"]))
    return Validation.from_json(result)


def run_keras(args: argparse.Namespace, progress: Progress) -> Validation | NotReporting:
    return run_in_worker("bnfix.validate.keras_worker", args, args.replicas, progress)
