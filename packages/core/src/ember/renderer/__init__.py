"""The Renderer base: what a backend's code generator declares about its target, and the ProgramSpec it produces.

A renderer turns a linear program (see `ember.codegen.linearize`) into source text. Differences between targets are
data: class attributes such as `has_local`, `has_threads`, `global_max`, `code_for_op` and `extra_matcher`.
"""
from __future__ import annotations
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable
from ember.dtype import DType, dtypes
from ember.uop.ops import Ops, UOp

@dataclass(frozen=True)
class Estimates:
  """Work a kernel does: arithmetic ops, bytes moved to and from global memory."""
  ops: int = 0
  mem: int = 0
  def __add__(self, other: Estimates) -> Estimates: return Estimates(self.ops + other.ops, self.mem + other.mem)

@dataclass
class ProgramSpec:
  """A rendered kernel: its name, source, the linear uops it came from and what the runtime needs to launch it.

  `globals` are the buffer slots in argument order; `vars` the DEFINE_VAR uops whose values are passed after the
  buffers; `outs`/`ins` the slots written and read; `global_size`/`local_size` the launch grid (None: no grid).
  """
  name: str
  src: str
  device: str
  uops: list[UOp]
  globals: list[int] = field(default_factory=list)
  vars: list[UOp] = field(default_factory=list)
  outs: list[int] = field(default_factory=list)
  ins: list[int] = field(default_factory=list)
  global_size: list[int] | None = None
  local_size: list[int] | None = None
  estimates: Estimates = Estimates()
  aux: dict[str, Any] = field(default_factory=dict)

class Renderer(ABC):
  """Base class of every renderer. Subclasses set the class attributes and implement `render`."""
  device: str = ""
  suffix: str = ""
  arch: str = ""
  has_local: bool = False
  has_shared: bool = False
  has_threads: bool = False
  global_max: tuple[int, ...] | None = None
  local_max: tuple[int, ...] | None = None
  shared_max: int = 0
  # threads that run in lockstep and exchange registers with SHUFFLE_XOR (a CUDA warp, an AMD wave, a Metal SIMD
  # group), and the dtypes that exchange works on; 0: no register exchange, group reductions use shared memory only
  warp_size: int = 0
  shuffle_dtypes: frozenset[DType] = frozenset()
  # warp-level matrix instructions (`ember.codegen.tensorcore.TENSOR_CORES` names) the target has, in order of
  # preference: matmul-like kernels over their input dtype run on them (one warp per block)
  tensor_cores: tuple[str, ...] = ()
  # lanes of the target's vector unit for 32-bit values; kernel opts unroll by it (0: no SIMD opts)
  simd_width: int = 0
  # matmul-like kernels first copy their B operand into the register block's layout (codegen/pack.py): for caches
  # that a power-of-two row stride thrashes, and B operands read transposed
  pack_operands: bool = False
  # reduce ops the target's compiler vectorises as written (no SPLIT into partial lanes needed)
  vector_reduce_ops: frozenset[Ops] = frozenset()
  # the target renders QDOT (UOp.qdot, a quantised row dot product): decode matvecs of quantised weights use it
  has_qdot: bool = False
  # ops the target computes natively; codegen decomposes the transcendental ones that are missing here
  code_for_op: dict[Ops, Callable[..., str]] = {}
  extra_matcher: Any = None
  # dtypes this target can store and compute; codegen raises a clear error for anything else
  unsupported_dtypes: frozenset[DType] = frozenset()
  # the narrow float formats (bfloat16, fp8) the target computes itself; the others it supports become raw bits in
  # memory and float32 in registers by one rewrite of the program (ember.renderer.emulate.emulate_floats), which the
  # C-style and LLVM bases run first thing in `render`
  native_floats: frozenset[DType] = frozenset()
  def supported_dtypes(self) -> list[DType]: return [d for d in dtypes.all if d not in self.unsupported_dtypes]
  @abstractmethod
  def render(self, uops: list[UOp], name: str = "kernel") -> str:
    """Print a linear program as source text for this target."""
  def __repr__(self) -> str: return f"{type(self).__name__}({self.arch!r})" if self.arch else f"{type(self).__name__}()"
