"""The doctor's report: the terminal summary (worst layers first) and the JSON document
(`bnfix-doctor/1`, with a `findings` list of ruff-shaped records like `check --output-format
json`, plus each finding's layer, ranks, steps and numbers)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

from bnfix import __version__
from bnfix.doctor.diagnose import Finding, RankGap, groups, rank_gaps
from bnfix.doctor.record import Recording

SCHEMA = "bnfix-doctor/1"


@dataclass
class DoctorReport:
    command: list[str]
    every: int
    recordings: list[Recording]
    findings: list[Finding]
    steps_limit: int | None = None
    exit_code: int = 0
    timed_out: bool = False
    monitor_errors: list[str] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def stopped(self) -> bool:
        return any(r.stopped for r in self.recordings)

    @property
    def failed(self) -> bool:
        """The command failed (not stopped by --steps), or nothing was recorded."""
        if not self.recordings:
            return True
        return self.timed_out or (self.exit_code != 0 and not self.stopped)

    @property
    def script(self) -> str:
        """The file findings point at: the command's first .py argument, else the command."""
        for token in self.command:
            if token.endswith(".py"):
                return os.path.abspath(token)
        return self.command[0] if self.command else ""

    def rank_gaps(self) -> list[tuple[str, RankGap]]:
        return [(group[0].model, gap) for group in groups(self.recordings)
                for gap in rank_gaps(group)]


def _rule(code: str) -> Any:
    from bnfix.rulebook import load_rulebook

    return load_rulebook().rules.get(code)


def layer_order(report: DoctorReport) -> list[tuple[str, str]]:
    """(model, layer) pairs with findings, the worst first."""
    worst: dict[tuple[str, str], float] = {}
    for f in report.findings:
        key = (f.model, f.layer)
        worst[key] = max(worst.get(key, 0.0), f.weight)
    return sorted(worst, key=lambda k: -worst[k])


def _runs_line(report: DoctorReport) -> str:
    parts = []
    for group in groups(report.recordings):
        rec = group[0]
        ranks = f", {len(group)} ranks" if len(group) > 1 else ""
        steps = max(r.steps for r in group)
        parts.append(f"{rec.framework} model {rec.model} ({len(rec.layers)} BN layers, "
                     f"{steps} training steps{ranks})")
    return "; ".join(parts)


def text(report: DoctorReport) -> str:
    lines = [""]
    if not report.recordings:
        lines.append("bnfix doctor: no BN layer was monitored (no torch model with BN was "
                     "called, no Keras fit, no TF1 session ran a BN graph)")
    else:
        lines.append(f"bnfix doctor: {_runs_line(report)}, sampled every {report.every} steps"
                     + (" (stopped by --steps)" if report.stopped else ""))
    if report.findings:
        layers = layer_order(report)
        total = sum(len(r.layers) for r in _one_per_group(report))
        lines.append(f"{len(report.findings)} finding{'s' if len(report.findings) != 1 else ''} "
                     f"in {len(layers)} of {total} BN layers, worst first:")
        multi = len(groups(report.recordings)) > 1
        for model, layer in layers:
            lines.append("")
            lines.append(f"{model + ': ' if multi else ''}{layer}")
            for f in [f for f in report.findings if (f.model, f.layer) == (model, layer)]:
                rule = _rule(f.code)
                ranks = f" [ranks {', '.join(map(str, f.ranks))}]" if len(f.ranks) > 1 else ""
                lines.append(f"  {f.code} {rule.name if rule else ''} ({f.steps}){ranks}")
                lines.append(f"    {f.message}")
                lines.append(f"    fix: {f.fix}")
    elif report.recordings:
        lines.append("no BN problem found")
    gaps = [(m, g) for m, g in report.rank_gaps() if g.shift > 0.01 or g.affine > 1e-6]
    if gaps:
        lines.append("")
        lines.append("ranks compared (end of run, against the first rank):")
        for _, gap in gaps[:10]:
            lines.append(f"  {gap.layer}: ranks {gap.ranks[0]}/{gap.ranks[1]} running means "
                         f"{gap.shift:.3g} std apart, variance ratio {math.exp(gap.scale):.3g}"
                         f", γ/β {gap.affine:.2%} apart")
    for note in sorted({n for r in report.recordings for n in r.notes}):
        lines.append(f"note: {note}")
    for error in report.monitor_errors:
        lines.append(f"monitor error: {error}")
    if report.timed_out:
        lines.append("bnfix doctor: the command ran past --timeout and was stopped")
    elif report.exit_code != 0 and not report.stopped:
        lines.append(f"bnfix doctor: the command exited with code {report.exit_code}")
    return "\n".join(lines) + "\n"


def _one_per_group(report: DoctorReport) -> list[Recording]:
    return [group[0] for group in groups(report.recordings)]


def finding_record(f: Finding, report: DoctorReport) -> dict[str, Any]:
    """A ruff-shaped record (as `check --output-format json`), plus what a runtime finding has
    instead of a source row: model, layer, ranks, steps and numbers."""
    rule = _rule(f.code)
    return {
        "code": f.code,
        "name": rule.name if rule else "",
        "filename": report.script,
        "location": {"row": 1, "column": 1},
        "end_location": {"row": 1, "column": 1},
        "message": f"{f.layer}: {f.message}",
        "noqa_row": None,
        "url": rule.url if rule else "",
        "fix": {"applicability": "display-only", "message": f.fix, "edits": []},
        "model": f.model,
        "framework": f.framework,
        "layer": f.layer,
        "ranks": list(f.ranks),
        "steps": [f.first_step, f.last_step],
        "numbers": f.numbers,
    }


def document(report: DoctorReport) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "bnfix": __version__,
        "command": report.command,
        "exit_code": report.exit_code,
        "timed_out": report.timed_out,
        "stopped": report.stopped,
        "every": report.every,
        "steps_limit": report.steps_limit,
        "wall_s": round(report.wall_s, 3),
        "findings": [finding_record(f, report) for f in report.findings],
        "ranks": [{"model": model, "layer": g.layer, "ranks": list(g.ranks), "shift": g.shift,
                   "variance_ratio": math.exp(g.scale), "affine": g.affine}
                  for model, g in report.rank_gaps()],
        "monitor_errors": report.monitor_errors,
        "recordings": [r.to_data() for r in report.recordings],
    }
