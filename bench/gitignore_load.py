"""How long bnfix takes to load a long `.gitignore` and to match paths against it, beside
`git ls-files` on the same file.

    python bench/gitignore_load.py [--megabytes 4] [--paths 100]

Generated ignore files of --megabytes each: literal paths (a generated list), patterns with a
`[...]` class, one long line, typical lines (1,500, as a gitignore.io combination holds) and
random wildcard patterns (the hostile case). For each: the seconds to load it
(`GitIgnore.from_lines`), to match the first path (the joined regexes are compiled then), and
to match --paths more; and, when git is installed, `git ls-files --others --exclude-standard`
in a repository holding it and --paths files.
"""

from __future__ import annotations

import argparse
import random
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bnfix.gitignore import GitIgnore


def _fill(size: int, line: Callable[[int], str]) -> list[str]:
    lines, total, i = [], 0, 0
    while total < size:
        text = line(i)
        lines.append(text)
        total += len(text) + 1
        i += 1
    return lines


def inputs(megabytes: float) -> dict[str, list[str]]:
    size = int(megabytes * 1024 * 1024)
    rng = random.Random(1)
    typical = ["node_modules/", ".DS_Store", "*.py[cod]", "__pycache__/", "*.so", "build/",
               "dist/", "*.egg-info/", ".env", ".venv", "*.log", "*.tmp", "*~", ".#*",
               "/data/raw/", "**/logs", "!.gitkeep", "*.ckpt", "checkpoints/", "runs/", "wandb/",
               "*.h5", "/outputs", "docs/_build/", ".ipynb_checkpoints", "*.swp", ".idea/",
               ".vscode/*", "!.vscode/settings.json", "coverage.xml", ".pytest_cache/"]
    return {
        "literal paths": _fill(size, lambda i: f"build/output_{i}/file_{i}.o"),
        "class patterns": _fill(size, lambda i: f"x[{chr(97 + i % 26)}{chr(65 + i % 26)}{i}]y"),
        "one long line": ["a" * (size - 2) + "*"],
        "1,500 typical lines": [rng.choice(typical) if i % 3 else
                                f"{rng.choice(typical).rstrip('/')}_{i}" for i in range(1500)],
        "random wildcards": _fill(size, lambda i: "".join(rng.choice("abc*?/")
                                                          for _ in range(30))),
    }


def git_seconds(lines: list[str], paths: int) -> float | None:
    git = shutil.which("git")
    if git is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        subprocess.run([git, "init", "-q", str(root)], check=True)
        (root / "pkg").mkdir()
        for k in range(paths):
            (root / "pkg" / f"mod{k}.py").write_text("x = 1\n", encoding="utf-8")
        (root / ".gitignore").write_text("\n".join(lines) + "\n", encoding="utf-8")
        start = time.perf_counter()
        subprocess.run([git, "ls-files", "--others", "--exclude-standard"], cwd=root,
                       stdout=subprocess.DEVNULL, check=True)
        return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=float, default=4.0)
    parser.add_argument("--paths", type=int, default=100)
    args = parser.parse_args()
    print(f"{'ignore file':<22} {'lines':>8} {'load s':>8} {'first path s':>13} "
          f"{f'{args.paths} paths s':>12} {'git s':>7}")
    for name, lines in inputs(args.megabytes).items():
        start = time.perf_counter()
        spec = GitIgnore.from_lines(lines)
        load = time.perf_counter() - start
        start = time.perf_counter()
        spec.match("src", True)
        first = time.perf_counter() - start
        start = time.perf_counter()
        for k in range(args.paths):
            spec.match(f"pkg/mod{k}.py", False)
        more = time.perf_counter() - start
        git = git_seconds(lines, args.paths)
        git_text = f"{git:.2f}" if git is not None else "-"
        print(f"{name:<22} {len(lines):>8,} {load:>8.2f} {first:>13.2f} {more:>12.2f} "
              f"{git_text:>7}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
