"""Benchmark: bnfix check beside `ruff check` and TorchFix on the same files.

    python bench/run.py                              # synthetic corpus (bench/synthetic.py)
    python bench/run.py --files 3000 --skip torchfix
    python bench/run.py --real timm tensor2tensor tf-models-official   # downloaded with pip
    python bench/run.py --installed tensorflow torch keras              # site-packages sources
    python bench/run.py PATH [PATH ...]                                 # any tree

For each corpus: cold runs (no cache) of bnfix (worker processes, and -j1), ruff (default rules)
and TorchFix; warm runs (nothing changed since the last run: the pre-commit case) of bnfix and
ruff with their caches; `bnfix check --fix --unsafe-fixes` on a copy; bnfix's peak memory.
Medians of --repeat runs (TorchFix: one run); ratios against bnfix's cold run.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from synthetic import build

# Real trees of ML code that pip can fetch here: (requirement, sdist or wheel)
REAL = {
    "timm": ("timm==1.0.15", "sdist"),
    "tensor2tensor": ("tensor2tensor==1.15.7", "sdist"),
    "tf-models-official": ("tf-models-official==2.15.0", "wheel"),
}
BNFIX = [sys.executable, "-m", "bnfix", "check", "--exit-zero", "--no-progress",
         "--output-format", "concise"]


@dataclass
class Corpus:
    label: str
    paths: list[str]
    files: int = 0
    lines: int = 0
    times: dict[str, float | None] = field(default_factory=dict)
    rss_mb: float | None = None


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


def timed(argv: list[str], repeat: int, cwd: str) -> float | None:
    if shutil.which(argv[0]) is None and argv[0] != sys.executable:
        return None
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       check=False)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def peak_rss_mb(argv: list[str], cwd: str) -> float:
    """Peak resident memory of a command and its worker processes, in MB."""
    probe = ("import resource, subprocess, sys; subprocess.run(sys.argv[1:], "
             "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); "
             "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    out = subprocess.run([sys.executable, "-c", probe, *argv], cwd=cwd, capture_output=True,
                         text=True, check=True).stdout
    return int(out.strip()) / 1024


def download(name: str, into: Path) -> str:
    requirement, kind = REAL[name]
    folder = into / name
    if folder.exists():
        return str(folder)
    flags = ["--no-binary", ":all:"] if kind == "sdist" else ["--only-binary", ":all:"]
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", *flags,
                    "-d", str(into / "dist"), requirement], check=True)
    archive = next((into / "dist").glob(requirement.split("==")[0].replace("-", "_") + "*")
                   if kind == "wheel" else (into / "dist").glob(requirement.split("==")[0] + "*"))
    folder.mkdir(parents=True)
    if archive.suffix == ".whl":
        with zipfile.ZipFile(archive) as zf:
            zf.extractall(folder)
    else:
        with tarfile.open(archive) as tf:
            tf.extractall(folder, filter="data")
    return str(folder)


def installed(name: str) -> str:
    spec = importlib.util.find_spec(name)  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"{name} is not installed")
    return next(iter(spec.submodule_search_locations))


def measure(corpus: Corpus, args: argparse.Namespace, work: Path) -> None:
    corpus.files, corpus.lines = count(corpus.paths)
    run_dir = work / f"run-{abs(hash(corpus.label))}"
    run_dir.mkdir()
    t = corpus.times
    cold = [*BNFIX, "--no-cache", *corpus.paths]
    t["bnfix"] = timed(cold, args.repeat, str(run_dir))
    t["bnfix -j1"] = timed([*BNFIX, "--no-cache", "-j", "1", *corpus.paths], args.repeat,
                           str(run_dir))
    t["ruff"] = timed(["ruff", "check", "--no-cache", "--exit-zero", "--quiet", *corpus.paths],
                      args.repeat, str(run_dir))
    warm = [*BNFIX, *corpus.paths]
    timed(warm, 1, str(run_dir))  # fills .bnfix_cache
    t["bnfix warm"] = timed(warm, args.repeat, str(run_dir))
    ruff_warm = ["ruff", "check", "--exit-zero", "--quiet", *corpus.paths]
    timed(ruff_warm, 1, str(run_dir))
    t["ruff warm"] = timed(ruff_warm, args.repeat, str(run_dir))
    copy = run_dir / "copy"
    for i, path in enumerate(corpus.paths):
        shutil.copytree(path, copy / str(i), ignore=shutil.ignore_patterns("*.so", "*.pyc"))
    t["bnfix --fix"] = timed([*BNFIX, "--no-cache", "--fix", "--unsafe-fixes", str(copy)], 1,
                             str(run_dir))
    if "torchfix" not in args.skip:
        t["torchfix"] = timed(["torchfix", *corpus.paths], 1, str(run_dir))
    corpus.rss_mb = peak_rss_mb(cold, str(run_dir))


def report(corpora: list[Corpus]) -> None:
    for c in corpora:
        print(f"\n{c.label}: {c.files} files, {c.lines:,} lines, {os.cpu_count()} cores, "
              f"bnfix peak RSS {c.rss_mb:.0f} MB")
        base = c.times.get("bnfix")
        print(f"  {'tool':<13} {'wall s':>8} {'lines/s':>10} {'x bnfix':>8}")
        for name, seconds in c.times.items():
            if seconds is None:
                print(f"  {name:<13} {'(not installed)':>8}")
                continue
            ratio = f"{seconds / base:.2f}" if base else "-"
            print(f"  {name:<13} {seconds:>8.2f} {c.lines / seconds:>10,.0f} {ratio:>8}")
        t = c.times
        if base and t.get("ruff"):
            print(f"  cold bnfix / ruff        = {base / t['ruff']:.2f}  (target <= 3)")
        if base and t.get("torchfix"):
            print(f"  torchfix / cold bnfix    = {t['torchfix'] / base:.0f}  (target >= 50)")
        if t.get("bnfix warm") and t.get("ruff warm"):
            print(f"  warm bnfix / warm ruff   = {t['bnfix warm'] / t['ruff warm']:.2f}  "
                  "(target <= 1)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", help="trees to measure")
    parser.add_argument("--files", type=int, default=600, help="synthetic corpus size")
    parser.add_argument("--real", nargs="*", default=[], choices=sorted(REAL))
    parser.add_argument("--installed", nargs="*", default=[])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--skip", action="append", default=[], help="tools to leave out")
    parser.add_argument("--downloads", default=str(Path(tempfile.gettempdir()) / "bnfix-bench"),
                        help="where --real trees are downloaded and unpacked (reused)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bnfix-bench-") as tmp:
        work = Path(tmp)
        corpora = [Corpus(p, [os.path.abspath(p)]) for p in args.paths]
        corpora += [Corpus(f"{n} (pip)", [download(n, Path(args.downloads))]) for n in args.real]
        corpora += [Corpus(f"{n} (installed)", [installed(n)]) for n in args.installed]
        if not corpora:
            build(work / "corpus", args.files)
            corpora = [Corpus(f"synthetic corpus ({args.files} files)", [str(work / "corpus")])]
        for corpus in corpora:
            measure(corpus, args, work)
        report(corpora)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
