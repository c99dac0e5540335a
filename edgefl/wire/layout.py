"""The tensors of an envelope: the dtype whitelist, and the tensor entries of a received header
checked as the safetensors library checks them (decode then reads each tensor as a read-only view
of the message, with no copy: :func:`edgefl.wire.envelope.decode`)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from edgefl.errors import WireError

#: dtype whitelist: numpy dtype ↔ safetensors dtype tag.
DTYPES = {
    np.dtype(np.float32): "F32",
    np.dtype(np.float16): "F16",
    np.dtype(np.float64): "F64",
    np.dtype(np.int64): "I64",
    np.dtype(np.int32): "I32",
    np.dtype(np.uint8): "U8",
    np.dtype(np.bool_): "BOOL",
}
NUMPY = {tag: dtype for dtype, tag in DTYPES.items()}


def malformed(why: str) -> WireError:
    """A WireError for a tensor layout the safetensors library would refuse."""
    return WireError(f"malformed tensors: {why}")


def tensor_layout(
    header: dict[str, Any], body: int
) -> list[tuple[str, str, np.dtype, tuple, int, int]]:
    """The tensor entries of a parsed header, checked as the safetensors library checks them and
    against the dtype whitelist: each entry exactly ``dtype``, ``shape`` (non-negative integers)
    and ``data_offsets`` (two), the byte ranges tiling the ``body`` bytes after the header from 0
    with no gap, overlap or excess, each as long as its shape and dtype say. Returns (name, tag,
    dtype, shape, start, end) per tensor, in name order."""
    spans = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(info, dict) or info.keys() != {"dtype", "shape", "data_offsets"}:
            raise malformed(f"tensor {name[:64]!r}: an entry is dtype, shape and data_offsets")
        tag, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
        if not isinstance(shape, list) or any(type(d) is not int or d < 0 for d in shape):
            raise malformed(f"tensor {name[:64]!r}: its shape is not a list of sizes")
        if (not isinstance(offsets, list) or len(offsets) != 2
                or any(type(o) is not int or o < 0 for o in offsets)):
            raise malformed(f"tensor {name[:64]!r}: its data_offsets are not two offsets")
        dtype = NUMPY.get(tag) if isinstance(tag, str) else None
        if dtype is None:
            raise WireError(
                f"tensor {name[:64]!r} has dtype {str(tag)[:16]}, outside the whitelist")
        spans.append((offsets[0], offsets[1], name, tag, dtype, tuple(shape)))
    spans.sort(key=lambda span: span[:2])
    at = 0
    for start, end, name, _, dtype, shape in spans:
        if start != at or end < start:
            raise malformed(
                f"tensor {name[:64]!r}: bytes [{start}, {end}) do not follow on at {at}")
        if end - start != math.prod(shape) * dtype.itemsize:
            raise malformed(f"tensor {name[:64]!r}: byte length does not match its shape")
        at = end
    if at != body:
        raise malformed(f"the tensors' bytes end at {at}, the message's {body} bytes later")
    return sorted((name, tag, dtype, shape, start, end)
                  for start, end, name, tag, dtype, shape in spans)
