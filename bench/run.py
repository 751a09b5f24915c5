"""Benchmark: bnfix check beside `ruff check` and TorchFix on the same files.

    python bench/run.py                      # synthetic corpus (bench/corpus.py), 600 files
    python bench/run.py --files 3000 --skip torchfix
    python bench/run.py PATH [PATH ...]      # real trees (e.g. an unpacked sdist, site-packages/torch)

Each tool runs cold (no cache) as a subprocess; the table shows the median wall time of
`--repeat` runs, lines per second, and each tool's time relative to bnfix's.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from corpus import build

TOOLS = {
    "bnfix": lambda paths: [sys.executable, "-m", "bnfix", "check", "--exit-zero", "--no-progress",
                            "--output-format", "concise", *paths],
    "bnfix -j1": lambda paths: [sys.executable, "-m", "bnfix", "check", "--exit-zero", "--no-progress",
                                "-j", "1", "--output-format", "concise", *paths],
    "ruff": lambda paths: ["ruff", "check", "--no-cache", "--exit-zero", "--quiet", *paths],
    "torchfix": lambda paths: ["torchfix", *paths],
}


def count(paths: list[str]) -> tuple[int, int]:
    files = lines = 0
    for root in paths:
        for folder, _, names in os.walk(root):
            for name in names:
                if name.endswith(".py"):
                    files += 1
                    with open(os.path.join(folder, name), "rb") as fh:
                        lines += fh.read().count(b"\n")
    return files, lines


def time_tool(argv: list[str], repeat: int, cwd: str) -> float | None:
    if shutil.which(argv[0]) is None and argv[0] != sys.executable:
        return None
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", help="real trees to measure (default: synthetic)")
    parser.add_argument("--files", type=int, default=600, help="synthetic corpus size")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--skip", action="append", default=[], help="tools to leave out")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bnfix-bench-") as tmp:
        if args.paths:
            paths = [os.path.abspath(p) for p in args.paths]
            label = ", ".join(args.paths)
        else:
            build(Path(tmp) / "corpus", args.files)
            paths = [str(Path(tmp) / "corpus")]
            label = f"synthetic corpus ({args.files} files)"
        files, lines = count(paths)
        print(f"corpus: {label}: {files} files, {lines} lines, {os.cpu_count()} cores")
        results = {}
        for name, make in TOOLS.items():
            if name in args.skip or name.split()[0] in args.skip:
                continue
            repeat = 1 if name == "torchfix" else args.repeat
            results[name] = time_tool(make(paths), repeat, tmp)
        base = results.get("bnfix")
        print(f"{'tool':<10} {'wall s':>9} {'lines/s':>11} {'x bnfix':>9}")
        for name, seconds in results.items():
            if seconds is None:
                print(f"{name:<10} {'not installed':>9}")
                continue
            ratio = f"{seconds / base:.2f}" if base else "-"
            print(f"{name:<10} {seconds:>9.2f} {lines / seconds:>11,.0f} {ratio:>9}")
        if base and results.get("ruff"):
            print(f"bnfix / ruff = {base / results['ruff']:.2f} (target <= 3)")
        if base and results.get("torchfix"):
            print(f"torchfix / bnfix = {results['torchfix'] / base:.1f} (target >= 50)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
