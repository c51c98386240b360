"""MetalRenderer: the linear program as one Metal Shading Language (MSL) compute kernel.

The kernel's calling convention, which the runtime (`ember_metal.device`) binds:

* buffers in slot order, `device T* dataN [[buffer(N)]]` (`device const T*` when only read);
* then each DEFINE_VAR, `constant int& name [[buffer(k)]]` (`long` for int64), bound with `setBytes:length:atIndex:`;
* then the hardware indices, `uint3 gid [[threadgroup_position_in_grid]]` and
  `uint3 lid [[thread_position_in_threadgroup]]` (the SPECIALs `gidx0` / `lidx0` read their `.x`).
  `ProgramSpec.global_size` is the grid in threadgroups, `local_size` the threadgroup size:
  `dispatchThreadgroups:threadsPerThreadgroup:` takes them as they are.

Group reductions (ember.codegen.group) use `threadgroup` arrays declared at the top of the kernel,
`threadgroup_barrier(mem_flags::mem_threadgroup)` and `simd_shuffle_xor` across the 32 threads of a SIMD-group.
float32 and float16 matmuls whose dims divide 8 run on `simdgroup_float8x8` / `simdgroup_half8x8` (float32
accumulators; ember.codegen.tensorcore), each SIMD-group computing 8x8 output tiles (large matmuls: several
SIMD-groups per threadgroup, A and B staged through threadgroup arrays), its A/B/D fragments moved through
threadgroup tiles with `simdgroup_load` / `simdgroup_store`.

dtypes: `half` is native; there is no double on Apple GPUs, so float64 is unsupported. bfloat16 and fp8 are emulated
as in every C-style renderer (raw bits in memory, computed in float32, round-to-nearest-even conversions): Metal's
own `bfloat` needs MSL 3.1 (macOS 14), and the emulation gives the same results as the PYTHON reference everywhere.
Math uses `metal::` functions on float (half math goes through float, like the C renderers), `metal::precise::sin`
because the fast `sin` loses accuracy away from zero; the runtime also compiles with fast math off, so NaN and inf
behave as IEEE says and MAX can propagate NaN.
"""
from __future__ import annotations
import re
from typing import Any, Callable
from ember.plugin import CompileError, CStyleLanguage, DType, Ops, UOp, UPat, dtypes, text_rules

METAL_HEADER = "#include <metal_stdlib>\nusing namespace metal;\n"

def _metal(name: str) -> Callable[..., str]:
  return lambda x, dtype: f"metal::{name}({x})"

def _max(a: str, b: str, dtype: DType) -> str:
  if dtypes.is_float(dtype): return f"((({a}>{b})||metal::isnan({a}))?{a}:{b})"  # NaN in either operand propagates
  return f"(({a}>{b})?{a}:{b})"

SIMDGROUP_MATMUL = "simdgroup_f32_8x8x8"  # ember.codegen.tensorcore: float32 matmuls on simdgroup_float8x8
SIMDGROUP_MATMUL_F16 = "simdgroup_f32_8x8x8_f16"  # float16 inputs on simdgroup_half8x8, float32 accumulators
PRE_APPLE7 = ("apple6", "apple5", "mac2")  # GPU families without simdgroup matrices (an arch of DEV=METAL::<arch>)
# instruction -> (the type of its A/B tiles, its simdgroup matrix type, the tiles' name prefix)
_SIMDGROUP_TYPES = {SIMDGROUP_MATMUL: ("float", "simdgroup_float8x8", "__ember_tc_"),
                    SIMDGROUP_MATMUL_F16: ("half", "simdgroup_half8x8", "__ember_tch_")}

def _simdgroups(x: UOp) -> int:
  """SIMD-groups per threadgroup of the kernel a WMMA is in: its lane index is read from lidx0, whose bound is the
  threadgroup size."""
  sizes = [n.src[0].arg for n in x.toposort() if n.op is Ops.SPECIAL and n.arg == "lidx0"]
  return max(1, max(sizes, default=32) // 32)

def _simdgroup_matmul(ctx: Any, x: UOp) -> str:
  """An 8x8x8 simdgroup matmul: each lane writes its two A and B elements to its SIMD-group's threadgroup tiles, the
  SIMD-group loads them as simdgroup matrices, multiplies, stores D to a third tile, and each lane reads its two D
  elements back (threadgroup barriers between; SIMD-group g = lid.x / 32 owns tiles at 64 * g, lane = lid.x % 32).
  `simdgroup_load`/`simdgroup_store` fix the tiles' layout, so the undocumented register layout of a simdgroup
  matrix never matters."""
  name, index, count = x.arg
  if (out := ctx.wmma.get(x.src)) is None:
    if (types := _SIMDGROUP_TYPES.get(name)) is None:
      raise CompileError(f"MetalRenderer has no code for the matrix instruction {name}; it has "
                         f"{', '.join(_SIMDGROUP_TYPES)}")
    elem, matrix, tile = types
    size = 64 * _simdgroups(x)
    tiles = [f"  threadgroup {elem} {tile}a[{size}];", f"  threadgroup {elem} {tile}b[{size}];",
             f"  threadgroup float {tile}c[{size}];"]
    if tiles[0] not in ctx.lines: ctx.lines[:0] = tiles  # once, at kernel scope (where threadgroup memory is)
    a0, a1, b0, b1 = (ctx[s] for s in x.src)
    out = ctx.wmma[x.src] = ctx.fresh("wmma")
    bar = "threadgroup_barrier(mem_flags::mem_threadgroup);"
    for line in (f"float {out}[{count}];",
                 "{ uint tc_o = lid.x / 32 * 64, tc_l = tc_o + lid.x % 32 * 2;",
                 f"  {tile}a[tc_l] = {a0}; {tile}a[tc_l+1] = {a1}; {tile}b[tc_l] = {b0}; {tile}b[tc_l+1] = {b1};",
                 f"  {bar}",
                 f"  {{ {matrix} tc_a, tc_b;",
                 "    simdgroup_float8x8 tc_d = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);",
                 f"    simdgroup_load(tc_a, {tile}a + tc_o, 8); simdgroup_load(tc_b, {tile}b + tc_o, 8);",
                 "    simdgroup_multiply_accumulate(tc_d, tc_a, tc_b, tc_d);",
                 f"    simdgroup_store(tc_d, {tile}c + tc_o, 8); }}",
                 f"  {bar}", f"  {out}[0] = {tile}c[tc_l]; {out}[1] = {tile}c[tc_l+1]; }}"):
      ctx.emit(line)
  return f"{out}[{index}]"

# MSL's rendering rules, in front of the C-style base's
pm_render_msl = text_rules([
  (UPat(Ops.WMMA, name="x"), _simdgroup_matmul),
])

# a scalar parameter as CStyleLanguage prints it: "<arg_int_prefix><type> <name>"
_scalar_param = re.compile(r"^constant (\w+) (\w+)$")

class MetalRenderer(CStyleLanguage):
  """MSL for Apple GPUs (Metal 2.3 and later; nothing here needs newer than macOS 11)."""
  device = "METAL"
  suffix = "metal"
  has_local = True
  has_shared = True
  shared_max = 32 * 1024  # threadgroup memory per threadgroup on Apple GPUs
  warp_size = 32  # a SIMD-group
  shuffle_dtypes = frozenset({dtypes.float32, dtypes.int32, dtypes.uint32})
  shared_prefix = "threadgroup "
  barrier = "threadgroup_barrier(mem_flags::mem_threadgroup);"
  code_for_shuffle = staticmethod(lambda x, mask, dtype: f"simd_shuffle_xor({x}, (ushort){mask})")
  global_max = (0xFFFFFFFF, 0xFFFF, 0xFFFF)  # threadgroups per grid
  local_max = (1024, 1024, 64)  # threads per threadgroup; the pipeline's maxTotalThreadsPerThreadgroup caps the product
  kernel_prefix = "kernel void "
  buffer_prefix = "device "
  arg_int_prefix = "constant "
  helper_prefix = "inline "
  thread_args = ("gid", "lid")  # not CPU threads here: reserving them keeps a DEFINE_VAR from taking these names
  extra_args = ("uint3 gid [[threadgroup_position_in_grid]]", "uint3 lid [[thread_position_in_threadgroup]]")
  code_for_workitem = {"g": lambda axis: f"(int)gid.{axis}", "l": lambda axis: f"(int)lid.{axis}"}
  type_map: dict[DType, str] = {
    dtypes.bool: "bool", dtypes.int8: "char", dtypes.uint8: "uchar", dtypes.int16: "short", dtypes.uint16: "ushort",
    dtypes.int32: "int", dtypes.uint32: "uint", dtypes.int64: "long", dtypes.uint64: "ulong", dtypes.float16: "half",
    dtypes.float32: "float"}
  unsupported_dtypes = frozenset({dtypes.float64})
  code_for_op = {**CStyleLanguage.code_for_op, Ops.EXP2: _metal("exp2"), Ops.LOG2: _metal("log2"),
                 Ops.SIN: _metal("precise::sin"), Ops.SQRT: _metal("sqrt"), Ops.TRUNC: _metal("trunc"), Ops.MAX: _max}
  string_rewrite = pm_render_msl + CStyleLanguage.string_rewrite

  tensor_cores: tuple[str, ...] = (SIMDGROUP_MATMUL, SIMDGROUP_MATMUL_F16)

  def __init__(self, arch: str = "") -> None:
    self.arch = arch
    if arch.lower() in PRE_APPLE7: self.tensor_cores = ()

  def render_bitcast(self, x: str, src: DType, dst: DType, ctx: object) -> str:
    return f"as_type<{self.render_dtype(dst)}>({x})"

  def render_kernel(self, name: str, params: list[str], body: list[str], helpers: list[str]) -> str:
    """Adds the `[[buffer(i)]]` binding to each buffer and variable (variables become `constant T&`)."""
    bound = []
    for index, param in enumerate(params[:len(params) - len(self.extra_args)]):
      if (scalar := _scalar_param.match(param)) is not None: param = f"constant {scalar[1]}& {scalar[2]}"
      bound.append(f"{param} [[buffer({index})]]")
    return METAL_HEADER + super().render_kernel(name, bound + list(self.extra_args), body, helpers)
