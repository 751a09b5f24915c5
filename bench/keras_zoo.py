"""`bnfix validate keras` on six keras.applications models (weights=None), as a user runs it.

For each model: the number of BN layers converted, conversion fidelity (convert_sync and
revert_sync, eval mode, max abs difference), and the 2-replica synced training run against one
device fed the global batch: synced max rel error, the model's own fp32 rounding noise (the
reference on the reversed batch), the unsynced gap, the verdict and the wall time. With
--dtype both, each model also runs in float64.

    python bench/keras_zoo.py [--models MobileNetV2,ResNet50] [--size 32] [--batch 8]
                              [--steps 2] [--lr 0.01] [--dtype float32|float64|both] [--out DIR]

At lr 0.1 (validate's default) two SGD steps on these randomly initialised models at 32x32 are
chaotic in fp32 (rounding alone moves MobileNetV2's output by 75% by the second step): validate
says "inconclusive" there, rightly; 0.01 keeps them in the regime a comparison can use.

The functions below are the factories the command imports (`bench/keras_zoo.py:MobileNetV2`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODELS = ("MobileNetV2", "ResNet50", "EfficientNetB0", "DenseNet121", "NASNetMobile",
          "MobileNetV3Small")
SIZE = int(os.environ.get("BNFIX_ZOO_SIZE", "32"))
CLASSES = 10


def _application(name: str):  # type: ignore[no-untyped-def]
    import keras

    kwargs = {"weights": None, "input_shape": (SIZE, SIZE, 3), "classes": CLASSES}
    if name.startswith("MobileNetV3"):
        kwargs["include_preprocessing"] = False
    return getattr(keras.applications, name)(**kwargs)


def MobileNetV2():  # type: ignore[no-untyped-def]
    return _application("MobileNetV2")


def ResNet50():  # type: ignore[no-untyped-def]
    return _application("ResNet50")


def EfficientNetB0():  # type: ignore[no-untyped-def]
    return _application("EfficientNetB0")


def DenseNet121():  # type: ignore[no-untyped-def]
    return _application("DenseNet121")


def NASNetMobile():  # type: ignore[no-untyped-def]
    return _application("NASNetMobile")


def MobileNetV3Small():  # type: ignore[no-untyped-def]
    return _application("MobileNetV3Small")


def run_one(name: str, dtype: str, args: argparse.Namespace, out: Path) -> dict:
    report = out / f"{name}-{dtype}.json"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": "",
           "BNFIX_ZOO_SIZE": str(args.size)}
    start = time.perf_counter()
    run = subprocess.run(
        [sys.executable, "-m", "bnfix", "validate", "keras", f"{__file__}:{name}",
         "--input-shape", f"{args.batch},{args.size},{args.size},3", "--steps", str(args.steps),
         "--lr", str(args.lr), "--timeout", str(args.timeout),
         "--dtype", dtype, "--json", str(report), "--no-progress"],
        capture_output=True, text=True, env=env, check=False)
    seconds = time.perf_counter() - start
    if not report.is_file():
        tail = (run.stderr.strip().splitlines() or ["no output"])[-1]
        return {"model": name, "dtype": dtype, "exit": run.returncode, "error": tail,
                "seconds": seconds}
    data = json.loads(report.read_text())
    fidelity = {f["name"]: f for f in data["fidelity"]}
    return {"model": name, "dtype": dtype, "exit": run.returncode, "seconds": seconds,
            "converted": fidelity["convert_sync"]["converted"],
            "refused": len(fidelity["convert_sync"]["refused"]),
            "convert_abs": fidelity["convert_sync"]["max_abs"],
            "revert_abs": fidelity["revert_sync"]["max_abs"],
            "synced": data["synced"]["max_rel"],
            "noise": max((row["max_rel"] for row in (data.get("noise") or {}).get("layers", [])),
                         default=float("nan")),
            "unsynced": data["unsynced"]["max_rel"],
            "within_noise": len(data.get("within_noise", [])),
            "summary": data["summary"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--size", type=int, default=SIZE)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--timeout", type=float, default=600,
                        help="validate's --timeout (its worker may run 6x as long)")
    parser.add_argument("--dtype", choices=("float32", "float64", "both"), default="float32")
    parser.add_argument("--out", help="keep the JSON reports here (default: a temporary folder)")
    args = parser.parse_args()
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="bnfix-keras-zoo-"))
    out.mkdir(parents=True, exist_ok=True)
    dtypes = ("float32", "float64") if args.dtype == "both" else (args.dtype,)
    print(f"bnfix validate keras, 2 logical CPU replicas, global batch {args.batch}x{args.size}x"
          f"{args.size}x3, {args.steps} SGD steps (lr {args.lr}), weights=None")
    print("| model | dtype | BN converted | convert / revert max abs | synced rel | rounding rel "
          "| unsynced rel | exit | s | verdict |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        for dtype in dtypes:
            r = run_one(name, dtype, args, out)
            if "error" in r:
                print(f"| {name} | {dtype} | - | - | - | - | - | {r['exit']} | "
                      f"{r['seconds']:.0f} | {r['error']} |", flush=True)
                continue
            print(f"| {name} | {dtype} | {r['converted']} ({r['refused']} refused) | "
                  f"{r['convert_abs']:.1e} / {r['revert_abs']:.1e} | {r['synced']:.1e} | "
                  f"{r['noise']:.1e} | {r['unsynced']:.1e} | {r['exit']} | {r['seconds']:.0f} | "
                  f"{r['summary']} |", flush=True)
    print(f"reports: {out}")


if __name__ == "__main__":
    main()
