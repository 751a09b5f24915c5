"""`bnfix validate fix PATH -- COMMAND`: copy the project twice, apply `bnfix fix
--unsafe-fixes` to one copy, run COMMAND in both under the probe, and show for each fixed
finding its symptom in the original run and its absence in the fixed one.

The probe is injected through the environment only (probe_boot/ first on PYTHONPATH: its
sitecustomize chains to any existing one and installs import hooks), so the script itself is
the user's, byte for byte, in the original copy."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bnfix.lint import UsageError
from bnfix.validate.probe_logs import RunLog
from bnfix.validate.probe_report import (
    Finding,
    RunResult,
    Validation,
    document,
    plot,
    remains,
    text,
)
from bnfix.validate.probe_symptoms import NOT_OBSERVABLE, Verdict, compare

BOOT = Path(__file__).with_name("probe_boot")
SKIPPED = shutil.ignore_patterns(".git", "__pycache__", ".bnfix_cache", ".pytest_cache",
                                 ".mypy_cache", ".ruff_cache")
KILL_GRACE_S = 3.0


class _Progress:
    """One line per phase on stderr, when it is a terminal (or --progress)."""

    def __init__(self, enabled: bool | None) -> None:
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.start = time.monotonic()

    def phase(self, message: str) -> None:
        if self.enabled:
            sys.stderr.write(f"[{time.monotonic() - self.start:6.1f} s] {message}\n")
            sys.stderr.flush()


class _OptionParser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"validate fix: {message}")


def _command(args: argparse.Namespace) -> list[str]:
    """Split the tokens after PATH: options up to `--`, the command after it (the options
    written after PATH are parsed here, argparse's REMAINDER having taken them)."""
    from bnfix.validate.arguments import fix_options

    tokens = list(args.run_command or [])
    if "--" in tokens:
        at = tokens.index("--")
        options, command = tokens[:at], tokens[at + 1:]
    elif tokens and tokens[0].startswith("-"):
        options, command = tokens, []
    else:
        options, command = [], tokens
    if options:
        parser = _OptionParser(prog="bnfix validate fix", add_help=False)
        fix_options(parser)
        parser.set_defaults(**{k: v for k, v in vars(args).items() if k != "run_command"})
        parser.parse_args(options, namespace=args)
    if not command:
        raise UsageError("validate fix: no command after `--` (e.g. `bnfix validate fix . -- "
                         "python train.py --steps 3`)")
    return command


def _findings(diagnostics: list, root: Path) -> list[Finding]:
    out = []
    for d in diagnostics:
        path = Path(d.path)
        rel = path.resolve().relative_to(root.resolve()) if path.is_absolute() else path
        out.append(Finding(d.code, rel.as_posix(), d.span.start.row, d.message))
    return sorted(set(out), key=lambda f: (f.path, f.row, f.code))


def _check_and_fix(original: Path, fixed: Path, select: list[str] | None,
                   extend: list[str]) -> tuple[list[Finding], list[Finding], list[Finding]]:
    """The findings in the original copy; the fixed and remaining ones after fixing the other."""
    from bnfix.api import check_paths

    found = check_paths([original], select=select, extend_select=extend)
    report = check_paths([fixed], fix=True, unsafe_fixes=True, select=select,
                         extend_select=extend)
    done = [d for r in report.results for d in r.fixed]
    return (_findings(found.remaining, original), _findings(done, fixed),
            _findings(report.remaining, fixed))


def _free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def _environment(copy: Path, probe_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(BOOT), env.get("PYTHONPATH")) if p)
    env["BNFIX_PROBE_DIR"] = str(probe_dir)
    env["BNFIX_PROBE_ROOT"] = str(copy)
    env["BNFIX_PROBE_PATH"] = str(Path(__file__).resolve().parents[2])
    env.setdefault("MASTER_PORT", _free_port())  # the two runs must not share a rendezvous
    return env


def _retarget(command: list[str], root: Path, copy: Path) -> list[str]:
    """Absolute paths into the project point into the copy instead."""
    prefix = str(root.resolve())
    return [str(copy) + arg[len(prefix):] if arg == prefix or arg.startswith(prefix + os.sep)
            else arg for arg in command]


class _Running:
    def __init__(self, name: str, command: list[str], copy: Path, probe_dir: Path,
                 outputs: Path) -> None:
        self.name = name
        self.probe_dir = probe_dir
        self.out = (outputs / f"{name}.stdout").open("w+", encoding="utf-8", errors="replace")
        self.err = (outputs / f"{name}.stderr").open("w+", encoding="utf-8", errors="replace")
        self.start = time.monotonic()
        self.process = subprocess.Popen(command, cwd=copy, env=_environment(copy, probe_dir),
                                        stdout=self.out, stderr=self.err, stdin=subprocess.DEVNULL,
                                        start_new_session=True)

    def wait(self, deadline: float) -> RunResult:
        timed_out = False
        try:
            self.process.wait(timeout=max(deadline - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            timed_out = True
            self._kill()
        wall = time.monotonic() - self.start
        outputs = []
        for stream in (self.out, self.err):
            stream.seek(0)
            outputs.append(stream.read())
            stream.close()
        return RunResult(self.name, self.process.returncode, wall, timed_out, outputs[0],
                         outputs[1], RunLog.read(self.probe_dir))

    def _kill(self) -> None:
        """The whole process group: DDP workers and data loaders go too."""
        for sig, grace in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, None)):
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.process.wait(timeout=grace)
                if sig == signal.SIGTERM:
                    os.killpg(self.process.pid, signal.SIGKILL)  # leftovers in the group
                return
            except subprocess.TimeoutExpired:
                continue
            except ProcessLookupError:
                return


def _run_both(command: list[str], root: Path, work: Path, timeout: float,
              sequential: bool) -> dict[str, RunResult]:
    results: dict[str, RunResult] = {}
    started: list[_Running] = []
    for name in ("original", "fixed"):
        probe_dir = work / f"probe-{name}"
        probe_dir.mkdir()
        started.append(_Running(name, _retarget(command, root, work / name), work / name,
                                probe_dir, work))
        if sequential:
            results[name] = started.pop().wait(time.monotonic() + timeout)
    for running in started:
        results[running.name] = running.wait(running.start + timeout)
    return results


def _verdict(finding: Finding, runs: dict[str, RunResult]) -> Verdict:
    ran = runs["original"].log.files | runs["fixed"].log.files
    if ran and finding.path not in ran:
        return Verdict(NOT_OBSERVABLE, f"{finding.path} did not run in this command", None, None)
    return compare(finding.code, runs["original"].log, runs["fixed"].log)


def _work_folder(keep: str | None) -> Path:
    if keep is None:
        return Path(tempfile.mkdtemp(prefix="bnfix-validate-fix-"))
    work = Path(keep)
    if work.exists() and any(work.iterdir()):
        raise UsageError(f"validate fix: --keep {keep} is not empty")
    work.mkdir(parents=True, exist_ok=True)
    return work.resolve()


def _codes(option: str | None) -> list[str]:
    return [s.strip() for s in (option or "").split(",") if s.strip()]


def run_fix(args: argparse.Namespace) -> int:
    started = time.monotonic()
    command = _command(args)
    root = Path(args.path)
    if not root.is_dir():
        raise UsageError(f"validate fix: {args.path} is not a folder")
    if args.timeout is not None and args.timeout <= 0:
        raise UsageError("validate fix: --timeout must be positive")
    progress = _Progress(args.progress)
    select = _codes(args.select) or None
    extend = _codes(args.extend_select)
    work = _work_folder(args.keep)
    try:
        progress.phase(f"copying {root} twice into {work}")
        for name in ("original", "fixed"):
            shutil.copytree(root, work / name, ignore=SKIPPED, symlinks=True)
        progress.phase("bnfix fix --unsafe-fixes on the second copy")
        found, fixed, remaining = _check_and_fix(work / "original", work / "fixed", select,
                                                   extend)
        result = Validation(str(root), command, found, fixed, remaining)
        if not fixed:
            sys.stdout.write(f"nothing to validate: bnfix fixed nothing in {root} "
                             f"({len(found)} findings)\n")
            return 0
        progress.phase(f"running `{' '.join(command)}` in both copies"
                       + (" (one after the other)" if args.sequential else " (concurrently)"))
        result.runs = _run_both(command, root, work, args.timeout, args.sequential)
        progress.phase("comparing the probe logs")
        if any(r.failed for r in result.runs.values()):
            result.exit_code = 2
        else:
            result.verdicts = [(f, _verdict(f, result.runs)) for f in fixed]
            result.exit_code = 1 if remains(result) else 0
        result.wall_s = time.monotonic() - started
        sys.stdout.write(text(result))
        if args.json_out:
            Path(args.json_out).write_text(json.dumps(document(result), indent=2) + "\n",
                                           encoding="utf-8")
        if args.plot and result.runs and not any(r.failed for r in result.runs.values()):
            plot(result, Path(args.plot))
        return result.exit_code
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
