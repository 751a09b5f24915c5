"""`.safetensors` files, parsed directly: an 8-byte little-endian header length, a JSON header
(name -> dtype, shape, byte offsets) and the raw tensor bytes. The format is simple enough that
reading it needs neither torch nor the safetensors package, and only BN tensors are read."""

from __future__ import annotations

import json
import os
import struct
from typing import Any

import numpy as np

from bnfix.artifacts.grouping import build_layers, group_keys
from bnfix.artifacts.model import Artifact, ArtifactError

MAX_HEADER = 100 * 1024 * 1024  # the reference implementation's limit
DTYPES = {
    "F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2",
    "I8": "i1", "U8": "u1", "BOOL": "?", "U16": "<u2", "U32": "<u4", "U64": "<u8",
}


def read_header(path: str) -> tuple[dict[str, Any], int]:
    """The header and the offset where the data starts; ArtifactError if malformed."""
    size = os.path.getsize(path)
    with open(path, "rb") as fh:
        raw = fh.read(8)
        if len(raw) < 8:
            raise ArtifactError(f"not a safetensors file: {size} bytes, shorter than its header")
        (length,) = struct.unpack("<Q", raw)
        if length > min(MAX_HEADER, size - 8):
            raise ArtifactError(f"not a safetensors file, or truncated: the header claims "
                                f"{length} bytes, the file has {size}")
        try:
            header = json.loads(fh.read(length))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ArtifactError(f"not a safetensors file: the header is not JSON ({exc})") from exc
    if not isinstance(header, dict):
        raise ArtifactError("not a safetensors file: the header is not a JSON object")
    data_size = size - 8 - length
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            begin, end = info["data_offsets"]
            dtype, shape = info["dtype"], info["shape"]
        except (KeyError, TypeError, ValueError) as exc:
            raise ArtifactError(f"malformed safetensors header entry `{name}`") from exc
        if not 0 <= begin <= end <= data_size:
            raise ArtifactError(f"truncated safetensors file: `{name}` ends at byte {end} of "
                                f"{data_size} data bytes")
        if not isinstance(shape, list) or not isinstance(dtype, str):
            raise ArtifactError(f"malformed safetensors header entry `{name}`")
    return header, 8 + length


def read_safetensors(path: str) -> Artifact:
    header, start = read_header(path)
    artifact = Artifact(path=path, kind="safetensors")
    with open(path, "rb") as fh:
        def fetch(key: str) -> np.ndarray:
            return _tensor(fh, header[key], start, key)

        artifact.layers = build_layers(group_keys(k for k in header if k != "__metadata__"),
                                       fetch, "torch")
    counts = [layer.num_batches_tracked for layer in artifact.layers
              if layer.num_batches_tracked is not None]
    if counts:
        artifact.trained = max(counts) > 0
        artifact.trained_evidence = f"num_batches_tracked = {max(counts)}"
    return artifact


def _tensor(fh: Any, info: dict[str, Any], start: int, key: str) -> np.ndarray:
    begin, end = info["data_offsets"]
    fh.seek(start + begin)
    raw = fh.read(end - begin)
    dtype = info["dtype"]
    if dtype == "BF16":  # the upper half of a float32
        bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
        array = bits.view(np.float32)
    elif dtype in DTYPES:
        array = np.frombuffer(raw, dtype=DTYPES[dtype])
    else:
        raise ArtifactError(f"`{key}`: unsupported safetensors dtype {dtype}")
    count = int(np.prod(info["shape"], dtype=np.int64))
    if array.size != count:
        raise ArtifactError(f"`{key}`: {array.size} values stored for shape {info['shape']}")
    return array.reshape(info["shape"])
