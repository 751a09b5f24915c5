"""Parse a TF graph file without executing it: .meta (MetaGraphDef), .pb (binary GraphDef or a
SavedModel's saved_model.pb, told apart by content), .pbtxt (text), or a SavedModel folder.

Only the protobuf messages are decoded (TensorFlow's generated `*_pb2` modules), never
imported into a `tf.Graph`: a graph from an untrusted source runs no op and loads no library.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bnfix.artifacts.model import ArtifactError


@dataclass
class LoadedGraph:
    """The parts of a graph file the analysis needs."""

    kind: str                       # "tf-graphdef" | "tf-metagraph" | "tf-saved-model"
    graph_def: Any
    collections: dict[str, list[str]] = field(default_factory=dict)  # node names per collection
    initializers: set[str] = field(default_factory=set)  # variable initializer ops
    serving: bool = False           # a SavedModel meta graph tagged "serve" / with signatures
    checkpoint: str | None = None   # checkpoint prefix holding the variables' values, if any


def _protos() -> tuple[Any, Any, Any, Any]:
    # Lazy: importing tensorflow.core imports TensorFlow (seconds); only graph reading pays it.
    try:
        from tensorflow.core.framework import graph_pb2, variable_pb2
        from tensorflow.core.protobuf import meta_graph_pb2, saved_model_pb2
    except ImportError as exc:
        raise ArtifactError(f"reading TF graphs needs tensorflow (pip install 'bnfix[tf]'): "
                            f"{exc}") from exc
    return graph_pb2, meta_graph_pb2, saved_model_pb2, variable_pb2


def _parse(path: Path, message: Any, what: str, text: bool) -> Any:
    from google.protobuf import message as pb_message
    from google.protobuf import text_format

    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ArtifactError(f"cannot read {path}: {exc.strerror or exc}") from exc
    try:
        if text:
            text_format.Parse(data.decode("utf-8"), message)
        else:
            message.ParseFromString(data)
    except (pb_message.DecodeError, text_format.ParseError, UnicodeDecodeError) as exc:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise ArtifactError(f"cannot parse {path} as a {what}: {reason}") from exc
    return message


def _from_meta_graph(meta: Any, kind: str, variable_pb2: Any) -> LoadedGraph:
    from google.protobuf.message import DecodeError

    collections: dict[str, list[str]] = {}
    initializers: set[str] = set()
    for key, collection in meta.collection_def.items():
        kind_of = collection.WhichOneof("kind")
        if kind_of == "node_list":
            collections[key] = [v.split(":", 1)[0] for v in collection.node_list.value]
        elif kind_of == "bytes_list" and key in ("variables", "trainable_variables",
                                                  "moving_average_variables", "local_variables",
                                                  "model_variables"):
            names = []
            for raw in collection.bytes_list.value:
                var = variable_pb2.VariableDef()
                try:
                    var.ParseFromString(raw)
                except DecodeError as exc:
                    raise ArtifactError(f"malformed variable definition in the `{key}` "
                                        f"collection: {' '.join(str(exc).split()) or 'DecodeError'}"
                                        ) from None
                names.append(var.variable_name.split(":", 1)[0])
                if var.initializer_name:
                    initializers.add(var.initializer_name.split(":", 1)[0])
            collections[key] = names
    serving = "serve" in meta.meta_info_def.tags or bool(meta.signature_def)
    return LoadedGraph(kind, meta.graph_def, collections, initializers, serving)


def _saved_model(path: Path, protos: tuple[Any, Any, Any, Any]) -> LoadedGraph:
    _, _, saved_model_pb2, variable_pb2 = protos
    saved = _parse(path, saved_model_pb2.SavedModel(), "SavedModel", path.suffix == ".pbtxt")
    if not saved.meta_graphs:
        raise ArtifactError(f"cannot parse {path} as a SavedModel: it holds no meta graph")
    # The serving meta graph is the inference artifact; a training one is kept otherwise.
    chosen = next((m for m in saved.meta_graphs if "serve" in m.meta_info_def.tags),
                  saved.meta_graphs[0])
    loaded = _from_meta_graph(chosen, "tf-saved-model", variable_pb2)
    prefix = path.parent / "variables" / "variables"
    if prefix.with_suffix(".index").is_file():
        loaded.checkpoint = str(prefix)
    return loaded


def load_graph(path_str: str) -> LoadedGraph:
    """Parse PATH by what it is; every failure is one ArtifactError line."""
    path = Path(path_str)
    protos = _protos()
    graph_pb2, meta_graph_pb2, _, variable_pb2 = protos
    if path.is_dir():
        for name in ("saved_model.pb", "saved_model.pbtxt"):
            if (path / name).is_file():
                return _saved_model(path / name, protos)
        raise ArtifactError(f"{path} is a folder without saved_model.pb: not a SavedModel")
    suffix = path.suffix.lower()
    if path.name in ("saved_model.pb", "saved_model.pbtxt"):
        return _saved_model(path, protos)
    if suffix == ".meta":
        meta = _parse(path, meta_graph_pb2.MetaGraphDef(), "MetaGraphDef", text=False)
        loaded = _from_meta_graph(meta, "tf-metagraph", variable_pb2)
        loaded.serving = False  # a .meta is what tf.train.Saver writes next to a checkpoint
        prefix = path.with_suffix("")
        if Path(f"{prefix}.index").is_file():
            loaded.checkpoint = str(prefix)
        return loaded
    text = suffix in (".pbtxt", ".txt")
    if text:
        head = path.read_text(encoding="utf-8", errors="replace")
        if "graph_def {" in head or "meta_info_def {" in head:
            meta = _parse(path, meta_graph_pb2.MetaGraphDef(), "MetaGraphDef", text=True)
            return _from_meta_graph(meta, "tf-metagraph", variable_pb2)
        return LoadedGraph("tf-graphdef", _parse(path, graph_pb2.GraphDef(), "GraphDef", True))
    with path.open("rb") as f:
        first = f.read(1)
    if first == b"\x08":  # SavedModel starts with saved_model_schema_version (field 1, varint)
        return _saved_model(path, protos)
    return LoadedGraph("tf-graphdef", _parse(path, graph_pb2.GraphDef(), "GraphDef", False))
