"""The `bnfix validate` command line (argparse only: the CLI's start-up stays cheap)."""

from __future__ import annotations

import argparse

RUNS_USER_CODE = ("validate imports and runs YOUR code (the model factory or training script "
                  "named on the command line): only validate code you trust.")
EXIT = ("Exit codes: 0 every comparison within tolerance, 1 a comparison out of tolerance (or a "
        "fix whose symptom did not go), 2 usage error or a run that failed.")


def _shape(value: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(v) for v in value.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"`{value}` is not a shape like 8,3,32,32") from None
    if not shape or any(v <= 0 for v in shape):
        raise argparse.ArgumentTypeError(f"`{value}`: every dimension must be positive")
    return shape


def _common(parser: argparse.ArgumentParser, devices: str) -> None:
    parser.add_argument("--input-shape", type=_shape, required=True,
                        help="the GLOBAL batch's shape, e.g. 8,3,32,32 (split over the devices)")
    parser.add_argument("--target", choices=("classes", "regression"), default="classes",
                        help="synthetic targets: class indices (cross-entropy) or regression (MSE)")
    parser.add_argument(devices, type=int, default=None,
                        help="how many devices/ranks/replicas (default 2; under torchrun or "
                             "TF_CONFIG: the job's own)")
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps to compare")
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    parser.add_argument("--backend", choices=("auto", "gloo", "nccl", "cpu", "gpu"), default="auto",
                        help="auto: CUDA/NCCL when GPUs are present, else CPU (gloo / logical "
                             "CPU devices)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seeds the model's initialisation and the synthetic data")
    parser.add_argument("--lr", type=float, default=None, help="SGD learning rate (default 0.1)")
    parser.add_argument("--tolerance", type=float, default=None,
                        help="max relative error allowed (default set by --dtype)")
    parser.add_argument("--json", dest="json_out", metavar="OUT", help="write every figure as JSON")
    parser.add_argument("--plot", metavar="OUT.png", help="write a per-layer error figure")
    parser.add_argument("--timeout", type=float, default=300,
                        help="seconds a rank may wait on a collective before the run fails")
    parser.add_argument("--no-progress", dest="progress", action="store_false", default=None)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`bnfix validate {torch,keras,tf1,fix} ...`."""
    parser.description = ("Prove a BatchNorm rewrite by running the original and the rewritten "
                          "version side by side. " + RUNS_USER_CODE)
    kinds = parser.add_subparsers(dest="kind", metavar="KIND", required=True)
    torch = kinds.add_parser("torch", help="a PyTorch model: MODULE:FACTORY", epilog=EXIT,
                             description=RUNS_USER_CODE)
    torch.add_argument("factory", metavar="MODULE:FACTORY",
                       help="a module path or file and a function returning an nn.Module")
    _common(torch, "--world-size")
    keras = kinds.add_parser("keras", help="a Keras model: MODEL.keras or MODULE:FACTORY",
                             epilog=EXIT, description=RUNS_USER_CODE)
    keras.add_argument("factory", metavar="MODEL.keras|MODULE:FACTORY")
    _common(keras, "--replicas")
    tf1 = kinds.add_parser("tf1", help="a TF1 graph builder: MODULE:BUILD(inputs, is_training)",
                           epilog=EXIT, description=RUNS_USER_CODE)
    tf1.add_argument("factory", metavar="MODULE:BUILD")
    _common(tf1, "--towers")
    fix = kinds.add_parser(
        "fix", help="run a training script before and after `bnfix fix` and show each bug's "
                    "symptom gone", epilog=EXIT, description=RUNS_USER_CODE,
        usage="bnfix validate fix PATH [options] -- COMMAND [ARGS...]")
    fix.add_argument("path", help="the project folder (copied twice; never modified)")
    fix_options(fix)
    # not `command`: the top-level parser keeps the subcommand's name there. Options written
    # after PATH land here too; fix_command parses them with fix_options.
    fix.add_argument("run_command", metavar="COMMAND", nargs=argparse.REMAINDER,
                     help="after `--`: the command to run in both copies")


def fix_options(fix: argparse.ArgumentParser) -> None:
    """The options of `validate fix` (also parsed from the tokens between PATH and `--`)."""
    fix.add_argument("--select", help="rules to fix, comma-separated (default: the "
                                      "configuration's)")
    fix.add_argument("--extend-select", metavar="SELECT",
                     help="rules to fix on top of the selection, comma-separated (e.g. the "
                          "opt-in BN104)")
    fix.add_argument("--json", dest="json_out", metavar="OUT", help="write every figure as JSON")
    fix.add_argument("--plot", metavar="OUT.png", help="write the BN state trajectories")
    fix.add_argument("--timeout", type=float, default=600, help="seconds each run may take")
    fix.add_argument("--keep", metavar="DIR",
                     help="keep the two copies, their output and the probe logs in DIR (new or "
                          "empty)")
    fix.add_argument("--sequential", action="store_true",
                     help="run the two copies one after the other (scripts that bind a fixed "
                          "port or need every GPU)")
    fix.add_argument("--no-progress", dest="progress", action="store_false", default=None)
