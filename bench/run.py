"""Benchmark: bnfix check beside `ruff check` and TorchFix on the same files.

    python bench/run.py                              # synthetic corpus (bench/synthetic.py)
    python bench/run.py --files 3000 --skip torchfix
    python bench/run.py --real timm tensor2tensor tf-models-official   # downloaded with pip
    python bench/run.py --installed tensorflow torch keras              # site-packages sources
    python bench/run.py PATH [PATH ...]                                 # any tree

For each corpus: cold runs (no cache) of bnfix (worker processes, and -j1), ruff (default rules)
and TorchFix; warm runs (nothing changed since the last run: the pre-commit case) of bnfix and
ruff with their caches; warm runs after an edit of one model file (a file that builds BN and that
other files import): a comment (its summary unchanged: only it is re-checked), a new helper
that calls nothing (a silent function: only it is re-checked) and a new function that calls one
of the module's functions (its summary changes: the files that consulted it are re-checked
too); `bnfix check --fix
--unsafe-fixes` on a copy; bnfix's peak memory; bnfix's start-up (an empty folder) beside the
interpreter's own. Medians of --repeat runs (TorchFix: one run) of wall time and of CPU time
(user + system of the process and its workers: less sensitive to a busy machine); ratios against
bnfix's cold run.
"""

from __future__ import annotations

import argparse
import compileall
import importlib.util
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import bnfix

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
    cpu: dict[str, float | None] = field(default_factory=dict)
    rss_mb: float | None = None
    edited: str | None = None


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


def timed(argv: list[str], repeat: int, cwd: str, cpu: list[float] | None = None,
          before: Callable[[], None] | None = None) -> float | None:
    """Median wall seconds of `repeat` runs (CPU seconds appended to `cpu`); `before` runs
    ahead of each (an edit), untimed."""
    if shutil.which(argv[0]) is None and argv[0] != sys.executable:
        return None
    times, cpus = [], []
    for _ in range(repeat):
        if before is not None:
            before()
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        subprocess.run(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       check=False)
        times.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - usage.ru_utime + after.ru_stime - usage.ru_stime)
    if cpu is not None:
        cpu.append(statistics.median(cpus))
    return statistics.median(times)


def model_file(paths: list[str]) -> Path | None:
    """A file that builds BN and whose module name other files mention: the edit that costs
    a project-wide linter the most."""
    words = (b"BatchNorm", b"batch_norm", b"batch_normalization")
    best: tuple[int, Path] | None = None
    sources = [Path(f, n) for root in paths for f, _, names in os.walk(root)
               for n in names if n.endswith(".py")]
    texts = {p: p.read_bytes() for p in sources}
    for path, text in texts.items():
        if not any(w in text for w in words) or path.stem == "__init__":
            continue
        stem = path.stem.encode()
        users = sum(1 for other, body in texts.items() if other != path and stem in body)
        if best is None or users > best[0]:
            best = (users, path)
    return best[1] if best else None


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
    t, c = corpus.times, corpus.cpu

    def run(name: str, argv: list[str], repeat: int, before: Callable[[], None] | None = None
            ) -> None:
        cpu: list[float] = []
        t[name] = timed(argv, repeat, str(run_dir), cpu, before)
        c[name] = cpu[0] if cpu else None

    run("bnfix", [*BNFIX, "--no-cache", *corpus.paths], args.repeat)
    run("bnfix -j1", [*BNFIX, "--no-cache", "-j", "1", *corpus.paths], args.repeat)
    run("ruff", ["ruff", "check", "--no-cache", "--exit-zero", "--quiet", *corpus.paths],
        args.repeat)
    copy = run_dir / "copy"
    # each copy keeps its folder's name: `torch/` copied as `0/` would be a package named `0`
    # whose `import torch.nn` no longer resolves to first-party code (a smaller project)
    copies = [copy / str(i) / Path(path).name for i, path in enumerate(corpus.paths)]
    for path, into in zip(corpus.paths, copies):
        shutil.copytree(path, into, ignore=shutil.ignore_patterns("*.so", "*.pyc"))
    warm = [*BNFIX, *map(str, copies)]
    timed(warm, 1, str(run_dir))  # fills .bnfix_cache
    run("bnfix warm", warm, args.repeat)
    ruff_warm = ["ruff", "check", "--exit-zero", "--quiet", str(copy)]
    timed(ruff_warm, 1, str(run_dir))
    run("ruff warm", ruff_warm, args.repeat)
    target = model_file([str(copy)])
    if target is not None:
        corpus.edited = str(target.relative_to(copy))
        counter = iter(range(10**6))
        run("bnfix edit comment", warm, args.repeat,
            lambda: target.open("a").write(f"# bench edit {next(counter)}\n"))
        run("bnfix edit model", warm, args.repeat,
            lambda: target.open("a").write(f"\ndef _bench_edit_{next(counter)}():\n    pass\n"))
        called = re.search(r"^def (\w+)\(", target.read_text(), re.MULTILINE)
        if called is not None:  # a summary change: the files whose cone holds it re-check
            run("bnfix edit model calls", warm, args.repeat,
                lambda: target.open("a").write(
                    f"\ndef _bench_call_{next(counter)}(*args):\n"
                    f"    return {called.group(1)}(*args)\n"))
        run("ruff edit comment", ruff_warm, args.repeat,
            lambda: target.open("a").write(f"# bench edit {next(counter)}\n"))
    fixed = [run_dir / "fixed" / str(i) / Path(path).name for i, path in enumerate(corpus.paths)]
    for path, into in zip(corpus.paths, fixed):
        shutil.copytree(path, into, ignore=shutil.ignore_patterns("*.so", "*.pyc"))
    run("bnfix --fix", [*BNFIX, "--no-cache", "--fix", "--unsafe-fixes", *map(str, fixed)], 1)
    if "torchfix" not in args.skip:
        run("torchfix", ["torchfix", *corpus.paths], 1)
    corpus.rss_mb = peak_rss_mb([*BNFIX, "--no-cache", *corpus.paths], str(run_dir))


def startup(repeat: int, work: Path) -> tuple[float, float, float]:
    """bnfix's start-up (check of an empty folder: as run by default, its cache folder made by
    a first run, and with --no-cache) and the bare interpreter's, median wall s."""
    empty = work / "empty"
    empty.mkdir(exist_ok=True)
    timed([*BNFIX, str(empty)], 1, str(empty))  # makes the cache folder
    default = timed([*BNFIX, str(empty)], repeat, str(empty))
    no_cache = timed([*BNFIX, "--no-cache", str(empty)], repeat, str(work))
    python = timed([sys.executable, "-c", "pass"], repeat, str(work))
    assert default is not None and no_cache is not None and python is not None
    return default, no_cache, python


def installed_startup(repeat: int, work: Path) -> tuple[float, float] | None:
    """bnfix's start-up as a user's `pip install` leaves it (a wheel, in a new virtual
    environment, byte-compiled) and that environment's bare interpreter, median wall s. The
    editable install this bench runs loads setuptools' import finder at every start (the
    rule book is mapped into the package), which imports pathlib and re before bnfix does:
    it hides part of bnfix's own imports inside the interpreter's time. None when the wheel
    or the environment cannot be made here (no network is needed: no dependency is
    installed, and an empty folder's check imports none)."""
    repo = Path(bnfix.__file__).resolve().parent.parent
    wheels, venv = work / "wheel", work / "venv"
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                            "--no-build-isolation", "-w", str(wheels), str(repo)],
                           capture_output=True, check=False)
    found = sorted(wheels.glob("bnfix-*.whl"))
    if built.returncode != 0 or not found:
        return None
    python = str(venv / "bin" / "python")
    for step in ([sys.executable, "-m", "venv", str(venv)],
                 [python, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                  str(found[-1])]):
        if subprocess.run(step, capture_output=True, check=False).returncode != 0:
            return None
    empty = work / "empty"
    command = [str(venv / "bin" / "bnfix"), *BNFIX[3:], str(empty)]
    timed(command, 1, str(empty))
    default = timed(command, repeat, str(empty))
    bare = timed([python, "-c", "pass"], repeat, str(work))
    assert default is not None and bare is not None
    return default, bare


def report(corpora: list[Corpus]) -> None:
    for c in corpora:
        print(f"\n{c.label}: {c.files} files, {c.lines:,} lines, {os.cpu_count()} cores, "
              f"bnfix peak RSS {c.rss_mb:.0f} MB")
        if c.edited:
            print(f"  edited model file: {c.edited}")
        base, base_cpu = c.times.get("bnfix"), c.cpu.get("bnfix")
        print(f"  {'tool':<19} {'wall s':>8} {'cpu s':>8} {'lines/s':>10} {'x bnfix':>8}")
        for name, seconds in c.times.items():
            if seconds is None:
                print(f"  {name:<19} {'(not installed)':>8}")
                continue
            cpu = c.cpu.get(name)
            ratio = f"{seconds / base:.2f}" if base else "-"
            cpu_text = f"{cpu:>8.2f}" if cpu is not None else f"{'-':>8}"
            print(f"  {name:<19} {seconds:>8.2f} {cpu_text} {c.lines / seconds:>10,.0f} "
                  f"{ratio:>8}")
        t, u = c.times, c.cpu
        if base and t.get("ruff"):
            print(f"  cold bnfix / ruff          = {base / t['ruff']:.2f} wall, "
                  f"{(base_cpu or 0) / (u.get('ruff') or 1):.2f} cpu  (target <= 2)")
        if base and t.get("torchfix"):
            print(f"  torchfix / cold bnfix      = {t['torchfix'] / base:.0f}  (target >= 50)")
        if t.get("bnfix warm") and t.get("ruff warm"):
            print(f"  warm bnfix / warm ruff     = {t['bnfix warm'] / t['ruff warm']:.2f}  "
                  "(target <= 1)")
        if t.get("bnfix edit model"):
            print(f"  warm after a model edit    = {t['bnfix edit model']:.2f} s  "
                  f"(target <= 0.5 s on 100k lines; a helper added)")
        if t.get("bnfix edit model calls"):
            print(f"  warm after a calling edit  = {t['bnfix edit model calls']:.2f} s  "
                  f"(a function calling the module's own: its summary changes)")


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
    # bnfix byte-compiled, as `pip install` leaves it: an editable install under
    # PYTHONDONTWRITEBYTECODE would compile every module at every start (~70 ms of start-up)
    compileall.compile_dir(str(Path(bnfix.__file__).parent), quiet=1)
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
        default, no_cache, python = startup(max(args.repeat, 5), work)
        print(f"\nstart-up: bnfix check of an empty folder {default * 1000:.0f} ms "
              f"({no_cache * 1000:.0f} ms with --no-cache), the interpreter alone "
              f"{python * 1000:.0f} ms: bnfix's own {(default - python) * 1000:.0f} ms "
              f"({(no_cache - python) * 1000:.0f} ms) (target <= 50 ms)")
        wheel = installed_startup(max(args.repeat, 5), work)
        if wheel is None:
            print("start-up as installed from a wheel: not measured (no wheel or venv here)")
        else:
            print(f"start-up as installed from a wheel in a new venv: {wheel[0] * 1000:.0f} ms, "
                  f"its interpreter alone {wheel[1] * 1000:.0f} ms: bnfix's own "
                  f"{(wheel[0] - wheel[1]) * 1000:.0f} ms (target <= 50 ms)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
