"""`bnfix doctor`'s command line, kept apart from the command so that building the parser
imports nothing heavy (`bnfix check` builds the whole parser at start-up)."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=None,
                        help="stop the training after N steps (default: let it finish)")
    parser.add_argument("--every", type=int, default=10,
                        help="sample BN statistics every K training steps (default 10)")
    parser.add_argument("--json", dest="json_out", metavar="PATH",
                        help="write the report as JSON (bnfix-doctor/1)")
    parser.add_argument("--html", metavar="PATH", help="write the report as an HTML page with "
                                                       "per-layer plots")
    parser.add_argument("--select", default=None, help="diagnoses to run (codes or prefixes)")
    parser.add_argument("--ignore", default="", help="diagnoses to skip (codes or prefixes)")
    parser.add_argument("--timeout", type=float, default=None,
                        help="stop the command after this many seconds")
    parser.add_argument("--exit-zero", action="store_true", help="exit 0 even with findings")
    parser.add_argument("run_command", nargs=argparse.REMAINDER, metavar="-- COMMAND",
                        help="the training command, after `--`")
