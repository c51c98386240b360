"""The UOp IR: one immutable, hash-consed node type that carries tensor graphs, kernel ASTs and linear programs.

`UOp(op, dtype, src, arg, tag)`: structurally equal nodes are the same object, so identity is equality and a UOp is
a cheap dict key. Three levels use the same nodes:

* tensor level: BUFFER, CONST (over DEVICE), movement ops (RESHAPE PERMUTE EXPAND PAD SHRINK FLIP), ALU, CAST,
  BITCAST, REDUCE_AXIS, CONTIGUOUS, COPY, ASSIGN, DETACH, CONTIGUOUS_BACKWARD, BIND/DEFINE_VAR;
* kernel level (the AST one kernel computes): SINK(STORE(INDEX(PARAM, idx), value)), RANGE, REDUCE, LOAD, ALU;
* linear level (a program a renderer prints line by line, see `ember.codegen.linearize`): PARAM, DEFINE_VAR,
  CONST, RANGE (opens a loop), END (closes it), DEFINE_ACC, ASSIGN (to an accumulator), INDEX, LOAD, STORE, ALU,
  CAST, BITCAST, WHERE.
"""
from __future__ import annotations
import functools
import math
import struct
import weakref
from dataclasses import dataclass
from enum import Enum, auto
from typing import Any, Callable
from ember.dtype import DType, PtrDType, AnyDType, dtypes, as_const, least_upper_dtype
from ember.errors import DTypeError, ShapeError

class Ops(Enum):
  # defs
  NOOP = auto(); SINK = auto(); DEVICE = auto(); BUFFER = auto(); PARAM = auto(); DEFINE_VAR = auto(); BIND = auto()  # noqa: E702
  CONST = auto(); RANGE = auto(); END = auto(); DEFINE_ACC = auto(); SPECIAL = auto()  # noqa: E702
  # movement
  RESHAPE = auto(); PERMUTE = auto(); EXPAND = auto(); PAD = auto(); SHRINK = auto(); FLIP = auto()  # noqa: E702
  # unary
  NEG = auto(); EXP2 = auto(); LOG2 = auto(); SIN = auto(); SQRT = auto(); RECIPROCAL = auto(); TRUNC = auto()  # noqa: E702
  # binary
  ADD = auto(); SUB = auto(); MUL = auto(); FDIV = auto(); IDIV = auto(); MOD = auto(); MAX = auto()  # noqa: E702
  CMPLT = auto(); CMPNE = auto(); CMPEQ = auto(); AND = auto(); OR = auto(); XOR = auto(); SHL = auto(); SHR = auto()  # noqa: E702
  # ternary
  WHERE = auto(); MULACC = auto()  # noqa: E702
  # dtype
  CAST = auto(); BITCAST = auto()  # noqa: E702
  # reduce
  REDUCE_AXIS = auto(); REDUCE = auto()  # noqa: E702
  # materialisation and memory
  CONTIGUOUS = auto(); CONTIGUOUS_BACKWARD = auto(); DETACH = auto(); COPY = auto(); ASSIGN = auto()  # noqa: E702
  INDEX = auto(); LOAD = auto(); STORE = auto()  # noqa: E702
  # GPU block-level memory and sync: a buffer shared by the threads of a block, a barrier, a register exchange
  DEFINE_LOCAL = auto(); BARRIER = auto(); SHUFFLE_XOR = auto()  # noqa: E702
  # a warp-level matrix instruction (tensor cores): one output element of this lane, see ember.codegen.tensorcore
  WMMA = auto()
  def __repr__(self) -> str: return f"Ops.{self.name}"

class GroupOp:
  Unary = {Ops.NEG, Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.RECIPROCAL, Ops.TRUNC}
  Binary = {Ops.ADD, Ops.SUB, Ops.MUL, Ops.FDIV, Ops.IDIV, Ops.MOD, Ops.MAX, Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ,
            Ops.AND, Ops.OR, Ops.XOR, Ops.SHL, Ops.SHR}
  Ternary = {Ops.WHERE, Ops.MULACC}
  ALU = Unary | Binary | Ternary
  Movement = {Ops.RESHAPE, Ops.PERMUTE, Ops.EXPAND, Ops.PAD, Ops.SHRINK, Ops.FLIP}
  Commutative = {Ops.ADD, Ops.MUL, Ops.MAX, Ops.CMPNE, Ops.CMPEQ, Ops.AND, Ops.OR, Ops.XOR}
  Associative = {Ops.ADD, Ops.MUL, Ops.AND, Ops.OR, Ops.MAX}
  Comparison = {Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ}
  Bitwise = {Ops.AND, Ops.OR, Ops.XOR, Ops.SHL, Ops.SHR}
  Transcendental = {Ops.EXP2, Ops.LOG2, Ops.SIN}

class AxisType(Enum):
  """What a RANGE means to the hardware. THREAD ranges are split over CPU cores; REDUCE ranges accumulate."""
  GLOBAL = auto(); THREAD = auto(); LOOP = auto(); REDUCE = auto(); UPCAST = auto(); UNROLL = auto()  # noqa: E702
  def __repr__(self) -> str: return f"AxisType.{self.name}"

@dataclass(frozen=True)
class BufferArg:
  """The arg of a tensor-level BUFFER: a unique id, the device and the element count."""
  uid: int
  device: str
  size: int


def _arg_key(arg: Any) -> Any:
  # -0.0 == 0.0 and True == 1 hash alike: keep them apart so hash-consing never merges different constants
  if isinstance(arg, float): return (float, arg, math.copysign(1.0, arg)) if not math.isnan(arg) else (float, "nan")
  if isinstance(arg, bool): return (bool, arg)
  if isinstance(arg, tuple): return tuple(_arg_key(a) for a in arg)
  return arg

class KernelInfo:
  """The SINK's arg: how many leading ranges are the kernel's output (global) ranges."""
  __slots__ = ("n_global",)
  def __init__(self, n_global: int): self.n_global = n_global
  def __eq__(self, other: Any) -> bool: return isinstance(other, KernelInfo) and other.n_global == self.n_global
  def __hash__(self) -> int: return hash(("KernelInfo", self.n_global))
  def __repr__(self) -> str: return f"KernelInfo(n_global={self.n_global})"

class UOpMetaClass(type):
  ucache: weakref.WeakValueDictionary[tuple, UOp] = weakref.WeakValueDictionary()
  def __call__(cls, op: Ops, dtype: AnyDType = dtypes.void, src: tuple[UOp, ...] = (), arg: Any = None,
               tag: Any = None) -> UOp:
    key = (op, dtype, src, _arg_key(arg), tag)
    if (ret := UOpMetaClass.ucache.get(key)) is not None: return ret
    ret = super().__call__(op, dtype, src, arg, tag)
    UOpMetaClass.ucache[key] = ret
    return ret

_unique_id = [0]
def next_unique() -> int:
  _unique_id[0] += 1
  return _unique_id[0]

class UOp(metaclass=UOpMetaClass):
  __slots__ = ("op", "dtype", "src", "arg", "tag", "__weakref__", "__dict__")
  def __init__(self, op: Ops, dtype: AnyDType = dtypes.void, src: tuple[UOp, ...] = (), arg: Any = None,
               tag: Any = None):
    self.op, self.dtype, self.src, self.arg, self.tag = op, dtype, src, arg, tag
  def __reduce__(self) -> Any: return UOp, (self.op, self.dtype, self.src, self.arg, self.tag)
  def replace(self, **kwargs: Any) -> UOp:
    new = {"op": self.op, "dtype": self.dtype, "src": self.src, "arg": self.arg, "tag": self.tag, **kwargs}
    if all(new[k] is getattr(self, k) for k in new): return self
    return UOp(new["op"], new["dtype"], new["src"], new["arg"], new["tag"])
  def __repr__(self) -> str:
    # symbolic int expressions (shapes, indices) print as infix: `UOp<(n+-1)>`; anything else as a node listing
    if not isinstance(self.dtype, PtrDType) and self.dtype is not dtypes.void and \
       all(n.op in _EXPR_OPS for n in self.toposort()): return f"UOp<{render_expr(self)}>"
    return pretty_print(self)
  def __bool__(self) -> bool: raise TypeError("a UOp has no truth value; compare with .op or use .vmin/.vmax")

  # ** graph walks **
  def toposort(self, gate: Callable[[UOp], bool] | None = None) -> dict[UOp, None]:
    """All nodes reachable from self, sources before users (iterative: deep graphs never hit the recursion limit)."""
    visited: dict[UOp, None] = {}
    stack: list[tuple[UOp, bool]] = [(self, False)]
    while stack:
      node, expanded = stack.pop()
      if node in visited: continue
      if expanded:
        visited[node] = None
        continue
      if gate is not None and not gate(node):
        visited[node] = None
        continue
      stack.append((node, True))
      for s in reversed(node.src):
        if s not in visited: stack.append((s, False))
    return visited
  @functools.cached_property
  def key(self) -> bytes:
    import hashlib
    own = str((self.op, self.dtype, self.arg, self.tag)).encode()
    return hashlib.sha256(own + b"".join(s.key for s in self.src)).digest()

  # ** tensor-level derived properties **
  @functools.cached_property
  def shape(self) -> tuple[sint, ...]:
    return _shape(self)
  @property
  def size(self) -> sint:
    from ember.helpers import prod
    return prod(self.shape)
  @functools.cached_property
  def device(self) -> str | tuple[str, ...] | None:
    if self.op is Ops.DEVICE: return self.arg
    if self.op is Ops.BUFFER: return self.arg.device
    if self.op is Ops.COPY: return self.src[1].arg
    for s in self.src:
      if (d := s.device) is not None: return d
    return None
  @property
  def base(self) -> UOp:
    """The node under any movement ops."""
    node = self
    while node.op in GroupOp.Movement: node = node.src[0]
    return node
  @property
  def is_realized(self) -> bool: return self.base.op is Ops.BUFFER
  @functools.cached_property
  def buffers(self) -> frozenset[UOp]:
    """The BUFFER nodes this graph reads."""
    if self.op is Ops.BUFFER: return frozenset({self})
    return frozenset().union(*(s.buffers for s in self.src))

  # ** value ranges for symbolic simplification **
  @functools.cached_property
  def _min_max(self) -> tuple[Any, Any]: return _vmin_vmax(self)
  @property
  def vmin(self) -> Any: return self._min_max[0]
  @property
  def vmax(self) -> Any: return self._min_max[1]

  # ** construction sugar **
  @staticmethod
  def const(dtype: AnyDType, value: Any) -> UOp:
    return UOp(Ops.CONST, dtype, arg=as_const(value, dtype))
  def const_like(self, value: Any) -> UOp:
    return UOp.const(self.dtype.base if isinstance(self.dtype, PtrDType) else self.dtype, value)
  @staticmethod
  def variable(name: str, min_val: int, max_val: int, dtype: DType = dtypes.int32) -> UOp:
    """A symbolic integer in [min_val, max_val]; `.bind(value)` gives it a value for one run."""
    if min_val > max_val: raise ValueError(f"Variable {name}: min {min_val} > max {max_val}")
    return UOp(Ops.DEFINE_VAR, dtype, arg=(name, min_val, max_val))
  def bind(self, value: int) -> UOp:
    if self.op is not Ops.DEFINE_VAR: raise ValueError(f"only a Variable can be bound, not {self.op}")
    if not self.arg[1] <= value <= self.arg[2]:
      raise ValueError(f"value {value} is out of range [{self.arg[1]}, {self.arg[2]}] of Variable {self.arg[0]!r}")
    return UOp(Ops.BIND, self.dtype, (self, UOp.const(self.dtype, value)))
  def unbind(self) -> tuple[UOp, int]:
    if self.op is not Ops.BIND: raise ValueError(f"unbind needs a BIND, not {self.op}")
    return self.src[0], self.src[1].arg
  @property
  def expr(self) -> str: return self.arg[0]
  def alu(self, op: Ops, *srcs: UOp) -> UOp:
    out_dtype = self.dtype
    if op in GroupOp.Comparison: out_dtype = dtypes.bool
    elif op is Ops.WHERE: out_dtype = srcs[0].dtype
    return UOp(op, out_dtype, (self, *srcs))
  def ufix(self, x: Any) -> UOp: return x if isinstance(x, UOp) else self.const_like(x)
  def _bin(self, op: Ops, x: Any, reverse: bool = False) -> UOp:
    other = self.ufix(x)
    if other.dtype is not self.dtype:
      dt = least_upper_dtype(self.dtype, other.dtype)
      a, b = self.cast(dt), other.cast(dt)
      return b.alu(op, a) if reverse else a.alu(op, b)
    return other.alu(op, self) if reverse else self.alu(op, other)
  def __add__(self, x: Any) -> UOp: return self._bin(Ops.ADD, x)
  def __radd__(self, x: Any) -> UOp: return self._bin(Ops.ADD, x, True)
  def __mul__(self, x: Any) -> UOp: return self._bin(Ops.MUL, x)
  def __rmul__(self, x: Any) -> UOp: return self._bin(Ops.MUL, x, True)
  def __sub__(self, x: Any) -> UOp: return self + (-self.ufix(x))
  def __rsub__(self, x: Any) -> UOp: return self.ufix(x) + (-self)
  def __neg__(self) -> UOp: return self * -1 if dtypes.is_int(self.dtype) else self.alu(Ops.NEG)
  def __floordiv__(self, x: Any) -> UOp: return self._bin(Ops.IDIV, x)
  def __mod__(self, x: Any) -> UOp: return self._bin(Ops.MOD, x)
  def __truediv__(self, x: Any) -> UOp: return self._bin(Ops.FDIV, x)
  def __and__(self, x: Any) -> UOp: return self._bin(Ops.AND, x)
  def __or__(self, x: Any) -> UOp: return self._bin(Ops.OR, x)
  def __xor__(self, x: Any) -> UOp: return self._bin(Ops.XOR, x)
  def lt(self, x: Any) -> UOp: return self._bin(Ops.CMPLT, x)
  def ge(self, x: Any) -> UOp: return self.lt(x).logical_not()
  def gt(self, x: Any) -> UOp: return self.ufix(x)._bin(Ops.CMPLT, self)
  def ne(self, x: Any) -> UOp: return self._bin(Ops.CMPNE, x)
  def eq(self, x: Any) -> UOp: return self._bin(Ops.CMPEQ, x)
  def maximum(self, x: Any) -> UOp: return self._bin(Ops.MAX, x)
  def minimum(self, x: Any) -> UOp: return -((-self).maximum(-self.ufix(x)))
  def logical_not(self) -> UOp: return self.ne(True)
  def where(self, x: Any, y: Any) -> UOp:
    a, b = (x if isinstance(x, UOp) else None), (y if isinstance(y, UOp) else None)
    ref = a if a is not None else b
    if ref is None: raise TypeError("UOp.where needs at least one UOp branch")
    return UOp(Ops.WHERE, ref.dtype, (self, ref.ufix(x), ref.ufix(y)))
  def cast(self, dtype: AnyDType) -> UOp: return self if self.dtype is dtype else UOp(Ops.CAST, dtype, (self,))
  def bitcast(self, dtype: DType) -> UOp: return UOp(Ops.BITCAST, dtype, (self,))
  def sink(self, *srcs: UOp, arg: Any = None) -> UOp: return UOp(Ops.SINK, dtypes.void, (self, *srcs), arg)
  def index(self, idx: UOp, valid: UOp | None = None) -> UOp:
    return UOp(Ops.INDEX, self.dtype, (self, idx) if valid is None else (self, idx, valid))
  def load(self, dtype: DType | None = None) -> UOp:
    base = self.dtype.base if isinstance(self.dtype, PtrDType) else self.dtype
    return UOp(Ops.LOAD, dtype or base, (self,))
  def store(self, value: UOp) -> UOp: return UOp(Ops.STORE, dtypes.void, (self, value))
  @staticmethod
  def range(end: sint, axis_id: int, axis_type: AxisType = AxisType.LOOP, dtype: AnyDType = dtypes.int32) -> UOp:
    """A loop counter 0..end-1 of `dtype` (int64 in kernels whose index range exceeds int32)."""
    end_u = end if isinstance(end, UOp) else UOp.const(dtype, end)
    return UOp(Ops.RANGE, dtype, (end_u,), (axis_id, axis_type))
  def simplify(self) -> UOp:
    from ember.uop.symbolic import symbolic
    from ember.uop.rewrite import graph_rewrite
    return graph_rewrite(self, symbolic, name="simplify")
  def substitute(self, mapping: dict[UOp, UOp]) -> UOp:
    from ember.uop.rewrite import substitute
    return substitute(self, mapping)
  def render(self) -> str:
    """A short infix string of a symbolic expression, e.g. `((a*-1)<4)`."""
    return render_expr(self)
  def variables(self) -> list[UOp]:
    return sorted({u for u in self.toposort() if u.op is Ops.DEFINE_VAR}, key=lambda v: v.arg)

Variable = UOp.variable
sint = int | UOp  # a shape dimension: an int or a symbolic UOp

def int_size(size: sint, what: str) -> int:
  """`size` where `what` needs it concrete; a ShapeError naming `what` where it is symbolic (holds a Variable)."""
  if isinstance(size, UOp):
    raise ShapeError(f"{what} needs concrete sizes, not the symbolic size {size}; give it a tensor whose shape "
                     "holds no Variable")
  return size

def int_shape(shape: tuple[sint, ...], what: str) -> tuple[int, ...]:
  """`shape` where `what` needs every size concrete (see `int_size`)."""
  return tuple(int_size(s, what) for s in shape)

# ** shape derivation (tensor level) **

def _shape(u: UOp) -> tuple[sint, ...]:
  op = u.op
  if op is Ops.BUFFER: return (u.arg.size,)
  if op in (Ops.CONST, Ops.DEFINE_VAR, Ops.BIND, Ops.DEVICE): return ()
  if op is Ops.RANGE and u.src[0].op is Ops.DEVICE: return (u.arg,)  # tensor-level iota (arange)
  if op is Ops.RESHAPE or op is Ops.EXPAND: return tuple(u.arg)
  if op is Ops.PERMUTE: return tuple(u.src[0].shape[i] for i in u.arg)
  if op is Ops.PAD: return tuple(_simp(s + b + a) for s, (b, a) in zip(u.src[0].shape, u.arg))
  if op is Ops.SHRINK: return tuple(_simp(e - b) for b, e in u.arg)
  if op is Ops.FLIP: return u.src[0].shape
  if op is Ops.REDUCE_AXIS: return tuple(1 if i in u.arg[1] else s for i, s in enumerate(u.src[0].shape))
  if op is Ops.WHERE: return u.src[1].shape
  if op is Ops.ASSIGN: return u.src[1].shape
  if op is Ops.BITCAST:
    shp = u.src[0].shape
    if not shp or u.src[0].dtype.itemsize == u.dtype.itemsize: return shp
    return (*shp[:-1], shp[-1] * u.src[0].dtype.itemsize // u.dtype.itemsize)
  return u.src[0].shape

def _simp(x: sint) -> sint: return x.simplify() if isinstance(x, UOp) else x

# ** value ranges **

def _vmin_vmax(u: UOp) -> tuple[Any, Any]:
  dt = u.dtype
  if u.op is Ops.CONST: return u.arg, u.arg
  if u.op is Ops.DEFINE_VAR: return u.arg[1], u.arg[2]
  if u.op is Ops.BIND: return u.src[0].vmin, u.src[0].vmax
  if u.op is Ops.SPECIAL: return 0, u.src[0].vmax - 1
  if u.op is Ops.RANGE: return (0, u.src[0].vmax - 1) if u.src[0].op is not Ops.DEVICE else (0, u.arg - 1)
  if isinstance(dt, PtrDType) or dt is dtypes.void: return None, None
  dmin, dmax = dtypes.min(dt), dtypes.max(dt)
  if u.op in GroupOp.Binary and len(u.src) == 2:
    a, b = u.src
    amin, amax, bmin, bmax = a.vmin, a.vmax, b.vmin, b.vmax
    if None in (amin, amax, bmin, bmax): return dmin, dmax
    # NaN orders nothing
    if any(isinstance(v, float) and math.isnan(v) for v in (amin, amax, bmin, bmax)): return dmin, dmax
    if u.op is Ops.ADD: return _clamp(amin + bmin, amax + bmax, dmin, dmax)
    if u.op is Ops.SUB: return _clamp(amin - bmax, amax - bmin, dmin, dmax)
    if u.op is Ops.MUL and not dtypes.is_float(dt):
      vals = [amin * bmin, amin * bmax, amax * bmin, amax * bmax]
      return _clamp(min(vals), max(vals), dmin, dmax)
    if u.op is Ops.MAX: return max(amin, bmin), max(amax, bmax)
    if u.op is Ops.IDIV and dtypes.is_int(dt) and bmin == bmax and bmin != 0:
      vals = [_cdiv(amin, bmin), _cdiv(amax, bmin)]
      return min(vals), max(vals)
    if u.op is Ops.MOD and dtypes.is_int(dt) and bmin == bmax and bmin > 0:
      if amin >= 0: return (amin, amax) if amax < bmin else (0, bmin - 1)
      return (-(bmin - 1), bmin - 1) if amax > 0 else (-(bmin - 1), 0)
    if u.op is Ops.CMPLT: return (amax < bmin, amin < bmax)
    if u.op is Ops.CMPNE:
      if amax < bmin or bmax < amin: return True, True
      if amin == amax == bmin == bmax: return False, False
      return False, True
    if u.op is Ops.CMPEQ:
      if amax < bmin or bmax < amin: return False, False
      if amin == amax == bmin == bmax: return True, True
      return False, True
    if u.op is Ops.AND and dt is dtypes.bool: return bool(amin and bmin), bool(amax and bmax)
    if u.op is Ops.OR and dt is dtypes.bool: return bool(amin or bmin), bool(amax or bmax)
    if u.op is Ops.AND and dtypes.is_int(dt) and amin >= 0 and bmin >= 0: return 0, min(amax, bmax)
    if u.op is Ops.SHL and dtypes.is_int(dt) and amin >= 0 and bmin == bmax and 0 <= bmin < 64:
      return _clamp(amin << bmin, amax << bmin, dmin, dmax)
    if u.op is Ops.SHR and dtypes.is_int(dt) and amin >= 0 and bmin == bmax and bmin >= 0:
      return amin >> bmin, amax >> bmin
    return dmin, dmax
  if u.op is Ops.NEG and not dtypes.is_float(dt) and u.src[0].vmin is not None:
    return _clamp(-u.src[0].vmax, -u.src[0].vmin, dmin, dmax)
  if u.op is Ops.WHERE:
    vals = [u.src[1].vmin, u.src[1].vmax, u.src[2].vmin, u.src[2].vmax]
    if None in vals: return dmin, dmax
    return min(vals), max(vals)
  if u.op is Ops.CAST and not isinstance(u.src[0].dtype, PtrDType) and u.src[0].vmin is not None:
    smin, smax = u.src[0].vmin, u.src[0].vmax
    if dtypes.is_int(dt) or dtypes.is_bool(dt):
      if dtypes.is_float(u.src[0].dtype): return dmin, dmax
      if dmin <= smin and smax <= dmax: return (bool(smin), bool(smax)) if dt is dtypes.bool else (smin, smax)
    if dtypes.is_float(dt) and not dtypes.is_float(u.src[0].dtype): return float(smin), float(smax)
  if u.op in (Ops.REDUCE, Ops.LOAD, Ops.ASSIGN, Ops.DEFINE_ACC, Ops.SHUFFLE_XOR, Ops.WMMA): return dmin, dmax
  return dmin, dmax

def _clamp(lo: Any, hi: Any, dmin: Any, dmax: Any) -> tuple[Any, Any]:
  if lo < dmin or hi > dmax: return dmin, dmax  # may overflow: no claim beyond the dtype's range
  return lo, hi

def _cdiv(a: int, b: int) -> int:
  """C-style (truncating) integer division."""
  q = abs(a) // abs(b)
  return q if (a >= 0) == (b > 0) else -q

def _cmod(a: int, b: int) -> int: return a - _cdiv(a, b) * b

# ** python semantics of every ALU op (constant folding and the PYTHON device) **

def _fdiv(a: float, b: float) -> float:
  if b == 0:
    if a == 0 or math.isnan(a): return math.nan
    return math.copysign(math.inf, a) * math.copysign(1.0, b)
  return a / b

def _exp2(x: float) -> float:
  try: return 2.0 ** x
  except OverflowError: return math.inf

def _log2(x: float) -> float:
  if x == 0: return -math.inf
  if x < 0 or math.isnan(x): return math.nan
  return math.log2(x) if not math.isinf(x) else math.inf

def _safe(fn: Callable[[float], float]) -> Callable[[float], float]:
  def wrapped(x: float) -> float:
    try: return fn(x)
    except ValueError: return math.nan
  return wrapped

def _max(x: Any, y: Any) -> Any:
  """max that propagates NaN from either float operand."""
  if math.isnan(x): return x
  if isinstance(x, float) and math.isnan(y): return y
  return max(x, y)

python_alu: dict[Ops, Callable[..., Any]] = {
  Ops.NEG: lambda x: (not x) if isinstance(x, bool) else -x, Ops.EXP2: _exp2, Ops.LOG2: _log2,
  Ops.SIN: _safe(lambda x: math.sin(x) if math.isfinite(x) else math.nan),
  Ops.SQRT: _safe(lambda x: math.sqrt(x) if x >= 0 else math.nan), Ops.RECIPROCAL: lambda x: _fdiv(1.0, x),
  Ops.TRUNC: lambda x: x if math.isinf(x) or math.isnan(x) else float(math.trunc(x)),
  Ops.ADD: lambda x, y: x + y, Ops.SUB: lambda x, y: x - y, Ops.MUL: lambda x, y: x * y, Ops.FDIV: _fdiv,
  Ops.IDIV: lambda x, y: _cdiv(x, y) if y != 0 else 0, Ops.MOD: lambda x, y: _cmod(x, y) if y != 0 else 0,
  Ops.MAX: _max,
  Ops.CMPLT: lambda x, y: x < y, Ops.CMPNE: lambda x, y: x != y, Ops.CMPEQ: lambda x, y: x == y,
  Ops.AND: lambda x, y: x & y, Ops.OR: lambda x, y: x | y, Ops.XOR: lambda x, y: x ^ y,
  Ops.SHL: lambda x, y: x << y, Ops.SHR: lambda x, y: x >> y,
  Ops.WHERE: lambda c, x, y: x if c else y, Ops.MULACC: lambda x, y, z: x * y + z,
}

def exec_alu(op: Ops, dtype: DType, operands: tuple[Any, ...]) -> Any:
  """Run one ALU op in Python with the dtype's semantics (wrapping ints, rounding floats)."""
  if dtypes.is_int(dtype) and op in (Ops.SHL, Ops.SHR) and not 0 <= operands[1] < dtype.bitsize * 2: return 0
  ret = python_alu[op](*operands)
  return as_const(ret, dtype)

def bitcast_value(value: Any, src: DType, dst: DType) -> Any:
  if src.fmt is None or dst.fmt is None: raise DTypeError(f"cannot bitcast constant {src!r} -> {dst!r} in python")
  return struct.unpack(dst.fmt, struct.pack(src.fmt, value))[0]

# ** printing **

_EXPR_OPS = {Ops.CONST, Ops.DEFINE_VAR, Ops.BIND, Ops.RANGE, Ops.SPECIAL} | GroupOp.ALU | {Ops.CAST}

_infix = {Ops.ADD: "+", Ops.SUB: "-", Ops.MUL: "*", Ops.IDIV: "//", Ops.MOD: "%", Ops.FDIV: "/", Ops.CMPLT: "<",
          Ops.CMPNE: "!=", Ops.CMPEQ: "==", Ops.AND: "&", Ops.OR: "|", Ops.XOR: "^", Ops.SHL: "<<", Ops.SHR: ">>"}

def render_expr(u: UOp) -> str:
  if u.op is Ops.CONST: return str(u.arg)
  if u.op is Ops.DEFINE_VAR: return u.arg[0]
  if u.op is Ops.BIND: return u.src[0].arg[0]
  if u.op is Ops.RANGE: return f"ridx{u.arg[0]}"
  if u.op in _infix: return f"({render_expr(u.src[0])}{_infix[u.op]}{render_expr(u.src[1])})"
  if u.op is Ops.MAX: return f"max({render_expr(u.src[0])}, {render_expr(u.src[1])})"
  if u.op is Ops.NEG: return f"(-{render_expr(u.src[0])})"
  if u.op is Ops.WHERE: return f"({render_expr(u.src[0])}?{render_expr(u.src[1])}:{render_expr(u.src[2])})"
  if u.op is Ops.CAST: return f"({u.dtype.name})({render_expr(u.src[0])})"
  return f"{u.op.name}({', '.join(render_expr(s) for s in u.src)})"

def pretty_print(u: UOp, max_nodes: int = 40) -> str:
  nodes = list(u.toposort())
  if len(nodes) > max_nodes: return f"UOp({u.op}, {u.dtype!r}, arg={u.arg!r}, <{len(u.src)} srcs, {len(nodes)} nodes>)"
  names = {n: f"x{i}" for i, n in enumerate(nodes)}
  lines = []
  for n in nodes:
    srcs = ", ".join(names[s] for s in n.src)
    lines.append(f"{names[n]} = UOp({n.op}, {n.dtype!r}, ({srcs}), arg={n.arg!r})")
  return "\n".join(lines)
