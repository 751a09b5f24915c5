"""`bnfix validate tf1 MODULE:BUILD`: run in a TensorFlow worker (see keras_runner)."""

from __future__ import annotations

import argparse

from bnfix.validate.comparison import NotReporting, Validation
from bnfix.validate.keras_runner import run_in_worker
from bnfix.validate.progress import Progress


def run_tf1(args: argparse.Namespace, progress: Progress) -> Validation | NotReporting:
    return run_in_worker("bnfix.validate.tf1_worker", args, args.towers, progress)
