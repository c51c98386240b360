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

def apply_tensor_cores(ast: UOp, renderer: Renderer) -> tuple[UOp, list[int], list[int]] | None:
  """The kernel on the first of `renderer.tensor_cores` that fits it (see the module docstring), its grid (a block
  per output tile) and its block (one warp); None when none fits."""
  for name in renderer.tensor_cores:
    tc = tensor_core(name)
    if renderer.local_max and tc.threads > renderer.local_max[0]: continue
    if (mm := match_matmul(ast, tc)) is None: continue
    tiles = prod(r.src[0].arg for r in _ranges(ast) if r is not mm.k) // (tc.dims[0] * tc.dims[1])
    if renderer.global_max and tiles > renderer.global_max[0]: continue
    return _rewrite(ast, mm), [tiles, 1, 1], [tc.threads, 1, 1]
  return None

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
