"""The terminal table and the JSON file of a validation."""

from __future__ import annotations

import json
from pathlib import Path

from bnfix.validate.comparison import Validation


def _e(value: float) -> str:
    return f"{value:.1e}"


def _mark(value: float, tolerance: float) -> str:
    return "ok" if value <= tolerance else "FAIL"


def _header(v: Validation) -> list[str]:
    s = v.settings
    shape = "x".join(str(d) for d in s["input_shape"])
    where = f"{s['backend']}, {s['device']}" if s.get("backend") else s["device"]
    return [f"bnfix validate {v.kind} {v.model}",
            (f"{s['devices']} {s['replica_word']} ({where}, {s['launcher']}), global batch "
            f"{shape}, {s['steps']} SGD steps (lr {s['lr']}), {s['dtype']}, {s['target']} "
            f"targets; tolerance {v.tolerance:.0e} (max relative error)")]


def _fidelity(v: Validation) -> list[str]:
    lines = ["", "conversion fidelity (eval mode, same weights as the original):"]
    width = max((len(f.name) for f in v.fidelity), default=0)
    for f in v.fidelity:
        counts = f"{f.converted} converted, {len(f.refused)} refused"
        lines.append(f"  {f.name:<{width}}  {counts:<24}  max abs {_e(f.max_abs)}  "
                     f"max rel {_e(f.max_rel)}  "
                     f"{'PROBLEM' if f.problem else _mark(f.max_rel, v.tolerance)}"
                     + (f"  ({f.note})" if f.note else ""))
        by_reason: dict[str, list[str]] = {}
        for r in f.refused:
            by_reason.setdefault(r.reason, []).append(f"{r.path} ({r.layer_class})")
        lines += [f"    refused {', '.join(where)}: {reason}" for reason, where in by_reason.items()]
    return lines


def _training(v: Validation) -> list[str]:
    s = v.settings
    lines = ["", (f"training: {s['devices']} {s['replica_word']} vs one device fed the global "
                  f"batch, errors over all {s['steps']} steps:")]
    unsynced = {layer.layer: layer for layer in v.unsynced.layers}
    rows = [("layer", "kind", "synced abs", "synced rel", "unsynced rel", "")]
    for layer in v.synced.layers:
        other = unsynced.get(layer.layer)
        rows.append((layer.layer, layer.kind, _e(layer.max_abs), _e(layer.max_rel),
                     _e(other.max_rel) if other else "-", _mark(layer.max_rel, v.tolerance)))
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    for row in rows:
        cells = [row[0].ljust(widths[0]), row[1].ljust(widths[1])]
        cells += [cell.rjust(w) for cell, w in zip(row[2:5], widths[2:5], strict=True)]
        lines.append(("  " + "  ".join(cells) + "  " + row[5]).rstrip())
    synced, gap = v.synced.max_rel, v.unsynced.max_rel
    if synced > v.tolerance:
        closes = "sync did not close the gap"
    else:
        closes = f"the gap sync closes ({gap / synced:.0e}x)" if synced else "the gap sync closes"
    lines.append(f"synced max rel {_e(synced)} {_mark(synced, v.tolerance)}; unsynced max rel "
                 f"{_e(gap)}: {closes}")
    lines.append(f"running statistics apart between {s['replica_word']}: synced "
                 f"{_e(v.synced.replica_drift)}, unsynced {_e(v.unsynced.replica_drift)}")
    return lines


def table(v: Validation) -> str:
    """The terminal report: settings, fidelity, the per-layer table, the verdict."""
    lines = _header(v) + _fidelity(v) + _training(v)
    if v.passed:
        verdict = "PASS: every comparison within tolerance"
    else:
        verdict = f"FAIL: {len(v.failures)} comparison(s) out of tolerance"
        lines += ["", *[f"  {failure}" for failure in v.failures]]
    lines += ["", f"verdict: {verdict} (total {v.seconds.get('total', 0.0):.1f} s)"]
    return "\n".join(lines) + "\n"


def write_json(v: Validation, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(v.to_json(), indent=1, allow_nan=True) + "\n", encoding="utf-8")
