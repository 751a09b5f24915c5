"""Time and peak memory of `bnfix check` / `bnfix fix` on big generated files (issue 14).

Each case is a fresh folder holding one generated file; each command runs as a subprocess under
an address-space limit (--limit-gb) and a timeout, and its wall time and peak RSS (`wait4`) are
printed as a table. The files:

- list-2MB: one BN bug, then a 2 MB one-line list literal (`x = [0, 0, ...]`): the file from
  the issue that took 5.8 GB and 59 s to fix;
- dense-200KB / dense-2MB: one line of `bn=nn.BatchNorm2d(8,momentum=0.9);` repeated (a
  finding and a fix every 35 bytes: the worst case per byte);
- wide-2MB: one BN bug, then a 2 MB one-line list of calls holding one non-ASCII character
  (every position on that row is converted from UTF-8 bytes to characters);
- lines-10MB: 110,000 ordinary rows and one BN bug at the end.

    python bench/bigfile.py [--cases list-2MB,dense-200KB] [--limit-gb 8] [--timeout 300]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HEAD = "import torch.nn as nn\nbn = nn.BatchNorm2d(8, momentum=0.9)\n"
DENSE = "bn=nn.BatchNorm2d(8,momentum=0.9);"


def _list(size: int) -> str:
    return HEAD + "x = [" + "0, " * (size // 3) + "]\n"


def _dense(size: int) -> str:
    return "import torch.nn as nn\n" + DENSE * (size // len(DENSE)) + "\n"


def _wide(size: int) -> str:
    return HEAD + 'x = ["é", ' + "f(0), " * (size // 6) + "]\n"


def _lines(size: int) -> str:
    row = "value_{:07d} = [1, 2, 3]  # " + "padding " * 8 + "\n"
    return "".join(row.format(i) for i in range(size // len(row.format(0)))) + HEAD


CASES = {
    "list-2MB": lambda: _list(2_000_000),
    "dense-200KB": lambda: _dense(200_000),
    "dense-2MB": lambda: _dense(2_000_000),
    "wide-2MB": lambda: _wide(2_000_000),
    "lines-10MB": lambda: _lines(10_000_000),
}


def run(args: list[str], cwd: Path, limit: int, timeout: float) -> tuple[str, float, float]:
    """(exit status, seconds, peak RSS in MiB) of `python -m bnfix ARGS`."""

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "bnfix", *args], cwd=cwd,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            preexec_fn=cap)  # noqa: PLW1509 - no threads here
    deadline = start + timeout
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.perf_counter() > deadline:
            proc.kill()
            _, status, usage = os.wait4(proc.pid, 0)
            return "timeout", time.perf_counter() - start, usage.ru_maxrss / 1024
        time.sleep(0.02)
    seconds = time.perf_counter() - start
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    code = os.waitstatus_to_exitcode(status)
    state = str(code) if "MemoryError" not in err else "MemoryError"
    if code < 0:
        state = f"signal {-code}"
    return state, seconds, usage.ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--limit-gb", type=float, default=8.0)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--max-file-size", default="0",
                        help="passed to bnfix (default 0: no limit, so the file is analysed; "
                             "empty: not passed, for a bnfix without the option)")
    options = parser.parse_args()
    limit = int(options.limit_gb * 2**30)
    print(f"{'case':<12} {'bytes':>10} {'command':<6} {'exit':>11} {'seconds':>8} {'peak MiB':>9}")
    for name in options.cases.split(","):
        text = CASES[name]()
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "big.py"
            path.write_text(text)
            for command in ("check", "fix"):
                args = [command, "--no-cache", "--output-format", "concise", "big.py"]
                if options.max_file_size:
                    args[1:1] = ["--max-file-size", options.max_file_size]
                if command == "fix":
                    args.insert(1, "--unsafe-fixes")
                state, seconds, peak = run(args, Path(folder), limit, options.timeout)
                print(f"{name:<12} {len(text.encode()):>10} {command:<6} {state:>11} {seconds:>8.1f} "
                      f"{peak:>9.0f}", flush=True)


if __name__ == "__main__":
    main()
