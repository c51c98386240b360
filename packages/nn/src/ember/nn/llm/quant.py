"""Weight matrices kept quantised on the device, dequantised inside the matmul kernel.

Every GGML block type becomes one layout here: an (out, in) matrix in blocks of 32 along `in`, element e of a block
an unsigned code c_e (at most 8 bits) with value s·c_e + m, where the scale s and offset m (float32) are per block of
32, or per half block (16 elements) for the types whose sub-blocks are 16 long (Q2_K, Q3_K, Q6_K). The codes are read
from the GGUF blocks on the host once, at load (`block_codes`), and packed for the kernel:

  nib  (out, in/32, 16) uint8   low 4 bits of c_j in the low nibble of byte j, of c_{j+16} in its high nibble
  high (out, in/32, 8) uint8    bits 4..5 of the codes (5- and 6-bit types): byte i holds those of c_i, c_{i+16},
                                c_{i+8}, c_{i+24} at bits 0, 2, 4, 6
  q    (out, in/32, 32) uint8   8-bit codes (Q8_0: the int8 quant + 128; gcc vectorises unsigned byte loads)

so lane j of a block (j < 16) multiplies elements j and j+16, which share a byte. Bits per weight stay close to the
file's: Q4_K 4 + 2 (scale and offset per 32) instead of 4.5, Q6_K 6 + 2 instead of 6.56, Q4_1 and Q8_0 as in the file.
F16 and BF16 matrices stay 16-bit (`HalfWeight`) and are widened inside the matmul.

With QDOT=1, decode matvecs of 4-bit codes with one scale per block (Q4_0, Q4_1, Q4_K) and of 8-bit ones (Q8_0) run
on QDOT (`UOp.qdot`) where the device's renderer has it: the activations quantised per block of 32 to int8 planes
(`quantise_activations`, ACT_PLANES of them), each block's codes times them as integer dot products (vpdpbusd on
x86 with VNNI).
"""
from __future__ import annotations
import numpy as np
from ember import Device, Tensor, UOp, dtypes
from ember.plugin import QDOT, QDOT_PLANE, AddrSpace, AxisType, KernelInfo, LLVMRenderer, Ops
from ember.errors import EmberError, ShapeError
from ember.nn.gguf import BLOCK_LAYOUT, QK_K, GGMLType

BLOCK = 32
DENSE_ROWS = 16  # a matmul of this many rows or more dequantises the matrix first (QuantWeight.matmul)
# int8 planes of the activations a decode matvec multiplies the codes with (QuantWeight.qdot): llama.cpp's one plane
# leaves an error of up to 1/254 of a block's largest value in every activation, which over SmolLM2's 30 layers moved
# its logits by up to 2 and changed its greedy replies; each further plane (the remainder, QDOT_PLANE = 254 times
# finer) divides that by 254: three carry float32's 24 bits of the block's largest value, so decode matches the float
# matmul
ACT_PLANES = 3
# QDOT=1 (ember.plugin.QDOT): decode matvecs run on QDOT (`QuantWeight.qdot_ok`). Off by default: on the 2-core
# development VM, loaded, a decode step ran at 0.92-1.3x (median 0.96x) the fused float matvec's speed, the matvecs
# being bound by memory there and the quantiser's kernels costing what QDOT saves (docs/llm.md)
DENSE_PIECE = 1 << 20  # at most this many elements of a matrix are dequantised into one temporary (QuantWeight.pieces)

class QuantError(EmberError, ValueError):
  """A matrix cannot be kept quantised in this layout (its input dim is not a multiple of the block)."""

def _f16(blocks: np.ndarray, start: int) -> np.ndarray:
  """The float16 at byte `start` of every block, (n, 1) float32."""
  return blocks[:, start:start + 2].copy().view(np.float16).astype(np.float32)

def _nibbles(qs: np.ndarray) -> np.ndarray:
  """(n, 16) bytes -> (n, 32): element j < 16 the low nibble of byte j, j + 16 its high nibble."""
  return np.concatenate([qs & 15, qs >> 4], axis=1)

def _bits(qh: np.ndarray, count: int) -> np.ndarray:
  """(n, count/8) bytes of a little-endian bit string -> (n, count) values 0/1, element i bit i."""
  return np.unpackbits(qh, axis=1, bitorder="little")[:, :count]

def _crumbs(qs: np.ndarray) -> np.ndarray:
  """(n, 64) bytes -> (n, 256) 2-bit values: element h*128 + j*32 + l is bits 2j..2j+1 of byte h*32 + l."""
  n = qs.shape[0]
  return ((qs.reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)) & 3).reshape(n, QK_K)

def _k4_scales_mins(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """ggml's get_scale_min_k4 for all 8 sub-blocks of Q4_K/Q5_K blocks: (n, 8) scales and mins."""
  first, second, third = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
  scales = np.concatenate([first & 63, (third & 15) | ((first >> 6) << 4)], axis=1)
  mins = np.concatenate([second & 63, (third >> 4) | ((second >> 6) << 4)], axis=1)
  return scales.astype(np.float32), mins.astype(np.float32)

def _k4_nibbles(qs: np.ndarray) -> np.ndarray:
  """(n, 128) bytes -> (n, 256): chunk c of 32 bytes gives sub-block 2c its low nibbles and 2c + 1 its high ones."""
  n = qs.shape[0]
  chunks = qs.reshape(n, 4, 1, 32)
  return np.concatenate([chunks & 15, chunks >> 4], axis=2).reshape(n, QK_K)

def _per(values: np.ndarray, size: int) -> np.ndarray:
  """Per-group values (n, groups) repeated over their `size` elements: (n, groups * size)."""
  return np.repeat(values, size, axis=1)

def _q3_k_scales(packed: np.ndarray) -> np.ndarray:
  n = packed.shape[0]
  low = np.concatenate([packed[:, 0:8] & 15, packed[:, 0:8] >> 4], axis=1)
  high = ((packed[:, 8:12].reshape(n, 1, 4) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 4, 1)) & 3).reshape(n, 16)
  return (low | (high << 4)).astype(np.float32) - 32.0

def _decode(gtype: GGMLType, b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | int, int]:
  """(codes (n, E) uint8, scale (n, E/g), offset, group size g) of n blocks of E elements each; the offset is an
  (n, E/g) array (value = scale * code + offset) or an int zero point z (value = scale * (code - z))."""
  if gtype is GGMLType.Q4_0:
    return _nibbles(b[:, 2:18]), _f16(b, 0), 8, 32
  if gtype is GGMLType.Q4_1: return _nibbles(b[:, 4:20]), _f16(b, 0), _f16(b, 2), 32
  if gtype is GGMLType.Q5_0: return _nibbles(b[:, 6:22]) | (_bits(b[:, 2:6], 32) << 4), _f16(b, 0), 16, 32
  if gtype is GGMLType.Q5_1: return _nibbles(b[:, 8:24]) | (_bits(b[:, 4:8], 32) << 4), _f16(b, 0), _f16(b, 2), 32
  if gtype is GGMLType.Q8_0: return b[:, 2:34] ^ np.uint8(0x80), _f16(b, 0), 128, 32  # int8 two's complement + 128
  if gtype is GGMLType.Q2_K:
    sc, d, dmin = b[:, 0:16], _f16(b, 80), _f16(b, 82)
    return _crumbs(b[:, 16:80]), d * (sc & 15).astype(np.float32), -dmin * (sc >> 4).astype(np.float32), 16
  if gtype is GGMLType.Q3_K:
    n = b.shape[0]
    hbit = (b[:, 0:32].reshape(n, 1, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 2, 4, 1)) & 1
    return _crumbs(b[:, 32:96]) | (hbit.reshape(n, QK_K) << 2), _f16(b, 108) * _q3_k_scales(b[:, 96:108]), 4, 16
  if gtype in (GGMLType.Q4_K, GGMLType.Q5_K):
    scales, mins = _k4_scales_mins(b[:, 4:16])
    scale, offset = _f16(b, 0) * scales, -_f16(b, 2) * mins
    if gtype is GGMLType.Q4_K: return _k4_nibbles(b[:, 16:144]), scale, offset, 32
    n = b.shape[0]
    high = (b[:, 16:48].reshape(n, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)) & 1  # bit s of byte l
    return _k4_nibbles(b[:, 48:176]) | (high.reshape(n, QK_K) << 4), scale, offset, 32
  if gtype is GGMLType.Q6_K:
    n = b.shape[0]
    ql = b[:, 0:128].reshape(n, 2, 1, 2, 32)  # (n, half, nibble, quarter & 1, l)
    low = np.concatenate([ql & 15, ql >> 4], axis=2).reshape(n, 2, 4, 32)
    high = (b[:, 128:192].reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)) & 3
    scale = _f16(b, 208) * b[:, 192:208].view(np.int8).astype(np.float32)
    return (low | (high << 4)).reshape(n, QK_K), scale, 32, 16
  raise QuantError(f"GGML type {gtype.name} has no kept-quantised layout; kept: {', '.join(t.name for t in KEPT)}")

KEPT = (GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q8_0, GGMLType.Q2_K, GGMLType.Q3_K,
        GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K)
HALF = (GGMLType.F16, GGMLType.BF16)
CODE_BITS = {GGMLType.Q4_0: 4, GGMLType.Q4_1: 4, GGMLType.Q5_0: 5, GGMLType.Q5_1: 5, GGMLType.Q8_0: 8,
             GGMLType.Q2_K: 2, GGMLType.Q3_K: 3, GGMLType.Q4_K: 4, GGMLType.Q5_K: 5, GGMLType.Q6_K: 6}

def block_codes(gtype: GGMLType, raw: np.ndarray, shape: tuple[int, int]
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray | int]:
  """The codes (out, in/32, 32) uint8, per-group scale (out, in/32, 1 or 2) float32 and offset (the same shape, or an
  int zero point) of a matrix's raw GGUF bytes: element e of block b of row r is s * codes[r, b, e] + o, or
  s * (codes[r, b, e] - zero), with s = scale[r, b, e // g'] and o = offset[r, b, e // g'] (g' = 32 or 16)."""
  out_dim, in_dim = shape
  per_block, block_bytes = BLOCK_LAYOUT[gtype]
  if in_dim % max(per_block, BLOCK):
    raise QuantError(f"a {gtype.name} matrix of shape {shape} cannot stay quantised: its input dim must be a multiple "
                     f"of {max(per_block, BLOCK)}")
  blocks = np.asarray(raw, np.uint8).reshape(-1, block_bytes)
  codes, scale, offset, group = _decode(gtype, blocks)
  groups = (out_dim, in_dim // BLOCK, BLOCK // group)  # 1 or 2 groups per block of 32
  if not isinstance(offset, int): offset = offset.reshape(groups).astype(np.float32)
  codes = codes.astype(np.uint8).reshape(out_dim, in_dim // BLOCK, BLOCK)
  return codes, scale.reshape(groups).astype(np.float32), offset

class QuantWeight:
  """An (out, in) matrix of a GGML block type kept in the packed layout of this module (`nib`/`high` or `q`, with
  `scale` and an `offset` or zero point), dequantised inside the matmul."""
  def __init__(self, ggml_type: GGMLType, raw: np.ndarray, shape: tuple[int, int], device: str | None):
    self.ggml_type, self.shape = ggml_type, shape
    codes, scale, offset = block_codes(ggml_type, raw, shape)
    self.bits = CODE_BITS[ggml_type]
    self.zero = offset if isinstance(offset, int) else 0
    arrays: dict[str, np.ndarray] = {"scale": scale}
    if not isinstance(offset, int): arrays["offset"] = offset
    if self.bits == 8: arrays["q"] = codes
    else:
      arrays["nib"] = (codes[..., :16] & 15) | ((codes[..., 16:] & 15) << 4)
      if self.bits > 4:
        h = codes >> 4
        arrays["high"] = h[..., 0:8] | (h[..., 16:24] << 2) | (h[..., 8:16] << 4) | (h[..., 24:32] << 6)
    self.nbytes = sum(a.nbytes for a in arrays.values())  # read per use
    self.tensors = {k: Tensor(np.ascontiguousarray(a), device=device).realize() for k, a in arrays.items()}

  def _lanes(self) -> tuple[Tensor, Tensor]:
    """The values (code - zero point) of elements j and j + 16 of every block as float32 (out, in/32, 16) each."""
    t = self.tensors
    if self.bits == 8:
      qf = t["q"].cast(dtypes.int32).cast(dtypes.float32) - float(self.zero)
      return qf[..., :16], qf[..., 16:]
    qi = t["nib"].cast(dtypes.int32)
    lo, hi = qi & 15, qi >> 4
    if "high" in t:
      hb = t["high"].cast(dtypes.int32)
      lo = lo | (Tensor.cat(hb & 3, (hb >> 4) & 3, dim=-1) << 4)
      hi = hi | (Tensor.cat((hb >> 2) & 3, hb >> 6, dim=-1) << 4)
    lo_f, hi_f = lo.cast(dtypes.float32), hi.cast(dtypes.float32)
    return (lo_f - float(self.zero), hi_f - float(self.zero)) if self.zero else (lo_f, hi_f)

  def dense(self, rows: tuple[int, int] | None = None) -> Tensor:
    """The matrix (or its output rows [start, stop)) dequantised to float32 (rows, in), stored: one kernel writing
    (rows, blocks, 2, 16) in order (the lanes j and j + 16 of a block side by side), which the flat (rows, in) view
    reads without index math."""
    start, stop = rows if rows is not None else (0, self.shape[0])
    nb = self.shape[1] // BLOCK
    scale, offset = self.tensors["scale"][start:stop], self.tensors.get("offset")
    group = (stop - start, nb, scale.shape[-1], 1)  # the scale of half h of a block: its own (Q*_K halves) or the
    # block's
    lo, hi = self._lanes()
    values = Tensor.stack(lo[start:stop], hi[start:stop], dim=2) * scale.reshape(group)  # (rows, blocks, 2, 16)
    if offset is not None: values = values + offset[start:stop].reshape(group)
    return values.contiguous().reshape(stop - start, self.shape[1])

  def pieces(self) -> list[tuple[int, int]]:
    """The output-row ranges a prefill matmul dequantises one at a time: pieces of at most DENSE_PIECE elements (one
    row where a row is longer), of one size where the rows allow. The memory planner gives a temporary the memory of
    a dead one of the same size only, so SmolLM2's (3072, 576) gate|up and (576, 1536) down now share 3.5 MB
    temporaries where gate|up held 7 MB ones of its own (a 128-token prefill's temporaries 52 -> 38 MiB)."""
    out_dim, in_dim = self.shape
    least = -(-out_dim // max(1, DENSE_PIECE // in_dim))  # pieces of at most DENSE_PIECE // in_dim rows
    # equal pieces where a count up to twice that divides the rows, else pieces of two sizes one row apart
    n = next((k for k in range(least, min(2 * least, out_dim) + 1) if out_dim % k == 0), least)
    return [(i * out_dim // n, (i + 1) * out_dim // n) for i in range(n)]

  def qdot_ok(self) -> bool:
    """Whether decode runs on QDOT: with QDOT=1, for 4-bit codes with one scale per block (Q4_0, Q4_1, Q4_K) or 8-bit
    ones (Q8_0), on a device whose renderer has it."""
    plain = self.bits == 8 or (self.bits == 4 and self.tensors["scale"].shape[-1] == 1)
    return bool(QDOT.value) and plain and Device[self.tensors["scale"].device].renderer.has_qdot

  def qdot(self, xq: tuple[Tensor, Tensor, Tensor], add: Tensor | None = None) -> Tensor:
    """The matvec of quantised activations (`quantise_activations` of x (T, in)) as one kernel of QDOTs: a loop over
    the output rows (split over the CPU's threads), the T activation vectors inside. Returns (T, out) float32, plus
    `add` (T, out) where given (a residual, added in the same kernel)."""
    (T, width), (out_dim, in_dim) = xq[0].shape, self.shape
    if not (isinstance(T, int) and isinstance(width, int)):
      raise ShapeError(f"QuantWeight.qdot needs concrete activation sizes, got {xq[0].shape}")
    nb, bits, zero, t, planes = in_dim // BLOCK, self.bits, self.zero, self.tensors, width // in_dim
    codes, offset = t["q" if bits == 8 else "nib"], t.get("offset")
    extra = [e for e in (offset, add) if e is not None]
    def kernel(out: UOp, codes: UOp, scale: UOp, q: UOp, d: UOp, s: UOp, *extra: UOp) -> UOp:
      row, i = UOp.range(out_dim, 0, AxisType.GLOBAL), UOp.range(T, 1, AxisType.LOOP)
      value = UOp.qdot(codes[row, 0, 0], scale[row, 0, 0], q[i, 0], d[i, 0], s[i, 0], nb, bits, zero,
                       extra[0][row, 0, 0] if offset is not None else None, planes)
      if add is not None: value = value + extra[-1][i, row]
      return out[i, row].store(value).end(i, row).sink(arg=KernelInfo(name=f"qdot{bits}x{planes}_{T}_{out_dim}_{nb}"))
    out = Tensor.empty(T, out_dim, device=codes.device, dtype=dtypes.float32)
    return Tensor.custom_kernel(out, codes, t["scale"], *xq, *extra, fxn=kernel)[0]

  def matvec(self, x: Tensor, scale: Tensor | None = None, add: Tensor | None = None) -> Tensor:
    """(x (T, in) * scale (in,)) @ W.T + add (T, out) -> (T, out) float32 as one hand-written kernel (`matvec_kernel`):
    the decode matvec where `fused_matvec` says so. The lane sums, the norm weight and the residual add are in it,
    where the scheduled form is two kernels (a lane-sum kernel on one thread, ~12 us) and x's block is reloaded per
    row: SmolLM2's decode went from 14-15 to 19-25 tokens/s on the loaded 2-core VM (alternating runs, load 3.7-4.4)."""
    T, out_dim = x.shape[0], self.shape[0]
    if not isinstance(T, int): raise ShapeError(f"QuantWeight.matvec needs a concrete row count, got {x.shape}")
    t = self.tensors
    codes = [t["q"]] if self.bits == 8 else [t["nib"], *([t["high"]] if "high" in t else [])]
    extra = [e for e in (scale, t.get("offset"), add) if e is not None]
    rows = next(r for r in MATVEC_ROWS if out_dim % r == 0)
    def kernel(out: UOp, x: UOp, *bufs: UOp) -> UOp:
      rest = iter(bufs[len(codes) + 1:])
      g, offset, summand = (next(rest) if e is not None else None for e in (scale, t.get("offset"), add))
      return matvec_kernel(out, x, bufs[:len(codes)], bufs[len(codes)], g, offset, summand, self.bits, self.zero, rows)
    out = Tensor.empty(T, out_dim, device=t["scale"].device, dtype=dtypes.float32)
    return Tensor.custom_kernel(out, x.cast(dtypes.float32), *codes, t["scale"], *extra, fxn=kernel)[0]

  def matmul(self, x: Tensor, scale: Tensor | None = None, add: Tensor | None = None) -> Tensor:
    """(x (T, in) * scale (in,)) @ W.T + add (T, out) -> (T, out), stored where `add` is given (`scale` and `add` are
    optional: a norm's weight and a residual, fused into the kernels). For T >= DENSE_ROWS (prefill chunks) the matrix
    is dequantised once, in `pieces` of rows, into float32 temporaries and multiplied by the packed, register-blocked
    matmul: the fused form below dequantises every weight again for each of the T rows (32 x 3072 x 576 on one core:
    7.7 ms fused, 4.1 ms dequantised first; 128 rows: 25 ms and 7.5 ms). Otherwise (decode), where `qdot_ok`, x is
    quantised to int8 (`quantise_activations`) and multiplied with the codes by integer dot products (`qdot`); where
    `fused_matvec`, it is one hand-written kernel (`matvec`). Elsewhere the dequantisation is fused into the reduce:
    per block the scale multiplies the dot product of x with the codes and the offset the block's sum of x; the first
    kernel keeps one partial sum per lane of 16 over the blocks (gcc turns them into one vector accumulator), the
    second sums the lanes."""
    T, nb = x.shape[0], self.shape[1] // BLOCK
    if isinstance(T, int) and T < DENSE_ROWS and self.qdot_ok(): return self.qdot(quantise_activations(x, scale), add)
    if isinstance(T, int) and T < DENSE_ROWS and fused_matvec(x.device): return self.matvec(x, scale, add)
    if scale is not None: x = x * scale
    if isinstance(T, int) and T >= DENSE_ROWS:
      parts = [x @ self.dense(rows).T for rows in self.pieces()]
      return stored_sum(parts[0] if len(parts) == 1 else Tensor.cat(*parts, dim=-1), add)
    xb = x.reshape(T, 1, nb, BLOCK)  # (T, 1, blocks, 32) broadcasts against the weight's (out, blocks, ...)
    xl, xh = xb[..., :16], xb[..., 16:]
    lo, hi = self._lanes()
    scale, offset = self.tensors["scale"], self.tensors.get("offset")
    if scale.shape[-1] == 1:
      lanes = (xl * lo + xh * hi) * scale
      if offset is not None: lanes = lanes + (xl + xh) * offset
    else:
      lanes = xl * lo * scale[..., 0:1] + xh * hi * scale[..., 1:2]
      if offset is not None: lanes = lanes + xl * offset[..., 0:1] + xh * offset[..., 1:2]
    return stored_sum(lanes.sum(-2).sum(-1), add)  # (T, out, 16) partial sums over the blocks, then (T, out)

MATVEC_ROWS = (4, 2, 1)  # output rows per iteration of a decode matvec (`matvec_kernel`): the largest dividing out

def _code_lanes(codes: tuple[UOp, ...], row: UOp, b: UOp, bits: int, zero: int) -> tuple[list[UOp], list[UOp]]:
  """The codes (minus the zero point where it folds into nothing else) of elements j and j + 16 of block b of `row`
  as float32 UOps, j = 0..15 (the layout of `QuantWeight`: `q`, or `nib` and `high`)."""
  if bits == 8:
    q = [codes[0][row, b, e].cast(dtypes.int32) for e in range(BLOCK)]
    return [c.cast(dtypes.float32) for c in q[:16]], [c.cast(dtypes.float32) for c in q[16:]]
  nib = [codes[0][row, b, j].cast(dtypes.int32) for j in range(16)]
  lo, hi = [n & 15 for n in nib], [n >> 4 for n in nib]
  if len(codes) > 1:  # bits 4..5: byte i of `high` holds those of c_i, c_i+16, c_i+8, c_i+24 at bits 0, 2, 4, 6
    hb = [codes[1][row, b, i].cast(dtypes.int32) for i in range(8)]
    lo = [c | (((hb[j % 8] >> (4 * (j // 8))) & 3) << 4) for j, c in enumerate(lo)]
    hi = [c | (((hb[j % 8] >> (2 + 4 * (j // 8))) & 3) << 4) for j, c in enumerate(hi)]
  return [c.cast(dtypes.float32) for c in lo], [c.cast(dtypes.float32) for c in hi]

def _ints(shape: tuple[int | UOp, ...]) -> tuple[int, ...]:
  """A shape of constant sizes (a decode matvec's buffers have fixed sizes)."""
  ints = tuple(d for d in shape if isinstance(d, int))
  if len(ints) != len(shape): raise ShapeError(f"matvec_kernel needs constant sizes, got {shape}")
  return ints

def matvec_kernel(out: UOp, x: UOp, codes: tuple[UOp, ...], scale: UOp, g: UOp | None, offset: UOp | None,
                  add: UOp | None, bits: int, zero: int, rows: int) -> UOp:
  """out (T, O) <- (x (T, I) * g) @ W.T + add for W in `QuantWeight`'s layout: the codes (`q`, or `nib` and `high`
  where there are 5 or 6 bits), scale (O, I/32, G) and offset (O, I/32, G) or zero point; the norm weight g (I,), the
  offset and the residual `add` (T, O) where given. One loop over `rows` output rows at a time (split over the
  threads), the T rows of x inside, the blocks of 32 innermost: per block and row, the codes widened to float (16 lanes
  for elements j and j + 16) times x's, times the scale, plus the offset times x's lanes, into 16 partial sums per row
  (one vector accumulator: a row's codes are consecutive bytes), summed by a halving tree at the end, plus `add`."""
  T, O = _ints(out.shape)
  nb, groups = _ints(x.shape)[1] // BLOCK, _ints(scale.shape)[2]
  r, i, b = UOp.range(O // rows, 0, AxisType.GLOBAL), UOp.range(T, 1), UOp.range(nb, 2)
  acc = UOp.placeholder((rows, 16), dtypes.float32, 0, AddrSpace.REG)
  init = UOp.group(*(acc[k, j].store(0.0) for k in range(rows) for j in range(16)))  # row by row: each row a vector
  def xv(e: int) -> UOp: return x[i, b * BLOCK + e] * g[b * BLOCK + e] if g is not None else x[i, b * BLOCK + e]
  xl, xh = [xv(j) for j in range(16)], [xv(16 + j) for j in range(16)]
  updates = []
  band = O // rows  # row k of iteration r is r + k * band: rows of one iteration a band apart, so that their
  # stores are no run for the lane groups to join across rows (each row's 16 partial sums are one vector)
  for k in range(rows):
    row = r + k * band
    lo, hi = _code_lanes(codes, row, b, bits, zero)
    s = [scale[row, b, h] for h in range(groups)]
    # per group, the offset: its own, or -zero * scale (s * (c - zero) = s * c + o), or none
    o = [offset[row, b, h] for h in range(groups)] if offset is not None else [v * float(-zero) for v in s if zero]
    for j in range(16):
      if groups == 1:
        part = (lo[j] * xl[j] + hi[j] * xh[j]) * s[0]
        if o: part = part + (xl[j] + xh[j]) * o[0]
      else:
        part = lo[j] * xl[j] * s[0] + hi[j] * xh[j] * s[1]
        if o: part = part + xl[j] * o[0] + xh[j] * o[1]
      updates.append(acc[k, j].store(acc.after(init)[k, j] + part))
  summed = UOp.group(*updates).end(b)
  stores = []
  for k in range(rows):
    total, row = _halving([acc.after(summed)[k, j] for j in range(16)]), r + k * band
    stores.append(out[i, row].store(total + add[i, row] if add is not None else total))
  return UOp.group(init, summed, *stores).end(i, r).sink(arg=KernelInfo(name=f"matvec{bits}_{T}_{O}_{nb}"))

def _halving(parts: list[UOp]) -> UOp:
  """The sum of parts by a halving tree (parts[i] + parts[i + half]), the form vector registers add in."""
  while len(parts) > 1:
    half = len(parts) // 2
    parts = [parts[i] + parts[i + half] for i in range(half)] + parts[2 * half:]
  return parts[0]

def fused_matvec(device: str | tuple[str, ...]) -> bool:
  """Whether decode matvecs on `device` run as `matvec_kernel`: where kernels run their blocks as loops and the C
  renderer prints lane groups as vectors (CPU's C renderer, and PYTHON), as `fused_decode_attention`."""
  if not isinstance(device, str): return False
  renderer = Device[device].renderer
  return not renderer.has_local and not isinstance(renderer, LLVMRenderer)

def stored_sum(y: Tensor, add: Tensor | None) -> Tensor:
  """A matmul's result with its residual added, stored (the residual stream is stored after each add: left lazy, every
  later kernel would re-add all earlier parts)."""
  return y if add is None else (add + y).contiguous()

def _round_away(v: UOp) -> UOp:
  """Round to the nearest integer, halves away from zero (C's roundf), as int8 (|v| <= 127.5)."""
  return (v < 0.0).where(v - 0.5, v + 0.5).cast(dtypes.int8)

def quantise_activations(x: Tensor, scale: Tensor | None = None, planes: int = ACT_PLANES
                         ) -> tuple[Tensor, Tensor, Tensor]:
  """x (T, n), times `scale` (n,) where given (in the same kernel), as QDOT's int8 activations, per block of 32: the
  scale d = max|x| / 127, the codes q0 = round(x / d) (halves away from zero; all 0 where the block is 0), each
  further plane the remainder's q_p = round(r_p) (r_1 = 254 * (x / d - q0), r_p+1 = 254 * (r_p - q_p): within
  +-127), and the block's sum s = d * sum_p sum(q_p) / 254**p. One kernel, a loop over the blocks. Returns q (T, n *
  planes) int8 (block b's plane p at 32 * (planes * b + p)), d and s (T, n/32) float32."""
  T, n = x.shape
  nb = n // BLOCK
  blocks = T * nb
  def quantise(q: UOp, d: UOp, s: UOp, x: UOp, *g: UOp) -> UOp:
    q, d, s, x = q.reshape(blocks, planes, BLOCK), d.reshape(blocks), s.reshape(blocks), x.reshape(blocks, BLOCK)
    b, j = UOp.range(blocks, 0, AxisType.GLOBAL), UOp.range(BLOCK, 1, AxisType.REDUCE)
    def value_at(e: UOp) -> UOp:
      return x[b, e].load() * g[0].reshape(nb, BLOCK)[b % nb, e].load() if g else x[b, e].load()
    amax = value_at(j).maximum(-value_at(j)).reduce(j, arg=Ops.MAX)
    inv = (amax > 0.0).where(127.0 / amax, 0.0)
    def codes(k: UOp) -> list[UOp]:
      rest, out = value_at(k) * inv, list[UOp]()
      for p in range(planes):  # each plane the remainder of those before, QDOT_PLANE times finer
        if p: rest = (rest - out[-1].cast(dtypes.float32)) * float(QDOT_PLANE)
        out.append(_round_away(rest))
      return out
    k, m = UOp.range(BLOCK, 2, AxisType.LOOP), UOp.range(BLOCK, 3, AxisType.REDUCE)
    value = UOp.const(dtypes.float32, 0.0)
    for p, c in enumerate(codes(m)): value = value + c.cast(dtypes.float32) * (1.0 / QDOT_PLANE ** p)
    scale = amax / 127.0
    stores = [q[b, p, k].store(c) for p, c in enumerate(codes(k))]
    stmts = UOp.group(UOp.group(*stores).end(k), d[b].store(scale), s[b].store(scale * value.reduce(m)))
    return stmts.end(b).sink(arg=KernelInfo(name=f"quantise_q8x{planes}_{blocks}"))
  q, d, s = (Tensor.empty(T, size, dtype=dt, device=x.device)
             for size, dt in ((n * planes, dtypes.int8), (nb, dtypes.float32), (nb, dtypes.float32)))
  g = [] if scale is None else [scale.cast(dtypes.float32)]
  q, d, s, *_ = Tensor.custom_kernel(q, d, s, x.cast(dtypes.float32), *g, fxn=quantise)
  return q, d, s

class HalfWeight:
  """An (out, in) F16 or BF16 matrix kept as its 16-bit words and widened to float32 inside the matmul."""
  def __init__(self, ggml_type: GGMLType, raw: np.ndarray, shape: tuple[int, int], device: str | None):
    self.ggml_type, self.shape = ggml_type, shape
    words = np.asarray(raw, np.uint8).view(np.uint16).reshape(shape)
    self.nbytes = words.nbytes
    self.w = Tensor(np.ascontiguousarray(words), device=device).realize()

  def matmul(self, x: Tensor, scale: Tensor | None = None, add: Tensor | None = None) -> Tensor:
    """(x * scale) @ W.T + add, as QuantWeight.matmul."""
    if self.ggml_type is GGMLType.BF16: w = (self.w.cast(dtypes.uint32) << 16).bitcast(dtypes.float32)
    else: w = self.w.bitcast(dtypes.float16).cast(dtypes.float32)
    return stored_sum((x if scale is None else x * scale) @ w.T, add)
