"""`.safetensors` files, parsed directly: an 8-byte little-endian header length, a JSON header
(name -> dtype, shape, byte offsets) and the raw tensor bytes. The format is simple enough that
reading it needs neither torch nor the safetensors package, and only BN tensors are read."""

from __future__ import annotations

import json
import os
import struct
from math import prod
from typing import Any

import numpy as np

from bnfix.artifacts.grouping import build_layers, group_keys, moved_affine
from bnfix.artifacts.limits import check
from bnfix.artifacts.model import Artifact, ArtifactError

MAX_HEADER = 100 * 1024 * 1024  # the reference implementation's limit
DTYPES = {
    "F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2",
    "I8": "i1", "U8": "u1", "BOOL": "?", "U16": "<u2", "U32": "<u4", "U64": "<u8",
}
ITEMSIZE = {**{name: np.dtype(code).itemsize for name, code in DTYPES.items()}, "BF16": 2}


def _entry(name: str, info: Any, data_size: int) -> None:
    """ArtifactError unless `info` is a well-formed entry whose bytes lie in the file and match
    its dtype and shape."""
    def bad(why: str) -> ArtifactError:
        return ArtifactError(f"malformed safetensors header entry `{name}`: {why}")

    if not isinstance(info, dict):
        raise bad(f"a {type(info).__name__}, not an object")
    offsets, dtype, shape = info.get("data_offsets"), info.get("dtype"), info.get("shape")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_int(o) for o in offsets)):
        raise bad("data_offsets is not two integers")
    if not isinstance(dtype, str):
        raise bad("dtype is not a string")
    if not (isinstance(shape, list) and all(_is_int(d) and d >= 0 for d in shape)):
        raise bad("shape is not a list of sizes")
    begin, end = offsets
    if not 0 <= begin <= end <= data_size:
        raise ArtifactError(f"truncated safetensors file: `{name}` ends at byte {end} of "
                            f"{data_size} data bytes")
    width = ITEMSIZE.get(dtype)
    if width is not None and width * prod(shape) != end - begin:
        raise bad(f"{end - begin} bytes stored for {dtype} of shape {shape}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


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
        check("the safetensors header", length)
        try:
            header = json.loads(fh.read(length))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ArtifactError(f"not a safetensors file: the header is not JSON ({exc})") from exc
        except RecursionError:
            raise ArtifactError("not a safetensors file: the header is nested too deeply") \
                from None
    if not isinstance(header, dict):
        raise ArtifactError("not a safetensors file: the header is not a JSON object")
    data_size = size - 8 - length
    for name, info in header.items():
        if name != "__metadata__":
            _entry(name, info, data_size)
    return header, 8 + length


def read_safetensors(path: str) -> Artifact:
    header, start = read_header(path)
    artifact = Artifact(path=path, kind="safetensors")

    def shape_of(key: str) -> tuple[tuple[int, ...], int]:
        return tuple(header[key]["shape"]), ITEMSIZE.get(header[key]["dtype"], 8)

    with open(path, "rb") as fh:
        def fetch(key: str) -> np.ndarray:
            return _tensor(fh, header[key], start, key)

        artifact.layers = build_layers(group_keys(k for k in header if k != "__metadata__"),
                                       fetch, "torch", shape_of=shape_of)
    counts = [layer.num_batches_tracked for layer in artifact.layers
              if layer.num_batches_tracked is not None]
    if counts:
        moved = moved_affine(artifact.layers) if max(counts) == 0 else ""
        artifact.trained = max(counts) > 0 or bool(moved)
        artifact.trained_evidence = (f"{moved} while num_batches_tracked = 0" if moved else
                                     f"num_batches_tracked = {max(counts)}")
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
    count = prod(info["shape"])
    if array.size != count:
        raise ArtifactError(f"`{key}`: {array.size} values stored for shape {info['shape']}")
    return array.reshape(info["shape"])
