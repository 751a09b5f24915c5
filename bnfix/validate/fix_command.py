"""`bnfix validate fix PATH -- COMMAND`: copy the project twice, apply `bnfix fix
--unsafe-fixes` to one copy, run COMMAND in both under the probe, and show for each fixed
finding its symptom in the original run and its absence in the fixed one.

The probe is injected through the environment only (probe_boot/ first on PYTHONPATH: its
sitecustomize chains to any existing one and installs import hooks), so the script itself is
the user's, byte for byte, in the original copy.

PATH is never changed, whatever it holds. The copies are self-contained: a symbolic link in PATH
to something inside PATH becomes a relative link inside the copy; a link that leads outside PATH
(absolute, or `../outside`) is not copied (listed on the output), so neither the fix nor the
runs can reach the original tree or anything else through a copy. Absolute paths into PATH in
the command (bare, or as `--opt=/abs/PATH/x`) are retargeted to the copy.

The project's configuration is honoured as `bnfix check` honours it: when PATH's
`[tool.bnfix]` lives in a pyproject.toml above PATH, that file is copied to the same place above
each copy, so `select`/`ignore`/`per-file-ignores`/`exclude` apply to the same relative paths.
Each fixed finding is reported at the line `bnfix check` reports it on (the fixes run in rounds,
and a later round sees lines an earlier round moved)."""

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
    base = os.path.abspath(root)
    for d in diagnostics:
        path = os.path.abspath(d.path)  # not resolved: a link's own path is the finding's
        rel = Path(os.path.relpath(path, base)) if path.startswith(base + os.sep) else \
            Path(d.path)
        out.append(Finding(d.code, rel.as_posix(), d.span.start.row, d.message))
    return sorted(set(out), key=lambda f: (f.path, f.row, f.code))


def _as_checked(fixed: list[Finding], found: list[Finding]) -> list[Finding]:
    """Each fixed finding at the line `check` reports it on: the fixes run in rounds, and one
    found in a later round carries a line an earlier round's edit moved (BN002 two lines
    down after BN006's). Matched to the original finding of the same file and rule, the same
    message first, then the nearest line."""
    pool = list(found)
    out = []
    for finding in fixed:
        same = [f for f in pool if (f.path, f.code) == (finding.path, finding.code)]
        if not same:
            out.append(finding)
            continue
        best = min(same, key=lambda f: (f.message != finding.message, abs(f.row - finding.row)))
        pool.remove(best)
        out.append(best)
    return sorted(set(out), key=lambda f: (f.path, f.row, f.code))


def _check_and_fix(original: Path, fixed: Path, select: list[str] | None,
                   extend: list[str]) -> tuple[list[Finding], list[Finding], list[Finding]]:
    """The findings in the original copy; the fixed and remaining ones after fixing the other.
    The configuration is found from each copy, as `bnfix check PATH` finds it."""
    from bnfix.api import check_paths

    found = check_paths([original], select=select, extend_select=extend)
    report = check_paths([fixed], fix=True, unsafe_fixes=True, select=select,
                         extend_select=extend)
    done = [d for r in report.results for d in r.fixed]
    original_findings = _findings(found.remaining, original)
    return (original_findings, _as_checked(_findings(done, fixed), original_findings),
            _findings(report.remaining, fixed))


def _project_config(root: Path) -> tuple[Path, Path] | None:
    """(the configuration file above PATH: a bnfix.toml, or a pyproject.toml holding
    [tool.bnfix]; PATH relative to its folder), or None when the configuration is inside PATH
    (copied with it) or there is none."""
    from bnfix.config import ConfigError, find_config

    try:
        found = find_config(root)
    except ConfigError as exc:
        raise UsageError(f"validate fix: {exc}") from None
    if found is None:
        return None
    base = found.parent.resolve()
    rel = root.resolve().relative_to(base) if root.resolve() != base else Path()
    return (found, rel) if rel != Path() else None


def _copy_project(root: Path, copy: Path) -> list[str]:
    """Copy PATH to `copy` so that nothing in the copy leads outside it (see the module
    docstring); returns the links left out."""
    base = root.resolve()
    skipped: list[str] = []

    def ignore(folder: str, names: list[str]) -> set[str]:
        out = set(SKIPPED(folder, names))
        for name in names:
            link = Path(folder) / name
            if link.is_symlink():
                out.add(name)
                try:
                    resolved = Path(os.path.abspath(link.parent / os.readlink(link))).resolve()
                except (OSError, RuntimeError):  # a loop, or unreadable: leads nowhere safe
                    resolved = None
                if resolved is not None and (resolved == base or base in resolved.parents):
                    mirror = copy / link.relative_to(root)
                    mirror.parent.mkdir(parents=True, exist_ok=True)
                    inside = copy / resolved.relative_to(base)
                    mirror.symlink_to(os.path.relpath(inside, mirror.parent))
                else:
                    skipped.append(f"{link.relative_to(root).as_posix()} -> {os.readlink(link)}")
        return out

    shutil.copytree(root, copy, ignore=ignore, symlinks=True, dirs_exist_ok=True)
    return skipped


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
    """Absolute paths into the project point into the copy instead: bare arguments and the
    values of `--opt=VALUE` arguments, PATH spelt as given or resolved."""
    prefixes = sorted({str(root.resolve()), os.path.abspath(root)}, key=len, reverse=True)

    def moved(value: str) -> str:
        for prefix in prefixes:
            if value == prefix or value.startswith(prefix + os.sep):
                return str(copy) + value[len(prefix):]
        return value

    out = []
    for arg in command:
        option, equals, value = arg.partition("=")
        out.append(f"{option}={moved(value)}" if equals and arg.startswith("-") else moved(arg))
    return out


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


def _run_both(command: list[str], root: Path, copies: dict[str, Path], work: Path,
              timeout: float, sequential: bool) -> dict[str, RunResult]:
    results: dict[str, RunResult] = {}
    started: list[_Running] = []
    for name, copy in copies.items():
        probe_dir = work / f"probe-{name}"
        probe_dir.mkdir()
        started.append(_Running(name, _retarget(command, root, copy), copy, probe_dir, work))
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


def _work_folder(keep: str | None, root: Path) -> Path:
    if keep is None:
        return Path(tempfile.mkdtemp(prefix="bnfix-validate-fix-"))
    work = Path(keep)
    base = root.resolve()
    if work.resolve() == base or base in work.resolve().parents:
        raise UsageError(f"validate fix: --keep {keep} is inside {root}, which is never changed")
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
    config = _project_config(root)
    work = _work_folder(args.keep, root)
    try:
        progress.phase(f"copying {root} twice into {work}")
        copies: dict[str, Path] = {}
        for name in ("original", "fixed"):
            copies[name] = work / name / config[1] if config else work / name
            skipped = _copy_project(root, copies[name])
            if config:
                shutil.copyfile(config[0], work / name / config[0].name)
        for link in skipped:
            sys.stdout.write(f"not copied: the link {link} leads outside {root}\n")
        progress.phase("bnfix fix --unsafe-fixes on the second copy")
        found, fixed, remaining = _check_and_fix(copies["original"], copies["fixed"], select,
                                                   extend)
        result = Validation(str(root), command, found, fixed, remaining)
        if not fixed:
            sys.stdout.write(f"nothing to validate: bnfix fixed nothing in {root} "
                             f"({len(found)} findings)\n")
            return 0
        progress.phase(f"running `{' '.join(command)}` in both copies"
                       + (" (one after the other)" if args.sequential else " (concurrently)"))
        result.runs = _run_both(command, root, copies, work, args.timeout, args.sequential)
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
