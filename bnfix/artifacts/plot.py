"""`--plot OUT.png`: the per-layer distributions of gamma, beta, mean and variance (one box per
layer, channels as samples), one row per artifact; layers with findings are drawn in red."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from bnfix.artifacts.model import Artifact, ArtifactFinding

ROLES = (("gamma", "gamma"), ("beta", "beta"), ("mean", "moving mean"),
         ("var", "moving variance"))
FLAGGED, NORMAL = "#d62728", "#1f77b4"
MAX_ROWS = 12  # artifacts drawn; a figure taller than this is unreadable


def require_matplotlib() -> None:
    """Raise ImportError early, before any artifact is read."""
    import matplotlib  # noqa: F401


def plot_artifacts(artifacts: Sequence[Artifact], findings: Sequence[ArtifactFinding],
                   out: str) -> int:
    """Write the figure; returns how many artifacts it shows."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [a for a in artifacts if a.layers][:MAX_ROWS]
    rows = max(1, len(shown))
    widest = max((len(a.layers) for a in shown), default=1)
    fig, axes = plt.subplots(rows, len(ROLES), squeeze=False,
                             figsize=(max(12.0, 0.35 * widest * len(ROLES)), 3.2 * rows))
    if not shown:
        fig.text(0.5, 0.5, "no BN layers found", ha="center", va="center")
    for row, artifact in enumerate(shown):
        flagged = {f.layer for f in findings if f.path == artifact.path and f.layer}
        names = [layer.name for layer in artifact.layers]
        colors = [FLAGGED if name in flagged else NORMAL for name in names]
        for col, (role, title) in enumerate(ROLES):
            ax = axes[row][col]
            data = [_finite(getattr(layer, role)) for layer in artifact.layers]
            positions = [i for i, d in enumerate(data) if d.size]
            if positions:
                boxes = ax.boxplot([data[i] for i in positions], positions=positions,
                                   widths=0.6, patch_artist=True, showfliers=False)
                for patch, i in zip(boxes["boxes"], positions):
                    patch.set_facecolor(colors[i])
                    patch.set_alpha(0.6)
            if role == "var" and all(d.size == 0 or d.min() > 0 for d in data):
                ax.set_yscale("log")
            ax.set_xticks(range(len(names)))
            ax.set_xticklabels(names, rotation=90, fontsize=6)
            for label, color in zip(ax.get_xticklabels(), colors):
                label.set_color(color)
            ax.set_xlim(-0.7, len(names) - 0.3)
            ax.set_title(title, fontsize=9)
            if col == 0:
                ax.set_ylabel(_short(artifact.path), fontsize=8)
    fig.suptitle("BN parameters and statistics per layer (red: flagged by bnfix inspect)",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return len(shown)


def _finite(value: np.ndarray | None) -> np.ndarray:
    if value is None:
        return np.empty(0)
    return value[np.isfinite(value)]


def _short(path: str, width: int = 32) -> str:
    return path if len(path) <= width else "…" + path[-(width - 1):]
