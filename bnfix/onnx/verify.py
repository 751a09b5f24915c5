"""Checks a rewritten model passes before it is written: `onnx.checker`, then onnxruntime on
seeded random inputs, rewritten vs a reference, within a tolerance that is reported.

What "equal" means per target:
- folded: the original model itself (same graph semantics, BN kept) -- folding only moves
  arithmetic, so outputs agree to float rounding;
- inference: the original with every training-mode BN replaced by explicit arithmetic on its
  *stored* running statistics, (x - mean) / sqrt(var + eps) * scale + B, and every
  training-mode Dropout by the identity. The original itself would not do: it normalizes with
  batch statistics and drops random units, the behaviour being removed.
A comparison with a random model proves nothing (two runs of it differ), so before comparing,
the rewritten model is run twice on the same inputs, graph optimizations off, and must give
bit-identical outputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from bnfix.onnx.graph import GraphView, attr

ATOL = 1e-5
RTOL = 1e-5


@dataclass
class Comparison:
    max_abs_error: float
    tolerance: float
    samples: int
    seed: int

    @property
    def ok(self) -> bool:
        return bool(np.isfinite(self.max_abs_error)) and self.max_abs_error <= self.tolerance

    def describe(self) -> str:
        sign = "≤" if self.ok else ">"
        return (f"max abs error {self.max_abs_error:.2g} {sign} {self.tolerance:.2g} on "
                f"{self.samples} random inputs (seed {self.seed})")


def random_feeds(model: Any, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """One random value per graph input (initializers excluded; symbolic dims set to 2)."""
    from onnx import helper

    initializers = {t.name for t in model.graph.initializer}
    feeds = {}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        tensor_type = value.type.tensor_type
        dtype = helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)
        shape = [d.dim_value if d.HasField("dim_value") else 2 for d in tensor_type.shape.dim]
        if np.issubdtype(dtype, np.floating):
            feeds[value.name] = rng.standard_normal(shape).astype(dtype)
        else:
            feeds[value.name] = np.zeros(shape, dtype=dtype)
    return feeds


def _session(model: Any, optimize: bool = True) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    if not optimize:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"])


def compare(reference: Any, rewritten: Any, tolerance: float | None = None, samples: int = 4,
            seed: int = 0) -> Comparison:
    """Run both models on the same seeded random inputs; the largest output difference."""
    ref_session, new_session = _session(reference), _session(rewritten)
    names = [o.name for o in rewritten.graph.output]
    rng = np.random.default_rng(seed)
    worst, scale = 0.0, 0.0
    for _ in range(samples):
        feeds = random_feeds(rewritten, rng)
        expected = dict(zip([o.name for o in ref_session.get_outputs()],
                            ref_session.run(None, feeds)))
        got = new_session.run(names, feeds)
        for name, value in zip(names, got):
            ref = np.asarray(expected[name], dtype=np.float64)
            diff = np.abs(np.asarray(value, dtype=np.float64) - ref)
            worst = max(worst, float(np.max(diff)) if diff.size else 0.0)
            if not np.all(np.isfinite(diff)):
                worst = float("inf")
            scale = max(scale, float(np.max(np.abs(ref))) if ref.size else 0.0)
    limit = tolerance if tolerance is not None else ATOL + RTOL * scale
    return Comparison(worst, limit, samples, seed)


def nondeterministic(model: Any, seed: int = 0) -> str:
    """'' when two runs of `model` on the same inputs give identical outputs, else which output
    differs and by how much. Graph optimizations are off: onnxruntime's optimizer turns a
    training-mode Dropout into one fixed mask, which would pass for deterministic."""
    session = _session(model, optimize=False)
    feeds = random_feeds(model, np.random.default_rng(seed))
    first, second = session.run(None, feeds), session.run(None, feeds)
    for out, a, b in zip(session.get_outputs(), first, second):
        a64, b64 = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
        if not np.array_equal(a64, b64, equal_nan=True):
            return f"output {out.name!r} differs by up to {float(np.nanmax(np.abs(a64 - b64))):.3g}"
    return ""


def check(model: Any) -> None:
    """onnx.checker on the rewritten model (raises onnx.checker.ValidationError)."""
    import onnx

    onnx.checker.check_model(model)


def running_stats_reference(original: Any) -> Any:
    """The original with each training-mode BN spelled out with its stored statistics
    (see the module docstring). ValueError when a BN input's rank is unknown."""
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.ModelProto()
    model.CopyFrom(original)
    inferred = onnx.shape_inference.infer_shapes(model)
    ranks = {v.name: len(v.type.tensor_type.shape.dim)
             for v in [*inferred.graph.value_info, *inferred.graph.input]
             if v.type.tensor_type.HasField("shape")}
    from bnfix.onnx.inference import training_dropouts

    view = GraphView.build(model.graph)
    dropouts = {tuple(n.output) for n in training_dropouts(model.graph)}
    nodes = list(model.graph.node)
    del model.graph.node[:]
    for node in nodes:
        if tuple(node.output) in dropouts:  # inference-mode Dropout: the identity
            model.graph.node.append(helper.make_node("Identity", [node.input[0]],
                                                     [node.output[0]]))
            continue
        if node.op_type != "BatchNormalization" or not attr(node, "training_mode", 0):
            model.graph.node.append(node)
            continue
        x = node.input[0]
        if x not in ranks:
            raise ValueError(f"the rank of {x!r} (input of {node.name or node.output[0]}) is "
                             "unknown, so the result cannot be checked")
        values = [view.constant(name) for name in node.input[1:5]]
        if any(v is None for v in values):
            raise ValueError(f"{node.name or node.output[0]}: scale/B/mean/var not constant")
        gamma, beta, mean, var = (np.asarray(v, dtype=np.float64) for v in values)
        shape = (-1,) + (1,) * (ranks[x] - 2)
        dtype = values[0].dtype
        tag = (node.name or node.output[0]).replace("/", "_")
        consts = {"mean": mean, "den": np.sqrt(var + attr(node, "epsilon", 1e-5)),
                  "scale": gamma, "shift": beta}
        for key, value in consts.items():
            model.graph.initializer.append(
                numpy_helper.from_array(value.reshape(shape).astype(dtype), f"{tag}_ref_{key}"))
        model.graph.node.extend([
            helper.make_node("Sub", [x, f"{tag}_ref_mean"], [f"{tag}_ref_centered"]),
            helper.make_node("Div", [f"{tag}_ref_centered", f"{tag}_ref_den"],
                             [f"{tag}_ref_normed"]),
            helper.make_node("Mul", [f"{tag}_ref_normed", f"{tag}_ref_scale"],
                             [f"{tag}_ref_scaled"]),
            helper.make_node("Add", [f"{tag}_ref_scaled", f"{tag}_ref_shift"], [node.output[0]]),
        ])
    return model
