"""The floor under a cold check with CPython's parser: `ast.parse` of every Python file of a
tree, beside ruff's whole cold run of the same tree.

    python bench/parse_floor.py TREE [TREE ...]

bnfix's front-end is CPython's `ast`; a cold check cannot cost less than parsing the files it
analyses. This prints, per tree, the seconds `ast.parse` takes on every `.py` file (read and
decoded first, untimed; one process), that time spread over the machine's cores, and ruff's
cold wall time (`ruff check --no-cache --isolated`, median of --repeat): when the parse alone,
spread over every core, comes near twice ruff's time, a goal of "cold <= 2x ruff" leaves
nothing for the analysis itself.
"""

from __future__ import annotations

import argparse
import ast
import os
import shutil
import statistics
import subprocess
import time
from pathlib import Path


def sources(tree: Path) -> list[str]:
    """The decodable Python sources under `tree` (UTF-8; others are left out, as they are a
    few files and bnfix reports them)."""
    out = []
    for path in sorted(tree.rglob("*.py")):
        try:
            out.append(path.read_bytes().decode("utf-8"))
        except (OSError, UnicodeDecodeError):
            continue
    return out


def parse_seconds(texts: list[str]) -> float:
    start = time.perf_counter()
    for text in texts:
        try:
            ast.parse(text)
        except (SyntaxError, ValueError, RecursionError):
            continue
    return time.perf_counter() - start


def ruff_seconds(tree: Path, repeat: int) -> float | None:
    ruff = shutil.which("ruff")
    if ruff is None:
        return None
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run([ruff, "check", "--no-cache", "--isolated", "--exit-zero", "-q",
                        str(tree)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       check=False)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs="+", type=Path)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    print(f"{'tree':<22} {'files':>6} {'parse s':>8} {'/ cores':>8} {'ruff s':>7} "
          f"{'parse / ruff':>13}")
    for tree in args.trees:
        texts = sources(tree)
        parse = statistics.median(parse_seconds(texts) for _ in range(args.repeat))
        ruff = ruff_seconds(tree, args.repeat)
        ratio = f"{parse / cores / ruff:.2f}" if ruff else "-"
        ruff_text = f"{ruff:.2f}" if ruff else "-"
        print(f"{tree.name:<22} {len(texts):>6} {parse:>8.2f} {parse / cores:>8.2f} "
              f"{ruff_text:>7} {ratio:>13}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
