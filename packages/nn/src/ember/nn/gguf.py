"""GGUF (llama.cpp's model format), the one reader of ember: the header parsed from the memory-mapped file, and every
tensor dequantised to float32 on the device with tensor ops (bit operations on uint8 tensors plus the blocks' float16
scales), so the work runs wherever the weights go. `ember.nn.llm` builds its models from `GGUFFile`.

Layout (all little-endian): magic b"GGUF", uint32 version (2 or 3), uint64 tensor count, uint64 metadata count, the
metadata (key string, uint32 value type, value; a string is a uint64 length and UTF-8 bytes; an array a uint32 element
type, a uint64 count and the elements), the tensor infos (name, uint32 n_dims, uint64 dims[n_dims] innermost first,
uint32 ggml type, uint64 offset into the data section, a multiple of the alignment), then padding to
`general.alignment` (uint32, default 32) and the data section. A tensor with dims (ne0, ne1) is a numpy array of shape
(ne1, ne0).

The file is untrusted: every count and length is checked against the bytes left before it sizes a loop or a read,
arrays nest at most MAX_ARRAY_NESTING deep, keys and tensor names are unique, tensors' byte ranges lie inside the file
and do not overlap, and whatever is wrong raises `GGUFError` (a `WeightFormatError`) with the file, offset and field.

Block layouts (ggml's; `d`, `m`, `dmin` are float16):
  Q4_0 d, 16 bytes of nibbles                     x = d * (q - 8)
  Q4_1 d, m, 16 bytes of nibbles                  x = d * q + m
  Q5_0 d, 4 bytes of high bits, 16 of nibbles     x = d * (q - 16)
  Q5_1 d, m, 4 bytes of high bits, 16 of nibbles  x = d * q + m
  Q8_0 d, 32 int8                                 x = d * q
  Q2_K..Q6_K: 256-element super-blocks of 16 or 8 sub-blocks, each with its own (6- or 4-bit) scale (and min).

>>> from ember import Tensor
>>> dequantize(Tensor(bytes([0, 60, 0, 64])), "F16", (2,)).numpy()  # float16 1.0 and 2.0
array([1., 2.], dtype=float32)
"""
from __future__ import annotations
import enum
import math
import os
import struct
from dataclasses import dataclass
from typing import Any, Callable
import numpy as np
from ember.dtype import dtypes
from ember import Tensor
from ember.nn.weightfile import WeightFormatError, check_disjoint, check_shape

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_ARRAY_NESTING = 8  # arrays of arrays; llama.cpp writes none nested
MAX_DIMS = 4  # GGML_MAX_DIMS

class GGUFError(WeightFormatError):
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
# the fewest bytes one value of each type takes in the file (a string's length, an array's type and count)
_MIN_BYTES = {**{t: struct.calcsize(f) for t, f in _SCALAR_FMT.items()}, GGUFValueType.STRING: 8,
              GGUFValueType.ARRAY: 12}

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

# (elements per block, bytes per block) of every type the reader knows; DEQUANTIZERS says which it can dequantise
BLOCK_LAYOUT: dict[GGMLType, tuple[int, int]] = {
  GGMLType.F32: (1, 4), GGMLType.F16: (1, 2), GGMLType.BF16: (1, 2), GGMLType.F64: (1, 8),
  GGMLType.I8: (1, 1), GGMLType.I16: (1, 2), GGMLType.I32: (1, 4), GGMLType.I64: (1, 8),
  GGMLType.Q4_0: (32, 2 + 16), GGMLType.Q4_1: (32, 2 + 2 + 16), GGMLType.Q5_0: (32, 2 + 4 + 16),
  GGMLType.Q5_1: (32, 2 + 2 + 4 + 16), GGMLType.Q8_0: (32, 2 + 32), GGMLType.Q8_1: (32, 2 + 2 + 32),
  GGMLType.Q2_K: (QK_K, QK_K // 16 + QK_K // 4 + 2 + 2), GGMLType.Q3_K: (QK_K, QK_K // 8 + QK_K // 4 + 12 + 2),
  GGMLType.Q4_K: (QK_K, 2 + 2 + 12 + QK_K // 2), GGMLType.Q5_K: (QK_K, 2 + 2 + 12 + QK_K // 8 + QK_K // 2),
  GGMLType.Q6_K: (QK_K, QK_K // 2 + QK_K // 4 + QK_K // 16 + 2), GGMLType.Q8_K: (QK_K, 4 + QK_K + QK_K // 8),
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
  def numel(self) -> int: return math.prod(self.shape)

# ** helpers on (n_blocks, block_bytes) uint8 tensors **

_UINTS = {2: dtypes.uint16, 4: dtypes.uint32}

def _le(raw: Tensor, width: int) -> Tensor:
  """(..., k * width) bytes -> (..., k) little-endian unsigned words of `width` bytes. The words are put together
  with shifts, not a size-changing bitcast: two such bitcasts of slices of one buffer fused into a kernel read the same
  offset in the core today, and shifts fuse with the rest of the dequantisation anyway."""
  words = raw.reshape(*raw.shape[:-1], raw.shape[-1] // width, width)
  out = words[..., 0].cast(_UINTS[width])
  for i in range(1, width): out = out | (words[..., i].cast(_UINTS[width]) << (8 * i))
  return out

def _f16(blocks: Tensor, start: int) -> Tensor:
  """The float16 at byte `start` of every block, as a (n_blocks, 1) float32 column."""
  return _le(blocks[:, start:start + 2], 2).bitcast(dtypes.float16).cast(dtypes.float32)

def _u8(values: list[int], shape: tuple[int, ...], like: Tensor) -> Tensor:
  """A small uint8 constant tensor (shift amounts) on `like`'s device."""
  return Tensor(np.array(values, dtype=np.uint8).reshape(shape), device=like.device)

def _nibbles(qs: Tensor) -> Tensor:
  """(n, 16) bytes -> (n, 32) 4-bit values: element j < 16 is the low nibble of byte j, j + 16 its high nibble."""
  return Tensor.cat(qs & 0x0F, qs >> 4, dim=1)

def _bits32(qh: Tensor) -> Tensor:
  """(n, 4) bytes of a little-endian uint32 -> (n, 32) values 0/1: element i is bit i."""
  n = qh.shape[0]
  return ((qh.reshape(n, 4, 1) >> _u8(list(range(8)), (1, 1, 8), qh)) & 1).reshape(n, 32)

# ** 32-element block types **

def dequant_q4_0(blocks: Tensor) -> Tensor:
  return _f16(blocks, 0) * (_nibbles(blocks[:, 2:18]).cast(dtypes.float32) - 8.0)  # x = d * (q - 8)

def dequant_q4_1(blocks: Tensor) -> Tensor:
  return _f16(blocks, 0) * _nibbles(blocks[:, 4:20]).cast(dtypes.float32) + _f16(blocks, 2)  # x = d * q + m

def dequant_q5_0(blocks: Tensor) -> Tensor:
  q = _nibbles(blocks[:, 6:22]) | (_bits32(blocks[:, 2:6]) << 4)
  return _f16(blocks, 0) * (q.cast(dtypes.float32) - 16.0)  # x = d * (q - 16)

def dequant_q5_1(blocks: Tensor) -> Tensor:
  q = _nibbles(blocks[:, 8:24]) | (_bits32(blocks[:, 4:8]) << 4)
  return _f16(blocks, 0) * q.cast(dtypes.float32) + _f16(blocks, 2)  # x = d * q + m

def dequant_q8_0(blocks: Tensor) -> Tensor:
  return _f16(blocks, 0) * blocks[:, 2:34].bitcast(dtypes.int8).cast(dtypes.float32)  # x = d * q

# ** k-quants: 256-element super-blocks **

def _crumbs(qs: Tensor) -> Tensor:
  """(n, 64) bytes -> (n, 2, 4, 32) 2-bit values: half h, shift j (bits 2j..2j+1) of byte h*32 + l."""
  n = qs.shape[0]
  return (qs.reshape(n, 2, 1, 32) >> _u8([0, 2, 4, 6], (1, 1, 4, 1), qs)) & 3

def dequant_q2_k(blocks: Tensor) -> Tensor:
  # element h*128 + j*32 + k*16 + l uses sub-block h*8 + j*2 + k: x = d * (scale & 15) * q - dmin * (scale >> 4)
  n = blocks.shape[0]
  scales, q = blocks[:, 0:16], _crumbs(blocks[:, 16:80]).reshape(n, 16, 16).cast(dtypes.float32)
  d, dmin = _f16(blocks, 80), _f16(blocks, 82)
  scale, low = (d * (scales & 0x0F).cast(dtypes.float32)), (dmin * (scales >> 4).cast(dtypes.float32))
  return (scale.reshape(n, 16, 1) * q - low.reshape(n, 16, 1)).reshape(n, QK_K)

def _q3_k_scales(packed: Tensor) -> Tensor:
  """The 16 signed 6-bit scales of a Q3_K block from its 12 bytes: low 4 bits are the nibbles of bytes 0..7 (low
  nibbles first), high 2 bits come from bytes 8..11, scale 4s + t from bits 2s..2s+1 of byte 8 + t."""
  n = packed.shape[0]
  low = Tensor.cat(packed[:, 0:8] & 0x0F, packed[:, 0:8] >> 4, dim=1)
  high = ((packed[:, 8:12].reshape(n, 1, 4) >> _u8([0, 2, 4, 6], (1, 4, 1), packed)) & 3).reshape(n, 16)
  return (low | (high << 4)).cast(dtypes.float32) - 32.0

def dequant_q3_k(blocks: Tensor) -> Tensor:
  # element h*128 + j*32 + k*16 + l: 2 low bits from _crumbs, a high bit in hmask byte k*16 + l at bit h*4 + j, and
  # x = d * scale[h*8 + j*2 + k] * (q - (0 if the high bit is set else 4))
  n = blocks.shape[0]
  hmask = (blocks[:, 0:32].reshape(n, 1, 1, 32) >> _u8(list(range(8)), (1, 2, 4, 1), blocks)) & 1  # (n, 2, 4, 32)
  q = _crumbs(blocks[:, 32:96]).cast(dtypes.float32) - 4.0 + 4.0 * hmask.cast(dtypes.float32)
  scales = _f16(blocks, 108) * _q3_k_scales(blocks[:, 96:108])
  return (scales.reshape(n, 16, 1) * q.reshape(n, 16, 16)).reshape(n, QK_K)

def _k4_scales_mins(packed: Tensor) -> tuple[Tensor, Tensor]:
  """The 8 six-bit scales and mins of a Q4_K/Q5_K block from its 12 bytes (ggml's get_scale_min_k4): sub-block j < 4
  has scale byte j & 63 and min byte j+4 & 63; j >= 4 takes its low 4 bits from byte j+4 and its top 2 bits from the
  top bits of byte j-4 (scale) or byte j (min)."""
  first, second, third = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
  scales = Tensor.cat(first & 63, (third & 0x0F) | ((first >> 6) << 4), dim=1)
  mins = Tensor.cat(second & 63, (third >> 4) | ((second >> 6) << 4), dim=1)
  return scales.cast(dtypes.float32), mins.cast(dtypes.float32)

def _k4_nibbles(qs: Tensor) -> Tensor:
  """(n, 128) bytes -> (n, 8, 32): 4 chunks of 32 bytes, sub-block 2c the low nibbles of chunk c, 2c + 1 the high."""
  n = qs.shape[0]
  chunks = qs.reshape(n, 4, 1, 32)
  return Tensor.cat(chunks & 0x0F, chunks >> 4, dim=2).reshape(n, 8, 32)

def _k4_combine(blocks: Tensor, q: Tensor) -> Tensor:
  n = blocks.shape[0]
  scales, mins = _k4_scales_mins(blocks[:, 4:16])
  scale, low = (_f16(blocks, 0) * scales).reshape(n, 8, 1), (_f16(blocks, 2) * mins).reshape(n, 8, 1)
  return (scale * q.cast(dtypes.float32) - low).reshape(n, QK_K)  # x = d * scale * q - dmin * min

def dequant_q4_k(blocks: Tensor) -> Tensor:
  return _k4_combine(blocks, _k4_nibbles(blocks[:, 16:144]))

def dequant_q5_k(blocks: Tensor) -> Tensor:
  # the fifth bit of element l of sub-block s is bit s of qh byte l
  n = blocks.shape[0]
  high = (blocks[:, 16:48].reshape(n, 1, 32) >> _u8(list(range(8)), (1, 8, 1), blocks)) & 1  # (n, 8, 32)
  return _k4_combine(blocks, _k4_nibbles(blocks[:, 48:176]) | (high << 4))

def dequant_q6_k(blocks: Tensor) -> Tensor:
  # half h, quarter k, element l (index h*128 + k*32 + l): low 4 bits are nibble k>>1 of ql byte h*64 + (k&1)*32 + l,
  # high 2 bits are bits 2k..2k+1 of qh byte h*32 + l; x = d * scale[index // 16] * (q - 32), scales int8
  n = blocks.shape[0]
  ql = blocks[:, 0:128].reshape(n, 2, 1, 2, 32)  # (n, half, nibble, k & 1, l)
  low = Tensor.cat(ql & 0x0F, ql >> 4, dim=2).reshape(n, 2, 4, 32)
  high = (blocks[:, 128:192].reshape(n, 2, 1, 32) >> _u8([0, 2, 4, 6], (1, 1, 4, 1), blocks)) & 3
  q = (low | (high << 4)).cast(dtypes.float32) - 32.0
  scales = _f16(blocks, 208) * blocks[:, 192:208].bitcast(dtypes.int8).cast(dtypes.float32)
  return (scales.reshape(n, 16, 1) * q.reshape(n, 16, 16)).reshape(n, QK_K)

# ** plain floats **

def _dequant_f32(blocks: Tensor) -> Tensor: return _le(blocks, 4).bitcast(dtypes.float32)
def _dequant_f16(blocks: Tensor) -> Tensor: return _le(blocks, 2).bitcast(dtypes.float16).cast(dtypes.float32)
def _dequant_bf16(blocks: Tensor) -> Tensor:
  # bfloat16 is the top half of a float32
  return (_le(blocks, 2).cast(dtypes.uint32) << 16).bitcast(dtypes.float32)

DEQUANTIZERS: dict[GGMLType, Callable[[Tensor], Tensor]] = {
  GGMLType.F32: _dequant_f32, GGMLType.F16: _dequant_f16, GGMLType.BF16: _dequant_bf16,
  GGMLType.Q4_0: dequant_q4_0, GGMLType.Q4_1: dequant_q4_1, GGMLType.Q5_0: dequant_q5_0, GGMLType.Q5_1: dequant_q5_1,
  GGMLType.Q8_0: dequant_q8_0, GGMLType.Q2_K: dequant_q2_k, GGMLType.Q3_K: dequant_q3_k,
  GGMLType.Q4_K: dequant_q4_k, GGMLType.Q5_K: dequant_q5_k, GGMLType.Q6_K: dequant_q6_k,
}

def ggml_type(t: GGMLType | int | str) -> GGMLType:
  """A GGML type from its enum, id or name ("Q4_K")."""
  try: return GGMLType[t] if isinstance(t, str) else GGMLType(t)
  except (KeyError, ValueError) as e:
    raise GGUFError(f"unknown GGML tensor type {t!r}; known: {', '.join(x.name for x in GGMLType)}") from e

def tensor_nbytes(gtype: GGMLType, shape: tuple[int, ...]) -> int:
  """The bytes a tensor of `shape` takes in type `gtype`."""
  block_elems, block_bytes = BLOCK_LAYOUT[gtype]
  numel = math.prod(shape)
  if numel % block_elems:
    raise GGUFError(f"a {gtype.name} tensor of shape {shape} has {numel} elements, not a multiple of its block size "
                    f"{block_elems}")
  return numel // block_elems * block_bytes

def dequantize(raw: Tensor, gtype: GGMLType | int | str, shape: tuple[int, ...]) -> Tensor:
  """Raw GGUF tensor bytes (a uint8 Tensor of any shape) -> a lazy float32 Tensor of `shape` (numpy order), computed
  on `raw`'s device."""
  gt = ggml_type(gtype)
  if gt not in DEQUANTIZERS:
    names = ", ".join(t.name for t in DEQUANTIZERS)
    raise GGUFError(f"GGUF tensor type {gt.name} is not supported; supported: {names}")
  need = tensor_nbytes(gt, shape)
  if raw.dtype is not dtypes.uint8:
    raise GGUFError(f"dequantize needs the raw bytes as a uint8 tensor, got {raw.dtype!r}; use .bitcast(dtypes.uint8)")
  if raw.numel() != need:
    raise GGUFError(f"a {gt.name} tensor of shape {shape} needs {need} bytes, got {raw.numel()}")
  if need == 0: return Tensor.zeros(*shape, device=raw.device)
  block_bytes = BLOCK_LAYOUT[gt][1]
  return DEQUANTIZERS[gt](raw.reshape(need // block_bytes, block_bytes)).reshape(shape)

# ** the file **

class _Cursor:
  """Sequential little-endian reads over the memory-mapped header; every length is checked against the bytes left
  before it sizes a read or a loop, and errors name the field and its offset."""
  def __init__(self, buf: np.ndarray, path: str):
    self.buf, self.pos, self.path = buf, 0, path
  def error(self, what: str, why: str, at: int | None = None) -> GGUFError:
    return GGUFError(f"{self.path}: {what} at offset {self.pos if at is None else at}: {why}")
  def take(self, n: int, what: str) -> bytes:
    if n > self.buf.size - self.pos:
      raise self.error(what, f"the file is truncated (needs {n} bytes, {self.buf.size - self.pos} remain)")
    out = self.buf[self.pos:self.pos + n].tobytes()
    self.pos += n
    return out
  def scalar(self, vtype: GGUFValueType, what: str) -> Any:
    fmt = _SCALAR_FMT[vtype]
    return struct.unpack("<" + fmt, self.take(struct.calcsize(fmt), what))[0]
  def u32(self, what: str) -> int: return int(self.scalar(GGUFValueType.UINT32, what))
  def u64(self, what: str) -> int: return int(self.scalar(GGUFValueType.UINT64, what))
  def count(self, what: str, item_bytes: int) -> int:
    """A uint64 count of items of at least `item_bytes` each, refused when the rest of the file cannot hold them."""
    at = self.pos
    n = self.u64(what)
    if n * item_bytes > self.buf.size - self.pos:
      raise self.error(what, f"{n} items of at least {item_bytes} bytes do not fit in the {self.buf.size - self.pos} "
                       "bytes left; the file is truncated or corrupt", at)
    return n
  def string(self, what: str) -> str:
    at = self.pos
    raw = self.take(self.count(f"the length of {what}", 1), what)
    try: return raw.decode("utf-8")
    except UnicodeDecodeError as e: raise self.error(what, f"the string is not UTF-8 ({e.reason})", at) from e
  def strings(self, count: int, what: str) -> list[str]:
    """An array of `count` strings: the hot path of vocabularies and merges, read without per-item method calls."""
    mv, pos, size, out = self.buf.data, self.pos, self.buf.size, []
    for i in range(count):
      if pos + 8 > size: raise self.error(f"the length of {what}[{i}]", "the file is truncated", pos)
      n = int.from_bytes(mv[pos:pos + 8], "little")
      if n > size - pos - 8: raise self.error(f"{what}[{i}]", f"{n} bytes run past the end of the file", pos)
      try: out.append(str(mv[pos + 8:pos + 8 + n], "utf-8"))
      except UnicodeDecodeError as e:
        raise self.error(f"{what}[{i}]", f"the string is not UTF-8 ({e.reason})", pos) from e
      pos += 8 + n
    self.pos = pos
    return out
  def value_type(self, what: str) -> GGUFValueType:
    at, vtype = self.pos, self.u32(what)
    try: return GGUFValueType(vtype)
    except ValueError as e: raise self.error(what, f"unknown GGUF value type {vtype}", at) from e
  def value(self, vt: GGUFValueType, what: str, depth: int = 0) -> Any:
    if vt is GGUFValueType.STRING: return self.string(what)
    if vt is not GGUFValueType.ARRAY: return self.scalar(vt, what)
    etype = self.value_type(f"the element type of {what}")
    if etype is GGUFValueType.ARRAY and depth + 1 >= MAX_ARRAY_NESTING:
      raise self.error(what, f"arrays nest deeper than {MAX_ARRAY_NESTING} levels")
    count = self.count(f"the length of {what}", _MIN_BYTES[etype])
    if etype in _SCALAR_FMT:  # fixed-size elements: one vectorised read
      fmt = _SCALAR_FMT[etype]
      raw = self.take(count * struct.calcsize(fmt), what)
      return np.frombuffer(raw, dtype=np.dtype("<" + fmt)).tolist()
    if etype is GGUFValueType.STRING: return self.strings(count, what)
    return [self.value(etype, f"{what}[{i}]", depth + 1) for i in range(count)]

class GGUFFile:
  """A parsed, memory-mapped GGUF file.

  >>> f = GGUFFile("model.gguf")  # doctest: +SKIP
  >>> f.metadata["general.architecture"], f.tensor("token_embd.weight").shape  # doctest: +SKIP
  ('llama', (49152, 576))
  """
  def __init__(self, path: str | os.PathLike[str]):
    self.path = os.fspath(path)
    if not os.path.isfile(self.path): raise GGUFError(f"GGUF file {self.path!r} does not exist or is not a file")
    size = os.path.getsize(self.path)
    if size < 24: raise GGUFError(f"{self.path}: too small to be a GGUF file ({size} bytes)")
    try: self.mm = np.memmap(self.path, dtype=np.uint8, mode="r")
    except OSError as e: raise GGUFError(f"cannot read GGUF file {self.path!r}: {e.strerror}") from e
    cur = _Cursor(self.mm, self.path)
    magic = cur.take(4, "the magic")
    if magic != GGUF_MAGIC:
      raise GGUFError(f"{self.path}: not a GGUF file (magic {magic!r} at offset 0, expected {GGUF_MAGIC!r})")
    self.version = cur.u32("the version")
    if self.version not in SUPPORTED_VERSIONS:
      raise GGUFError(f"{self.path}: GGUF version {self.version} is not supported (the version at offset 4; "
                      f"supported: {SUPPORTED_VERSIONS}); re-convert the model with a current llama.cpp")
    n_tensors = cur.count("the tensor count", 24)  # name length, rank, type and offset at least
    n_kv = cur.count("the metadata count", 12)  # key length and value type at least
    self.metadata: dict[str, Any] = {}
    self.metadata_types: dict[str, GGUFValueType] = {}
    value_at: dict[str, int] = {}
    for i in range(n_kv):
      at = cur.pos
      key = cur.string(f"metadata key #{i}")
      if key in self.metadata: raise cur.error(f"metadata key {key!r}", "the key appears twice", at)
      vtype = cur.value_type(f"the type of {key!r}")
      value_at[key] = cur.pos
      self.metadata[key] = cur.value(vtype, repr(key))
      self.metadata_types[key] = vtype
    self.alignment = self._alignment(value_at.get("general.alignment", 0))
    entries: list[tuple[str, tuple[int, ...], GGMLType, int, int]] = []
    for i in range(n_tensors):
      at = cur.pos
      name = cur.string(f"tensor name #{i}")
      n_dims = cur.u32(f"the rank of tensor {name!r}")
      if n_dims > MAX_DIMS: raise cur.error(f"the rank of tensor {name!r}", f"{n_dims} > {MAX_DIMS} dimensions")
      dims = tuple(cur.u64(f"dim {d} of tensor {name!r}") for d in range(n_dims))
      shape = check_shape(GGUFError, f"{self.path}: tensor {name!r} at offset {at}, field dims", dims[::-1], 1)
      gtype = cur.u32(f"the type of tensor {name!r}")
      if gtype not in {t.value for t in GGMLType}:
        raise cur.error(f"the type of tensor {name!r}", f"unknown GGML type id {gtype}", cur.pos - 4)
      rel = cur.u64(f"the offset of tensor {name!r}")
      if rel % self.alignment:
        raise cur.error(f"the offset of tensor {name!r}", f"{rel} is not a multiple of the alignment "
                        f"{self.alignment}", cur.pos - 8)
      entries.append((name, shape, GGMLType(gtype), rel, at))
    self.data_offset = -(-cur.pos // self.alignment) * self.alignment
    self.tensors: dict[str, GGUFTensorInfo] = {}
    for name, shape, gtype, rel, at in entries:
      if name in self.tensors: raise GGUFError(f"{self.path}: tensor {name!r} at offset {at}: the name appears twice")
      block_elems = BLOCK_LAYOUT[gtype][0]
      if math.prod(shape) % block_elems:
        raise GGUFError(f"{self.path}: tensor {name!r} at offset {at}: its {math.prod(shape)} elements are not a "
                        f"multiple of the {gtype.name} block size {block_elems}")
      info = GGUFTensorInfo(name, shape, gtype, self.data_offset + rel, tensor_nbytes(gtype, shape))
      if info.offset + info.nbytes > size:
        raise GGUFError(f"{self.path}: tensor {name!r} ({gtype.name} {shape}) spans bytes {info.offset}.."
                        f"{info.offset + info.nbytes}, past the end of the file at offset {size}; the file is "
                        "truncated")
      self.tensors[name] = info
    check_disjoint(GGUFError, self.path, [(i.name, i.offset, i.offset + i.nbytes) for i in self.tensors.values()])

  def _alignment(self, at: int) -> int:
    if "general.alignment" not in self.metadata: return DEFAULT_ALIGNMENT
    value, vtype = self.metadata["general.alignment"], self.metadata_types["general.alignment"]
    if vtype is not GGUFValueType.UINT32 or value <= 0 or value & (value - 1):
      raise GGUFError(f"{self.path}: general.alignment (value at offset {at}) must be a uint32 power of two, got "
                      f"{vtype.name} {value!r:.50}")
    return int(value)

  def raw(self, name: str) -> np.ndarray:
    """The bytes of tensor `name` as a uint8 view of the memory map (no copy)."""
    info = self._info(name)
    return self.mm[info.offset:info.offset + info.nbytes]

  def raw_tensor(self, name: str, device: str | None = None) -> Tensor:
    """The bytes of tensor `name` as a lazy uint8 Tensor, read from the file to `device` when realized."""
    info = self._info(name)
    return Tensor.from_file(self.path, info.offset, (info.nbytes,), dtypes.uint8, device)

  def load(self, name: str, device: str | None = None) -> Tensor:
    """Tensor `name` as a lazy float32 Tensor of its shape, dequantised on `device` when realized."""
    info = self._info(name)
    return dequantize(self.raw_tensor(name, device), info.ggml_type, info.shape)

  def tensor(self, name: str, device: str | None = None) -> np.ndarray:
    """Tensor `name` dequantised (on `device`) to a float32 numpy array of its shape."""
    return self.load(name, device).numpy()

  def _info(self, name: str) -> GGUFTensorInfo:
    if name not in self.tensors: raise GGUFError(f"{self.path}: no tensor named {name!r} (it has "
      f"{len(self.tensors)} tensors)")
    return self.tensors[name]

  def type_counts(self) -> dict[str, int]:
    """How many tensors of each GGML type the file holds, e.g. {'Q4_1': 210, 'F32': 61}."""
    out: dict[str, int] = {}
    for info in self.tensors.values(): out[info.ggml_type.name] = out.get(info.ggml_type.name, 0) + 1
    return out

def gguf_load(path: str | os.PathLike[str], device: str | None = None) -> tuple[dict[str, Any], dict[str, Tensor]]:
  """(metadata, tensors) of a GGUF file: every tensor is lazy float32 of its numpy-order shape, its bytes copied from
  the memory-mapped file to `device` and dequantised there when it is realized.

  >>> metadata, weights = gguf_load("model.gguf")  # doctest: +SKIP
  >>> weights["token_embd.weight"].shape  # doctest: +SKIP
  (49152, 576)
  """
  f = GGUFFile(path)
  return dict(f.metadata), {name: f.load(name, device) for name in f.tensors}

def gguf_load_raw(path: str | os.PathLike[str], device: str | None = None
                  ) -> tuple[dict[str, Any], dict[str, Tensor], dict[str, GGUFTensorInfo]]:
  """(metadata, raw uint8 tensors on `device`, tensor infos): the bytes of each tensor, still quantised, lazily."""
  f = GGUFFile(path)
  return dict(f.metadata), {name: f.raw_tensor(name, device) for name in f.tensors}, dict(f.tensors)

__all__ = ["GGUFError", "GGUFFile", "GGUFTensorInfo", "GGUFValueType", "GGMLType", "BLOCK_LAYOUT", "DEQUANTIZERS",
           "dequantize", "gguf_load", "gguf_load_raw", "ggml_type", "tensor_nbytes"]
