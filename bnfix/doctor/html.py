"""The doctor's HTML page: one self-contained file (CSS inline, plots as base64 PNGs) with the
findings and, per BN layer (the worst first), four plots over the training steps: γ/β (mean and
min-max band), batch vs running statistics (channel averages), the fraction of dead channels,
and the train/eval gap on the probe batch. Ranks of a distributed run are drawn side by side."""

from __future__ import annotations

import base64
import html
import io
import math
from collections.abc import Sequence

from bnfix.doctor.diagnose import Finding, groups
from bnfix.doctor.record import LayerTrace, Recording, Sample, number
from bnfix.doctor.report import DoctorReport, _rule, layer_order

CSS = """
body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}
h1{font-size:1.5em}h2{font-size:1.15em;margin-top:2em;border-bottom:1px solid #ccc}
code{background:#f3f3f3;padding:0 .2em}
table{border-collapse:collapse;width:100%;font-size:.9em}
td,th{border:1px solid #ddd;padding:.3em .5em;text-align:left;vertical-align:top}
th{background:#f6f6f6}.code{font-weight:bold;white-space:nowrap}
.finding{border-left:4px solid #c0392b;background:#fdf2f1;padding:.4em .8em;margin:.5em 0}
.fix{color:#1e6b35}.ok{color:#1e6b35}.muted{color:#777}
img.plot{width:100%;max-width:1100px}
"""


def render_html(report: DoctorReport) -> str:
    title = "bnfix doctor: " + " ".join(report.command)
    parts = [(f"<!doctype html><html><head><meta charset='utf-8'><title>{_e(title)}</title>"
              f"<style>{CSS}</style></head><body>"),
             f"<h1>bnfix doctor</h1><p><code>{_e(' '.join(report.command))}</code></p>",
             f"<p>{_e(_summary(report))}</p>"]
    parts.append(_findings_table(report.findings))
    parts.append(_ranks_table(report))
    notes = sorted({n for r in report.recordings for n in r.notes}) + report.monitor_errors
    if notes:
        parts.append("<ul class='muted'>" + "".join(f"<li>{_e(n)}</li>" for n in notes)
                     + "</ul>")
    for group in groups(report.recordings):
        parts.extend(_layer_sections(report, group))
    parts.append("</body></html>\n")
    return "\n".join(parts)


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _summary(report: DoctorReport) -> str:
    layers = sum(len(g[0].layers) for g in groups(report.recordings))
    steps = max((r.steps for r in report.recordings), default=0)
    ranks = len({r.rank for r in report.recordings if r.rank is not None})
    text = (f"{len(report.findings)} finding(s) in {len(layer_order(report))} of {layers} BN "
            f"layers; {steps} training steps sampled every {report.every}")
    if ranks > 1:
        text += f"; {ranks} ranks merged"
    if report.stopped:
        text += " (stopped by --steps)"
    return text + "."


def _findings_table(findings: Sequence[Finding]) -> str:
    if not findings:
        return "<p class='ok'>No BN problem found.</p>"
    rows = ["<table><tr><th>code</th><th>layer</th><th>steps</th><th>what</th><th>fix</th></tr>"]
    for f in findings:
        rule = _rule(f.code)
        ranks = f"<br><span class='muted'>ranks {', '.join(map(str, f.ranks))}</span>" \
            if len(f.ranks) > 1 else ""
        rows.append(f"<tr><td class='code'><a href='{_e(rule.url if rule else '')}'>{f.code}</a>"
                    f"<br><span class='muted'>{_e(rule.name if rule else '')}</span></td>"
                    f"<td><a href='#{_anchor(f.model, f.layer)}'>{_e(f.layer)}</a>{ranks}</td>"
                    f"<td>{_e(f.steps)}</td><td>{_e(f.message)}</td>"
                    f"<td class='fix'>{_e(f.fix)}</td></tr>")
    rows.append("</table>")
    return "\n".join(rows)


def _ranks_table(report: DoctorReport) -> str:
    gaps = report.rank_gaps()
    if not gaps:
        return ""
    rows = [("<h2>Ranks compared</h2><p>Each layer's end state against the first rank's "
             "(running means in std units, variance ratio, γ/β relative difference).</p><table>"
             "<tr><th>layer</th><th>ranks</th><th>mean shift</th><th>variance ratio</th>"
             "<th>γ/β</th></tr>")]
    for _, g in gaps:
        rows.append(f"<tr><td>{_e(g.layer)}</td><td>{g.ranks[0]} / {g.ranks[1]}</td>"
                    f"<td>{g.shift:.3g}</td><td>{math.exp(g.scale):.3g}</td>"
                    f"<td>{g.affine:.2%}</td></tr>")
    rows.append("</table>")
    return "\n".join(rows)


def _anchor(model: str, layer: str) -> str:
    return "layer-" + "".join(c if c.isalnum() else "-" for c in f"{model}-{layer}")


def _layer_sections(report: DoctorReport, group: list[Recording]) -> list[str]:
    base = group[0]
    flagged = [name for model, name in layer_order(report) if model == base.model]
    names = flagged + [n for n in base.layers if n not in flagged]
    multi = len(groups(report.recordings)) > 1
    out = []
    for name in names:
        layer = base.layers[name]
        findings = [f for f in report.findings if (f.model, f.layer) == (base.model, name)]
        head = f"{base.model}: {name}" if multi else name
        info = (f"{layer.cls}, {layer.channels} channels, momentum "
                f"{'cumulative' if layer.momentum is None else f'{layer.momentum:g}'}"
                f"{', synced' if layer.synced else ''}, {layer.updates} updates")
        out.append(f"<h2 id='{_anchor(base.model, name)}'>{_e(head)} "
                   f"<span class='muted'>({_e(info)})</span></h2>")
        for f in findings:
            out.append(f"<div class='finding'><b>{f.code}</b> ({_e(f.steps)}): {_e(f.message)}"
                       f"<br><span class='fix'>fix: {_e(f.fix)}</span></div>")
        traces = [(r.rank, r.layers[name]) for r in group if name in r.layers]
        out.append(f"<img class='plot' alt='{_e(name)} plots' "
                   f"src='data:image/png;base64,{plot_layer(traces, base)}'>")
    return out


def _series(samples: Sequence[Sample], name: str) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for s in samples:
        value = number(getattr(s, name))
        if value is not None and math.isfinite(value):
            xs.append(s.step)
            ys.append(value)
    return xs, ys


def plot_layer(traces: Sequence[tuple[int | None, LayerTrace]], rec: Recording) -> str:
    """The four panels of one layer as a base64 PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(15, 2.9), dpi=72)
    multi = len(traces) > 1
    for index, (rank, layer) in enumerate(traces):
        tag = f" r{rank}" if multi else ""
        alpha = 1.0 if index == 0 else 0.6
        samples = layer.samples
        ax = axes[0]
        for name, colour, symbol in (("gamma", "tab:blue", "γ"), ("beta", "tab:orange", "β")):
            xs, ys = _series(samples, f"{name}_mean")
            if xs:
                ax.plot(xs, ys, color=colour, alpha=alpha, label=f"{symbol} mean{tag}")
                lo, hi = _series(samples, f"{name}_min")[1], _series(samples, f"{name}_max")[1]
                if len(lo) == len(xs) == len(hi):
                    ax.fill_between(xs, lo, hi, color=colour, alpha=0.15)
        ax = axes[1]
        for name, colour, style in (("batch_mean", "tab:green", "-"),
                                    ("running_mean", "tab:green", "--"),
                                    ("batch_var", "tab:purple", "-"),
                                    ("running_var", "tab:purple", "--")):
            xs, ys = _series(samples, name)
            if xs:
                ax.plot(xs, ys, style, color=colour, alpha=alpha,
                        label=f"{name.replace('_', ' ')}{tag}")
        xs, ys = _series(samples, "dead")
        if xs:
            axes[2].plot(xs, ys, color="tab:red", alpha=alpha, label=f"dead{tag}")
        if layer.probes:
            axes[3].plot([p[0] for p in layer.probes], [p[1] for p in layer.probes], "o-",
                         color="tab:brown", alpha=alpha, label=f"layer{tag}")
    if rec.output_gap:
        axes[3].plot([p[0] for p in rec.output_gap], [p[1] for p in rec.output_gap], "x:",
                     color="grey", label="model output")
    titles = ("γ / β (mean, min-max)", "batch vs running statistics (channel mean)",
              "dead channels after ReLU", "train/eval gap on the probe batch")
    for ax, title in zip(axes, titles):
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=6, loc="best")
        else:
            ax.text(0.5, 0.5, "not measured", ha="center", va="center",
                    transform=ax.transAxes, color="grey")
    axes[2].set_ylim(-0.05, 1.05)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    return base64.b64encode(buffer.getvalue()).decode("ascii")
