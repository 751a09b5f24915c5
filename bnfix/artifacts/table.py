"""The `full` output's per-artifact table: one row per BN layer with its channel count, a summary
of gamma/beta/mean/var and the rules that flagged it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from bnfix.artifacts.model import Artifact, ArtifactFinding

COLUMNS = ("layer", "ch", "gamma", "beta", "mean", "var", "flags")


def summarize(value: np.ndarray | None) -> str:
    """`all 1` for a constant vector, `mean±std` otherwise; non-finite values are counted."""
    if value is None:
        return "-"
    if value.size == 0:
        return "empty"
    finite = np.isfinite(value)
    if not finite.all():
        return f"{int((~finite).sum())} non-finite"
    if np.all(value == value[0]):
        return f"all {value[0]:.4g}"
    return f"{value.mean():.3g}±{value.std():.2g}"


@dataclass
class Table:
    """What the `full` output shows of one artifact, as strings: it is what the inspect cache
    stores, so that a cached artifact is shown without reading it (or importing its framework).
    `seconds` is how long the read took; `cached` says it was not read in this run."""

    path: str
    facts: list[str]          # the header's facts, without the read time
    graph: str | None         # the graph summary line, for graph artifacts
    rows: list[list[str]]     # per BN layer: name, channels, gamma, beta, mean, var
    seconds: float
    cached: bool = False


def table_of(artifact: Artifact) -> Table:
    n = len(artifact.layers)
    facts = [artifact.kind, f"{n} BN layer{'s' if n != 1 else ''}"]
    if artifact.trained is not None:
        facts.append(f"{'trained' if artifact.trained else 'untrained'}: "
                     f"{artifact.trained_evidence}")
    facts.extend(artifact.notes)
    rows = [[layer.name, str(layer.channels if layer.channels is not None else "-"),
             summarize(layer.gamma), summarize(layer.beta), summarize(layer.mean),
             summarize(layer.var)] for layer in artifact.layers]
    return Table(artifact.path, facts, _graph_line(artifact), rows, artifact.seconds)


def _graph_line(artifact: Artifact) -> str | None:
    graph = artifact.graph
    if graph is None:
        return None
    return (f"  graph: {'inference' if graph.inference else 'training'}; "
            f"{len(graph.train_ops)} train op(s), {len(graph.update_ops)} moving variable(s) "
            f"with update ops, {sum(1 for v in graph.reachable_updates.values() if v)} updated "
            f"by the train op, {len(graph.ema_shadows)} EMA shadow(s), "
            f"{len(graph.training_mode_nodes)} training-mode BN node(s), "
            f"{len(graph.unfolded)} unfolded BN(s)")


def render_table(table: Table | Artifact, findings: Sequence[ArtifactFinding]) -> str:
    """The header line, the graph line and a row per BN layer with the codes that flagged it."""
    if isinstance(table, Artifact):
        table = table_of(table)
    flags: dict[str, list[str]] = {}
    for f in findings:
        if f.path == table.path and f.code not in flags.get(f.layer, []):
            flags.setdefault(f.layer, []).append(f.code)
    timing = f"read in {table.seconds:.2f} s"
    facts = [*table.facts, f"cached ({timing})" if table.cached else timing]
    lines = [f"{table.path}  ({'; '.join(facts)})"]
    if table.graph:
        lines.append(table.graph)
    if table.rows:
        rows = [list(COLUMNS)] + [[*row, " ".join(flags.get(row[0], []))] for row in table.rows]
        widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
        for row in rows:
            cells = [cell.rjust(w) if i == 1 else cell.ljust(w)
                     for i, (cell, w) in enumerate(zip(row, widths))]
            lines.append(("  " + "  ".join(cells)).rstrip())
    return "\n".join(lines) + "\n"
