"""The CPU renderers: C for the system compiler, LLVM IR for llvmlite. Both take `core_id, num_cores` last.

The CPU runtime's calling convention: buffers (pointers) in slot order, then the DEFINE_VAR values, then
`core_id, num_cores` (every kernel takes them; only a THREAD range reads them). The C renderer also exports
`<name>_argfmt`, a struct-style format of those arguments ("P" pointer, "i" int32, "q" int64), so the runtime can
pass each value at its own width.
"""
from __future__ import annotations
import os
from typing import Any, Callable
from ember.plugin import CStyleLanguage, LLVMRenderer, DType, Ops, UOp, dtypes, NUM_CPU_THREADS

ARGFMT_SUFFIX = "_argfmt"

def cpu_threads() -> int:
  """How many threads a kernel runs on: NUM_CPU_THREADS, else every core."""
  return NUM_CPU_THREADS.value or os.cpu_count() or 1

def kernel_argfmt(uops: list[UOp], has_threads: bool) -> str:
  """The argument format of a kernel under the CPU calling convention."""
  fmt = "P" * sum(1 for u in uops if u.op is Ops.PARAM)
  fmt += "".join("q" if u.dtype.itemsize == 8 else "i" for u in uops if u.op is Ops.DEFINE_VAR)
  return fmt + ("ii" if has_threads else "")

def _builtin(name: str) -> Callable[..., str]:
  return lambda x, dtype: f"__builtin_{name}{'' if dtype is dtypes.float64 else 'f'}({x})"

def _index_terms(idx: UOp, inlined: set[UOp]) -> tuple[list[UOp], int]:
  """An integer index as the terms of its ADD tree, in order, and the sum of its constant terms.

  An inlined value is printed where its user is evaluated, so an ADD is split into its terms only where that keeps
  each inlined term at the place it was planned for: the index's own use (every ADD above it inlined), or a named
  ADD whose terms are all named."""
  def splittable(x: UOp, here: bool) -> bool:
    return all(c.op is Ops.CONST or c not in inlined or here or (c.op is Ops.ADD and splittable(c, False))
               for c in x.src)
  terms: list[UOp] = []
  const = 0
  stack = [(idx, idx in inlined)]  # (value, whether it is evaluated at the index's use)
  while stack:
    x, here = stack.pop()
    if x.op is Ops.CONST: const += x.arg
    elif x.op is Ops.ADD and splittable(x, here): stack += [(c, here and c in inlined) for c in reversed(x.src)]
    else: terms.append(x)
  return terms, const

class ClangRenderer(CStyleLanguage):
  """C for clang or gcc: builtins instead of libm headers, `_Float16` for half, bfloat16/fp8 as raw bits."""
  device = "CPU"
  suffix = "c"
  has_threads = True
  simd_width = 16
  infinity = "__builtin_inff()"
  nan = '__builtin_nanf("")'
  type_map: dict[DType, str] = {**CStyleLanguage.type_map, dtypes.bool: "_Bool", dtypes.float16: "_Float16"}
  # kernel opts turn `acc += a*b` into MULACC with arg "fma" (ember.codegen.opt.FUSED): one fused multiply-add
  # (vfmadd), which gcc's SLP vectoriser keeps in vector registers; a plain MULACC stays a*b rounded, then +c
  fused_mulacc = True
  code_for_op = {**CStyleLanguage.code_for_op, Ops.EXP2: _builtin("exp2"), Ops.LOG2: _builtin("log2"),
                 Ops.SIN: _builtin("sin"), Ops.SQRT: _builtin("sqrt"), Ops.TRUNC: _builtin("trunc")}
  def __init__(self) -> None:
    self.global_max = (cpu_threads(),)
  def _render_alu(self, u: UOp, ctx: Any) -> str:
    if u.op is Ops.MULACC and u.arg == "fma" and u.dtype in (dtypes.float32, dtypes.float64):
      a, b, c = (self._src(s, ctx) for s in u.src)
      return f"__builtin_fma{'f' if u.dtype is dtypes.float32 else ''}({a},{b},{c})"
    return super()._render_alu(u, ctx)
  def _render_uop(self, u: UOp, ctx: Any) -> None:
    # `buf[x+y+c]` is printed `(buf+x+y)[c]`: under -fwrapv gcc cannot prove that int `x+c` and `x+c+1` are
    # neighbours, nor that a wrapping int sum `x+y` of a loop-invariant x and a loop counter's y moves affinely with
    # the loop, but pointer offsets added one term at a time are both; its SLP and loop vectorisers then turn unrolled
    # loads and stores into vector loads and stores, and partial sums over a loop into vector accumulators
    idx = u.src[1] if u.op is Ops.INDEX else None
    if idx is not None and idx.op is Ops.ADD:
      terms, const = _index_terms(idx, ctx.inlined)
      super()._render_uop(u, ctx)
      base = "+".join([self._src(u.src[0], ctx), *(self._src(t, ctx) for t in terms)])
      ctx.names[u] = f"({base})[{self.render_const(const, idx.dtype)}]"
      return
    super()._render_uop(u, ctx)
  def render(self, uops: list[UOp], name: str = "kernel") -> str:
    src = super().render(uops, name)
    return src + f'const char {name}{ARGFMT_SUFFIX}[] = "{kernel_argfmt(uops, self.has_threads)}";\n'

class CPULLVMRenderer(LLVMRenderer):
  """LLVM IR for the host: triple and datalayout come from llvmlite's host target machine."""
  device = "CPU"
  suffix = "ll"
  has_threads = True
  simd_width = 16
  def __init__(self) -> None:
    from ember_cpu.compiler import host_target_machine
    machine = host_target_machine()
    self.triple, self.datalayout = machine.triple, str(machine.target_data)
    self.global_max = (cpu_threads(),)
