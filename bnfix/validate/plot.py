"""The per-layer error figure: synced vs unsynced relative error, log scale, tolerance line."""

from __future__ import annotations

from pathlib import Path

from bnfix.validate.comparison import Validation

_SMALLEST = 1e-18  # exact zeros are drawn here (a log axis has no 0)


def write_plot(validation: Validation, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [layer.layer for layer in validation.synced.layers]
    unsynced = {layer.layer: layer.max_rel for layer in validation.unsynced.layers}
    synced_values = [max(layer.max_rel, _SMALLEST) for layer in validation.synced.layers]
    unsynced_values = [max(unsynced.get(name, 0.0), _SMALLEST) for name in names]
    positions = range(len(names))
    fig, ax = plt.subplots(figsize=(max(6.0, 0.32 * len(names) + 2), 4.8))
    ax.semilogy(positions, unsynced_values, "o-", color="tab:red",
                label=f"unsynced BN on {validation.settings['devices']} replicas")
    ax.semilogy(positions, synced_values, "s-", color="tab:blue",
                label="synced BN (bnfix)")
    ax.axhline(validation.tolerance, color="gray", linestyle="--",
               label=f"tolerance {validation.tolerance:.0e}")
    ax.set_xticks(list(positions), names, rotation=70, ha="right", fontsize=7)
    ax.set_ylabel("max relative error vs one device, global batch")
    ax.set_title(f"bnfix validate {validation.kind}: {validation.model} "
                 f"({validation.settings['steps']} steps, {validation.settings['dtype']})",
                 fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(True, which="major", axis="y", alpha=0.3)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
