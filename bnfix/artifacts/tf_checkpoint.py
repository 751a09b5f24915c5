"""TensorFlow checkpoints (`PREFIX.index` + `PREFIX.data-*`), TF1 name-based and TF2 object-based.

Read with `tf.train.load_checkpoint`, which reads tensors and runs nothing from the file.
Training evidence: a positive `global_step` / optimizer iteration count, or optimizer slot
variables (Momentum, Adam) that are no longer zero — the smallest slots first, up to 4M values: a
slot is as large as its variable, and reading all of them to learn one bit would read the model
twice.
Every tensor's declared shape is checked against the budget before it is read
(`bnfix.artifacts.limits`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bnfix.artifacts.grouping import TF2_SLOT, ShapeOf, build_layers, clean_name, group_keys
from bnfix.artifacts.limits import check_elements
from bnfix.artifacts.model import Artifact, ArtifactError, short_reason

STEP_NAMES = ("global_step", "iter", "iterations", "_iterations")  # TF1, then optimizer counters
OBJECT_GRAPH = "_CHECKPOINTABLE_OBJECT_GRAPH"
SLOT = re.compile(r"/(Momentum|Adam|Adam_1|RMSProp|RMSProp_1|Adagrad|Ftrl|Ftrl_1)$")
DATA_SUFFIX = re.compile(r"\.data-\d{5}-of-\d{5}$")
SLOT_VALUES_READ = 1 << 22  # optimizer slot values read for training evidence, smallest first


def checkpoint_prefix(path: str) -> str | None:
    """The checkpoint prefix a path names (`x.index`, `x.data-00000-of-00001`, `x` itself when
    `x.index` exists, or a folder with a `checkpoint` state file), or None."""
    if path.endswith(".index"):
        return path[: -len(".index")]
    if DATA_SUFFIX.search(path):
        return DATA_SUFFIX.sub("", path)
    if os.path.isfile(path + ".index"):
        return path
    state = Path(path) / "checkpoint"
    if state.is_file():
        match = re.search(r'^model_checkpoint_path:\s*"(.+)"', state.read_text(errors="replace"),
                          re.MULTILINE)
        if match:
            prefix = Path(match.group(1))
            return str(prefix if prefix.is_absolute() else Path(path) / prefix)
    return None


def read_tf_checkpoint(path: str) -> Artifact:
    prefix = checkpoint_prefix(path) or path
    if not os.path.isfile(prefix + ".index"):
        raise ArtifactError(f"no checkpoint index `{prefix}.index`")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    try:
        reader = tf.train.load_checkpoint(prefix)
        shapes = reader.get_variable_to_shape_map()
    except (tf.errors.OpError, ValueError) as exc:
        raise ArtifactError(f"unreadable TF checkpoint: {short_reason(exc)}") from exc
    fetch, shape_of = tensor_access(reader)
    artifact = Artifact(path=prefix, kind="tf-checkpoint")
    keys = sorted(k for k in shapes if k != OBJECT_GRAPH)
    names: dict[str, str] = {}
    if OBJECT_GRAPH in shapes:
        artifact.kind = "tf2-checkpoint"
        full_names = _full_names(reader.get_tensor(OBJECT_GRAPH))
    groups = group_keys(keys)
    for group in groups if OBJECT_GRAPH in shapes else ():
        # `model/layer_with_weights-1/moving_mean` was created as `bn/moving_mean`
        full = full_names.get(group.keys["mean"], "")
        if "/" in full:
            names[group.name] = full.rpartition("/")[0]
    artifact.layers = build_layers(groups, fetch, "tf", names, shape_of=shape_of)
    evidence = training_evidence(reader)
    if evidence is not None:
        artifact.trained, artifact.trained_evidence = evidence
    return artifact


def tensor_access(reader: Any) -> tuple[Callable[[str], np.ndarray], ShapeOf]:
    """(fetch, shape_of) over a CheckpointReader: `fetch` checks the declared size first."""
    import tensorflow as tf

    shapes = reader.get_variable_to_shape_map()
    dtypes = reader.get_variable_to_dtype_map()

    def shape_of(key: str) -> tuple[tuple[int, ...], int]:
        dtype = dtypes.get(key)
        width = dtype.size if dtype is not None and dtype.size else 8
        return tuple(int(d) for d in shapes.get(key, ())), width

    def fetch(key: str) -> np.ndarray:
        shape, width = shape_of(key)
        check_elements(f"`{key}`", int(np.prod(shape, dtype=np.int64)), width)
        try:
            return np.asarray(reader.get_tensor(key))
        except (tf.errors.OpError, ValueError) as exc:
            raise ArtifactError(f"unreadable tensor `{key}`: {short_reason(exc)}") from exc

    return fetch, shape_of


def training_evidence(reader: Any) -> tuple[bool, str] | None:
    """(trained, evidence) from a checkpoint's step counters and optimizer slots; None when
    it holds neither."""
    fetch, shape_of = tensor_access(reader)
    keys = sorted(k for k in reader.get_variable_to_shape_map() if k != OBJECT_GRAPH)
    found: tuple[bool, str] | None = None
    for key in keys:
        name = clean_name(key)
        if _is_step(name) and shape_of(key)[0] in ((), (1,)):
            value = fetch(key)
            if np.issubdtype(value.dtype, np.number):
                steps = int(value.reshape(()))
                found = (steps > 0, f"{name} = {steps}")
                if steps > 0:
                    return found
    slots = [k for k in keys if TF2_SLOT in k or SLOT.search(clean_name(k))]
    sizes = {k: int(np.prod(shape_of(k)[0], dtype=np.int64)) for k in slots}
    read = 0
    for key in sorted(slots, key=sizes.__getitem__):
        read += sizes[key]
        if read > SLOT_VALUES_READ:
            break
        value = fetch(key)
        if np.issubdtype(value.dtype, np.number) and np.any(value != 0):
            return True, f"optimizer slot `{clean_name(key)}` is non-zero"
    return found


def _full_names(serialized: bytes) -> dict[str, str]:
    """Checkpoint key -> the variable's name at creation, from a TF2 checkpoint's object graph."""
    from google.protobuf.message import DecodeError
    from tensorflow.core.protobuf import trackable_object_graph_pb2

    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    try:
        graph.ParseFromString(serialized)
    except DecodeError:
        return {}
    return {attr.checkpoint_key: attr.full_name for node in graph.nodes
            for attr in node.attributes if attr.full_name}


def _is_step(name: str) -> bool:
    head, _, leaf = name.rpartition("/")
    return leaf == "global_step" or (leaf in STEP_NAMES and head.startswith("optimizer"))
