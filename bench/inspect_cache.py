"""Wall time of `bnfix inspect DIR` with a cold cache, a warm cache and `--no-cache` (issue 17).

DIR holds N small torch checkpoints (a conv and a BN, trained a few steps; one in three with
its statistics reset, so BN201 is found) and one TF1 checkpoint (`.index` + `.data-*`). The
files are made 2.5 s before the first run, so that no cache entry is racy. Each command runs
as a subprocess (`python -m bnfix inspect DIR`); "cold" removes the cache folder first. The
median of --repeat runs is printed, with what a warm run imported (from a separate run that
lists the framework modules it loaded).

    python bench/inspect_cache.py [--checkpoints 20] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TF_SCRIPT = """
import sys
import tensorflow as tf
tf.compat.v1.disable_eager_execution()
with tf.Graph().as_default():
    init = tf.compat.v1.constant_initializer
    for name, value in (("gamma", 0.5), ("beta", 0.0), ("moving_mean", 0.0),
                        ("moving_variance", 1.0)):
        tf.compat.v1.get_variable("bn1/" + name, [64], initializer=init(value))
    tf.compat.v1.get_variable("conv1/kernel", [3, 3, 64, 64], initializer=init(0.1))
    tf.compat.v1.get_variable("global_step", [], tf.int64, initializer=init(3))
    saver = tf.compat.v1.train.Saver()
    with tf.compat.v1.Session() as session:
        session.run(tf.compat.v1.global_variables_initializer())
        saver.save(session, sys.argv[1] + "/model.ckpt", write_meta_graph=False)
"""
IMPORTS = """
import sys
from bnfix.cli import main
code = main(["inspect", sys.argv[1], "--output-format", "concise"])
print(sorted(m for m in ("torch", "tensorflow", "onnx", "h5py") if m in sys.modules),
      file=sys.stderr)
"""
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}


def make_runs(folder: Path, checkpoints: int) -> None:
    import torch

    torch.manual_seed(0)
    for i in range(checkpoints):
        model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3), torch.nn.BatchNorm2d(16))
        model.train()
        for _ in range(3):
            model(torch.randn(4, 3, 16, 16))
        state = model.state_dict()
        if i % 3 == 0:
            state["1.running_mean"].zero_()
            state["1.running_var"].fill_(1.0)
        torch.save(state, folder / f"epoch_{i:03d}.pt")
    (folder / "tf").mkdir()
    subprocess.run([sys.executable, "-c", TF_SCRIPT, str(folder / "tf")], check=True,
                   env=ENV, capture_output=True)


def timed(args: list[str], cwd: Path) -> tuple[float, str]:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, *args], cwd=cwd, env=ENV, capture_output=True,
                          text=True, check=False)
    seconds = time.perf_counter() - start
    if proc.returncode not in (0, 1):
        raise SystemExit(f"bnfix failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return seconds, proc.stdout + "\n" + proc.stderr


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoints", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        runs = root / "runs"
        runs.mkdir()
        make_runs(runs, args.checkpoints)
        time.sleep(2.5)  # older than the racy window: entries are trusted by stat
        cache = root / ".bnfix_cache"
        inspect = ["-m", "bnfix", "inspect", "runs"]
        times: dict[str, list[float]] = {"cold": [], "warm": [], "--no-cache": []}
        outputs: dict[str, str] = {}
        for _ in range(args.repeat):
            shutil.rmtree(cache, ignore_errors=True)
            seconds, outputs["cold"] = timed(inspect, root)
            times["cold"].append(seconds)
            seconds, outputs["warm"] = timed(inspect, root)
            times["warm"].append(seconds)
            seconds, _ = timed([*inspect, "--no-cache"], root)
            times["--no-cache"].append(seconds)
        _, imported = timed(["-c", IMPORTS, "runs"], root)
        artifacts = args.checkpoints + 1
        print(f"bnfix inspect runs/: {args.checkpoints} torch checkpoints + 1 TF checkpoint, "
              f"median of {args.repeat} runs, {os.cpu_count()} CPUs")
        print(f"{'run':<12} {'wall s':>8} {'per artifact ms':>16}")
        for name, values in times.items():
            median = statistics.median(values)
            print(f"{name:<12} {median:>8.2f} {1000 * median / artifacts:>16.1f}")
        print(f"warm run: {outputs['warm'].count('cached (')} of {artifacts} artifacts from the "
              f"cache; framework modules imported: {imported.strip().splitlines()[-1]}")


if __name__ == "__main__":
    main()
