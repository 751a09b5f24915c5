"""Artifact rules (BN201-BN208): the fingerprints that BN bugs leave in checkpoints, graphs and
exported models. They read only the artifact IR (`bnfix.artifacts.model`), never the file, so
every reader (torch, TF checkpoints and graphs, Keras, ONNX) gets every rule.

The messages name the layer, what the stored values show, and the training-code bug that
produces them (the source rule that finds it)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

from bnfix.artifacts.model import Artifact, ArtifactFinding, BNLayer

ArtifactCheck = Callable[[Artifact], Iterable[ArtifactFinding]]
ARTIFACT_CHECKS: dict[str, ArtifactCheck] = {}
# Reported by `bnfix inspect` itself: the artifact could not be read.
ARTIFACT_ENGINE_CODES = frozenset({"BN902"})

DEAD_GAMMA = 1e-6  # |gamma| below this: the channel outputs beta whatever its input
EXTREME = 1e6      # |mean|, |gamma|, |beta| or std above this overflow fp16 and signal divergence
STAT_NAMES = {
    "torch": ("running_mean", "running_var"), "tf": ("moving_mean", "moving_variance"),
    "keras": ("moving_mean", "moving_variance"), "onnx": ("input_mean", "input_var"),
}
KIND_NOUNS = {
    "torch-state-dict": "state dict", "torch-module": "pickled module",
    "safetensors": "safetensors file", "tf-checkpoint": "TF checkpoint",
    "tf2-checkpoint": "TF checkpoint", "keras": ".keras model", "keras-h5": "Keras .h5 file",
}
NOT_UPDATED_HINT = {
    "tf": "the update ops never ran: run the train op under "
          "tf.control_dependencies(UPDATE_OPS) (BN003), or a Keras 3 BN in a TF1 graph (BN011)",
    "keras": "the layer ran in inference mode during training (trainable=False, BN009, or "
             "training=False)",
    "torch": "the layer never ran in train mode during training (model.eval() while training, "
             "momentum=0, or the stats were reset afterwards)",
    "onnx": "the statistics were never updated before export",
}
FROZEN_HINT = {
    "tf": "the BN was built with trainable=False in training code (BN001)",
    "keras": "the layer was frozen with trainable=False (BN009)",
    "torch": "its parameters had requires_grad=False or were left out of the optimizer (BN105)",
    "onnx": "its parameters were frozen or never trained before export",
}


def artifact_check(code: str) -> Callable[[ArtifactCheck], ArtifactCheck]:
    def register(fn: ArtifactCheck) -> ArtifactCheck:
        if code in ARTIFACT_CHECKS:
            raise ValueError(f"two artifact checks registered for {code}")
        ARTIFACT_CHECKS[code] = fn
        return fn

    return register


def run_checks(artifact: Artifact, enabled: Iterable[str]) -> list[ArtifactFinding]:
    """Every enabled artifact rule over one artifact, in code order."""
    findings: list[ArtifactFinding] = []
    for code in sorted(set(enabled) & set(ARTIFACT_CHECKS)):
        findings.extend(ARTIFACT_CHECKS[code](artifact))
    return findings


def _stat_names(layer: BNLayer) -> tuple[str, str]:
    return STAT_NAMES.get(layer.framework, ("moving_mean", "moving_variance"))


def _after(artifact: Artifact, layer: BNLayer) -> str:
    if layer.num_batches_tracked:
        return f"after {layer.num_batches_tracked} batches (num_batches_tracked)"
    noun = KIND_NOUNS.get(artifact.kind, artifact.kind)
    return f"in a trained {noun} ({artifact.trained_evidence or 'trained'})"


def _all_equal(value: np.ndarray | None, constant: float) -> bool:
    return value is not None and value.size > 0 and bool(np.all(value == constant))


@artifact_check("BN201")
def stats_never_updated(artifact: Artifact) -> Iterable[ArtifactFinding]:
    if not artifact.trained:
        return
    for layer in artifact.layers:
        if _all_equal(layer.mean, 0.0) and _all_equal(layer.var, 1.0):
            mean, var = _stat_names(layer)
            hint = NOT_UPDATED_HINT.get(layer.framework, NOT_UPDATED_HINT["tf"])
            yield ArtifactFinding("BN201", artifact.path, layer.name,
                                  f"{layer.name}: {mean} is all 0 and {var} all 1 "
                                  f"{_after(artifact, layer)}: {hint}")


@artifact_check("BN202")
def affine_never_trained(artifact: Artifact) -> Iterable[ArtifactFinding]:
    if not artifact.trained:
        return
    for layer in artifact.layers:
        present = [(name, value, init) for name, value, init in
                   (("gamma", layer.gamma, 1.0), ("beta", layer.beta, 0.0)) if value is not None]
        if present and all(_all_equal(value, init) for _, value, init in present):
            what = " and ".join(f"{name} all {init:g}" for name, _, init in present)
            hint = FROZEN_HINT.get(layer.framework, FROZEN_HINT["tf"])
            yield ArtifactFinding("BN202", artifact.path, layer.name,
                                  f"{layer.name}: {what} (their initial values) "
                                  f"{_after(artifact, layer)}: never trained; {hint}")


@artifact_check("BN207")
def degenerate_stats(artifact: Artifact) -> Iterable[ArtifactFinding]:
    for layer in artifact.layers:
        message = degenerate_summary(layer)
        if message:
            yield ArtifactFinding("BN207", artifact.path, layer.name, f"{layer.name}: {message}")


def degenerate_summary(layer: BNLayer) -> str:
    """What is degenerate in one layer's stored values ('' when nothing is)."""
    channels = layer.channels or 0
    mean_name, var_name = _stat_names(layer)
    values = {"gamma": layer.gamma, "beta": layer.beta, mean_name: layer.mean,
              var_name: layer.var}
    parts: list[str] = []
    harmful = False
    bad = {name: ~np.isfinite(v) for name, v in values.items() if v is not None}
    nonfinite = [f"{int(mask.sum())} {name}" for name, mask in bad.items() if mask.any()]
    if nonfinite:
        parts.append(f"non-finite values ({', '.join(nonfinite)})")
        harmful = True
    with np.errstate(invalid="ignore"):
        if layer.var is not None:
            low = layer.var <= 0
            if low.any():
                parts.append(f"{int(low.sum())} of {channels} channels with {var_name} <= 0 "
                             f"(min {np.nanmin(layer.var):.3g})")
                harmful = True
        if layer.gamma is not None:
            dead = np.abs(layer.gamma) < DEAD_GAMMA
            if dead.any():
                parts.append(f"{int(dead.sum())} of {channels} dead channels "
                             f"(|gamma| < {DEAD_GAMMA:g})")
        for name, value in values.items():
            if value is None:
                continue
            size = np.sqrt(np.abs(value)) if name == var_name else np.abs(value)
            big = np.isfinite(size) & (size > EXTREME)
            if big.any():
                parts.append(f"extreme {name} (up to {np.nanmax(np.abs(value[big])):.3g})")
    if not parts:
        return ""
    if harmful:
        advice = ("inference through this layer gives NaN/Inf or garbage: the run diverged or "
                  "the stats were overwritten; restore an earlier checkpoint")
    elif any(p.startswith("extreme") for p in parts):
        advice = "values this large overflow fp16 inference; check the input scaling"
    else:
        advice = "those channels output beta whatever the input: prune them or check gamma's decay"
    return f"{'; '.join(parts)}: {advice}"


def _layer_of(variable: str) -> str:
    """`tower_0/bn/moving_mean` -> `tower_0/bn` (the BN layer a moving variable belongs to)."""
    head, _, leaf = variable.rpartition("/")
    if head and leaf.split(":")[0] in ("moving_mean", "moving_variance", "mean", "variance"):
        return head
    return variable


def _by_layer(variables: Iterable[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for variable in sorted(variables):
        out.setdefault(_layer_of(variable), []).append(variable)
    return out


def _listed(names: list[str], limit: int = 3) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f", … ({len(names)} in all)" if len(names) > limit else "")


@artifact_check("BN203")
def update_ops_unreachable(artifact: Artifact) -> Iterable[ArtifactFinding]:
    graph = artifact.graph
    if graph is None or not graph.train_ops:
        return
    lost = [v for v, ops in graph.update_ops.items() if ops and not graph.reachable_updates.get(v)]
    for layer, variables in _by_layer(lost).items():
        ops = sorted({op for v in variables for op in graph.update_ops[v]})
        yield ArtifactFinding(
            "BN203", artifact.path, layer,
            f"{layer}: its update ops ({_listed(ops)}) are not reachable from the train op "
            f"`{graph.train_ops[0]}`, so {_listed(variables)} never change in training: "
            + _unreachable_cause(graph, layer, ops))


def _unreachable_cause(graph, layer: str, ops: list[str]) -> str:  # type: ignore[no-untyped-def]
    """The advice the graph's evidence points to: a BN built with trainable=False publishes no
    update ops to UPDATE_OPS (BN001: no control dependency would run them); update ops in the
    collection that the train op does not depend on are BN003's missing control dependency."""
    if layer in graph.frozen_layers:
        return ("its gamma/beta are not trainable variables (built with trainable=False), and "
                "such a BN adds no update ops to UPDATE_OPS, so no control dependency on the "
                "collection would run them: build it with trainable=True (BN001)")
    if graph.update_collection and not set(ops) & graph.update_collection:
        return ("they are not in the UPDATE_OPS collection either (a Keras 3 BN in a TF1 graph, "
                "BN011, or updates_collections=None misused): run them with the train op")
    return ("build the train op under tf.control_dependencies(tf.get_collection(UPDATE_OPS)) "
            "(BN003)")


@artifact_check("BN204")
def duplicate_stat_updates(artifact: Artifact) -> Iterable[ArtifactFinding]:
    graph = artifact.graph
    if graph is None:
        return
    doubled = [v for v, ops in graph.reachable_updates.items() if len(ops) > 1]
    for layer, variables in _by_layer(doubled).items():
        ops = sorted({op for v in variables for op in graph.reachable_updates[v]})
        times = max(len(graph.reachable_updates[v]) for v in variables)
        yield ArtifactFinding(
            "BN204", artifact.path, layer,
            f"{layer}: {times} update ops per moving statistic run with the train op "
            f"({_listed(ops)}): the statistics move {times}x per step, one tower overwriting "
            "or adding to another; collect UPDATE_OPS from one tower's name scope (BN002)")


@artifact_check("BN205")
def double_ema_shadow(artifact: Artifact) -> Iterable[ArtifactFinding]:
    shadows: dict[str, list[str]] = {}
    for layer in artifact.layers:
        for role in ("mean_shadow", "var_shadow"):
            if role in layer.keys:
                shadows.setdefault(layer.name, []).append(layer.keys[role])
    if artifact.graph is not None:
        for shadow, variable in artifact.graph.ema_shadows:
            names = shadows.setdefault(_layer_of(variable), [])
            if shadow not in names:
                names.append(shadow)
    for layer, names in sorted(shadows.items()):
        yield ArtifactFinding(
            "BN205", artifact.path, layer,
            f"{layer}: EMA shadow variables of its moving statistics ({_listed(sorted(names))}): "
            "the moving stats are already an average, evaluating with their shadows averages "
            "twice and lags behind the weights; apply the EMA to trainable_variables() only "
            "(BN004)")


@artifact_check("BN206")
def training_mode_in_export(artifact: Artifact) -> Iterable[ArtifactFinding]:
    if artifact.graph is None:
        return
    for node in artifact.graph.training_mode_nodes:
        yield ArtifactFinding(
            "BN206", artifact.path, node,
            f"{node}: BatchNorm normalizes with batch statistics in an inference graph, so "
            "outputs depend on the rest of the batch: export in eval mode (model.eval(), "
            "training=False / is_training=False) or run `bnfix convert --to inference`")


@artifact_check("BN208")
def unfolded_inference_bn(artifact: Artifact) -> Iterable[ArtifactFinding]:
    if artifact.graph is None:
        return
    for producer, node in artifact.graph.unfolded:
        yield ArtifactFinding(
            "BN208", artifact.path, node,
            f"{node}: BatchNorm right after {producer} is not folded in this inference graph: "
            f"fold it into {producer}'s weights and bias (`bnfix convert --to folded`)")
