"""`bnfix convert MODEL.onnx --to inference|folded -o OUT`: rewrite, verify, then write.

Nothing is written unless the rewritten model passes `onnx.checker` and matches its reference
under onnxruntime (see `bnfix.onnx.verify` for what each target is compared with); the output
is written atomically (`bnfix.convert.atomic_output`: a temporary file in the output's folder,
then `os.replace`; the umask's mode for a new file, the replaced file's own mode otherwise).
"""

from __future__ import annotations

import os
from typing import Any

from bnfix.artifacts.model import ArtifactError
from bnfix.convert import ConversionError, atomic_output
from bnfix.onnx import fold, inference, verify
from bnfix.onnx.external_data import load_model
from bnfix.onnx.graph import GraphView, node_label


def _bn_count(model: Any) -> int:
    return sum(n.op_type == "BatchNormalization" for n in model.graph.node)


def _to_inference(model: Any, original: Any) -> tuple[list[str], Any]:
    if not inference.has_training_behaviour(model.graph):
        raise ConversionError("no BatchNormalization with training_mode=1 and no training-mode "
                              "Dropout: already an inference model, nothing written")
    try:
        lines = inference.strip_training_mode(model)
        reference = verify.running_stats_reference(original)
    except ValueError as exc:
        raise ConversionError(f"refused: {exc}") from None
    random = inference.random_nodes(model.graph)
    if random:
        names = ", ".join(f"{node_label(n)} ({n.op_type})" for n in random[:3])
        raise ConversionError(f"refused: the model draws random numbers in {names}, so its "
                              "outputs would still vary from run to run; nothing written")
    return lines, reference


def _to_folded(model: Any, original: Any) -> tuple[list[str], Any]:
    view = GraphView.build(model.graph)
    plans, kept = [], []
    for node in [n for n in model.graph.node if n.op_type == "BatchNormalization"]:
        plan = fold.why_not_foldable(view, node)
        if isinstance(plan, str):
            kept.append(f"kept {node_label(node)}: {plan}")
        else:
            plans.append(plan)
    if not plans:
        reasons = "; ".join(kept) or "the model has no BatchNormalization node"
        raise ConversionError(f"nothing to fold ({reasons}), nothing written")
    lines = []
    for plan in plans:
        weight, bias = fold.folded_weights(plan)
        fold.apply_fold(model, plan, weight, bias)
        lines.append(plan.describe())
    fold.remove_unused(model)
    return lines + kept, original


def _write_atomically(model: Any, output: str) -> None:
    with atomic_output(output) as temporary, temporary.open("wb") as f:
        f.write(model.SerializeToString())
        f.flush()
        os.fsync(f.fileno())


def convert_onnx_file(path: str, to: str, output: str, *, tolerance: float | None = None,
                      samples: int = 4, seed: int = 0) -> str:
    """Rewrite PATH's BN nodes to TO ("inference" or "folded"), check, write OUTPUT; return the
    printed summary. `tolerance` overrides the default max-abs-error bound
    (1e-5 + 1e-5 * max |reference output|). Raises ConversionError, writing nothing."""
    import onnx

    if to not in ("inference", "folded"):
        raise ConversionError(f"unknown ONNX target {to!r} (use inference or folded)")
    try:
        model = load_model(path)
    except ArtifactError as exc:
        raise ConversionError(str(exc)) from None
    original = onnx.ModelProto()
    original.CopyFrom(model)
    before = _bn_count(model)
    lines, reference = (_to_inference if to == "inference" else _to_folded)(model, original)
    try:
        verify.check(model)
    except onnx.checker.ValidationError as exc:
        first = str(exc).strip().splitlines()[0]
        raise ConversionError(f"the rewritten model fails onnx.checker ({first}); "
                              "nothing written") from None
    varying = verify.nondeterministic(model, seed)
    if varying:
        raise ConversionError(f"the rewritten model's outputs vary from run to run ({varying}): "
                              "not an inference model; nothing written")
    comparison = verify.compare(reference, model, tolerance, samples, seed)
    if not comparison.ok:
        raise ConversionError(f"the rewritten model does not match its reference: "
                              f"{comparison.describe()}; nothing written")
    _write_atomically(model, output)
    reference_name = "the original" if to == "folded" else \
        "BN on the stored running statistics"
    summary = [*lines,
               (f"checked: onnx.checker ok; two runs on the same inputs identical; onnxruntime "
                f"vs {reference_name}: {comparison.describe()}"),
               f"wrote {output} (BatchNormalization nodes: {before} -> {_bn_count(model)})"]
    return "\n".join(summary) + "\n"
