"""`bnfix doctor [--steps N] [--every K] [--json PATH] [--html PATH] -- COMMAND`: run a training
command with BN monitors injected (the script is not edited), then diagnose what they recorded.

The monitors reach the command's Python processes (torchrun workers included) the way `validate
fix` injects its probe: its boot folder first on PYTHONPATH, BNFIX_PROBE_HOOKS naming
`bnfix.doctor.inject:hooks`. Each process writes its recordings; this command reads them all,
merges ranks, prints a summary (worst layers first), and writes the JSON and HTML reports.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bnfix.doctor.diagnose import diagnose
from bnfix.doctor.inject import ENV_EVERY, ENV_STEPS
from bnfix.doctor.record import Recording, read_recordings
from bnfix.doctor.report import DoctorReport, document, text
from bnfix.lint import UsageError

KILL_GRACE_S = 3.0


def _codes(text: str | None) -> list[str] | None:
    return None if text is None else [c.strip() for c in text.split(",") if c.strip()]


def enabled_codes(select: str | None, ignore: str) -> set[str]:
    from bnfix.rulebook import RuleBookError, load_rulebook

    book = load_rulebook()
    try:
        chosen = book.expand(_codes(select) or ["BN3"], target="runtime")
        return chosen - book.expand(_codes(ignore) or [], target=None)
    except RuleBookError as exc:
        raise UsageError(f"doctor: {exc}") from exc


def _environment(folder: Path, every: int, steps: int | None) -> dict[str, str]:
    from bnfix.validate.fix_command import BOOT
    from bnfix.validate.probe_runtime import ENV_DIR, ENV_HOOKS

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(BOOT), env.get("PYTHONPATH")) if p)
    env[ENV_DIR] = str(folder)
    env[ENV_HOOKS] = "bnfix.doctor.inject:hooks"
    env["BNFIX_PROBE_PATH"] = str(Path(__file__).resolve().parents[2])
    env[ENV_EVERY] = str(every)
    if steps is not None:
        env[ENV_STEPS] = str(steps)
    return env


def _run(command: list[str], env: dict[str, str], timeout: float | None) -> tuple[int, bool]:
    """Run the command (its output goes to the terminal); (exit code, timed out)."""
    try:
        process = subprocess.Popen(command, env=env, start_new_session=True)
    except OSError as exc:
        raise UsageError(f"doctor: cannot run `{command[0]}`: {exc.strerror or exc}") from exc
    try:
        return process.wait(timeout=timeout), False
    except subprocess.TimeoutExpired:
        _stop(process)
        return process.returncode if process.returncode is not None else -9, True
    except KeyboardInterrupt:
        _stop(process)
        raise


def _stop(process: subprocess.Popen) -> None:
    """The whole process group (torchrun workers, data loaders): SIGTERM, then SIGKILL."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=KILL_GRACE_S)
            return
        except subprocess.TimeoutExpired:
            continue


def _monitor_errors(folder: Path) -> list[str]:
    """Monitor failures the processes logged (the training itself went on)."""
    errors = []
    for path in sorted(folder.glob("probe-*.jsonl")):
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            if event.get("kind") == "probe_error":
                errors.append(f"{event.get('where')}: {event.get('error')}")
    return sorted(set(errors))


def _recordings(folder: Path) -> list[Recording]:
    found: list[Recording] = []
    for path in sorted(folder.glob("doctor-*.json")):
        found.extend(read_recordings(path))
    return found


def run(args: argparse.Namespace) -> int:
    command = list(args.run_command or [])
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise UsageError("doctor: no command after `--` (e.g. `bnfix doctor -- python train.py`)")
    if args.every < 1:
        raise UsageError("doctor: --every must be at least 1")
    if args.steps is not None and args.steps < 1:
        raise UsageError("doctor: --steps must be at least 1")
    if args.timeout is not None and args.timeout <= 0:
        raise UsageError("doctor: --timeout must be positive")
    enabled = enabled_codes(args.select, args.ignore)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bnfix-doctor-") as work:
        folder = Path(work)
        code, timed_out = _run(command, _environment(folder, args.every, args.steps),
                               args.timeout)
        recordings = _recordings(folder)
        errors = _monitor_errors(folder)
    report = DoctorReport(command=command, every=args.every, steps_limit=args.steps,
                          exit_code=code, timed_out=timed_out, recordings=recordings,
                          findings=diagnose(recordings, enabled), monitor_errors=errors,
                          wall_s=time.monotonic() - started)
    sys.stdout.write(text(report))
    if args.json_out:
        _write(Path(args.json_out), json.dumps(document(report), indent=2) + "\n")
        sys.stdout.write(f"wrote {args.json_out}\n")
    if args.html:
        from bnfix.doctor.html import render_html

        _write(Path(args.html), render_html(report))
        sys.stdout.write(f"wrote {args.html}\n")
    if report.failed:
        return 2
    return 0 if args.exit_zero or not report.findings else 1


def _write(path: Path, content: str) -> None:
    """Whole or nothing: a temporary file beside `path`, then a rename."""
    handle, temporary = tempfile.mkstemp(dir=path.resolve().parent, prefix=".bnfix-")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(content)
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)
