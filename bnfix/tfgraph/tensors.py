"""TensorProto -> numpy, for the constants of frozen graphs.

Decoded here rather than with `tf.make_ndarray` so that reading a graph never builds a TF
runtime object: only the message's bytes are looked at.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from bnfix.artifacts.limits import check_elements

# DataType enum values (tensorflow/core/framework/types.proto) -> numpy dtype, value field
_DTYPES: dict[int, tuple[Any, str]] = {
    1: (np.float32, "float_val"),
    2: (np.float64, "double_val"),
    3: (np.int32, "int_val"),
    4: (np.uint8, "int_val"),
    5: (np.int16, "int_val"),
    6: (np.int8, "int_val"),
    9: (np.int64, "int64_val"),
    10: (np.bool_, "bool_val"),
    19: (np.float16, "half_val"),
}


def tensor_to_numpy(tensor: Any) -> np.ndarray | None:
    """The value of a TensorProto, or None for a dtype BN parameters never have."""
    if tensor.dtype not in _DTYPES:
        return None
    dtype, field = _DTYPES[tensor.dtype]
    shape = [int(d.size) for d in tensor.tensor_shape.dim]
    if any(d < 0 for d in shape):
        return None  # an unknown dimension: not a constant's value
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    # the compact form below fills `count` values from a few stored ones: check before
    check_elements("a graph constant", count, np.dtype(dtype).itemsize)
    if tensor.tensor_content:
        content = tensor.tensor_content
        if len(content) != count * np.dtype(dtype).itemsize:
            return None  # malformed: not the bytes its shape says
        return np.frombuffer(content, dtype=dtype).reshape(shape).copy()
    values = list(getattr(tensor, field))
    if field == "half_val":  # stored as the uint16 bit patterns
        array = np.asarray(values, dtype=np.uint16).view(np.float16)
    else:
        array = np.asarray(values, dtype=dtype)
    if array.size == count:
        return array.reshape(shape)
    if array.size > count:
        return None  # malformed: more values than its shape holds
    # TF's compact form: the last value repeats to fill the shape (none given: zeros)
    fill = array[-1] if array.size else np.zeros((), dtype=dtype)
    out = np.full(count, fill, dtype=dtype)
    out[: array.size] = array
    return out.reshape(shape)
