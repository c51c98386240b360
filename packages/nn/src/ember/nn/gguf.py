"""GGUF weights for ember.nn: dequantisation on the device as tensor ops, and lazy loading of a file's tensors.

The header (metadata, tensor infos) is parsed by `ember.nn.llm.gguf.GGUFFile`; this module reads each tensor's bytes
through the DISK device (nothing is read until the tensor is realized) and turns them into float32 with bit operations
on uint8 tensors plus the blocks' float16 scales, so the work runs on whatever device the weights go to.

Block layouts (ggml's, little-endian; `d`, `m`, `dmin` are float16):
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
import os
from typing import Any, Callable
import numpy as np
from ember.device.base import Buffer
from ember.dtype import dtypes
from ember.schedule import attach_buffer
from ember.tensor import Tensor
from ember.uop.ops import BufferArg, Ops, UOp, next_unique
from ember.nn.llm.gguf import QK_K, GGMLType, GGUFError, GGUFFile, GGUFTensorInfo

# (elements per block, bytes per block) of every type dequantised here
BLOCK_LAYOUT: dict[GGMLType, tuple[int, int]] = {
  GGMLType.F32: (1, 4), GGMLType.F16: (1, 2), GGMLType.BF16: (1, 2),
  GGMLType.Q4_0: (32, 2 + 16), GGMLType.Q4_1: (32, 2 + 2 + 16), GGMLType.Q5_0: (32, 2 + 4 + 16),
  GGMLType.Q5_1: (32, 2 + 2 + 4 + 16), GGMLType.Q8_0: (32, 2 + 32),
  GGMLType.Q2_K: (QK_K, QK_K // 16 + QK_K // 4 + 2 + 2), GGMLType.Q3_K: (QK_K, QK_K // 8 + QK_K // 4 + 12 + 2),
  GGMLType.Q4_K: (QK_K, 2 + 2 + 12 + QK_K // 2), GGMLType.Q5_K: (QK_K, 2 + 2 + 12 + QK_K // 8 + QK_K // 2),
  GGMLType.Q6_K: (QK_K, QK_K // 2 + QK_K // 4 + QK_K // 16 + 2),
}

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
  if gtype not in BLOCK_LAYOUT:
    raise GGUFError(f"GGUF tensor type {gtype.name} is not supported; supported: "
                    f"{', '.join(t.name for t in BLOCK_LAYOUT)}")
  block_elems, block_bytes = BLOCK_LAYOUT[gtype]
  numel = int(np.prod(shape, dtype=np.int64))
  if numel % block_elems:
    raise GGUFError(f"a {gtype.name} tensor of shape {shape} has {numel} elements, not a multiple of its block size "
                    f"{block_elems}")
  return numel // block_elems * block_bytes

def dequantize(raw: Tensor, gtype: GGMLType | int | str, shape: tuple[int, ...]) -> Tensor:
  """Raw GGUF tensor bytes (a uint8 Tensor of any shape) -> a lazy float32 Tensor of `shape` (numpy order), computed
  on `raw`'s device."""
  gt = ggml_type(gtype)
  need = tensor_nbytes(gt, shape)
  if raw.dtype is not dtypes.uint8:
    raise GGUFError(f"dequantize needs the raw bytes as a uint8 tensor, got {raw.dtype!r}; use .bitcast(dtypes.uint8)")
  if raw.numel() != need:
    raise GGUFError(f"a {gt.name} tensor of shape {shape} needs {need} bytes, got {raw.numel()}")
  if need == 0: return Tensor.zeros(*shape, device=raw.device)
  block_bytes = BLOCK_LAYOUT[gt][1]
  return DEQUANTIZERS[gt](raw.reshape(need // block_bytes, block_bytes)).reshape(shape)

# ** files **

def _check_extent(path: str, size: int, info: GGUFTensorInfo, nbytes: int) -> None:
  if info.offset + nbytes > size:
    raise GGUFError(f"{path}: tensor {info.name!r} ({info.ggml_type.name} {info.shape}) spans bytes {info.offset}.."
                    f"{info.offset + nbytes}, past the end of the file at offset {size}; the file is truncated")

def gguf_load(path: str | os.PathLike[str], device: str | None = None) -> tuple[dict[str, Any], dict[str, Tensor]]:
  """(metadata, tensors) of a GGUF file: every tensor is lazy float32 of its numpy-order shape, its bytes copied from
  the memory-mapped file to `device` and dequantised there when it is realized.

  >>> metadata, weights = gguf_load("model.gguf")  # doctest: +SKIP
  >>> weights["token_embd.weight"].shape  # doctest: +SKIP
  (49152, 576)
  """
  raw = gguf_load_raw(path, device)
  meta, infos = raw[0], raw[2]
  return meta, {name: dequantize(t, infos[name].ggml_type, infos[name].shape) for name, t in raw[1].items()}

def gguf_load_raw(path: str | os.PathLike[str], device: str | None = None
                  ) -> tuple[dict[str, Any], dict[str, Tensor], dict[str, GGUFTensorInfo]]:
  """(metadata, raw uint8 tensors on `device`, tensor infos): the bytes of each tensor, still quantised, lazily."""
  reader = GGUFFile(path)
  fpath = os.path.abspath(reader.path)
  size = os.path.getsize(fpath)
  for info in reader.tensors.values(): _check_extent(reader.path, size, info, tensor_nbytes(info.ggml_type, info.shape))
  disk = f"disk:{fpath}"
  base = Buffer(disk, size, dtypes.uint8)
  out: dict[str, Tensor] = {}
  for name, info in reader.tensors.items():
    nbytes = tensor_nbytes(info.ggml_type, info.shape)
    if nbytes == 0:
      out[name] = Tensor.zeros(0, dtype=dtypes.uint8, device=device)
      continue
    uop = UOp(Ops.BUFFER, dtypes.uint8, (), BufferArg(next_unique(), disk, nbytes))
    attach_buffer(uop, Buffer(disk, nbytes, dtypes.uint8, base=base, offset=info.offset))
    out[name] = Tensor(uop).to(device)
  return dict(reader.metadata), out, dict(reader.tensors)

__all__ = ["GGUFError", "GGMLType", "BLOCK_LAYOUT", "DEQUANTIZERS", "dequantize", "gguf_load", "gguf_load_raw",
           "ggml_type", "tensor_nbytes"]
