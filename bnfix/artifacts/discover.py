"""Which artifacts the command-line paths name, and which reader each needs.

Folders are walked; a SavedModel folder (it holds `saved_model.pb`) is one artifact, and so is a
TF checkpoint (its `.index` and `.data-*` files) — with its `.meta` graph when `tf.train.Saver`
wrote one: the graph reader reads the checkpoint's values, so each finding is reported once.
A path named explicitly whose extension says nothing is recognised by its first bytes; a walked
`.bin` only when it starts like a torch checkpoint (an ONNX model's external `weights.bin` is
raw tensor data, not an artifact of its own). Excluded files (`exclude`, a predicate on paths:
the project's `[tool.bnfix]` exclude patterns) are not walked into.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bnfix.artifacts.tf_checkpoint import DATA_SUFFIX, checkpoint_prefix

# extension -> reader kind
READERS = {
    ".pt": "torch", ".pth": "torch", ".bin": "torch", ".ckpt": "torch", ".tar": "torch",
    ".safetensors": "safetensors",
    ".index": "tf-checkpoint",
    ".keras": "keras", ".h5": "h5", ".hdf5": "h5",
    ".meta": "tf-graph", ".pb": "tf-graph", ".pbtxt": "tf-graph",
    ".onnx": "onnx",
}
WALKED = {ext for ext in READERS if ext != ".tar"}  # a .tar in a folder is rarely a checkpoint
SKIP_DIRS = {".git", "__pycache__", ".bnfix_cache", "node_modules", ".venv", "venv"}


@dataclass(frozen=True)
class Candidate:
    path: str
    reader: str  # a key of bnfix.artifacts.read.READ, or "missing" / "unknown"


def discover(paths: list[str], exclude: Callable[[Path], bool] | None = None
             ) -> tuple[list[Candidate], list[str]]:
    """Candidates in command-line order (folders sorted), and the folders that held none."""
    out: list[Candidate] = []
    empty: list[str] = []
    seen: set[str] = set()
    for raw in paths:
        found = _walk(raw, exclude or _nothing) if os.path.isdir(raw) and \
            not _is_saved_model(raw) else [_one(raw)]
        if not found:
            empty.append(raw)
        for candidate in found:
            key = os.path.normpath(candidate.path)
            if key not in seen:
                seen.add(key)
                out.append(candidate)
    return out, empty


def _is_saved_model(folder: str) -> bool:
    return any((Path(folder) / name).is_file() for name in ("saved_model.pb", "saved_model.pbtxt"))


def _one(path: str) -> Candidate:
    """What an explicitly named path is."""
    if os.path.isdir(path):
        return Candidate(path, "tf-graph")  # a SavedModel folder
    prefix = checkpoint_prefix(path)
    if prefix is not None and os.path.isfile(prefix + ".index"):
        return Candidate(prefix, "tf-checkpoint")
    if not os.path.exists(path):
        return Candidate(path, "missing")
    reader = READERS.get(Path(path).suffix.lower())
    return Candidate(path, reader or _sniff(path))


def _sniff(path: str) -> str:
    from bnfix.artifacts.keras_file import HDF5_MAGIC
    from bnfix.artifacts.torch_reader import sniff

    try:
        with open(path, "rb") as fh:
            head = fh.read(8)
    except OSError:
        return "unknown"
    if head == HDF5_MAGIC:
        return "h5"
    if sniff(head):
        return "torch"
    return "unknown"


def _nothing(_path: Path) -> bool:
    return False


def _walk(folder: str, exclude: Callable[[Path], bool]) -> list[Candidate]:
    out: list[Candidate] = []
    for root, dirs, files in os.walk(folder):
        dirs.sort()
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and
                   not exclude(Path(os.path.abspath(os.path.join(root, d))))]
        saved = [d for d in dirs if _is_saved_model(os.path.join(root, d))]
        out.extend(Candidate(os.path.join(root, d), "tf-graph") for d in saved)
        dirs[:] = [d for d in dirs if d not in saved]
        names = {name for name in files if not exclude(Path(os.path.abspath(
            os.path.join(root, name))))}
        for name in sorted(names):
            path = os.path.join(root, name)
            if DATA_SUFFIX.search(name) or name == "checkpoint":
                continue  # the checkpoint is found through its .index
            suffix = Path(name).suffix.lower()
            if suffix == ".index":
                if name[: -len(".index")] + ".meta" not in names:  # else read with its graph
                    out.append(Candidate(path[: -len(".index")], "tf-checkpoint"))
            elif suffix == ".bin":
                if _starts_like_torch(path):
                    out.append(Candidate(path, "torch"))
            elif suffix in WALKED:
                out.append(Candidate(path, READERS[suffix]))
    return out


def _starts_like_torch(path: str) -> bool:
    from bnfix.artifacts.torch_reader import sniff_strict

    try:
        with open(path, "rb") as fh:
            return sniff_strict(fh.read(8))
    except OSError:
        return True  # reported by the reader, with the reason
