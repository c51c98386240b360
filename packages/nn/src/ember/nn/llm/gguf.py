"""A pure-Python reader of GGUF v2/v3 files (llama.cpp's model format) and numpy dequantisation of its tensor types.

The file is memory-mapped: `GGUFFile` parses the header, the metadata key/values and the tensor infos, and
`tensor(name)` dequantises one tensor to float32 on demand, reading only its bytes.

Layout (all little-endian): magic b"GGUF", uint32 version, uint64 tensor count, uint64 metadata count, the metadata
(key string, uint32 value type, value), the tensor infos (name, uint32 n_dims, uint64 dims[n_dims] innermost first,
uint32 ggml type, uint64 offset into the data section), then padding to `general.alignment` (default 32) and the
data section. A tensor with dims (ne0, ne1) is a numpy array of shape (ne1, ne0).
"""
from __future__ import annotations
import enum
import os
import struct
from dataclasses import dataclass
from typing import Any, Callable
import numpy as np
from ember.errors import EmberError

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32

class GGUFError(EmberError, ValueError):
  """A GGUF file is malformed, truncated, of an unsupported version, or holds an unsupported tensor type."""

class GGUFValueType(enum.IntEnum):
  UINT8 = 0
  INT8 = 1
  UINT16 = 2
  INT16 = 3
  UINT32 = 4
  INT32 = 5
  FLOAT32 = 6
  BOOL = 7
  STRING = 8
  ARRAY = 9
  UINT64 = 10
  INT64 = 11
  FLOAT64 = 12

# struct format of each fixed-size scalar value type
_SCALAR_FMT: dict[GGUFValueType, str] = {
  GGUFValueType.UINT8: "B", GGUFValueType.INT8: "b", GGUFValueType.UINT16: "H", GGUFValueType.INT16: "h",
  GGUFValueType.UINT32: "I", GGUFValueType.INT32: "i", GGUFValueType.FLOAT32: "f", GGUFValueType.BOOL: "?",
  GGUFValueType.UINT64: "Q", GGUFValueType.INT64: "q", GGUFValueType.FLOAT64: "d",
}

class GGMLType(enum.IntEnum):
  F32 = 0
  F16 = 1
  Q4_0 = 2
  Q4_1 = 3
  Q5_0 = 6
  Q5_1 = 7
  Q8_0 = 8
  Q8_1 = 9
  Q2_K = 10
  Q3_K = 11
  Q4_K = 12
  Q5_K = 13
  Q6_K = 14
  Q8_K = 15
  I8 = 24
  I16 = 25
  I32 = 26
  I64 = 27
  F64 = 28
  BF16 = 30

QK_K = 256  # elements in a k-quant super-block

# (elements per block, bytes per block) of each type the reader understands
BLOCK_LAYOUT: dict[GGMLType, tuple[int, int]] = {
  GGMLType.F32: (1, 4), GGMLType.F16: (1, 2), GGMLType.BF16: (1, 2),
  GGMLType.Q4_0: (32, 2 + 16), GGMLType.Q4_1: (32, 2 + 2 + 16), GGMLType.Q8_0: (32, 2 + 32),
  GGMLType.Q4_K: (QK_K, 2 + 2 + 12 + QK_K // 2), GGMLType.Q6_K: (QK_K, QK_K // 2 + QK_K // 4 + QK_K // 16 + 2),
}

@dataclass(frozen=True)
class GGUFTensorInfo:
  """One tensor's entry: `shape` is numpy order (outermost first), `offset` is absolute in the file."""
  name: str
  shape: tuple[int, ...]
  ggml_type: GGMLType
  offset: int
  nbytes: int
  @property
  def numel(self) -> int: return int(np.prod(self.shape, dtype=np.int64))

# ** dequantisation: raw bytes as a (n_blocks, block_bytes) uint8 array -> (n_blocks, block_elems) float32 **

def _f16(raw: np.ndarray, start: int) -> np.ndarray:
  """The float16 at byte `start` of every block, as a (n_blocks, 1) float32 column."""
  return raw[:, start:start + 2].copy().view(np.float16).astype(np.float32)

def _low_high_nibbles(qs: np.ndarray) -> np.ndarray:
  """Blocks of 32 4-bit values: element j < 16 is the low nibble of byte j, element j + 16 its high nibble."""
  return np.concatenate([qs & 0x0F, qs >> 4], axis=1)

def dequant_q4_0(raw: np.ndarray) -> np.ndarray:
  # x = d * (q - 8)
  return _f16(raw, 0) * (_low_high_nibbles(raw[:, 2:]).astype(np.float32) - 8.0)

def dequant_q4_1(raw: np.ndarray) -> np.ndarray:
  # x = d * q + m
  return _f16(raw, 0) * _low_high_nibbles(raw[:, 4:]).astype(np.float32) + _f16(raw, 2)

def dequant_q8_0(raw: np.ndarray) -> np.ndarray:
  # x = d * q, q int8
  return _f16(raw, 0) * raw[:, 2:].view(np.int8).astype(np.float32)

def _k4_scales_mins(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """The 8 six-bit scales and mins of a Q4_K super-block, unpacked from its 12 bytes (as ggml's get_scale_min_k4)."""
  q = packed.astype(np.uint8)
  sc_lo, mn_lo = q[:, 0:4] & 63, q[:, 4:8] & 63
  sc_hi = (q[:, 8:12] & 0x0F) | ((q[:, 0:4] >> 6) << 4)
  mn_hi = (q[:, 8:12] >> 4) | ((q[:, 4:8] >> 6) << 4)
  scales = np.concatenate([sc_lo, sc_hi], axis=1).astype(np.float32)
  return scales, np.concatenate([mn_lo, mn_hi], axis=1).astype(np.float32)

def dequant_q4_k(raw: np.ndarray) -> np.ndarray:
  n = raw.shape[0]
  d, dmin = _f16(raw, 0), _f16(raw, 2)
  scales, mins = _k4_scales_mins(raw[:, 4:16])
  qs = raw[:, 16:].reshape(n, 4, 32)  # 4 chunks of 32 bytes, each holding two 32-element sub-blocks
  q = np.stack([qs & 0x0F, qs >> 4], axis=2).reshape(n, 8, 32).astype(np.float32)  # sub-block 2c: low, 2c+1: high
  # x = d * scale[sub] * q - dmin * min[sub]
  return ((d * scales)[:, :, None] * q - (dmin * mins)[:, :, None]).reshape(n, QK_K)

def dequant_q6_k(raw: np.ndarray) -> np.ndarray:
  n = raw.shape[0]
  ql = raw[:, 0:128].reshape(n, 2, 64)   # per 128-element half: 64 bytes of low nibbles
  qh = raw[:, 128:192].reshape(n, 2, 32)  # per half: 32 bytes holding four 2-bit high parts
  scales = raw[:, 192:208].view(np.int8).astype(np.float32).reshape(n, 16)
  d = _f16(raw, 208)
  # quarter k (0..3) of a half, element l (0..31): low 4 bits from nibble k>>1 of ql[l + 32*(k&1)],
  # high 2 bits from qh[l] >> 2k
  low = np.stack([ql[:, :, :32] & 0x0F, ql[:, :, 32:] & 0x0F, ql[:, :, :32] >> 4, ql[:, :, 32:] >> 4], axis=2)
  high = np.stack([(qh >> (2 * k)) & 3 for k in range(4)], axis=2)
  q = ((low | (high << 4)).astype(np.float32) - 32.0).reshape(n, 16, 16)  # (block, 16 groups of 16)
  return (d[:, :, None] * scales[:, :, None] * q).reshape(n, QK_K)

def _dequant_f32(raw: np.ndarray) -> np.ndarray: return raw.view(np.float32).astype(np.float32)
def _dequant_f16(raw: np.ndarray) -> np.ndarray: return raw.view(np.float16).astype(np.float32)
def _dequant_bf16(raw: np.ndarray) -> np.ndarray: return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)

DEQUANTIZERS: dict[GGMLType, Callable[[np.ndarray], np.ndarray]] = {
  GGMLType.F32: _dequant_f32, GGMLType.F16: _dequant_f16, GGMLType.BF16: _dequant_bf16,
  GGMLType.Q4_0: dequant_q4_0, GGMLType.Q4_1: dequant_q4_1, GGMLType.Q8_0: dequant_q8_0,
  GGMLType.Q4_K: dequant_q4_k, GGMLType.Q6_K: dequant_q6_k,
}

def dequantize(raw: np.ndarray | bytes, ggml_type: GGMLType | int, shape: tuple[int, ...]) -> np.ndarray:
  """Raw GGUF tensor bytes -> a float32 array of `shape` (numpy order)."""
  gtype = _ggml_type(ggml_type)
  if gtype not in DEQUANTIZERS:
    names = ", ".join(t.name for t in DEQUANTIZERS)
    raise GGUFError(f"GGUF tensor type {gtype.name} is not supported; supported types: {names}")
  block_elems, block_bytes = BLOCK_LAYOUT[gtype]
  numel = int(np.prod(shape, dtype=np.int64))
  if numel % block_elems:
    raise GGUFError(f"a {gtype.name} tensor of shape {shape} has {numel} elements, not a multiple of its block "
      f"size {block_elems}")
  data = np.frombuffer(raw, dtype=np.uint8) if isinstance(raw, (bytes, bytearray, memoryview)) else raw.reshape(-1)
  need = numel // block_elems * block_bytes
  if data.size != need: raise GGUFError(f"{gtype.name} tensor of shape {shape} needs {need} bytes, got {data.size}")
  return DEQUANTIZERS[gtype](data.reshape(numel // block_elems, block_bytes)).reshape(shape)

def _ggml_type(t: GGMLType | int) -> GGMLType:
  try: return GGMLType(t)
  except ValueError as e: raise GGUFError(f"unknown GGML tensor type id {int(t)}; this reader knows "
    f"{[x.name for x in GGMLType]}") from e

def tensor_nbytes(ggml_type: GGMLType, shape: tuple[int, ...]) -> int:
  if ggml_type not in BLOCK_LAYOUT: raise GGUFError(f"GGUF tensor type {ggml_type.name} is not supported (unknown "
    f"block layout)")
  block_elems, block_bytes = BLOCK_LAYOUT[ggml_type]
  return int(np.prod(shape, dtype=np.int64)) // block_elems * block_bytes

# ** the file **

class _Cursor:
  """Sequential little-endian reads over the memory-mapped header, with bounds checks that name what was cut off."""
  def __init__(self, buf: np.ndarray, path: str):
    self.buf, self.pos, self.path = buf, 0, path
  def take(self, n: int, what: str) -> bytes:
    if self.pos + n > self.buf.size:
      raise GGUFError(f"{self.path}: file is truncated while reading {what} at byte {self.pos} (needs {n} bytes, "
        f"size {self.buf.size})")
    out = self.buf[self.pos:self.pos + n].tobytes()
    self.pos += n
    return out
  def scalar(self, vtype: GGUFValueType, what: str) -> Any:
    fmt = _SCALAR_FMT[vtype]
    return struct.unpack("<" + fmt, self.take(struct.calcsize(fmt), what))[0]
  def u32(self, what: str) -> int: return int(self.scalar(GGUFValueType.UINT32, what))
  def u64(self, what: str) -> int: return int(self.scalar(GGUFValueType.UINT64, what))
  def string(self, what: str) -> str:
    n = self.u64(f"the length of {what}")
    return self.take(n, what).decode("utf-8", errors="replace")
  def strings(self, count: int, what: str) -> list[str]:
    """An array of `count` strings: the hot path of vocabularies and merges, read without per-item method calls."""
    mv, pos, size, out = self.buf.data, self.pos, self.buf.size, []
    for i in range(count):
      if pos + 8 > size: raise GGUFError(f"{self.path}: file is truncated in {what}[{i}] at byte {pos}")
      n = int.from_bytes(mv[pos:pos + 8], "little")
      if pos + 8 + n > size: raise GGUFError(f"{self.path}: file is truncated in {what}[{i}] at byte {pos}")
      out.append(str(mv[pos + 8:pos + 8 + n], "utf-8", "replace"))
      pos += 8 + n
    self.pos = pos
    return out
  def value(self, vtype: int, what: str) -> Any:
    try: vt = GGUFValueType(vtype)
    except ValueError as e: raise GGUFError(f"{self.path}: {what} has unknown GGUF value type {vtype}") from e
    if vt is GGUFValueType.STRING: return self.string(what)
    if vt is GGUFValueType.ARRAY:
      etype, count = self.u32(f"the element type of {what}"), self.u64(f"the length of {what}")
      if etype in [t.value for t in _SCALAR_FMT]:  # fixed-size elements: one vectorised read
        fmt = _SCALAR_FMT[GGUFValueType(etype)]
        raw = self.take(count * struct.calcsize(fmt), what)
        return np.frombuffer(raw, dtype=np.dtype("<" + fmt)).tolist()
      if etype == GGUFValueType.STRING: return self.strings(count, what)
      return [self.value(etype, f"{what}[{i}]") for i in range(count)]
    return self.scalar(vt, what)

class GGUFFile:
  """A parsed, memory-mapped GGUF file.

  >>> f = GGUFFile("model.gguf")  # doctest: +SKIP
  >>> f.metadata["general.architecture"], f.tensor("token_embd.weight").shape  # doctest: +SKIP
  ('llama', (49152, 576))
  """
  def __init__(self, path: str | os.PathLike[str]):
    self.path = os.fspath(path)
    if not os.path.isfile(self.path): raise GGUFError(f"GGUF file {self.path!r} does not exist")
    if os.path.getsize(self.path) < 24: raise GGUFError(f"{self.path}: too small to be a GGUF file "
      f"({os.path.getsize(self.path)} bytes)")
    self.mm = np.memmap(self.path, dtype=np.uint8, mode="r")
    cur = _Cursor(self.mm, self.path)
    magic = cur.take(4, "the magic")
    if magic != GGUF_MAGIC: raise GGUFError(f"{self.path}: not a GGUF file (magic {magic!r}, expected {GGUF_MAGIC!r})")
    self.version = cur.u32("the version")
    if self.version not in SUPPORTED_VERSIONS:
      raise GGUFError(f"{self.path}: GGUF version {self.version} is not supported (supported: "
        f"{SUPPORTED_VERSIONS}); re-convert the model with a current llama.cpp")
    n_tensors, n_kv = cur.u64("the tensor count"), cur.u64("the metadata count")
    self.metadata: dict[str, Any] = {}
    self.metadata_types: dict[str, GGUFValueType] = {}
    for i in range(n_kv):
      key = cur.string(f"metadata key #{i}")
      vtype = cur.u32(f"the type of {key!r}")
      self.metadata[key] = cur.value(vtype, repr(key))
      self.metadata_types[key] = GGUFValueType(vtype)
    infos: list[tuple[str, tuple[int, ...], GGMLType, int]] = []
    for i in range(n_tensors):
      name = cur.string(f"tensor name #{i}")
      n_dims = cur.u32(f"the rank of tensor {name!r}")
      dims = tuple(cur.u64(f"dim {d} of tensor {name!r}") for d in range(n_dims))
      gtype = _ggml_type(cur.u32(f"the type of tensor {name!r}"))
      infos.append((name, tuple(reversed(dims)), gtype, cur.u64(f"the offset of tensor {name!r}")))
    self.alignment = int(self.metadata.get("general.alignment", DEFAULT_ALIGNMENT))
    if self.alignment <= 0 or self.alignment & (self.alignment - 1):
      raise GGUFError(f"{self.path}: general.alignment must be a power of two, got {self.alignment}")
    self.data_offset = -(-cur.pos // self.alignment) * self.alignment
    self.tensors: dict[str, GGUFTensorInfo] = {}
    for name, shape, gtype, rel in infos:
      nbytes = tensor_nbytes(gtype, shape) if gtype in BLOCK_LAYOUT else -1
      info = GGUFTensorInfo(name, shape, gtype, self.data_offset + rel, nbytes)
      if nbytes >= 0 and info.offset + nbytes > self.mm.size:
        raise GGUFError(f"{self.path}: tensor {name!r} ({gtype.name} {shape}) runs past the end of the file; the "
          f"file is truncated")
      self.tensors[name] = info

  def raw(self, name: str) -> np.ndarray:
    """The bytes of tensor `name` as a uint8 view of the memory map (no copy)."""
    info = self._info(name)
    if info.nbytes < 0: raise GGUFError(f"tensor {name!r} has type {info.ggml_type.name}, which this reader "
      f"cannot read")
    return self.mm[info.offset:info.offset + info.nbytes]

  def tensor(self, name: str) -> np.ndarray:
    """Tensor `name` dequantised to a float32 numpy array of its shape."""
    info = self._info(name)
    return dequantize(self.raw(name), info.ggml_type, info.shape)

  def _info(self, name: str) -> GGUFTensorInfo:
    if name not in self.tensors: raise GGUFError(f"{self.path}: no tensor named {name!r} (it has "
      f"{len(self.tensors)} tensors)")
    return self.tensors[name]

  def type_counts(self) -> dict[str, int]:
    """How many tensors of each GGML type the file holds, e.g. {'Q4_1': 210, 'F32': 61}."""
    out: dict[str, int] = {}
    for info in self.tensors.values(): out[info.ggml_type.name] = out.get(info.ggml_type.name, 0) + 1
    return out
