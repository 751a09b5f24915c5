"""Load an ONNX model safely: external-data locations must stay inside the model's folder.

An ONNX file names the files that hold its large tensors; a hostile model could name
`../../home/user/.ssh/id_rsa` or `/etc/shadow` and have them read into a tensor. Every location
is checked (absolute paths, `..`, symlinks resolved) *before* any external byte is read.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bnfix.artifacts.model import ArtifactError


def _graph_tensors(graph: Any) -> Iterator[Any]:
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield sparse.values
        yield sparse.indices
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            if attr.HasField("g"):
                yield from _graph_tensors(attr.g)
            for sub in attr.graphs:
                yield from _graph_tensors(sub)


def all_tensors(model: Any) -> Iterator[Any]:
    """Every TensorProto of the model: initializers, constants, subgraphs', functions'."""
    yield from _graph_tensors(model.graph)
    for function in model.functions:
        for node in function.node:
            for attr in node.attribute:
                if attr.HasField("t"):
                    yield attr.t


def external_location(tensor: Any) -> str | None:
    from onnx import TensorProto

    if tensor.data_location != TensorProto.EXTERNAL:
        return None
    entries = {entry.key: entry.value for entry in tensor.external_data}
    return entries.get("location", "")


def confined(folder: Path, location: str) -> Path:
    """The file a location names, or ArtifactError when it leaves `folder`."""
    if not location:
        raise ArtifactError("external data without a location")
    if os.path.isabs(location) or location.startswith(("/", "\\")) or \
            (len(location) > 1 and location[1] == ":"):
        raise ArtifactError(f"refusing external data at absolute path {location!r}")
    root = folder.resolve()
    target = (root / location).resolve()
    if target != root and root not in target.parents:
        raise ArtifactError(f"refusing external data {location!r}: it resolves outside the "
                            f"model's folder {root}")
    return target


def load_model(path: str) -> Any:
    """onnx.load with external data confined to the model's folder; ArtifactError otherwise."""
    import onnx
    from google.protobuf.message import DecodeError
    from onnx import external_data_helper

    folder = Path(path).resolve().parent
    try:
        model = onnx.load(path, load_external_data=False)
    except DecodeError as exc:
        raise ArtifactError(f"cannot parse {path} as an ONNX model: {exc}") from exc
    except OSError as exc:
        raise ArtifactError(f"cannot read {path}: {exc.strerror or exc}") from exc
    for tensor in all_tensors(model):
        location = external_location(tensor)
        if location is None:
            continue
        try:
            target = confined(folder, location)
        except ArtifactError as exc:
            raise ArtifactError(f"{path}: tensor {tensor.name!r}: {exc}") from None
        if not target.is_file():
            raise ArtifactError(f"{path}: tensor {tensor.name!r}: external data file "
                                f"{location!r} is missing")
    try:
        external_data_helper.load_external_data_for_model(model, str(folder))
    except (OSError, ValueError, onnx.checker.ValidationError) as exc:
        raise ArtifactError(f"{path}: cannot load external data: {exc}") from exc
    return model
