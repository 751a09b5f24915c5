"""The files one artifact is made of, for the inspect cache: a cached result stays valid only
while every one of them is unchanged.

`listed` finds them from names and folder listings alone (stat and glob, nothing read), so a
cached run can check an artifact without opening it: a TF checkpoint is `PREFIX.index` and its
`PREFIX.data-*` shards, a `.meta` graph adds the checkpoint beside it, a SavedModel folder is
every file in it. A file whose presence would change the result (the checkpoint beside a
`.meta`) is listed even when it is absent: its appearance is a change. `from_content` adds the
files only the artifact's content names (an ONNX model's external data): it reads the model,
and runs only before a read, never to check a cached entry (the model's own file, unchanged,
names the same files).
"""

from __future__ import annotations

import glob
import os
from pathlib import Path

from bnfix.artifacts.discover import Candidate
from bnfix.artifacts.model import ArtifactError
from bnfix.artifacts.tf_checkpoint import checkpoint_prefix

Stat = tuple[int, int, int, int] | None  # (size, mtime_ns, inode, ctime_ns); None: absent


def stat(path: str) -> Stat:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns


def listed(candidate: Candidate) -> list[str]:
    """The artifact's files found by name (see the module docstring)."""
    path = candidate.path
    if candidate.reader == "tf-checkpoint":
        prefix = checkpoint_prefix(path) or path
        state = [os.path.join(path, "checkpoint")] if os.path.isdir(path) else []
        return state + _checkpoint(prefix)
    if candidate.reader == "tf-graph":
        if os.path.isdir(path):
            return _tree(path)
        if path.endswith(".meta"):
            return [path, *_checkpoint(path[: -len(".meta")])]
        # a SavedModel's saved_model.pb (also sniffed by content) reads variables/ beside it
        return [path, *_checkpoint(os.path.join(os.path.dirname(path), "variables",
                                                "variables"))]
    return [path]


def from_content(candidate: Candidate) -> list[str]:
    """Files named inside the artifact: an ONNX model's external data (only locations the
    reader accepts; a refused or unparsable model is reported by the reader)."""
    if candidate.reader != "onnx":
        return []
    try:
        import onnx
        from google.protobuf.message import DecodeError
    except ImportError:
        return []  # the reader reports the missing package
    from bnfix.onnx.external_data import all_tensors, confined, external_location

    try:
        model = onnx.load(candidate.path, load_external_data=False)
        folder = Path(candidate.path).resolve().parent
        locations = {external_location(t) for t in all_tensors(model)}
        return sorted({str(confined(folder, loc)) for loc in locations if loc is not None})
    except (OSError, DecodeError, ArtifactError):
        return []


def _checkpoint(prefix: str) -> list[str]:
    shards = glob.glob(glob.escape(prefix) + ".data-*")
    return [prefix + ".index", *sorted(shards)]


def _tree(folder: str) -> list[str]:
    out = []
    for root, dirs, files in os.walk(folder):
        dirs.sort()
        out.extend(os.path.join(root, name) for name in sorted(files))
    return out


def snapshot(candidate: Candidate) -> dict[str, Stat]:
    """Every file of the artifact with its stat, taken before the artifact is read."""
    return {os.path.abspath(path): stat(path)
            for path in [*listed(candidate), *from_content(candidate)]}
