"""One reader per artifact kind, imported only when an artifact of that kind is read (each pulls
in its framework: torch, tensorflow, h5py, onnx)."""

from __future__ import annotations

import time
from collections.abc import Callable

from bnfix.artifacts.discover import Candidate
from bnfix.artifacts.model import Artifact, ArtifactError

SUPPORTED = ".pt .pth .bin .ckpt .safetensors, TF checkpoints (.index), .keras .h5, " \
            ".meta .pb .pbtxt, SavedModel folders, .onnx"


def _torch(path: str, allow_pickle: bool) -> Artifact:
    from bnfix.artifacts.torch_reader import read_torch

    return read_torch(path, allow_pickle)


def _safetensors(path: str, _allow_pickle: bool) -> Artifact:
    from bnfix.artifacts.safetensors_file import read_safetensors

    return read_safetensors(path)


def _tf_checkpoint(path: str, _allow_pickle: bool) -> Artifact:
    from bnfix.artifacts.tf_checkpoint import read_tf_checkpoint

    return read_tf_checkpoint(path)


def _keras(path: str, _allow_pickle: bool) -> Artifact:
    from bnfix.artifacts.keras_file import read_keras_file

    return read_keras_file(path)


def _h5(path: str, _allow_pickle: bool) -> Artifact:
    from bnfix.artifacts.keras_file import read_h5

    return read_h5(path)


def _tf_graph(path: str, _allow_pickle: bool) -> Artifact:
    from bnfix.tfgraph.read import read_tf_graph

    return read_tf_graph(path)


def _onnx(path: str, _allow_pickle: bool) -> Artifact:
    from bnfix.onnx.read import read_onnx

    return read_onnx(path)


READ: dict[str, Callable[[str, bool], Artifact]] = {
    "torch": _torch, "safetensors": _safetensors, "tf-checkpoint": _tf_checkpoint,
    "keras": _keras, "h5": _h5, "tf-graph": _tf_graph, "onnx": _onnx,
}
# the package each reader needs, named in the error when it is not installed
NEEDS = {"torch": "torch", "tf-checkpoint": "tensorflow", "tf-graph": "tensorflow",
         "keras": "h5py", "h5": "h5py", "onnx": "onnx"}


def read_artifact(candidate: Candidate, allow_pickle: bool = False) -> Artifact:
    """The artifact's IR; ArtifactError (one line) when it cannot be read."""
    if candidate.reader == "missing":
        raise ArtifactError("no such file or folder")
    if candidate.reader == "unknown":
        raise ArtifactError(f"not a known artifact type (bnfix inspect reads {SUPPORTED})")
    start = time.perf_counter()
    try:
        artifact = READ[candidate.reader](candidate.path, allow_pickle)
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] in ("bnfix",):
            raise
        package = NEEDS.get(candidate.reader, exc.name)
        raise ArtifactError(f"reading this needs {package} (pip install 'bnfix[all]'): "
                            f"{exc}") from exc
    except OSError as exc:  # permissions, a folder where a file was expected, I/O errors
        raise ArtifactError(f"cannot read: {exc.strerror or exc}") from exc
    artifact.seconds = time.perf_counter() - start
    return artifact
