"""The terminal table and the JSON file of a validation."""

from __future__ import annotations

import json
from pathlib import Path

from bnfix.validate import rounding
from bnfix.validate.comparison import LayerError, Validation


def _e(value: float) -> str:
    return f"{value:.1e}"


def _mark(value: float, tolerance: float) -> str:
    return "ok" if value <= tolerance else "FAIL"


def _header(v: Validation) -> list[str]:
    s = v.settings
    shape = "x".join(str(d) for d in s["input_shape"])
    where = f"{s['backend']}, {s['device']}" if s.get("backend") else s["device"]
    lines = [f"bnfix validate {v.kind} {v.model}",
             (f"{s['devices']} {s['replica_word']} ({where}, {s['launcher']}), global batch "
              f"{shape}, {s['steps']} SGD steps (lr {s['lr']}), {s['dtype']}, {s['target']} "
              f"targets; tolerance {v.tolerance:.0e} (max relative error)")]
    if s.get("deterministic"):
        lines.append(s["deterministic"])
    return lines


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


def _allowed(v: Validation, layer: str) -> float:
    return rounding.allowed(v, layer) if v.noise is not None else v.tolerance


def _failing(v: Validation) -> list[LayerError]:
    """Synced layers out of allowance that fail the validation."""
    if v.noise is None:
        return [row for row in v.synced.layers if not row.max_rel <= v.tolerance]
    if rounding.amplified(v) or v.passed:
        return []
    run, noise = rounding.judged(v)
    return [row for row in run.layers if not row.max_rel <= rounding.allowed(v, row.layer, noise)]


def _cause(v: Validation, row: LayerError) -> str:
    if v.noise is not None:
        return rounding.cause(v, row)
    unsynced = {x.layer: x.max_rel for x in v.unsynced.layers}.get(row.layer, 0.0)
    return "sync" if row.max_rel >= rounding.SYNC_BUG_FRACTION * unsynced else "numerics"


def _training(v: Validation) -> list[str]:
    s = v.settings
    lines = ["", (f"training: {s['devices']} {s['replica_word']} vs one device fed the global "
                  f"batch, errors over all {s['steps']} steps:")]
    unsynced = {layer.layer: layer for layer in v.unsynced.layers}
    noise = {layer.layer: layer for layer in v.noise.layers} if v.noise is not None else None
    amplified = set(rounding.amplified(v)) if v.noise is not None else set()
    wide_ok = bool(v.float64) and rounding.confirmed_in_float64(v)
    step_one: dict[str, str] = {}
    if v.noise is not None and rounding.chaotic_later(v) and v.first_step:
        first_noise = v.first_step["noise"]
        step_one = {row.layer: "ok at step 1 (later steps chaotic)"
                    if row.max_rel <= rounding.allowed(v, row.layer, first_noise)
                    else "FAIL at step 1" for row in v.first_step["synced"].layers}
    header = ("layer", "kind", "synced abs", "synced rel", "unsynced rel")
    rows = [header + (("rounding rel",) if noise is not None else ()) + ("",)]
    for layer in v.synced.layers:
        other = unsynced.get(layer.layer)
        row = (layer.layer, layer.kind, _e(layer.max_abs), _e(layer.max_rel),
               _e(other.max_rel) if other else "-")
        if noise is not None:
            row += (_e(noise[layer.layer].max_rel) if layer.layer in noise else "-",)
        mark = _mark(layer.max_rel, _allowed(v, layer.layer))
        if layer.layer in step_one and mark == "FAIL":
            mark = step_one[layer.layer]
        if layer.layer in amplified:
            mark = "ok at step 1, diverges after"
        elif mark == "FAIL" and wide_ok:
            mark = "float32 numerics (ok in float64)"
        elif mark == "ok" and layer.max_rel > v.tolerance:
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
        lines.append(f"rounding rel: runs equal to the reference in exact arithmetic (the "
                     f"reference on the reversed batch, the synced model on one device): "
                     f"{s['dtype']} rounding alone; a layer passes within max(tolerance, "
                     f"{rounding.NOISE_FACTOR:g}x its rounding)")
    synced, gap = v.synced.max_rel, v.unsynced.max_rel
    if _failing(v):
        closes = "sync did not close the gap"
    else:
        closes = f"the gap sync closes ({gap / synced:.0e}x)" if synced else "the gap sync closes"
    worst = v.synced.worst()
    lines.append(f"synced max rel {_e(synced)} "
                 f"{_mark(synced, _allowed(v, worst.layer) if worst else v.tolerance)}; "
                 f"unsynced max rel {_e(gap)}: {closes}")
    lines.append(f"running statistics apart between {s['replica_word']}: synced "
                 f"{_e(v.synced.replica_drift)}, unsynced {_e(v.unsynced.replica_drift)}")
    if v.float64:
        wide, noise = v.float64["synced"], v.float64["noise"]
        lines.append(f"float64 rerun (same weights): synced max rel {_e(wide.max_rel)}, its "
                     f"rounding {_e(noise.max_rel)}: "
                     + ("agrees" if wide_ok else "differs: not float32 rounding"))
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
    inconclusive runs, a sync bug, or numerics (see bnfix.validate.rounding)."""
    dtype = v.settings["dtype"]
    if v.passed:
        if v.float64 and rounding.confirmed_in_float64(v):
            worst = max((row.max_rel for row in v.float64["synced"].layers), default=0.0)
            why = rounding.inconclusive(v)
            what = (f"was inconclusive ({why})" if why else "differs from the global batch by "
                    f"more than its measured rounding (max rel {v.synced.max_rel:.1e})")
            return (f"PASS: synchronized; float32 {what}, and the float64 rerun agrees with "
                    f"its reference (max rel {worst:.1e}): numerics, not sync")
        later = rounding.chaotic_later(v) if v.noise is not None else 0.0
        if later:
            return (f"PASS: synchronized (step 1 matches the global batch within {dtype} "
                    "rounding and the replicas' statistics are identical); after step 1 "
                    f"rounding alone moves this model by {later:.1e} (chaotic at lr "
                    f"{v.settings['lr']}), so the later steps are no evidence either way")
        amplified = rounding.amplified(v) if v.noise is not None else []
        if amplified:
            return (f"PASS: synchronized (step 1 matches the global batch within {dtype} "
                    f"rounding and the replicas' statistics are identical); {len(amplified)} "
                    "layer(s) drift further apart over the next steps as this model amplifies "
                    "rounding (numerics, not sync)")
        within = rounding.within_noise(v) if v.noise is not None else []
        if within:
            return (f"PASS: within the model's {dtype} rounding noise ({len(within)} layer(s) "
                    f"above the fixed tolerance {v.tolerance:.0e}, each within "
                    f"{rounding.NOISE_FACTOR:g}x its measured rounding)")
        return "PASS: every comparison within tolerance"
    refused_all = [f for f in v.fidelity if f.refused and not f.converted]
    if refused_all:
        return (f"FAIL: the conversion refused every BN layer ({len(refused_all[0].refused)} "
                "refused, 0 converted): nothing was synchronized")
    if v.float64 and not rounding.confirmed_in_float64(v):
        return ("FAIL: sync bug: the synced run differs from the global batch in float64 too "
                "(not float32 rounding)")
    why = rounding.inconclusive(v) if v.noise is not None else ""
    if why:
        return (f"FAIL: inconclusive in {dtype}: {why}; rerun with --dtype float64, a smaller "
                "--lr or fewer --steps")
    failing = _failing(v)
    bugs = [row for row in failing if _cause(v, row) == "sync"]
    if bugs:
        return (f"FAIL: sync bug: {len(bugs)} layer(s) as far from the global batch as without "
                "sync on the first step, or replicas whose statistics disagree")
    if failing:
        return (f"FAIL: numerics: {len(failing)} layer(s) off by more than the tolerance and "
                f"{rounding.NOISE_FACTOR:g}x their rounding noise, far below the unsynced gap; "
                "rerun with --dtype float64 to tell rounding from a bug")
    return f"FAIL: {len(v.failures)} comparison(s) out of tolerance"


def write_json(v: Validation, out: Path) -> None:
    """Every figure, plus the verdict in words and the cause of each failing synced layer
    ("sync" or "numerics", see bnfix.validate.rounding)."""
    data = v.to_json()
    data["summary"] = verdict(v)
    data["causes"] = {row.layer: _cause(v, row) for row in _failing(v)}
    data["refused_everything"] = [f.name for f in v.fidelity if f.refused and not f.converted]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1, allow_nan=True) + "\n", encoding="utf-8")
