"""ONNX front-end: reading BN facts, `convert --to inference|folded` on models exported from
torch and built by hand, the checks that guard every write, and external-data confinement."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, run_bnfix

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper

from bnfix.artifacts.model import ArtifactError
from bnfix.convert import ConversionError
from bnfix.onnx import fold
from bnfix.onnx.read import read_onnx
from bnfix.onnx.rewrite import convert_onnx_file

EXPORTER = REPO / "tests" / "programs" / "onnx_export.py"


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    """The torch-exported models (one subprocess: torch is imported there only)."""
    pytest.importorskip("torch")
    out = tmp_path_factory.mktemp("onnx_models")
    proc = subprocess.run([sys.executable, str(EXPORTER), str(out)], capture_output=True,
                          text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def run(path: Path | str, x: np.ndarray, optimize: bool = True) -> np.ndarray:
    options = ort.SessionOptions()
    if not optimize:  # onnxruntime's optimizer fixes a training-mode Dropout's mask
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x})[0]


def bn_nodes(path: Path | str) -> list:
    return [n for n in onnx.load(str(path)).graph.node if n.op_type == "BatchNormalization"]


def test_training_mode_export_is_reported(exported):
    artifact = read_onnx(str(exported / "train_mode.onnx"))
    assert artifact.kind == "onnx" and artifact.graph.inference
    assert artifact.graph.training_mode_nodes == ["/1/BatchNormalization"]
    assert artifact.graph.unfolded == []  # batch-statistics BN cannot be folded
    (layer,) = artifact.layers
    assert layer.flags["training_mode"] and layer.channels == 4
    assert layer.keys["var"] == "1.running_var" and float(layer.var.min()) > 0.1


def test_inference_conversion_matches_the_eval_mode_export(exported, tmp_path):
    out = tmp_path / "inference.onnx"
    summary = convert_onnx_file(str(exported / "train_mode.onnx"), "inference", str(out))
    assert "training_mode=1 -> inference" in summary and "max abs error" in summary
    (node,) = bn_nodes(out)
    assert len(node.output) == 1 and "training_mode" not in [a.name for a in node.attribute]
    x = np.random.default_rng(3).standard_normal((2, 3, 8, 8)).astype(np.float32)
    reference = run(exported / "train_mode_reference.onnx", x)  # torch's own eval export
    np.testing.assert_allclose(run(out, x), reference, atol=1e-5)
    assert np.max(np.abs(run(exported / "train_mode.onnx", x) - reference)) > 1e-2


def test_inference_conversion_also_turns_off_dropout(exported, tmp_path):
    """A training-mode export holds a Dropout with training_mode true: random on every run.
    After --to inference, two runs are identical and equal torch's own eval export."""
    x = np.random.default_rng(5).standard_normal((2, 3, 8, 8)).astype(np.float32)
    source = exported / "dropout_train.onnx"
    assert not np.array_equal(run(source, x, False), run(source, x, False))  # random
    out = tmp_path / "inference.onnx"
    summary = convert_onnx_file(str(source), "inference", str(out))
    assert "Dropout training_mode -> inference (identity)" in summary
    assert "two runs on the same inputs identical" in summary
    dropouts = [n for n in onnx.load(str(out)).graph.node if n.op_type == "Dropout"]
    assert dropouts and all(len(n.input) <= 2 and len(n.output) == 1 for n in dropouts)
    np.testing.assert_array_equal(run(out, x, False), run(out, x, False))
    np.testing.assert_allclose(run(out, x), run(exported / "dropout_reference.onnx", x),
                               atol=1e-5)


def test_inference_refused_when_random_nodes_remain(tmp_path):
    """RandomNormalLike draws whatever the mode: no inference model can be made of it."""
    model = gemm_bn_model(1, training=True)
    graph = model.graph
    graph.node.append(helper.make_node("RandomNormalLike", ["y"], ["noise"], name="noise"))
    graph.node.append(helper.make_node("Add", ["y", "noise"], ["z"]))
    graph.output[0].CopyFrom(helper.make_tensor_value_info("z", TensorProto.FLOAT, [4, 3]))
    src, out = tmp_path / "random.onnx", tmp_path / "out.onnx"
    onnx.save(model, src)
    with pytest.raises(ConversionError, match=r"draws random numbers in noise \(RandomNormalLike\)"):
        convert_onnx_file(str(src), "inference", str(out))
    assert not out.exists()


@pytest.mark.parametrize("name, producer", [("grouped_conv.onnx", "Conv, group=2"),
                                            ("conv_transpose.onnx", "ConvTranspose, group=2"),
                                            ("linear.onnx", "Gemm, transB=1")])
def test_fold_torch_exports(exported, tmp_path, name, producer):
    out = tmp_path / name
    summary = convert_onnx_file(str(exported / name), "folded", str(out))
    assert f"({producer})" in summary
    assert bn_nodes(out) == []
    shape = {"grouped_conv.onnx": (2, 4, 8, 8), "conv_transpose.onnx": (2, 4, 5, 5),
             "linear.onnx": (4, 5)}[name]
    x = np.random.default_rng(7).standard_normal(shape).astype(np.float32)
    np.testing.assert_allclose(run(out, x), run(exported / name, x), atol=1e-5)


def test_cli_folds_and_refuses(exported, tmp_path):
    out = tmp_path / "out.onnx"
    ok = run_bnfix("convert", str(exported / "grouped_conv.onnx"), "--to", "folded",
                   "-o", str(out))
    assert ok.returncode == 0, ok.stderr
    assert "folded /1/BatchNormalization" in ok.stdout and "max abs error" in ok.stdout
    assert bn_nodes(out) == []
    # an already-inference model: nothing to convert, exit 1, nothing written
    refused = tmp_path / "refused.onnx"
    bad = run_bnfix("convert", str(out), "--to", "inference", "-o", str(refused))
    assert bad.returncode == 1 and "nothing written" in bad.stderr
    assert not refused.exists()


# -- hand-built models ------------------------------------------------------------------------


def bn_params(prefix: str, c: int, rng) -> list:
    values = [rng.uniform(0.5, 1.5, c), rng.standard_normal(c), rng.standard_normal(c),
              rng.uniform(0.1, 2.0, c)]
    return [numpy_helper.from_array(v.astype(np.float32), f"{prefix}_{role}")
            for v, role in zip(values, ("scale", "B", "mean", "var"))]


def gemm_bn_model(trans_b: int, extra_reader: bool = False, training: bool = False):
    """x[4,5] -> Gemm(alpha=0.7, beta=0.5, C) -> BN(3) -> y; optionally the Gemm output is also
    a graph output (so the fold is invalid)."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((3, 5) if trans_b else (5, 3)).astype(np.float32)
    inits = [numpy_helper.from_array(w, "W"),
             numpy_helper.from_array(rng.standard_normal(3).astype(np.float32), "C"),
             *bn_params("bn", 3, rng)]
    bn_attrs = {"epsilon": 1e-3, "momentum": 0.9}
    bn_outputs = ["y"]
    if training:
        bn_attrs["training_mode"] = 1
        bn_outputs = ["y", "running_mean", "running_var"]
    nodes = [helper.make_node("Gemm", ["x", "W", "C"], ["g"], name="gemm", alpha=0.7, beta=0.5,
                              transB=trans_b),
             helper.make_node("BatchNormalization", ["g", "bn_scale", "bn_B", "bn_mean",
                                                     "bn_var"], bn_outputs, name="bn", **bn_attrs)]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 3])]
    if extra_reader:
        outputs.append(helper.make_tensor_value_info("g", TensorProto.FLOAT, [4, 3]))
    if training and extra_reader:
        outputs.append(helper.make_tensor_value_info("running_mean", TensorProto.FLOAT, [3]))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [4, 5])], outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])


@pytest.mark.parametrize("trans_b", [0, 1])
def test_fold_gemm_with_alpha_beta_and_bias(tmp_path, trans_b):
    src, out = tmp_path / "gemm.onnx", tmp_path / "folded.onnx"
    onnx.save(gemm_bn_model(trans_b), src)
    assert read_onnx(str(src)).graph.unfolded == [("gemm", "bn")]
    summary = convert_onnx_file(str(src), "folded", str(out))
    assert f"into gemm (Gemm, transB={trans_b})" in summary
    x = np.random.default_rng(1).standard_normal((4, 5)).astype(np.float32)
    np.testing.assert_allclose(run(out, x), run(src, x), atol=1e-5)


def test_fold_refused_when_the_producer_output_is_read_elsewhere(tmp_path):
    src, out = tmp_path / "shared.onnx", tmp_path / "out.onnx"
    onnx.save(gemm_bn_model(1, extra_reader=True), src)
    assert read_onnx(str(src)).graph.unfolded == []
    with pytest.raises(ConversionError, match="gemm's output is used by other nodes too"):
        convert_onnx_file(str(src), "folded", str(out))
    assert not out.exists()


def test_inference_refused_when_running_stats_are_read(tmp_path):
    src, out = tmp_path / "train.onnx", tmp_path / "out.onnx"
    onnx.save(gemm_bn_model(1, extra_reader=True, training=True), src)
    with pytest.raises(ConversionError, match="running-statistics outputs"):
        convert_onnx_file(str(src), "inference", str(out))
    assert not out.exists()


def test_failed_check_writes_nothing(tmp_path, monkeypatch):
    src, out = tmp_path / "gemm.onnx", tmp_path / "out.onnx"
    onnx.save(gemm_bn_model(1), src)
    with pytest.raises(ConversionError, match=r"max abs error .* > 0 on 4 random inputs"):
        convert_onnx_file(str(src), "folded", str(out), tolerance=0.0)
    assert not out.exists()
    # a wrong fold (the BN shift forgotten) is caught by the onnxruntime comparison
    real = fold.folded_weights
    monkeypatch.setattr(fold, "folded_weights",
                        lambda plan: (real(plan)[0], real(plan)[1] - plan.shift.astype("f4")))
    with pytest.raises(ConversionError, match="does not match its reference"):
        convert_onnx_file(str(src), "folded", str(out))
    assert not out.exists() and sorted(os.listdir(tmp_path)) == ["gemm.onnx"]


# -- files: external data, corruption ----------------------------------------------------------


def save_external(model, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "model.onnx"
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="weights.bin", size_threshold=0)
    return path


def relocate(path: Path, location: str) -> None:
    model = onnx.load(str(path), load_external_data=False)
    for tensor in model.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = location
    onnx.save_model(model, str(path))


def test_external_data_inside_the_folder_is_loaded(tmp_path):
    path = save_external(gemm_bn_model(1), tmp_path / "m")
    (layer,) = read_onnx(str(path)).layers
    assert layer.var is not None and layer.var.shape == (3,)
    out = tmp_path / "m" / "folded.onnx"
    convert_onnx_file(str(path), "folded", str(out))
    assert bn_nodes(out) == []


@pytest.mark.parametrize("kind", ["parent", "absolute", "symlink"])
def test_external_data_outside_the_folder_is_refused(tmp_path, kind):
    path = save_external(gemm_bn_model(1), tmp_path / "m")
    secret = tmp_path / "secret.bin"
    secret.write_bytes((tmp_path / "m" / "weights.bin").read_bytes())
    if kind == "parent":
        relocate(path, "../secret.bin")
    elif kind == "absolute":
        relocate(path, str(secret))
    else:
        (tmp_path / "m" / "link.bin").symlink_to(secret)
        relocate(path, "link.bin")
    with pytest.raises(ArtifactError, match="refusing external data"):
        read_onnx(str(path))
    with pytest.raises(ConversionError, match="refusing external data"):
        convert_onnx_file(str(path), "folded", str(tmp_path / "out.onnx"))


def test_truncated_model_is_one_clear_error(tmp_path):
    data = gemm_bn_model(1).SerializeToString()
    path = tmp_path / "cut.onnx"
    path.write_bytes(data[: len(data) // 3])
    with pytest.raises(ArtifactError, match=r"cannot parse .*cut\.onnx as an ONNX model"):
        read_onnx(str(path))
