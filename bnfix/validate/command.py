"""Dispatch `bnfix validate KIND` to its runner (each imports its framework lazily)."""

from __future__ import annotations

import argparse


def run(args: argparse.Namespace) -> int:
    if args.kind == "fix":
        from bnfix.validate.fix_command import run_fix

        return run_fix(args)
    from bnfix.validate.side_by_side import run_side_by_side

    return run_side_by_side(args)
