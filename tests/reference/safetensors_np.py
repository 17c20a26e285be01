"""Minimal safetensors reader/writer on numpy (no `safetensors` package needed).

File layout (https://github.com/huggingface/safetensors):
    8 bytes   little-endian u64 N = length of the JSON header
    N bytes   UTF-8 JSON: {"__metadata__": {str: str}?, "<name>": {"dtype": "F32", "shape": [...],
              "data_offsets": [begin, end]}, ...}; offsets are relative to the first byte after the
              header; the header is padded with spaces to a multiple of 8 bytes
    data      the tensors' bytes, row-major, little-endian

Supported dtypes: F32, F16, BF16 (and F64, I64, I32, I16, I8, U8, BOOL for reading). BF16 has no numpy
type: it is carried as uint16 bit patterns. `read_file` returns BF16 tensors as float32 (bits << 16)
unless `raw_bf16=True`; `f32_to_bf16_bits` converts float32 -> bf16 with round-to-nearest-even.

Writing: `write_file(path, {name: array or BF16(bits)})`; arrays of dtype float32/float16 keep that dtype,
wrap a uint16 array in `BF16(...)` (or pass `dtype_overrides={name: "BF16"}` with float32 arrays, which
are rounded to bf16). Tensors are laid out in sorted-name order. The write is atomic (tmp + rename).
"""

import json
import os
import struct

import numpy as np

_NP = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
    "BF16": np.dtype("<u2"),  # raw bit patterns
}


class BF16:
    """A bf16 tensor given as its uint16 bit patterns."""

    def __init__(self, bits):
        bits = np.ascontiguousarray(bits)
        if bits.dtype != np.uint16:
            raise TypeError("BF16 wants uint16 bit patterns")
        self.bits = bits
        self.shape = bits.shape

    def to_f32(self):
        return bf16_bits_to_f32(self.bits)


def f32_to_bf16_bits(x):
    """float32 array -> uint16 bf16 bits, round to nearest, ties to even (NaN kept quiet NaN)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    rounding = ((u >> 16) & 1) + 0x7FFF
    out = ((u + rounding) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        out[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)
    return out


def bf16_bits_to_f32(bits):
    bits = np.ascontiguousarray(bits, dtype=np.uint16)
    return (bits.astype(np.uint32) << 16).view(np.float32)


def round_to_bf16(x):
    """float32 values rounded to the nearest bf16 value, returned as float32."""
    return bf16_bits_to_f32(f32_to_bf16_bits(x))


def read_header(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n).decode("utf-8"))
    return header, 8 + n


def read_file(path, raw_bf16=False):
    """Returns ({name: np.ndarray}, metadata dict). BF16 -> float32 unless raw_bf16 (then BF16 objects)."""
    header, data_start = read_header(path)
    meta = header.pop("__metadata__", {}) or {}
    with open(path, "rb") as f:
        f.seek(data_start)
        data = f.read()
    out = {}
    for name, info in header.items():
        dt = info["dtype"]
        if dt not in _NP:
            raise ValueError("unsupported safetensors dtype %s for %s" % (dt, name))
        b, e = info["data_offsets"]
        shape = tuple(info["shape"])
        npdt = _NP[dt]
        count = int(np.prod(shape)) if shape else 1
        if e - b != count * npdt.itemsize:
            raise ValueError("size mismatch for %s" % name)
        arr = np.frombuffer(data, dtype=npdt, count=count, offset=b).reshape(shape).copy()
        if dt == "BF16":
            out[name] = BF16(arr) if raw_bf16 else bf16_bits_to_f32(arr).reshape(shape)
        else:
            out[name] = arr
    return out, meta


def _encode(value, override=None):
    if isinstance(value, BF16):
        return "BF16", value.bits.shape, value.bits.astype("<u2", copy=False).tobytes()
    arr = np.ascontiguousarray(value)
    if override == "BF16":
        bits = f32_to_bf16_bits(arr.astype(np.float32))
        return "BF16", arr.shape, bits.astype("<u2", copy=False).tobytes()
    if override is not None:
        arr = arr.astype(_NP[override])
        return override, arr.shape, arr.tobytes()
    for name, dt in _NP.items():
        if name != "BF16" and arr.dtype.newbyteorder("<") == dt.newbyteorder("<") and arr.dtype.kind == dt.kind:
            return name, arr.shape, arr.astype(dt, copy=False).tobytes()
    raise TypeError("unsupported numpy dtype %s" % arr.dtype)


def tensor_nbytes(value):
    if isinstance(value, BF16):
        return value.bits.size * 2
    return np.asarray(value).nbytes


def atomic_write_bytes(path, chunks):
    tmp = "%s.tmp.%d" % (path, os.getpid())
    with open(tmp, "wb") as f:
        for c in chunks:
            f.write(c)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_file(path, tensors, metadata=None, dtype_overrides=None):
    """Writes {name: ndarray | BF16} as a safetensors file (atomic)."""
    dtype_overrides = dtype_overrides or {}
    header = {}
    if metadata is not None:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    blobs = []
    off = 0
    for name in sorted(tensors):
        dt, shape, blob = _encode(tensors[name], dtype_overrides.get(name))
        header[name] = {"dtype": dt, "shape": [int(s) for s in shape], "data_offsets": [off, off + len(blob)]}
        blobs.append(blob)
        off += len(blob)
    hjson = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hjson += b" " * ((8 - len(hjson) % 8) % 8)
    atomic_write_bytes(path, [struct.pack("<Q", len(hjson)), hjson] + blobs)
    return off
