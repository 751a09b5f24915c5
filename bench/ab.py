"""Two versions of bnfix side by side: a run without cache (cold), then the incremental runs:
warm with nothing changed, then after three edits of the tree's model file (a helper, a
function calling the file's first function, a BN builder), the versions alternating run by run so that the machine's drift
(this one has a fast and a slow phase) falls on both alike. Start-up first: a check of an empty
folder (its cache folder made) and of one file that builds BN (no cache: the analysis imported).

    git worktree add /tmp/before <commit>
    python bench/ab.py /tmp/before . tree... --repeat 5

Each checkout's `bnfix/` is staged with its `rules/` inside as `bnfix/rules` (as the wheel
installs them: an editable install would serve the current rules to both), byte-compiled, and
run with `PYTHONPATH` on its own copy of each tree, the folder's name kept (a package copied
under another name would be a smaller project), with its own cache folder. Prints the median
wall time in ms of each run kind."""

from __future__ import annotations

import argparse
import compileall
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from run import model_file

EDITS = {
    "helper": "\ndef _ab_helper_{i}():\n    pass\n",
    "calls": "\ndef _ab_calls_{i}(*args):\n    return {called}(*args)\n",
    "bn": "\ndef _ab_bn_{i}(x):\n    import torch.nn as nn\n    return nn.BatchNorm2d(3)(x)\n",
}

KINDS = ["cold", "warm", *EDITS]


class Version:
    """One bnfix (the folder holding its package) with its copy of a tree and its cache."""

    def __init__(self, code: Path, tree: Path, work: Path, label: str) -> None:
        self.code = code
        self.label = label
        self.tree = work / label / tree.name
        shutil.copytree(tree, self.tree, ignore=shutil.ignore_patterns("*.so", "*.pyc",
                                                                        ".bnfix_cache"))
        self.cache = work / label / "cache"
        self.cwd = work / label / "cwd"
        self.cwd.mkdir()

    def run(self, *extra: str) -> float:
        return timed(self.code, [str(self.tree), "--cache-dir", str(self.cache), *extra],
                     self.cwd)


def timed(code: Path, argv: list[str], cwd: Path) -> float:
    """Wall seconds of `bnfix check -q --exit-zero <argv>` run with the bnfix under `code`."""
    env = dict(os.environ, PYTHONPATH=str(code))
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "bnfix", "check", "-q", "--exit-zero", *argv],
                   env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   check=True)
    return time.perf_counter() - start


def stage(checkout: Path, target: Path) -> Path:
    """The checkout's package as installed (rules inside), byte-compiled, under `target`."""
    package = target / "bnfix"
    shutil.copytree(checkout / "bnfix", package, ignore=shutil.ignore_patterns("__pycache__"))
    if (checkout / "rules").is_dir() and not (package / "rules").exists():
        shutil.copytree(checkout / "rules", package / "rules")
    compileall.compile_dir(str(package), quiet=1)
    return target


def compare(codes: dict[str, Path], tree: Path, repeat: int) -> dict[str, dict[str, float]]:
    with tempfile.TemporaryDirectory(prefix="bnfix-ab-") as tmp:
        versions = [Version(code, tree, Path(tmp), label) for label, code in codes.items()]
        model = model_file([str(versions[0].tree)])
        if model is None:
            raise SystemExit(f"{tree}: no file builds BN: nothing to edit")
        first = re.search(r"^def (\w+)\(", model.read_text(), re.MULTILINE)
        called = first.group(1) if first else "print"
        relative = model.relative_to(versions[0].tree)
        for version in versions:  # the cache made, then one warm run
            version.run()
            version.run()
        times: dict[str, dict[str, list[float]]] = {
            v.label: {kind: [] for kind in KINDS} for v in versions}
        for i in range(repeat):
            for version in versions if i % 2 == 0 else versions[::-1]:
                times[version.label]["cold"].append(version.run("--no-cache"))
                times[version.label]["warm"].append(version.run())
                for kind, text in EDITS.items():
                    with (version.tree / relative).open("a") as out:
                        out.write(text.format(i=i, called=called))
                    times[version.label][kind].append(version.run())
        return {label: {kind: statistics.median(runs) * 1000 for kind, runs in kinds.items()}
                for label, kinds in times.items()}


ONE_FILE = ("import torch.nn as nn\n\n\nclass Net(nn.Module):\n    def __init__(self):\n"
            "        super().__init__()\n        self.bn = nn.BatchNorm2d(8)\n")


def startup(codes: dict[str, Path], repeat: int) -> dict[str, dict[str, float]]:
    """Median ms of `bnfix check` of an empty folder and of a one-file project, per version."""
    with tempfile.TemporaryDirectory(prefix="bnfix-ab-start-") as tmp:
        kinds = {"empty": ["empty", "--cache-dir", "cache"], "one file": ["net.py", "--no-cache"]}
        times: dict[str, dict[str, list[float]]] = {label: {k: [] for k in kinds} for label in codes}
        for label, code in codes.items():  # each its own folder (the cache keeps one version's
            Path(tmp, label, "empty").mkdir(parents=True)  # rule book), its cache folder made
            Path(tmp, label, "net.py").write_text(ONE_FILE)
            timed(code, kinds["empty"], Path(tmp, label))
        for i in range(repeat):
            for label in list(codes) if i % 2 == 0 else list(codes)[::-1]:
                for kind, argv in kinds.items():
                    times[label][kind].append(timed(codes[label], argv, Path(tmp, label)))
        return {label: {kind: statistics.median(runs) * 1000 for kind, runs in kinds.items()}
                for label, kinds in times.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path, help="folder holding the first bnfix package")
    parser.add_argument("after", type=Path, help="folder holding the second bnfix package")
    parser.add_argument("trees", nargs="*", type=Path)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    checkouts = {"before": args.before.resolve(), "after": args.after.resolve()}
    for label, checkout in checkouts.items():
        if not (checkout / "bnfix" / "__init__.py").is_file():
            parser.error(f"{label}: {checkout} holds no bnfix package")
    with tempfile.TemporaryDirectory(prefix="bnfix-ab-code-") as tmp:
        codes = {label: stage(checkout, Path(tmp) / label)
                 for label, checkout in checkouts.items()}
        print(f"{'start-up':<20} {'version':<8} {'empty':>8} {'one file':>8}")
        for label, row in startup(codes, max(args.repeat, 9)).items():
            print(f"{'':<20} {label:<8} " + " ".join(f"{ms:>8.0f}" for ms in row.values()),
                  flush=True)
        print(f"{'tree':<20} {'version':<8} " + " ".join(f"{k:>8}" for k in KINDS))
        for tree in args.trees:
            for label, row in compare(codes, tree, args.repeat).items():
                print(f"{tree.name:<20} {label:<8} "
                      + " ".join(f"{ms:>8.0f}" for ms in row.values()), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
