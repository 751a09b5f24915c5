"""Run the local ranks / the TensorFlow worker as child processes that can never hang the command.

Each child logs to its own file and, when it fails, writes an error file (JSON: time, usage,
message). The parent polls: the first child to fail ends the run with ITS error (its peers then
fail too, on a lost connection, and are killed: their errors are echoes), a child past the
deadline is killed, and the run fails. A worker can report its phase in a progress file.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bnfix.validate.errors import RunFailed, ValidateUsageError
from bnfix.validate.progress import Progress

_GRACE = 1.0  # seconds a failure waits for earlier failures' error files to land
_TAIL = 25  # log lines shown with a failure


@dataclass
class Child:
    name: str  # "rank 1", "keras worker"
    proc: subprocess.Popen[bytes]
    log: Path
    error_file: Path


def start(name: str, module: str, args: list[str], workdir: Path, error_file: Path,
          env: dict[str, str], cwd: Path) -> Child:
    """`python -m MODULE ARGS` with `env` added, its output to WORKDIR/<name>.log."""
    log = workdir / f"{name.replace(' ', '_')}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", module, *args], cwd=cwd,
                                env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    return Child(name, proc, log, error_file)


def _tail(path: Path) -> str:
    if not path.exists():
        return ""
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    return "\n".join(f"  | {line}" for line in lines[-_TAIL:])


def _failure(child: Child) -> tuple[float, bool, str]:
    """(when, usage error?, message) of a failed child."""
    if child.error_file.exists():
        error = json.loads(child.error_file.read_text(encoding="utf-8"))
        return error["time"], error["usage"], error["message"]
    code = child.proc.returncode
    how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
    return time.time(), False, f"{how} without reporting an error"


def kill_all(children: list[Child]) -> None:
    for child in children:
        if child.proc.poll() is None:
            child.proc.kill()
    for child in children:
        child.proc.wait()


def wait_all(children: list[Child], deadline: float, progress: Progress | None = None,
             progress_file: Path | None = None) -> None:
    """Wait for every child to exit 0; raise (and kill the rest) on the first failure or when
    `deadline` (time.monotonic) passes. Always leaves no child running."""
    shown = ""
    try:
        while True:
            failed = [c for c in children if c.proc.poll() not in (None, 0)]
            if failed:
                time.sleep(_GRACE)
                failed = [c for c in children if c.proc.poll() not in (None, 0)]
                first = min(failed, key=lambda c: _failure(c)[0])
                _, usage, message = _failure(first)
                if usage:
                    raise ValidateUsageError(message)
                raise RunFailed(f"{first.name} failed: {message}",
                                f"{first.name}'s log ({first.log.name}):\n{_tail(first.log)}")
            if all(c.proc.returncode == 0 for c in children):
                return
            if time.monotonic() > deadline:
                late = ", ".join(c.name for c in children if c.proc.poll() is None)
                raise RunFailed(f"{late} did not finish in time (see --timeout)",
                                "\n".join(_tail(c.log) for c in children))
            if progress is not None and progress_file is not None and progress_file.exists():
                phase = progress_file.read_text(encoding="utf-8").strip().rpartition("\n")[2]
                if phase and phase != shown:
                    progress.phase(phase)
                    shown = phase
            time.sleep(0.05)
    finally:
        kill_all(children)


def run_worker(module: str, job: dict[str, object], progress: Progress, timeout: float
               ) -> dict[str, object]:
    """Start `python -m MODULE DIR` on `job` (see bnfix.validate.worker_io), relay its phases,
    and return its result; its failure raises like a rank's."""
    import tempfile

    from bnfix.validate import worker_io

    with tempfile.TemporaryDirectory(prefix="bnfix-validate-") as tmp:
        workdir = Path(tmp)
        (workdir / worker_io.JOB).write_text(json.dumps(job), encoding="utf-8")
        child = start(module.rpartition("_")[0].rpartition(".")[2] + " worker", module, [tmp],
                      workdir, workdir / worker_io.ERROR, {"PYTHONUNBUFFERED": "1"},
                      Path(str(job["cwd"])))
        wait_all([child], time.monotonic() + timeout, progress, workdir / worker_io.PROGRESS)
        return json.loads((workdir / worker_io.RESULT).read_text(encoding="utf-8"))
