"""Tensor cores: matmul-like kernels on the warp-level matrix instructions of GPUs (NVIDIA mma.sync, AMD WMMA and
MFMA, Apple simdgroup matrices).

A matrix instruction computes D = A @ B on small tiles (A is M x K, B is K x N, D is M x N) with all the lanes of a
warp at once. Each lane holds a *fragment*: some elements of A and of B in its registers, and it gets some elements of
D back. Which ones is the instruction's documented layout, `TensorCore.a/b/c`: (lane, element) -> (row, col).

`apply_tensor_cores` rewrites a kernel of the form

    out[..., m, n] = epilogue(sum_k x(..., m, k) * y(..., k, n))   with x, y of the instruction's input dtype

(the product cast to the accumulator dtype, or the inputs cast before the product) so that one warp, a block of
`threads` lanes, computes one M x N tile of the output:

1. the output ranges become the block index `gidx0` (batch ranges, then the M and N tiles, in loop order) and the
   lane `lidx0`;
2. the reduction over k steps by K; every step each lane evaluates x and y at the (row, col) its layout gives for
   each of its A and B elements (plain loads);
3. the instruction is one WMMA uop per D element the lane holds, all with the same sources (the A elements, then the
   B elements) and arg `(name, element, elements per lane)`; renderers emit the instruction once per distinct sources
   and name element i of its result. Each feeds an ordinary REDUCE(ADD): `acc_i += WMMA_i(a..., b...)`, so the
   instruction's own C input is zero and the accumulators are the linearizer's;
4. each lane stores its D elements through the kernel's own stores (and epilogue) at their (row, col).

Products are exact and sums run in the accumulator dtype (float32): a float16 matmul whose reference rounds each
product to float16 first differs from it by that rounding.
"""
from __future__ import annotations
from dataclasses import dataclass
from typing import Any, Callable
from ember.dtype import DType, dtypes
from ember.errors import CompileError
from ember.helpers import prod
from ember.renderer import Renderer
from ember.uop.ops import Ops, UOp, AxisType
from ember.codegen.group import unflatten
from ember.codegen.opt import KernelOptError

Layout = Callable[[Any, int], tuple[Any, Any]]
"""(lane, element index) -> (row, col), written with `//`, `%`, `*`, `+` only so it works on an int lane (tests,
shims) and on the lane as a UOp (codegen)."""

@dataclass(frozen=True)
class TensorCore:
  """One warp-level matrix instruction D = A @ B: `dims` (M, N, K); A and B of `dtype_in`, D of `dtype_acc`; run by
  `threads` lanes, each holding `elements` (A, B, D) of them at the positions its layouts `a` (row m, col k of A),
  `b` (row k, col n of B) and `c` (row m, col n of D) give. A layout may give a position to several lanes (RDNA3
  replicates A and B in both halves of the wave): each of them holds it."""
  name: str
  dims: tuple[int, int, int]
  dtype_in: DType
  dtype_acc: DType
  threads: int
  elements: tuple[int, int, int]
  a: Layout
  b: Layout
  c: Layout

# ** NVIDIA mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32 (sm_80+) **
# PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type": groupID = laneid >> 2,
# threadID_in_group = laneid % 4. A (4 .f16x2 registers, a0..a7 low to high): row = groupID (+8 for a2, a3, a6, a7),
# col = threadID_in_group*2 + (i & 1) (+8 for a4..a7). B (2 .f16x2 registers, b0..b3): row = threadID_in_group*2 +
# (i & 1) (+8 for b2, b3), col = groupID. C/D (4 .f32, c0..c3): row = groupID (+8 for c2, c3),
# col = threadID_in_group*2 + (i & 1).

def _mma_a(lane: Any, i: int) -> tuple[Any, Any]:
  return lane // 4 + 8 * ((i // 2) % 2), lane % 4 * 2 + i % 2 + 8 * (i // 4)
def _mma_b(lane: Any, i: int) -> tuple[Any, Any]: return lane % 4 * 2 + i % 2 + 8 * (i // 2), lane // 4
def _mma_c(lane: Any, i: int) -> tuple[Any, Any]: return lane // 4 + 8 * (i // 2), lane % 4 * 2 + i % 2

# ** AMD RDNA3 (gfx11, wave32) v_wmma_f32_16x16x16_f16 **
# AMD RDNA3 ISA / GPUOpen "How to accelerate AI applications on RDNA 3 using WMMA": lane l holds row l % 16 of A and
# column l % 16 of B, all 16 k values in order (lanes 16..31 hold copies of lanes 0..15); D element v of lane l is
# D[2*v + l // 16][l % 16].

def _rdna3_a(lane: Any, i: int) -> tuple[Any, Any]: return lane % 16, i
def _rdna3_b(lane: Any, i: int) -> tuple[Any, Any]: return i, lane % 16
def _rdna3_c(lane: Any, i: int) -> tuple[Any, Any]: return lane // 16 + 2 * i, lane % 16

# ** AMD CDNA (gfx90a, gfx942, gfx950; wave64) v_mfma_f32_16x16x16_f16 **
# AMD, "Matrix Core Programming on AMD CDNA3 and CDNA4" (its HIP example for __builtin_amdgcn_mfma_f32_16x16x16f16):
# lane l holds A[l % 16][4*(l // 16) + i] and B[4*(l // 16) + i][l % 16] for i = 0..3, and D element i of lane l is
# D[4*(l // 16) + i][l % 16].

def _cdna_a(lane: Any, i: int) -> tuple[Any, Any]: return lane % 16, lane // 16 * 4 + i
def _cdna_b(lane: Any, i: int) -> tuple[Any, Any]: return lane // 16 * 4 + i, lane % 16
def _cdna_c(lane: Any, i: int) -> tuple[Any, Any]: return lane // 16 * 4 + i, lane % 16

# ** Apple simdgroup matrices (Apple7+, a SIMD-group of 32 threads): simdgroup_float8x8 **
# Which elements of a simdgroup matrix each thread holds is not documented, so the Metal renderer never relies on it:
# each lane writes its fragment to threadgroup memory and `simdgroup_load` / `simdgroup_store` move whole 8x8 tiles
# (documented, row-major with a stride). The fragment layout is therefore ember's own choice: lane l holds row l // 4,
# columns 2*(l % 4) and 2*(l % 4) + 1 of A, of B and of D (two elements each).

def _simd_rc(lane: Any, i: int) -> tuple[Any, Any]: return lane // 4, lane % 4 * 2 + i

TENSOR_CORES: dict[str, TensorCore] = {tc.name: tc for tc in (
  TensorCore("mma_m16n8k16_f16_f32", (16, 8, 16), dtypes.float16, dtypes.float32, 32, (8, 4, 4),
             _mma_a, _mma_b, _mma_c),
  TensorCore("mma_m16n8k16_bf16_f32", (16, 8, 16), dtypes.bfloat16, dtypes.float32, 32, (8, 4, 4),
             _mma_a, _mma_b, _mma_c),
  TensorCore("wmma_f32_16x16x16_f16_w32", (16, 16, 16), dtypes.float16, dtypes.float32, 32, (16, 16, 8),
             _rdna3_a, _rdna3_b, _rdna3_c),
  TensorCore("mfma_f32_16x16x16_f16", (16, 16, 16), dtypes.float16, dtypes.float32, 64, (4, 4, 4),
             _cdna_a, _cdna_b, _cdna_c),
  TensorCore("simdgroup_f32_8x8x8", (8, 8, 8), dtypes.float32, dtypes.float32, 32, (2, 2, 2),
             _simd_rc, _simd_rc, _simd_rc),
  TensorCore("simdgroup_f32_8x8x8_f16", (8, 8, 8), dtypes.float16, dtypes.float32, 32, (2, 2, 2),
             _simd_rc, _simd_rc, _simd_rc),
)}
"""The matrix instructions codegen knows, by the name a renderer lists in `Renderer.tensor_cores`."""

def tensor_core(name: str) -> TensorCore:
  if (tc := TENSOR_CORES.get(name)) is None:
    raise CompileError(f"unknown tensor core {name!r} in Renderer.tensor_cores; known: {', '.join(TENSOR_CORES)}")
  return tc

@dataclass(frozen=True)
class _Matmul:
  """A kernel that fits `tc`: its reduction over `k` of x(m, k) * y(k, n), `m` and `n` output ranges."""
  tc: TensorCore
  red: UOp
  k: UOp
  m: UOp
  n: UOp
  x: UOp
  y: UOp

def _factors(value: UOp, tc: TensorCore) -> tuple[UOp, UOp] | None:
  """(x, y) of dtype_in when `value` is cast(x * y) or cast(x) * cast(y) to dtype_acc, or x * y when the input and
  accumulator dtypes are the same."""
  if value.dtype is not tc.dtype_acc: return None
  if tc.dtype_in is tc.dtype_acc:
    return (value.src[0], value.src[1]) if value.op is Ops.MUL else None
  if value.op is Ops.CAST and value.src[0].op is Ops.MUL and value.src[0].dtype is tc.dtype_in:
    return value.src[0].src[0], value.src[0].src[1]
  if value.op is Ops.MUL and all(s.op is Ops.CAST and s.src[0].dtype is tc.dtype_in for s in value.src):
    return value.src[0].src[0], value.src[1].src[0]
  return None

def _ranges(u: UOp) -> set[UOp]: return {n for n in u.toposort() if n.op is Ops.RANGE}

def match_matmul(ast: UOp, tc: TensorCore) -> _Matmul | None:
  """The matmul `tc` computes in `ast`, or None: one ADD reduction in dtype_acc over one constant range that K
  divides, of a product of two dtype_in operands x and y, and output ranges m (x depends on it, y does not; M divides
  it) and n (the other way round; N divides it). Other output ranges (batch) may appear anywhere."""
  M, N, K = tc.dims
  reds = [n for n in ast.toposort() if n.op is Ops.REDUCE]
  if len(reds) != 1 or reds[0].arg is not Ops.ADD or len(reds[0].src) != 2: return None
  red, k = reds[0], reds[0].src[1]
  if k.src[0].op is not Ops.CONST or k.src[0].arg % K: return None
  outs = [r for r in _ranges(ast) if r is not k]
  if any(r.arg[1] is not AxisType.GLOBAL or r.src[0].op is not Ops.CONST for r in outs): return None
  if (factors := _factors(red.src[0], tc)) is None: return None
  outs.sort(key=lambda r: r.arg[0])
  for x, y in (factors, factors[::-1]):
    rx, ry = _ranges(x), _ranges(y)
    ms = [r for r in outs if r in rx and r not in ry and r.src[0].arg % M == 0]
    ns = [r for r in outs if r in ry and r not in rx and r.src[0].arg % N == 0]
    if ms and ns: return _Matmul(tc, red, k, ms[-1], ns[-1], x, y)  # the innermost fitting ranges
  return None

def apply_tensor_cores(ast: UOp, renderer: Renderer,
                       tiles: tuple[int, int] | None = None) -> tuple[UOp, list[int], list[int]] | None:
  """The kernel on the first of `renderer.tensor_cores` that fits it (see the module docstring), its grid and its
  block; None when none fits. A matmul big enough for a block of several instruction tiles is staged through shared
  memory (`staged_tiles`); `tiles` = (warps, tiles per warp) forces that tiling (a KernelOptError if it does not fit),
  (1, 0) the plain one-warp-per-tile kernel."""
  for name in renderer.tensor_cores:
    tc = tensor_core(name)
    if renderer.local_max and tc.threads > renderer.local_max[0]: continue
    if (mm := match_matmul(ast, tc)) is None: continue
    if tiles is None: tiles = next((t for t in STAGED_TILES if staging_fits(mm, renderer, *t)), (1, 0))
    if tiles[1]:
      if not staging_fits(mm, renderer, *tiles):
        raise KernelOptError(f"TC {tiles}: a block of {tiles[0]} warps x {tiles[1]}x{tiles[1]} tiles of {name} does "
                             "not divide this matmul or fit the target's block and shared memory")
      return staged_tiles(ast, mm, renderer, *tiles)
    blocks = prod(r.src[0].arg for r in _ranges(ast) if r is not mm.k) // (tc.dims[0] * tc.dims[1])
    if renderer.global_max and blocks > renderer.global_max[0]: continue
    return _rewrite(ast, mm), [blocks, 1, 1], [tc.threads, 1, 1]
  if tiles is not None: raise KernelOptError(f"TC {tiles}: no tensor core of {renderer} fits this kernel")
  return None

# ** staged through shared memory **
# A block of W warps (a `_warp_grid` of wm x wn) computes a BM x BN tile of the output: each warp a tm x tn grid of
# instruction tiles (tm = `amt` tiles of M rows, tn enough tiles of N columns for amt*M of them). Every step of the k
# loop, the block's threads copy the BM x BK slice of A and the BK x BN slice of B to shared memory (adjacent threads
# take adjacent elements: coalesced), a BARRIER makes them visible, and each lane loads its fragments from there, so
# a value read from global memory feeds wn (A) or wm (B) warps and tn (or tm) instruction tiles instead of one. The
# linearizer ends the loop with a second barrier, so no thread overwrites a slice another still reads.

STAGE_K = 32  # k elements per staged step (a multiple of the instruction's K)
STAGED_TILES = ((4, 4), (4, 2), (2, 2), (1, 2))
"""(warps per block, instruction tiles per warp side) the hand-coded heuristic tries, largest first: 4 warps of 4x4
tiles make a 128x128 block of a 4096 fp16 matmul on sm_90 (m16n8k16), 128x128 on gfx942 (16x16x16) and 64x64 on
Apple's 8x8 simdgroup matrices."""

def _warp_grid(warps: int) -> tuple[int, int]:
  rows = 2 if warps >= 4 else 1
  return rows, warps // rows

def _block_shape(tc: TensorCore, warps: int, amt: int) -> tuple[int, int, int, int, int]:
  """(BM, BN, BK, tiles per warp along M, along N) of a staged block."""
  M, N, K = tc.dims
  wm, wn = _warp_grid(warps)
  tn = max(1, amt * M // N)
  return wm * amt * M, wn * tn * N, K * max(1, STAGE_K // K), amt, tn

def staging_fits(mm: _Matmul, renderer: Renderer, warps: int, amt: int) -> bool:
  """Whether a staged block of `warps` warps x `amt` tiles divides the matmul and fits the target."""
  tc = mm.tc
  if warps < 1 or amt < 1 or tc.dtype_in not in (dtypes.float16, dtypes.float32): return False
  bm, bn, bk, _, _ = _block_shape(tc, warps, amt)
  threads = warps * tc.threads
  if renderer.local_max and threads > renderer.local_max[0]: return False
  if renderer.shared_max and (bm + bn) * bk * tc.dtype_in.itemsize > renderer.shared_max: return False
  if (bm * bk) % threads or (bk * bn) % threads: return False
  return mm.m.src[0].arg % bm == 0 and mm.n.src[0].arg % bn == 0 and mm.k.src[0].arg % bk == 0

def staged_tiles(ast: UOp, mm: _Matmul, renderer: Renderer, warps: int, amt: int) -> tuple[UOp, list[int], list[int]]:
  """The matmul as blocks of `warps` warps, each `amt` x `amt` instruction tiles, with A and B staged through shared
  memory (see above); its grid and block."""
  tc = mm.tc
  M, N, K = tc.dims
  n_a, n_b, n_c = tc.elements
  bm, bn, bk, tm, tn = _block_shape(tc, warps, amt)
  _, wn = _warp_grid(warps)
  threads = warps * tc.threads
  lid = UOp(Ops.SPECIAL, dtypes.int32, (UOp.const(dtypes.int32, threads),), "lidx0")
  warp, lane = lid // tc.threads, lid % tc.threads
  outs = sorted((r for r in _ranges(ast) if r is not mm.k), key=lambda r: r.arg[0])
  counts = [r.src[0].arg // (bm if r is mm.m else bn if r is mm.n else 1) for r in outs]
  if renderer.global_max and prod(counts) > renderer.global_max[0]:
    raise KernelOptError(f"TC ({warps}, {amt}): {prod(counts)} blocks exceed the target's grid")
  block = UOp(Ops.SPECIAL, dtypes.int32, (UOp.const(dtypes.int32, prod(counts)),), "gidx0")
  tile = dict(zip(outs, unflatten(block, counts)))
  batch = {r: t for r, t in tile.items() if r is not mm.m and r is not mm.n}
  m0, n0 = tile[mm.m] * bm, tile[mm.n] * bn
  step = UOp.range(mm.k.src[0].arg // bk, mm.k.arg[0], AxisType.REDUCE)
  axis = max(n.arg[0] for n in ast.toposort() if n.op is Ops.RANGE) + 1
  a_tile = UOp(Ops.DEFINE_LOCAL, tc.dtype_in.ptr(bm * bk), (), f"temp{axis}")
  b_tile = UOp(Ops.DEFINE_LOCAL, tc.dtype_in.ptr(bk * bn), (), f"temp{axis + 1}")
  stores = []
  for i in range(bm * bk // threads):  # thread t copies elements t, t + threads, ... (row-major: coalesced)
    e = lid + i * threads
    stores.append(a_tile.index(e).store(mm.x.substitute({**batch, mm.m: m0 + e // bk, mm.k: step * bk + e % bk})))
  for i in range(bk * bn // threads):
    e = lid + i * threads
    stores.append(b_tile.index(e).store(mm.y.substitute({**batch, mm.k: step * bk + e // bn, mm.n: n0 + e % bn})))
  barrier = UOp(Ops.BARRIER, dtypes.void, tuple(stores))
  row0, col0 = warp // wn * (tm * M), warp % wn * (tn * N)  # this warp's corner in the block tile
  def a_frag(i: int, s: int) -> list[UOp]:
    return [UOp(Ops.LOAD, tc.dtype_in, (a_tile.index((row0 + i * M + r) * bk + s * K + c), barrier))
            for r, c in (tc.a(lane, e) for e in range(n_a))]
  def b_frag(j: int, s: int) -> list[UOp]:
    return [UOp(Ops.LOAD, tc.dtype_in, (b_tile.index((s * K + r) * bn + col0 + j * N + c), barrier))
            for r, c in (tc.b(lane, e) for e in range(n_b))]
  out: list[UOp] = []
  for i in range(tm):
    for j in range(tn):
      srcs = [(*a_frag(i, s), *b_frag(j, s)) for s in range(bk // K)]
      for c in range(n_c):
        value = UOp(Ops.WMMA, tc.dtype_acc, srcs[0], (tc.name, c, n_c))
        for more in srcs[1:]: value = value + UOp(Ops.WMMA, tc.dtype_acc, more, (tc.name, c, n_c))
        acc = UOp(Ops.REDUCE, tc.dtype_acc, (value, step), Ops.ADD)
        r, col = tc.c(lane, c)
        out.extend(ast.substitute({**batch, mm.red: acc, mm.m: m0 + row0 + i * M + r,
                                   mm.n: n0 + col0 + j * N + col}).src)
  return ast.replace(src=tuple(out)), [prod(counts), 1, 1], [threads, 1, 1]

def _rewrite(ast: UOp, mm: _Matmul) -> UOp:
  tc = mm.tc
  M, N, K = tc.dims
  n_a, n_b, n_c = tc.elements
  lane = UOp(Ops.SPECIAL, dtypes.int32, (UOp.const(dtypes.int32, tc.threads),), "lidx0")
  outs = sorted((r for r in _ranges(ast) if r is not mm.k), key=lambda r: r.arg[0])
  counts = [r.src[0].arg // (M if r is mm.m else N if r is mm.n else 1) for r in outs]
  block = UOp(Ops.SPECIAL, dtypes.int32, (UOp.const(dtypes.int32, prod(counts)),), "gidx0")
  tile = dict(zip(outs, unflatten(block, counts)))  # the block index walks the tiles in loop order, the last fastest
  batch = {r: t for r, t in tile.items() if r is not mm.m and r is not mm.n}
  m0, n0 = tile[mm.m] * M, tile[mm.n] * N
  step = UOp.range(mm.k.src[0].arg // K, mm.k.arg[0], AxisType.REDUCE)
  a_elems = [mm.x.substitute({**batch, mm.m: m0 + row, mm.k: step * K + col})
             for row, col in (tc.a(lane, i) for i in range(n_a))]
  b_elems = [mm.y.substitute({**batch, mm.k: step * K + row, mm.n: n0 + col})
             for row, col in (tc.b(lane, i) for i in range(n_b))]
  stores: list[UOp] = []
  for i in range(n_c):
    wmma = UOp(Ops.WMMA, tc.dtype_acc, (*a_elems, *b_elems), (tc.name, i, n_c))
    acc = UOp(Ops.REDUCE, tc.dtype_acc, (wmma, step), Ops.ADD)
    row, col = tc.c(lane, i)
    stores.extend(ast.substitute({**batch, mm.red: acc, mm.m: m0 + row, mm.n: n0 + col}).src)
  return ast.replace(src=tuple(stores))
