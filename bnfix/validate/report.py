"""The terminal table and the JSON file of a validation."""

from __future__ import annotations

import json
from pathlib import Path

from bnfix.validate.comparison import NOISE_FACTOR, Validation


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
                     f"max rel {_e(f.max_rel)}  {_mark(f.max_rel, v.tolerance)}"
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
    noise = {layer.layer: layer for layer in v.noise.layers} if v.noise is not None else None
    header = ("layer", "kind", "synced abs", "synced rel", "unsynced rel")
    rows = [header + (("rounding rel",) if noise is not None else ()) + ("",)]
    for layer in v.synced.layers:
        other = unsynced.get(layer.layer)
        row = (layer.layer, layer.kind, _e(layer.max_abs), _e(layer.max_rel),
               _e(other.max_rel) if other else "-")
        if noise is not None:
            row += (_e(noise[layer.layer].max_rel) if layer.layer in noise else "-",)
        mark = _mark(layer.max_rel, v.allowed(layer.layer))
        if mark == "ok" and layer.max_rel > v.tolerance:
            mark = "ok (rounding)"
        rows.append(row + (mark,))
    numbers = len(rows[0]) - 1
    widths = [max(len(row[i]) for row in rows) for i in range(numbers)]
    for row in rows:
        cells = [row[0].ljust(widths[0]), row[1].ljust(widths[1])]
        cells += [cell.rjust(w) for cell, w in zip(row[2:numbers], widths[2:numbers],
                                                   strict=True)]
        lines.append(("  " + "  ".join(cells) + "  " + row[-1]).rstrip())
    if noise is not None:
        lines.append(f"rounding rel: the reference trained again on the global batch in reverse "
                     f"order (equal in exact arithmetic): {s['dtype']} rounding alone; a layer "
                     f"passes within max(tolerance, {NOISE_FACTOR:g}x its rounding)")
    synced, gap = v.synced.max_rel, v.unsynced.max_rel
    if not v.passed and any(not x.max_rel <= v.allowed(x.layer) for x in v.synced.layers):
        closes = "sync did not close the gap"
    else:
        closes = f"the gap sync closes ({gap / synced:.0e}x)" if synced else "the gap sync closes"
    worst = v.synced.worst()
    lines.append(f"synced max rel {_e(synced)} "
                 f"{_mark(synced, v.allowed(worst.layer) if worst else v.tolerance)}; "
                 "unsynced max rel "
                 f"{_e(gap)}: {closes}")
    lines.append(f"running statistics apart between {s['replica_word']}: synced "
                 f"{_e(v.synced.replica_drift)}, unsynced {_e(v.unsynced.replica_drift)}")
    return lines


def table(v: Validation) -> str:
    """The terminal report: settings, fidelity, the per-layer table, the verdict."""
    lines = _header(v) + _fidelity(v) + _training(v)
    lines += ["", f"verdict: {verdict(v)} (total {v.seconds.get('total', 0.0):.1f} s)"]
    if not v.passed:
        lines += [f"  {failure}" for failure in v.failures]
    return "\n".join(lines) + "\n"


def verdict(v: Validation) -> str:
    """One line that says what passed or failed and why: a conversion that refused every BN,
    a sync bug (the synced run as far off as the unsynced one), or numerics."""
    if v.passed:
        if v.within_noise:
            return (f"PASS: within the model's {v.settings['dtype']} rounding noise "
                    f"({len(v.within_noise)} layer(s) above the fixed tolerance {v.tolerance:.0e}"
                    f", each within {NOISE_FACTOR:g}x its measured rounding)")
        return "PASS: every comparison within tolerance"
    refused_all = [f for f in v.fidelity if f.refused and not f.converted]
    if v.inconclusive:
        return (f"FAIL: inconclusive in {v.settings['dtype']}: {v.inconclusive}; rerun with "
                "--dtype float64, a smaller --lr or fewer --steps")
    if refused_all:
        return (f"FAIL: the conversion refused every BN layer ({len(refused_all[0].refused)} "
                "refused, 0 converted): nothing was synchronized")
    failing = [layer for layer in v.synced.layers if not layer.max_rel <= v.allowed(layer.layer)]
    causes = {v.cause(layer) for layer in failing}
    if "sync" in causes:
        return (f"FAIL: sync bug: {sum(v.cause(x) == 'sync' for x in failing)} layer(s) as far "
                "from the global batch as without sync (statistics not synchronized)")
    if failing:
        return (f"FAIL: numerics: {len(failing)} layer(s) off by more than the tolerance and "
                f"{NOISE_FACTOR:g}x their rounding noise, far below the unsynced gap; rerun "
                "with --dtype float64 to tell rounding from a bug")
    return f"FAIL: {len(v.failures)} comparison(s) out of tolerance"


def write_json(v: Validation, out: Path) -> None:
    """Every figure, plus the verdict in words and the cause of each failing synced layer
    ("sync" or "numerics", see `Validation.cause`)."""
    data = v.to_json()
    data["summary"] = verdict(v)
    data["causes"] = {layer.layer: v.cause(layer) for layer in v.synced.layers
                      if not layer.max_rel <= v.allowed(layer.layer)}
    data["refused_everything"] = [f.name for f in v.fidelity if f.refused and not f.converted]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1, allow_nan=True) + "\n", encoding="utf-8")
