"""`bnfix validate torch|keras|tf1`: dispatch to the framework's runner, then report.

Each runner imports its framework itself (torch in-process; TensorFlow only in a worker
subprocess, whose devices must be configured before TensorFlow starts), so this module and the
rest of bnfix stay free of heavy imports.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path

from bnfix.validate.comparison import NotReporting, Validation
from bnfix.validate.errors import RunFailed, ValidateUsageError
from bnfix.validate.progress import Progress
from bnfix.validate.report import table, write_json

Runner = Callable[[argparse.Namespace, Progress], "Validation | NotReporting"]


def _runner(kind: str) -> Runner:
    if kind == "torch":
        from bnfix.validate.torch_runner import run_torch

        return run_torch
    if kind == "keras":
        from bnfix.validate.keras_runner import run_keras

        return run_keras
    from bnfix.validate.tf1_runner import run_tf1

    return run_tf1


def check_arguments(args: argparse.Namespace, devices: int | None) -> None:
    """What argparse cannot see: counts that must be positive and fit the batch."""
    if args.steps < 1:
        raise ValidateUsageError(f"--steps must be at least 1, not {args.steps}")
    if devices is not None and devices < 1:
        raise ValidateUsageError(f"the device count must be at least 1, not {devices}")
    if devices is not None and args.input_shape[0] < devices:
        raise ValidateUsageError(
            f"--input-shape {','.join(map(str, args.input_shape))}: a global batch of "
            f"{args.input_shape[0]} cannot give each of {devices} devices a sample")
    if len(args.input_shape) < 2:
        raise ValidateUsageError("--input-shape needs a batch dimension and at least one more")
    if args.tolerance is not None and not args.tolerance > 0:
        raise ValidateUsageError(f"--tolerance must be positive, not {args.tolerance}")
    if args.timeout <= 0:
        raise ValidateUsageError(f"--timeout must be positive, not {args.timeout}")


def run_side_by_side(args: argparse.Namespace) -> int:
    """Exit 0 when every comparison is within tolerance, 1 when one is not, 2 on a usage error
    or a failed run."""
    progress = Progress(args.progress)
    try:
        outcome = _runner(args.kind)(args, progress)
    except ValidateUsageError as exc:
        progress.done()
        sys.stderr.write(f"bnfix: validate {args.kind}: {exc}\n")
        return 2
    except RunFailed as exc:
        progress.done()
        sys.stderr.write(f"bnfix: validate {args.kind}: {exc}\n")
        if exc.detail:
            sys.stderr.write(exc.detail.rstrip("\n") + "\n")
        return 2
    seconds = progress.done()
    if isinstance(outcome, NotReporting):
        return outcome.exit_code
    validation = dataclasses.replace(outcome, seconds={**outcome.seconds, **seconds})
    sys.stdout.write(table(validation))
    if args.json_out:
        write_json(validation, Path(args.json_out))
        sys.stdout.write(f"JSON: {args.json_out}\n")
    if args.plot:
        from bnfix.validate.plot import write_plot

        write_plot(validation, Path(args.plot))
        sys.stdout.write(f"figure: {args.plot}\n")
    return 0 if validation.passed else 1
