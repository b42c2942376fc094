"""A reader for the IDX format of MNIST and Fashion-MNIST (raw or gzip-compressed).

IDX (LeCun et al., http://yann.lecun.com/exdb/mnist/): a big-endian header ``0x00 0x00 T D``
(T the element type code, D the number of dimensions), then D big-endian uint32 sizes, then the
elements in C order. MNIST's files are ``0x00000803`` (uint8 images, 3 dims) and ``0x00000801``
(uint8 labels, 1 dim).
"""

from __future__ import annotations

import gzip
import pathlib

import numpy as np

# type code -> big-endian numpy dtype (the IDX specification's table)
IDX_TYPES = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
GZIP_MAGIC = b"\x1f\x8b"


def parse_idx(data: bytes, *, name: str = "data") -> np.ndarray:
    """The array stored in IDX bytes ``data`` (native byte order).

    Raises:
        ValueError: the magic number is not IDX's, the type code is unknown, or the payload's
            length is not the one its header declares.
    """
    if len(data) < 4 or data[0] != 0 or data[1] != 0:
        raise ValueError(f"{name}: not an IDX file (magic bytes {data[:4].hex()!r}, want 0000TTDD)")
    code, ndim = data[2], data[3]
    if code not in IDX_TYPES:
        raise ValueError(f"{name}: IDX type code must be one of {sorted(IDX_TYPES)}; got {code}")
    if ndim == 0 or len(data) < 4 + 4 * ndim:
        raise ValueError(f"{name}: IDX header declares {ndim} dimensions but is truncated")
    shape = tuple(int(s) for s in np.frombuffer(data, ">u4", count=ndim, offset=4))
    dtype = IDX_TYPES[code]
    expected = int(np.prod(shape)) * dtype.itemsize
    payload = len(data) - 4 - 4 * ndim
    if payload != expected:
        raise ValueError(
            f"{name}: IDX header declares shape {shape} ({expected} bytes) but the file holds "
            f"{payload} bytes of elements"
        )
    array = np.frombuffer(data, dtype, offset=4 + 4 * ndim).reshape(shape)
    return array.astype(dtype.newbyteorder("="))


def read_idx(path: pathlib.Path | str) -> np.ndarray:
    """Read an IDX file, gunzipping it first when it starts with the gzip magic bytes."""
    path = pathlib.Path(path)
    raw = path.read_bytes()
    if raw[:2] == GZIP_MAGIC:
        raw = gzip.decompress(raw)
    return parse_idx(raw, name=str(path))


def expect_shape(array: np.ndarray, shape: tuple, *, name: str) -> np.ndarray:
    """``array`` when its shape matches ``shape`` (``None`` entries match any size)."""
    ok = array.ndim == len(shape) and all(
        s is None or s == a for s, a in zip(shape, array.shape, strict=False)
    )
    if not ok:
        raise ValueError(f"{name}: expected an array of shape {shape}; got {array.shape}")
    return array
