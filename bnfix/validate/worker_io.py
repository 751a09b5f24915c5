"""The files a TensorFlow worker process and its parent exchange (no TensorFlow here).

The parent writes DIR/job.json and starts `python -m bnfix.validate.<kind>_worker DIR`; the
worker appends phase names to DIR/progress.txt, and ends with DIR/result.json (a Validation as
JSON, or {"reporting": false} on a non-chief TF_CONFIG worker) or DIR/error.json.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bnfix.validate.errors import ValidateUsageError

JOB, RESULT, ERROR, PROGRESS = "job.json", "result.json", "error.json", "progress.txt"


def phase(workdir: Path, name: str) -> None:
    with (workdir / PROGRESS).open("a", encoding="utf-8") as out:
        out.write(name + "\n")


def worker_main(run: Callable[[dict[str, Any], Path], dict[str, Any] | None]) -> None:
    """Run `run(job, workdir)` and leave its result or its error for the parent; exits."""
    workdir = Path(sys.argv[1])
    job = json.loads((workdir / JOB).read_text(encoding="utf-8"))
    try:
        result = run(job, workdir)
    except BaseException as exc:  # noqa: BLE001 - the parent reports it
        usage = isinstance(exc, ValidateUsageError)
        error = {"time": time.time(), "usage": usage,
                 "message": str(exc) if usage else f"{type(exc).__name__}: {exc}"}
        (workdir / ERROR).write_text(json.dumps(error), encoding="utf-8")
        if not usage:
            traceback.print_exc()
        sys.exit(2 if usage else 1)
    (workdir / RESULT).write_text(json.dumps(result if result is not None else
                                             {"reporting": False}), encoding="utf-8")
    sys.exit(0)
