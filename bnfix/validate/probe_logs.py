"""The probe's logs of one run, read back: events by kind, probe failures, the project files
that ran, and BN state trajectories (per layer and variable, one vector per training step)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

Trajectories = dict[str, dict[str, list[np.ndarray]]]  # layer -> variable -> values per step


@dataclass
class RunLog:
    events: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def read(cls, folder: Path) -> RunLog:
        events = []
        for path in sorted(folder.glob("probe-*.jsonl")):
            for line in path.read_text(encoding="utf-8").splitlines():
                if line.strip():
                    events.append(json.loads(line))
        return cls(events)

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["kind"] == kind]

    @property
    def errors(self) -> list[str]:
        return [f"{e['where']}: {e['error']}" for e in self.of("probe_error")]

    @property
    def files(self) -> set[str]:
        return {f for e in self.of("files") for f in e["files"]}

    def bn_calls(self) -> list[dict[str, Any]]:
        """The final counters of each kind of BN call, per process (they are cumulative)."""
        last: dict[tuple, dict[str, Any]] = {}
        for e in self.of("bn_calls"):
            key = (e["pid"], e["layer"], e["cls"], e["training"], e["grad"], e["frozen"],
                   e["biased_input"])
            last[key] = e
        return list(last.values())

    def steps_by_rank(self) -> dict[int | None, list[dict[str, Any]]]:
        """torch/Keras "step" snapshots per rank (None outside distributed runs), by step."""
        ranks: dict[int | None, dict[int, dict[str, Any]]] = {}
        for e in self.of("step"):
            ranks.setdefault(e["rank"], {})[e["step"]] = e
        return {r: [s[k] for k in sorted(s)] for r, s in ranks.items()}

    def trajectories(self) -> Trajectories:
        """BN variables at step 0 (before training) and after each recorded step: TF1 runs from
        the first train op's steps, torch/Keras from rank 0's (or the only process's)."""
        out: Trajectories = {}
        tf1 = self.of("tf1_step")
        if tf1:
            plan = tf1[0]["plan"]
            steps = [e for e in tf1 if e["plan"] == plan and e["pid"] == tf1[0]["pid"]]
            for i, e in enumerate(steps):
                states = ([e["before"]] if i == 0 and e["before"] else []) + [e["after"]]
                for state in states:
                    for name, vals in state.items():
                        layer, _, var = name.rpartition("/")
                        out.setdefault(layer, {}).setdefault(var, []).append(np.asarray(vals))
            return out
        ranks = self.steps_by_rank()
        if not ranks:
            return out
        rank = 0 if 0 in ranks else min(ranks, key=lambda r: (r is None, r))
        for e in ranks[rank]:
            for layer, state in e["layers"].items():
                for var, vals in state.items():
                    out.setdefault(layer, {}).setdefault(var, []).append(np.asarray(vals))
        return out
