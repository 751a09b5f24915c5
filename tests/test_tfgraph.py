"""TF graph front-end on hand-built graphs: one small GraphDef / MetaGraphDef per fact, parsed
from disk by `read_tf_graph` exactly as `bnfix inspect` reads a user's file."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tensorflow")
pytestmark = pytest.mark.tf

from google.protobuf import text_format
from tensorflow.core.framework import graph_pb2, variable_pb2
from tensorflow.core.protobuf import meta_graph_pb2

from bnfix.artifacts.model import ArtifactError
from bnfix.tfgraph.read import read_tf_graph


def add(graph, name: str, op: str, inputs=(), **attrs):
    nodes = graph.node_def if hasattr(graph, "node_def") else graph.node  # FunctionDef bodies
    node = nodes.add(name=name, op=op, input=list(inputs))
    for key, value in attrs.items():
        if isinstance(value, bool):
            node.attr[key].b = value
        elif isinstance(value, float):
            node.attr[key].f = value
        elif isinstance(value, np.ndarray):
            tensor = node.attr[key].tensor
            tensor.dtype = 1
            tensor.tensor_shape.dim.add(size=value.size)
            tensor.tensor_content = value.astype(np.float32).tobytes()
        else:
            node.attr[key].func.name = value
    return node


def bn_variables(graph, prefix: str, resource: bool = False) -> None:
    op = "VarHandleOp" if resource else "VariableV2"
    for role in ("gamma", "beta", "moving_mean", "moving_variance"):
        add(graph, f"{prefix}/{role}", op)
        add(graph, f"{prefix}/{role}/Initializer/zeros", "Const")
        add(graph, f"{prefix}/{role}/Assign", "Assign",
            [f"{prefix}/{role}", f"{prefix}/{role}/Initializer/zeros"])
        add(graph, f"{prefix}/{role}/read", "ReadVariableOp" if resource else "Identity",
            [f"{prefix}/{role}"])


def tower_updates(graph, prefix: str, tower: str, resource: bool = False) -> list[str]:
    """One tower's moving-average updates of `prefix`'s statistics (as TF1 BN builds them)."""
    names = []
    for i, role in enumerate(("moving_mean", "moving_variance")):
        name = f"{tower}/{prefix}/AssignMovingAvg{'_1' if i else ''}"
        add(graph, f"{name}/mul", "Mul")
        if resource:
            add(graph, f"{name}/handle", "Identity", [f"{prefix}/{role}"])
            add(graph, name, "AssignSubVariableOp", [f"{name}/handle", f"{name}/mul"])
        else:
            add(graph, name, "AssignSub", [f"{prefix}/{role}", f"{name}/mul"])
        names.append(name)
    return names


def training_graph(towers: int, wired: list[str], train_op_collection: bool,
                   resource: bool = False) -> meta_graph_pb2.MetaGraphDef:
    """BN `bn` shared by `towers` towers; the apply op control-depends on the `wired` ops."""
    meta = meta_graph_pb2.MetaGraphDef()
    g = meta.graph_def
    bn_variables(g, "bn", resource)
    updates = [op for t in range(towers) for op in tower_updates(g, "bn", f"tower_{t}", resource)]
    add(g, "w", "VariableV2")
    add(g, "grad", "Const")
    add(g, "GradientDescent/update_w", "ApplyGradientDescent",
        ["w", "lr", "grad", *[f"^{op}" for op in wired]])
    add(g, "global_step", "VariableV2")
    add(g, "GradientDescent", "AssignAdd", ["global_step", "one", "^GradientDescent/update_w"])
    add(g, "group_deps", "NoOp", ["^GradientDescent"])
    if train_op_collection:
        meta.collection_def["train_op"].node_list.value.append("GradientDescent")
    meta.collection_def["update_ops"].node_list.value.extend(updates)
    var = variable_pb2.VariableDef(variable_name="bn/moving_mean:0",
                                   initializer_name="bn/moving_mean/Assign")
    meta.collection_def["variables"].bytes_list.value.append(var.SerializeToString())
    return meta


def write(tmp_path: Path, name: str, message) -> str:
    path = tmp_path / name
    if name.endswith(".pbtxt"):
        path.write_text(text_format.MessageToString(message))
    else:
        path.write_bytes(message.SerializeToString())
    return str(path)


def test_updates_outside_the_train_op_closure_are_unreachable(tmp_path):
    artifact = read_tf_graph(write(tmp_path, "m.meta", training_graph(1, [], True)))
    g = artifact.graph
    assert artifact.kind == "tf-metagraph" and not g.inference
    assert g.train_ops == ["group_deps"]  # the collection's op, widened to its group
    assert g.update_ops == {"bn/moving_mean": ["tower_0/bn/AssignMovingAvg"],
                            "bn/moving_variance": ["tower_0/bn/AssignMovingAvg_1"]}
    assert g.reachable_updates == {"bn/moving_mean": [], "bn/moving_variance": []}
    assert [layer.name for layer in artifact.layers] == ["bn"]


def test_updates_wired_by_control_dependencies_are_reachable(tmp_path):
    meta = training_graph(1, ["tower_0/bn/AssignMovingAvg", "tower_0/bn/AssignMovingAvg_1"],
                          True)
    g = read_tf_graph(write(tmp_path, "m.meta", meta)).graph
    assert g.reachable_updates == g.update_ops


@pytest.mark.parametrize("resource", [False, True])
def test_every_tower_wired_gives_several_reachable_updates_per_variable(tmp_path, resource):
    wired = [f"tower_{t}/bn/AssignMovingAvg{s}" for t in (0, 1) for s in ("", "_1")]
    # no train_op collection: the apply ops and their bundling group are found instead
    artifact = read_tf_graph(write(tmp_path, "m.meta", training_graph(2, wired, False, resource)))
    g = artifact.graph
    assert g.train_ops == ["group_deps"]
    assert g.reachable_updates["bn/moving_mean"] == ["tower_0/bn/AssignMovingAvg",
                                                     "tower_1/bn/AssignMovingAvg"]
    assert len(g.reachable_updates["bn/moving_variance"]) == 2
    assert artifact.distributed


def test_initializers_and_checkpoint_restores_are_not_updates(tmp_path):
    meta = training_graph(1, [], True)
    g = meta.graph_def
    add(g, "save/RestoreV2", "RestoreV2")
    add(g, "save/Assign_3", "Assign", ["bn/moving_variance", "save/RestoreV2:3"])
    add(g, "bn/moving_mean/ExponentialMovingAverage", "VariableV2")
    add(g, "ExponentialMovingAverage/AssignMovingAvg", "AssignSub",
        ["bn/moving_mean/ExponentialMovingAverage", "ema/mul"])
    facts = read_tf_graph(write(tmp_path, "m.meta", meta)).graph
    assert facts.update_ops["bn/moving_variance"] == ["tower_0/bn/AssignMovingAvg_1"]
    assert facts.ema_shadows == [("bn/moving_mean/ExponentialMovingAverage", "bn/moving_mean")]


def test_layernorm_gamma_beta_alone_is_not_a_bn_layer(tmp_path):
    graph = graph_pb2.GraphDef()
    add(graph, "LayerNorm/gamma", "VariableV2")
    add(graph, "LayerNorm/beta", "VariableV2")
    assert read_tf_graph(write(tmp_path, "g.pb", graph)).layers == []


def inference_graph(training: bool, conv_consumers: int = 1) -> graph_pb2.GraphDef:
    graph = graph_pb2.GraphDef()
    add(graph, "images", "Placeholder")
    add(graph, "conv/kernel", "Const")
    add(graph, "conv/Conv2D", "Conv2D", ["images", "conv/kernel"])
    add(graph, "conv/BiasAdd", "BiasAdd", ["conv/Conv2D", "conv/bias"])
    for i in range(conv_consumers - 1):
        add(graph, f"probe_{i}", "Identity", ["conv/Conv2D"])
    params = {"gamma": [1.5, 0.5], "beta": [0.1, 0.2], "moving_mean": [0.0, 1.0],
              "moving_variance": [1.0, 4.0]}
    for role, value in params.items():
        add(graph, f"bn/{role}", "Const", value=np.array(value))
        add(graph, f"bn/{role}/read", "Identity", [f"bn/{role}"])
    add(graph, "bn/FusedBatchNormV3", "FusedBatchNormV3",
        ["conv/BiasAdd", *[f"bn/{role}/read" for role in params]],
        is_training=training, epsilon=0.001)
    return graph


def test_frozen_graph_with_training_mode_bn(tmp_path):
    artifact = read_tf_graph(write(tmp_path, "frozen.pbtxt", inference_graph(True)))
    g = artifact.graph
    assert artifact.kind == "tf-graphdef" and g.inference and g.train_ops == []
    assert g.training_mode_nodes == ["bn/FusedBatchNormV3"]
    assert g.unfolded == []  # a batch-statistics BN cannot be folded
    (layer,) = artifact.layers
    np.testing.assert_array_equal(layer.var, [1.0, 4.0])
    assert layer.flags["training_mode"] is True


def test_conv_bias_bn_not_folded_in_an_inference_graph(tmp_path):
    g = read_tf_graph(write(tmp_path, "frozen.pb", inference_graph(False))).graph
    assert g.training_mode_nodes == []
    assert g.unfolded == [("conv/Conv2D", "bn/FusedBatchNormV3")]
    shared = read_tf_graph(write(tmp_path, "shared.pb", inference_graph(False, 2))).graph
    assert shared.unfolded == []  # the conv output is used elsewhere too: no fold


def test_serving_function_bodies_are_inspected(tmp_path):
    """TF2 SavedModels keep the network in library functions called from the serving graph;
    functions nothing calls (Keras' training traces) are not part of the export."""
    meta = meta_graph_pb2.MetaGraphDef()
    meta.meta_info_def.tags.append("serve")
    add(meta.graph_def, "serving", "StatefulPartitionedCall", ["images"], f="serve_fn")
    for name, training in (("serve_fn", False), ("train_trace", True)):
        fn = meta.graph_def.library.function.add()
        fn.signature.name = name
        add(fn, "conv", "Conv2D", ["images", "kernel"])
        add(fn, "bn", "FusedBatchNormV3", ["conv:output:0", "g", "b", "m", "v"],
            is_training=training)
    saved = tmp_path / "sm"
    saved.mkdir()
    from tensorflow.core.protobuf import saved_model_pb2

    model = saved_model_pb2.SavedModel(saved_model_schema_version=1)
    model.meta_graphs.append(meta)
    (saved / "saved_model.pb").write_bytes(model.SerializeToString())
    artifact = read_tf_graph(str(saved))
    assert artifact.kind == "tf-saved-model" and artifact.graph.inference
    assert artifact.graph.unfolded == [("serve_fn/conv", "serve_fn/bn")]
    assert artifact.graph.training_mode_nodes == []


@pytest.mark.parametrize("name", ["model.meta", "graph.pb"])
def test_truncated_file_is_one_clear_error(tmp_path, name):
    data = training_graph(1, [], True).SerializeToString()
    path = tmp_path / name
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ArtifactError) as err:
        read_tf_graph(str(path))
    what = "MetaGraphDef" if name.endswith(".meta") else "GraphDef"
    assert str(err.value).startswith(f"cannot parse {path} as a {what}: ")
    assert "\n" not in str(err.value)


def test_garbage_text_graph_and_empty_folder(tmp_path):
    (tmp_path / "g.pbtxt").write_text("node { name: 'a' op: \n")
    with pytest.raises(ArtifactError, match="as a GraphDef"):
        read_tf_graph(str(tmp_path / "g.pbtxt"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ArtifactError, match="not a SavedModel"):
        read_tf_graph(str(tmp_path / "empty"))


def test_large_graph_reads_fast(tmp_path):
    """100k nodes in one dependency chain (deeper than any recursion limit), the BN update at
    its far end: one index pass plus one iterative walk."""
    meta = training_graph(1, [], True)
    g = meta.graph_def
    previous = "tower_0/bn/AssignMovingAvg"
    for i in range(100_000):
        add(g, f"chain/n{i}", "NoOp", [f"^{previous}"])
        previous = f"chain/n{i}"
    add(g, "GradientDescent/update_w2", "ApplyGradientDescent", ["w", "lr", "grad",
                                                                 f"^{previous}"])
    g.node[[n.name for n in g.node].index("GradientDescent")].input.append(
        "^GradientDescent/update_w2")
    path = write(tmp_path, "big.meta", meta)
    start = time.perf_counter()
    facts = read_tf_graph(path).graph
    elapsed = time.perf_counter() - start
    print(f"100k-node graph read in {elapsed:.2f} s")
    assert facts.reachable_updates["bn/moving_mean"] == ["tower_0/bn/AssignMovingAvg"]
    assert elapsed < 5.0
