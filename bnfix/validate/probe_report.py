"""What `bnfix validate fix` shows: the text table, the JSON document and the trajectory plot."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bnfix.validate.probe_logs import RunLog
from bnfix.validate.probe_symptoms import STILL_THERE, Observation, Verdict

TAIL_LINES = 20


@dataclass(frozen=True)
class Finding:
    code: str
    path: str  # relative to the project
    row: int
    message: str

    @property
    def location(self) -> str:
        return f"{self.path}:{self.row}"


@dataclass
class RunResult:
    """One run of the command (in the original or the fixed copy)."""

    name: str
    returncode: int | None
    wall_s: float
    timed_out: bool
    stdout: str
    stderr: str
    log: RunLog

    @property
    def failed(self) -> bool:
        return self.timed_out or self.returncode != 0

    def tail(self) -> str:
        lines = (self.stderr or self.stdout).rstrip().splitlines()
        return "\n".join(lines[-TAIL_LINES:])


@dataclass
class Validation:
    path: str
    command: list[str]
    found: list[Finding]
    fixed: list[Finding]
    remaining: list[Finding]
    runs: dict[str, RunResult] = field(default_factory=dict)
    verdicts: list[tuple[Finding, Verdict]] = field(default_factory=list)
    wall_s: float = 0.0
    exit_code: int = 0


def text(result: Validation) -> str:
    """The table: one block per fixed finding, the original's and the fixed run's figures."""
    command = " ".join(result.command)
    head = f"{len(result.found)} findings, {len(result.fixed)} fixed; `{command}` run in both copies"
    lines = [head]
    failed = [r for r in result.runs.values() if r.failed]
    for run in failed:
        why = "timed out" if run.timed_out else f"exited with {run.returncode}"
        lines += [f"the {run.name} run {why} after {run.wall_s:.1f} s; its output ends with:",
                  *("    " + line for line in run.tail().splitlines())]
    if not failed and result.verdicts:
        width = max(len(f.location) for f, _ in result.verdicts)
        lines.append(f"{'code':<6} {'location':<{width}}  verdict")
        for finding, verdict in result.verdicts:
            lines.append(f"{finding.code:<6} {finding.location:<{width}}  {verdict.status}"
                         + ("" if verdict.original and verdict.fixed and
                            verdict.original.present is not None and
                            verdict.fixed.present is not None else f": {verdict.reason}"))
            for side, observation in (("original", verdict.original), ("fixed", verdict.fixed)):
                if observation is not None and observation.present is not None:
                    lines.append(f"{'':<6} {side:>{width}}  {observation.text}")
    for name, run in result.runs.items():
        for error in dict.fromkeys(run.log.errors):  # once, not once per process
            lines.append(f"probe failed in the {name} run: {error}")
    for finding in result.remaining:
        lines.append(f"not fixed: {finding.code} {finding.location} (no fix available)")
    times = ", ".join(f"{r.name} {r.wall_s:.1f} s" for r in result.runs.values())
    lines.append(f"validated in {result.wall_s:.1f} s" + (f" ({times})" if times else ""))
    return "\n".join(lines) + "\n"


def _observation(observation: Observation | None) -> dict[str, Any] | None:
    if observation is None:
        return None
    return {"present": observation.present, "figure": observation.figure,
            "text": observation.text}


def _trajectories(log: RunLog) -> dict[str, dict[str, list[float]]]:
    """Per layer and variable, the channel mean at each recorded step."""
    return {layer: {var: [float(np.mean(v)) for v in series] for var, series in state.items()}
            for layer, state in log.trajectories().items()}


def document(result: Validation) -> dict[str, Any]:
    def finding(f: Finding) -> dict[str, Any]:
        return {"code": f.code, "path": f.path, "row": f.row, "message": f.message}

    return {
        "path": result.path, "command": result.command, "exit_code": result.exit_code,
        "wall_s": round(result.wall_s, 3),
        "findings": [finding(f) for f in result.found],
        "fixed": [finding(f) for f in result.fixed],
        "remaining": [finding(f) for f in result.remaining],
        "runs": {name: {"returncode": r.returncode, "timed_out": r.timed_out,
                        "wall_s": round(r.wall_s, 3), "stderr_tail": r.tail() if r.failed else "",
                        "probe_errors": r.log.errors, "files": sorted(r.log.files),
                        "trajectories": _trajectories(r.log)}
                 for name, r in result.runs.items()},
        "symptoms": [{**finding(f), "verdict": v.status, "reason": v.reason,
                      "original": _observation(v.original), "fixed": _observation(v.fixed)}
                     for f, v in result.verdicts],
    }


def remains(result: Validation) -> bool:
    return any(v.status == STILL_THERE for _, v in result.verdicts)


def plot(result: Validation, out: Path, max_layers: int = 6) -> None:
    """Channel-mean trajectories of gamma, beta, moving mean and variance: original solid,
    fixed dashed, one colour per layer."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    variables = ("gamma", "beta", "moving_mean", "moving_variance")
    runs = {name: _trajectories(r.log) for name, r in result.runs.items()}
    layers = sorted({layer for t in runs.values() for layer in t})[:max_layers]
    fig, axes = plt.subplots(1, len(variables), figsize=(4 * len(variables), 3.4))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, var in zip(axes, variables):
        for i, layer in enumerate(layers):
            for name, style in (("original", "-"), ("fixed", "--")):
                series = runs.get(name, {}).get(layer, {}).get(var)
                if series:
                    ax.plot(range(len(series)), series, style, color=colours[i % len(colours)],
                            label=f"{layer} ({name})")
        ax.set_title(f"{var} (channel mean)")
        ax.set_xlabel("step")
    if layers:
        axes[0].legend(fontsize=6)
    fig.suptitle("BN state: original (solid) vs fixed (dashed)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
