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
import math
import struct
import weakref
from dataclasses import dataclass
from enum import Enum, auto
from typing import TYPE_CHECKING, Any, Callable, Generic, Iterable, TypeVar
from ember.dtype import DType, PtrDType, AnyDType, dtypes, as_const, least_upper_dtype
from ember.errors import ArgumentError, DTypeError, ShapeError

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
  # hand-written kernels (ember.codegen.handwritten): statements grouped, ordered after others, ranges ended; a
  # per-thread register array; a kernel a user wrote as source (PROGRAM of SOURCE and BINARY)
  GROUP = auto(); AFTER = auto(); DEFINE_REG = auto(); PROGRAM = auto(); SOURCE = auto(); BINARY = auto()  # noqa: E702
  # a per-thread REG buffer seen as the whole tile the threads of LOCAL ranges hold together (UOp.unshard)
  UNSHARD = auto()
  # a quantised dot product (UOp.qdot): one row of blocks of 32 weight codes with int8-quantised activations
  QDOT = auto()
  # tensor level: a custom kernel run over its inputs' buffers (Tensor.custom_kernel)
  CUSTOM_KERNEL = auto()
  # tensor level: src[0]'s value, whose gradient with respect to src[1:] is given by a function (ember.gradient's
  # custom_gradient); the scheduler computes src[0] and never reads the other sources through it
  CUSTOM_GRAD = auto()
  def __repr__(self) -> str: return f"Ops.{self.name}"
  # members hash by identity, in C: Enum's __hash__ hashes the name in Python, and an op is hashed for every UOp
  # built (the hash-consing key) and every rule tried (pattern tables are indexed by op)
  __hash__ = object.__hash__

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
  """What a RANGE means to the hardware. THREAD ranges are split over CPU cores; REDUCE ranges accumulate. In a
  hand-written kernel GLOBAL ranges are blocks and LOCAL ranges threads of a block on GPUs (loops elsewhere), UPCAST
  ranges are unrolled and LOOP/REDUCE ranges are serial loops."""
  GLOBAL = auto(); THREAD = auto(); LOOP = auto(); REDUCE = auto(); UPCAST = auto(); UNROLL = auto()  # noqa: E702
  LOCAL = auto()
  def __repr__(self) -> str: return f"AxisType.{self.name}"
  __hash__ = object.__hash__  # as Ops': a range's arg is part of its hash-consing key

class AddrSpace(Enum):
  """Where a hand-written kernel's placeholder buffer lives: GLOBAL device memory (a kernel argument), LOCAL memory
  shared by the threads of a block, REG registers of one thread."""
  GLOBAL = auto(); LOCAL = auto(); REG = auto()  # noqa: E702
  def __repr__(self) -> str: return f"AddrSpace.{self.name}"

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
  """The SINK's arg: how many leading ranges are the kernel's output (global) ranges. A hand-written kernel
  (`Tensor.custom_kernel`) has a `name` instead: its SINK holds statements (STORE, END, GROUP, BARRIER) that codegen
  linearizes as written (ember.codegen.handwritten)."""
  __slots__ = ("n_global", "name")
  def __init__(self, n_global: int = 0, name: str | None = None): self.n_global, self.name = n_global, name
  def __eq__(self, other: Any) -> bool:
    return isinstance(other, KernelInfo) and (other.n_global, other.name) == (self.n_global, self.name)
  def __hash__(self) -> int: return hash(("KernelInfo", self.n_global, self.name))
  def __repr__(self) -> str:
    return f"KernelInfo(name={self.name!r})" if self.name is not None else f"KernelInfo(n_global={self.n_global})"

# each int8 activation plane of QDOT after the first is this many times finer: a remainder in [-1/2, 1/2] of the plane
# before it times 254 fits int8 without clamping, and two planes' integer dot products combine exactly in int32
QDOT_PLANE = 254

T = TypeVar("T")

class _cached_property(Generic[T]):
  """functools.cached_property without its lock: Python 3.11 takes one (shared by every node) on each first read,
  and codegen reads a value range first on thousands of new nodes per kernel. The value lands in the node's __dict__,
  where later reads find it before this descriptor."""
  def __init__(self, fn: Callable[[Any], T]) -> None: self.fn, self.name, self.__doc__ = fn, fn.__name__, fn.__doc__
  def __get__(self, obj: Any, owner: Any = None) -> T:
    if obj is None: return self  # type: ignore[return-value]  # read on the class (help(), docs): the descriptor
    obj.__dict__[self.name] = value = self.fn(obj)
    return value

class UOpMetaClass(type):
  # the live UOps by (op, dtype, src, arg, tag), held weakly: a UOp leaves when it dies (UOp.__del__). A dict of plain
  # weak references, not a WeakValueDictionary, whose entries (KeyedRef) are built in Python: hash-consing is paid
  # for every node any pass builds
  ucache: dict[tuple, weakref.ReferenceType[UOp]] = {}
  def __call__(cls, op: Ops, dtype: AnyDType = dtypes.void, src: tuple[UOp, ...] = (), arg: Any = None,
               tag: Any = None) -> UOp:
    key = (op, dtype, src, arg if arg is None or type(arg) is int else _arg_key(arg), tag)
    if (ref := _ucache_get(key)) is not None and (ret := ref()) is not None: return ret
    # a new node: its fields set here, without type.__call__ and a frame of UOp.__init__ (a pass builds thousands)
    ret = _new_object(cls)
    ret.op, ret.dtype, ret.src, ret.arg, ret.tag, ret._ukey = op, dtype, src, arg, tag, key
    _ucache[key] = _weak(ret)
    return ret

_unique_id = [0]
def next_unique() -> int:
  _unique_id[0] += 1
  return _unique_id[0]

_ucache = UOpMetaClass.ucache
_ucache_get, _weak = _ucache.get, weakref.ref
_new_object: Callable[[type], Any] = object.__new__

class UOp(metaclass=UOpMetaClass):
  """Built by UOpMetaClass.__call__ (hash-consing), which sets the fields."""
  __slots__ = ("op", "dtype", "src", "arg", "tag", "_ukey", "__weakref__", "__dict__")
  op: Ops
  dtype: AnyDType
  src: tuple[UOp, ...]
  arg: Any
  tag: Any
  _ukey: tuple  # its key in UOpMetaClass.ucache
  if TYPE_CHECKING:  # the constructor's signature for type checkers: UOpMetaClass.__call__ builds UOps, not __init__
    def __init__(self, op: Ops, dtype: AnyDType = dtypes.void, src: tuple[UOp, ...] = (), arg: Any = None,
                 tag: Any = None) -> None: ...
  def __del__(self, ucache: dict[tuple, weakref.ReferenceType[UOp]] = UOpMetaClass.ucache) -> None:
    # leave the hash-consing table, unless the entry is already another live UOp's (one built after this one's weak
    # reference was cleared, which a garbage collection does before it finalizes); the table is bound here, as a
    # default, so UOps that die while the interpreter shuts down still find it
    if (ref := ucache.get(key := self._ukey)) is not None and ((live := ref()) is None or live is self): del ucache[key]
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
    return toposort_all((self,), gate)
  @_cached_property
  def key(self) -> bytes:
    import hashlib
    own = str((self.op, self.dtype, self.arg, self.tag)).encode()
    return hashlib.sha256(own + b"".join(s.key for s in self.src)).digest()

  # ** tensor-level derived properties **
  @_cached_property
  def shape(self) -> tuple[sint, ...]:
    return _shape(self)
  @property
  def size(self) -> sint:
    from ember.helpers import prod
    return prod(self.shape)
  @_cached_property
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
  @_cached_property
  def buffers(self) -> frozenset[UOp]:
    """The BUFFER nodes this graph reads."""
    if self.op is Ops.BUFFER: return frozenset({self})
    return frozenset().union(*(s.buffers for s in self.src))

  # ** value ranges for symbolic simplification **
  @_cached_property
  def _min_max(self) -> tuple[Any, Any]: return _vmin_vmax(self)
  @property
  def vmin(self) -> Any: return self._min_max[0]
  @property
  def vmax(self) -> Any: return self._min_max[1]

  # ** construction sugar **
  @staticmethod
  def const(dtype: AnyDType, value: Any) -> UOp:
    # an int within an int dtype's range is its own constant (what as_const makes of it): index math builds thousands
    if type(value) is int and (bounds := _INT_BOUNDS.get(dtype)) is not None and bounds[0] <= value <= bounds[1]:
      return UOp(Ops.CONST, dtype, arg=value)
    return UOp(Ops.CONST, dtype, arg=as_const(value, dtype))
  def const_like(self, value: Any) -> UOp:
    return UOp.const(self.dtype.base if isinstance(self.dtype, PtrDType) else self.dtype, value)
  @staticmethod
  def variable(name: str, min_val: int, max_val: int, dtype: DType = dtypes.int32) -> UOp:
    """A symbolic integer in [min_val, max_val]; `.bind(value)` gives it a value for one run."""
    if min_val > max_val: raise ArgumentError(f"Variable {name}: min {min_val} > max {max_val}")
    return UOp(Ops.DEFINE_VAR, dtype, arg=(name, min_val, max_val))
  def bind(self, value: int) -> UOp:
    if self.op is not Ops.DEFINE_VAR: raise ValueError(f"only a Variable can be bound, not {self.op}")
    if not self.arg[1] <= value <= self.arg[2]:
      raise ArgumentError(f"value {value} is out of range [{self.arg[1]}, {self.arg[2]}] of Variable {self.arg[0]!r}")
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
  def ufix(self, x: Any) -> UOp:
    if isinstance(x, UOp): return x
    base = self.dtype.base if isinstance(self.dtype, PtrDType) else self.dtype
    # a Python float next to an int value promotes it (r * 0.5 is a float), as Tensor does
    if isinstance(x, float) and not dtypes.is_float(base): return UOp.const(dtypes.default_float, x)
    return self.const_like(x)
  def _bin(self, op: Ops, x: Any, reverse: bool = False) -> UOp:
    # two values of one dtype (index math, most of what rewrite rules build): the node `alu` builds, built here
    if type(x) is UOp and x.dtype is self.dtype and self.op is not Ops.INDEX and x.op is not Ops.INDEX and \
       op not in GroupOp.Comparison:
      return UOp(op, self.dtype, (x, self) if reverse else (self, x))
    me = _value(self)
    other = _value(me.ufix(x))
    if other.dtype is not me.dtype:
      dt = least_upper_dtype(me.dtype, other.dtype)
      a, b = me.cast(dt), other.cast(dt)
      return b.alu(op, a) if reverse else a.alu(op, b)
    return other.alu(op, me) if reverse else me.alu(op, other)
  def __add__(self, x: Any) -> UOp: return self._bin(Ops.ADD, x)
  def __radd__(self, x: Any) -> UOp: return self._bin(Ops.ADD, x, True)
  def __mul__(self, x: Any) -> UOp: return self._bin(Ops.MUL, x)
  def __rmul__(self, x: Any) -> UOp: return self._bin(Ops.MUL, x, True)
  def __sub__(self, x: Any) -> UOp: return self + (-_value(self.ufix(x)))
  def __rsub__(self, x: Any) -> UOp: return _value(self.ufix(x)) + (-self)
  def __neg__(self) -> UOp:
    me = _value(self)
    return me * -1 if dtypes.is_int(me.dtype) else me.alu(Ops.NEG)
  def __floordiv__(self, x: Any) -> UOp: return self._bin(Ops.IDIV, x)
  def __rfloordiv__(self, x: Any) -> UOp: return self._bin(Ops.IDIV, x, True)
  def __mod__(self, x: Any) -> UOp: return self._bin(Ops.MOD, x)
  def __rmod__(self, x: Any) -> UOp: return self._bin(Ops.MOD, x, True)
  def __truediv__(self, x: Any) -> UOp: return self._bin(Ops.FDIV, x)
  def __rtruediv__(self, x: Any) -> UOp: return self._bin(Ops.FDIV, x, True)
  def __and__(self, x: Any) -> UOp: return self._bin(Ops.AND, x)
  def __rand__(self, x: Any) -> UOp: return self._bin(Ops.AND, x, True)
  def __or__(self, x: Any) -> UOp: return self._bin(Ops.OR, x)
  def __ror__(self, x: Any) -> UOp: return self._bin(Ops.OR, x, True)
  def __xor__(self, x: Any) -> UOp: return self._bin(Ops.XOR, x)
  def __rxor__(self, x: Any) -> UOp: return self._bin(Ops.XOR, x, True)
  def __lshift__(self, x: Any) -> UOp: return _shift(Ops.SHL, _value(self), _value(self.ufix(x)))
  def __rshift__(self, x: Any) -> UOp: return _shift(Ops.SHR, _value(self), _value(self.ufix(x)))
  def __rlshift__(self, x: Any) -> UOp: return _shift(Ops.SHL, _value(self.ufix(x)), _value(self))
  def __rrshift__(self, x: Any) -> UOp: return _shift(Ops.SHR, _value(self.ufix(x)), _value(self))
  # comparisons build CMPLT nodes (UOps stay hashable by identity: == is `is`, compare values with .eq/.ne)
  def __lt__(self, x: Any) -> UOp: return self.lt(x)
  def __gt__(self, x: Any) -> UOp: return self.gt(x)
  def __le__(self, x: Any) -> UOp: return self.gt(x).logical_not()
  def __ge__(self, x: Any) -> UOp: return self.ge(x)
  def lt(self, x: Any) -> UOp: return self._bin(Ops.CMPLT, x)
  def ge(self, x: Any) -> UOp: return self.lt(x).logical_not()
  def gt(self, x: Any) -> UOp: return _value(self.ufix(x))._bin(Ops.CMPLT, self)
  def ne(self, x: Any) -> UOp: return self._bin(Ops.CMPNE, x)
  def eq(self, x: Any) -> UOp: return self._bin(Ops.CMPEQ, x)
  def maximum(self, x: Any) -> UOp: return self._bin(Ops.MAX, x)
  def minimum(self, x: Any) -> UOp: return -((-_value(self)).maximum(-_value(self.ufix(x))))
  def logical_not(self) -> UOp: return self.ne(True)
  def where(self, x: Any, y: Any) -> UOp:
    a, b = (_value(x) if isinstance(x, UOp) else None), (_value(y) if isinstance(y, UOp) else None)
    ref = a if a is not None else b
    if ref is None:  # two Python values: a constant of the dtype they promote to (an int is the default int)
      from ember.dtype import strong_dtype
      ref = UOp.const(strong_dtype(least_upper_dtype(dtypes.from_py(x), dtypes.from_py(y))), x)
    return UOp(Ops.WHERE, ref.dtype, (_value(self), ref.ufix(x if a is None else a), ref.ufix(y if b is None else b)))
  def cast(self, dtype: AnyDType) -> UOp:
    if isinstance(dtype, PtrDType): dtype = dtype.base  # a buffer's dtype, read as its elements'
    me = _value(self)
    return me if me.dtype is dtype else UOp(Ops.CAST, dtype, (me,))
  def bitcast(self, dtype: DType) -> UOp: return UOp(Ops.BITCAST, dtype, (_value(self),))

  # ** math (floats; an int value is converted to the default float first) **
  def _float(self) -> UOp:
    me = _value(self)
    return me if dtypes.is_float(me.dtype) else me.cast(dtypes.default_float)
  def _unary(self, op: Ops) -> UOp:
    me = self._float()
    return UOp(op, me.dtype, (me,))
  def exp2(self) -> UOp: return self._unary(Ops.EXP2)
  def log2(self) -> UOp: return self._unary(Ops.LOG2)
  def sin(self) -> UOp: return self._unary(Ops.SIN)
  def sqrt(self) -> UOp: return self._unary(Ops.SQRT)
  def reciprocal(self) -> UOp: return self._unary(Ops.RECIPROCAL)
  def trunc(self) -> UOp: return self._unary(Ops.TRUNC)
  def exp(self) -> UOp: return (self._float() * (1 / math.log(2))).exp2()
  def log(self) -> UOp: return self.log2() * math.log(2)
  def abs(self) -> UOp:
    me = _value(self)
    return me.lt(0).where(-me, me)
  def relu(self) -> UOp: return self.maximum(0)

  # ** movement of placeholder buffers (and tensor-level graphs) **
  def reshape(self, *shape: sint) -> UOp:
    new = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else tuple(shape)
    from ember.helpers import prod
    if isinstance(prod(new), int) and isinstance(self.size, int) and prod(new) != self.size:
      raise ShapeError(f"cannot reshape {self.shape} ({self.size} elements) to {new} ({prod(new)} elements)")
    return self if new == self.shape else UOp(Ops.RESHAPE, self.dtype, (self,), new)
  def permute(self, *order: int) -> UOp:
    perm = tuple(order[0]) if len(order) == 1 and isinstance(order[0], (tuple, list)) else tuple(order)
    if sorted(perm) != list(range(len(self.shape))):
      raise ShapeError(f"permute {perm} is not an order of the {len(self.shape)} dims of shape {self.shape}")
    return UOp(Ops.PERMUTE, self.dtype, (self,), perm)
  @property
  def T(self) -> UOp: return self.permute(*range(len(self.shape) - 2), len(self.shape) - 1, len(self.shape) - 2)
  def shrink(self, arg: tuple[tuple[sint, sint], ...]) -> UOp: return UOp(Ops.SHRINK, self.dtype, (self,), tuple(arg))
  def flip(self, *axes: int) -> UOp:
    return UOp(Ops.FLIP, self.dtype, (self,), tuple(i in axes for i in range(len(self.shape))))
  def unshard(self, axes: tuple[int, ...], ranges: tuple[UOp, ...]) -> UOp:
    """A fragment: this per-thread REG buffer as the tile that the threads of LOCAL `ranges` hold together, axis
    `axes[k]` `ranges[k]`'s size times longer. Index it with whole-tile indices: thread r must own the index, either
    contiguously (`r*shard + i`) or strided (`r + i*threads`); anything else raises "cannot shard index"."""
    if len(axes) != len(ranges) or any(r.op is not Ops.RANGE or r.src[0].op is not Ops.CONST for r in ranges):
      raise ShapeError(f"unshard takes one constant-size RANGE per axis, got axes {axes} and {len(ranges)} ranges")
    return UOp(Ops.UNSHARD, self.dtype, (self, *ranges), tuple(axes))
  def _shard_index(self, idxs: tuple[UOp, ...]) -> tuple[UOp, ...]:
    """The index into the per-thread buffer of whole-tile indices `idxs` of this UNSHARD view."""
    out = list(idxs)
    for axis, rng in zip(self.arg, self.src[1:]):
      shard, threads, e = self.src[0].shape[axis], rng.src[0].arg, idxs[axis]
      contiguous = (e - rng * shard).simplify()
      strided = (e - rng).simplify()
      if rng not in contiguous.toposort() and 0 <= contiguous.vmin and contiguous.vmax < shard: out[axis] = contiguous
      elif rng not in strided.toposort() and (strided % threads).simplify().op is Ops.CONST and \
           (strided % threads).simplify().arg == 0: out[axis] = (strided // threads).simplify()
      else: raise ShapeError(f"cannot shard index {e.render()} of axis {axis} over range {rng.arg[0]}: thread "
                             f"r must own r*{shard}+i (contiguous) or r+i*{threads} (strided)")
    return tuple(out)
  def __getitem__(self, idx: Any) -> UOp:
    """`buf[i, j]`: the address of one element of a placeholder buffer (or a view of one: reshape, permute, shrink,
    flip), indexed by UOps or ints. Used as a value it is loaded; `.store(v)` writes it."""
    if self.op is Ops.AFTER:  # the buffer once `deps` ran: the element's address keeps that order
      inner = self.src[0][idx]
      return inner.replace(src=(UOp(Ops.AFTER, inner.src[0].dtype, (inner.src[0], *self.src[1:])), *inner.src[1:]))
    idxs = idx if isinstance(idx, tuple) else (idx,)
    if len(idxs) != len(self.shape) or any(not isinstance(i, (int, UOp)) or isinstance(i, bool) for i in idxs):
      raise ShapeError(f"index a buffer of shape {self.shape} with {len(self.shape)} ints or UOps (one per dim), "
                       f"got {idx!r}")
    from ember.schedule.kernel import index_through, flat_index
    as_uops = tuple(i if isinstance(i, UOp) else UOp.const(dtypes.int32, i) for i in idxs)
    if self.op is Ops.UNSHARD: return self.src[0][self._shard_index(as_uops)]
    base, at, valid = index_through(self, as_uops)
    if base.op not in _PLACEHOLDERS:
      raise ShapeError(f"only placeholder buffers (UOp.placeholder, a custom kernel's arguments) can be indexed, "
                       f"not {base.op}")
    return base.index(flat_index(at, base.shape), valid)

  # ** kernel builders **
  def sink(self, *srcs: UOp, arg: Any = None) -> UOp: return UOp(Ops.SINK, dtypes.void, (self, *srcs), arg)
  def index(self, idx: UOp | int, valid: UOp | None = None) -> UOp:
    at = idx if isinstance(idx, UOp) else UOp.const(dtypes.int32, idx)
    return UOp(Ops.INDEX, self.dtype, (self, at) if valid is None else (self, at, valid))
  def load(self, dtype: DType | None = None) -> UOp:
    base = self.dtype.base if isinstance(self.dtype, PtrDType) else self.dtype
    return UOp(Ops.LOAD, dtype or base, (self,))
  def store(self, value: Any) -> UOp: return UOp(Ops.STORE, dtypes.void, (self, _value(self.ufix(value))))
  def end(self, *ranges: UOp) -> UOp:
    """This statement inside loops `ranges` (closed here, innermost first)."""
    if not ranges or any(r.op is not Ops.RANGE for r in ranges):
      raise ShapeError(f"end() takes the RANGEs the statement runs in, got {[getattr(r, 'op', r) for r in ranges]}")
    return UOp(Ops.END, dtypes.void, (self, *ranges))
  def after(self, *deps: UOp) -> UOp:
    """This buffer (or value) once the statements `deps` have run: orders reads after writes."""
    return UOp(Ops.AFTER, self.dtype, (self, *deps))
  @staticmethod
  def group(*stmts: UOp) -> UOp:
    """Statements that run in this order, as one statement."""
    return UOp(Ops.GROUP, dtypes.void, tuple(stmts))
  @staticmethod
  def barrier(*deps: UOp) -> UOp:
    """Every thread of a block waits here until all have run `deps` (stores to LOCAL memory)."""
    return UOp(Ops.BARRIER, dtypes.void, tuple(deps))
  def reduce(self, *ranges: UOp, arg: Ops = Ops.ADD) -> UOp:
    """This value accumulated with `arg` (ADD, MUL, MAX) over the loops `ranges`."""
    if arg not in (Ops.ADD, Ops.MUL, Ops.MAX): raise ValueError(f"reduce op must be ADD, MUL or MAX, not {arg}")
    if not ranges or any(r.op is not Ops.RANGE for r in ranges):
      raise ShapeError("reduce() takes the RANGEs to reduce over")
    me = _value(self)
    return UOp(Ops.REDUCE, me.dtype, (me, *ranges), arg)
  def sum(self, *axes: Any) -> UOp:
    """A kernel value summed over ranges (`x.sum(r)`), or a tensor-level graph summed over axes (`x.sum(0, 1)`)."""
    return self._reduce(Ops.ADD, axes)
  def max(self, *axes: Any) -> UOp: return self._reduce(Ops.MAX, axes)
  def prod(self, *axes: Any) -> UOp: return self._reduce(Ops.MUL, axes)
  def _reduce(self, op: Ops, axes: tuple[Any, ...]) -> UOp:
    if axes and all(isinstance(a, UOp) for a in axes): return self.reduce(*axes, arg=op)
    if any(not isinstance(a, int) for a in axes): raise ShapeError(f"reduce over ranges or int axes, not {axes}")
    dims = tuple(a % len(self.shape) for a in axes) if axes else tuple(range(len(self.shape)))
    return UOp(Ops.REDUCE_AXIS, self.dtype, (self,), (op, dims))
  @staticmethod
  def special(end: int, name: str) -> UOp:
    """A hardware index of GPU kernels: `gidx0`..`gidx2` (block), `lidx0`..`lidx2` (thread in the block), < end."""
    if not (len(name) == 5 and name[:4] in ("gidx", "lidx") and name[4] in "012"):
      raise ValueError(f"special index name must be gidx0..2 or lidx0..2, got {name!r}")
    return UOp(Ops.SPECIAL, dtypes.int32, (UOp.const(dtypes.int32, end),), name)
  @staticmethod
  def wmma(name: str, a: tuple[UOp, ...], b: tuple[UOp, ...]) -> tuple[UOp, ...]:
    """The warp matrix instruction `name` (a renderer's `tensor_cores`, ember.codegen.tensorcore.TENSOR_CORES): this
    lane's elements of D = A @ B from its elements of A and B, at the positions the instruction's layouts give
    (`TENSOR_CORES[name].a/b/c(lane, element)`). Every lane of the warp must run it."""
    from ember.codegen.tensorcore import TENSOR_CORES
    if (tc := TENSOR_CORES.get(name)) is None:
      raise ValueError(f"no matrix instruction {name!r}; the instructions are {sorted(TENSOR_CORES)}")
    if (len(a), len(b)) != tc.elements[:2]:
      raise ShapeError(f"{name} takes {tc.elements[0]} A and {tc.elements[1]} B elements per lane, got {len(a)} and "
                       f"{len(b)}")
    srcs = tuple(_value(x).cast(tc.dtype_in) for x in (*a, *b))
    return tuple(UOp(Ops.WMMA, tc.dtype_acc, srcs, (name, i, tc.elements[2])) for i in range(tc.elements[2]))
  @staticmethod
  def qdot(codes: UOp, scale: UOp, xq: UOp, xd: UOp, xs: UOp, blocks: int, bits: int, zero: int = 0,
           offset: UOp | None = None, planes: int = 1) -> UOp:
    """The float32 dot product of one row of `blocks` blocks of 32 quantised weights with int8-quantised activations
    (llama.cpp's q8_1 arithmetic, optionally with more int8 planes for the remainders). Every source is the address
    of the row's or the vector's first element (`buf[i, 0]`):

    * `codes` uint8, 16 bytes a block for `bits` 4 (byte j: element j in the low nibble, j + 16 in the high one) or
      32 for `bits` 8; `scale` (and `offset`) float32 per block: weight e of block b is scale[b] * (code - zero) +
      offset[b];
    * `xq` int8, 32 * `planes` a block (plane p at 32p), activation e of block b being xd[b] * sum_p xq[b, p, e] /
      QDOT_PLANE**p; `xd` float32 per block; `xs` float32 per block, the block's sum of activations.

    The value is sum_b scale[b] * (xd[b] * sum_p sum_e code[b, e] * xq[b, p, e] / QDOT_PLANE**p - zero * xs[b]) +
    offset[b] * xs[b], the integer sums exact (int32)."""
    if bits not in (4, 8): raise ValueError(f"qdot codes are 4 or 8 bits, not {bits}")
    if planes not in (1, 2, 3): raise ValueError(f"qdot activations have 1 to 3 int8 planes, not {planes}")
    if not (isinstance(blocks, int) and blocks > 0): raise ShapeError(f"qdot needs a block count > 0, got {blocks!r}")
    want = {"codes": dtypes.uint8, "scale": dtypes.float32, "xq": dtypes.int8, "xd": dtypes.float32,
            "xs": dtypes.float32, "offset": dtypes.float32}
    srcs = {"codes": codes, "scale": scale, "xq": xq, "xd": xd, "xs": xs}
    if offset is not None: srcs["offset"] = offset
    for name, src in srcs.items():
      if src.op is not Ops.INDEX or not isinstance(src.dtype, PtrDType) or src.dtype.base is not want[name]:
        raise DTypeError(f"qdot's {name} is the address of a {want[name]!r} buffer element (buf[i, 0]), got "
                         f"{src.op} of {src.dtype!r}")
    return UOp(Ops.QDOT, dtypes.float32, tuple(srcs.values()), (blocks, bits, zero, planes))
  @staticmethod
  def placeholder(shape: tuple[int, ...] | int, dtype: AnyDType, slot: int,
                  addrspace: AddrSpace = AddrSpace.GLOBAL) -> UOp:
    """A buffer of a hand-written kernel, of `shape`: GLOBAL is kernel argument `slot`, LOCAL memory shared by the
    threads of a block, REG registers of one thread (index REG buffers with UPCAST ranges or constants)."""
    shp = (shape,) if isinstance(shape, int) else tuple(shape)
    if isinstance(dtype, PtrDType): dtype = dtype.base  # another buffer's dtype
    from ember.helpers import prod
    size = prod(shp)
    if not all(isinstance(s, int) and s > 0 for s in shp):
      raise ShapeError(f"placeholder shape must be ints > 0, got {shp}")
    if dtype.weak or dtype is dtypes.void: raise DTypeError(f"a placeholder holds a concrete dtype, not {dtype!r}")
    if addrspace is AddrSpace.GLOBAL: buf = UOp(Ops.PARAM, dtype.ptr(size), (), slot)
    elif addrspace is AddrSpace.LOCAL: buf = UOp(Ops.DEFINE_LOCAL, dtype.ptr(size), (), f"temp{slot}")
    else: buf = UOp(Ops.DEFINE_REG, dtype.ptr(size), (), slot)
    return buf.reshape(*shp) if len(shp) != 1 else buf
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
  def pyrender(self) -> str:
    """Python source that rebuilds this graph, for bug reports and tests: run it with `exec` and its `ret` is this
    very UOp (hash-consing gives back the same object).

    >>> ns = {}
    >>> exec((Variable("n", 1, 8) * 2).pyrender(), ns)
    >>> ns["ret"].render()
    '(n*2)'
    """
    return pyrender(self)
  def variables(self) -> list[UOp]:
    return sorted({u for u in self.toposort() if u.op is Ops.DEFINE_VAR}, key=lambda v: v.arg)

_INT_BOUNDS: dict[AnyDType, tuple[int, int]] = {dt: (int(dtypes.min(dt)), int(dtypes.max(dt))) for dt in dtypes.ints}

Variable = UOp.variable
sint = int | UOp  # a shape dimension: an int or a symbolic UOp

_PLACEHOLDERS = (Ops.PARAM, Ops.DEFINE_LOCAL, Ops.DEFINE_REG)

def _value(u: UOp) -> UOp:
  """`u` read as a value: the address of an element of a kernel buffer (INDEX) is loaded."""
  return u.load() if u.op is Ops.INDEX else u

def _shift(op: Ops, x: UOp, y: UOp) -> UOp:
  """x << y, x >> y: ints only; the result has x's dtype (the amount is cast to it)."""
  if not (dtypes.is_int(x.dtype) and dtypes.is_int(y.dtype)):
    raise DTypeError(f"shift needs int operands, got {x.dtype!r} and {y.dtype!r}")
  return UOp(op, x.dtype, (x, y.cast(x.dtype)))

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
  if op in _PLACEHOLDERS and isinstance(u.dtype, PtrDType): return (u.dtype.size,)
  if op is Ops.AFTER: return u.src[0].shape
  if op is Ops.UNSHARD:  # each sharded axis times its range's size
    sizes = dict(zip(u.arg, (r.src[0].arg for r in u.src[1:])))
    return tuple(s * sizes[i] if i in sizes else s for i, s in enumerate(u.src[0].shape))
  if op in (Ops.INDEX, Ops.LOAD, Ops.STORE, Ops.END, Ops.GROUP, Ops.BARRIER, Ops.SPECIAL, Ops.SINK): return ()
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
    (amin, amax), (bmin, bmax) = a._min_max, b._min_max
    if None in (amin, amax, bmin, bmax): return dmin, dmax
    # NaN orders nothing (only a NaN is unequal to itself: index math, all ints, skips the check)
    if (amin != amin or amax != amax or bmin != bmin or bmax != bmax) and \
       any(isinstance(v, float) and math.isnan(v) for v in (amin, amax, bmin, bmax)): return dmin, dmax
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

_PYRENDER_HEADER = ("import math\nfrom ember.dtype import dtypes\n"
                    "from ember.uop.ops import UOp, Ops, AxisType, AddrSpace, KernelInfo, BufferArg\n")

def _py_arg(x: Any) -> str:
  """A Python expression for a UOp's arg (floats that repr cannot spell are math constants)."""
  if isinstance(x, float) and not math.isfinite(x):
    return "math.nan" if math.isnan(x) else ("math.inf" if x > 0 else "-math.inf")
  if isinstance(x, tuple): return "(" + "".join(f"{_py_arg(a)}, " for a in x).removesuffix(" ") + ")"
  if isinstance(x, KernelInfo): return f"KernelInfo({x.n_global}, {x.name!r})"
  return repr(x)

def pyrender(u: UOp) -> str:
  """See `UOp.pyrender`: one `uN = UOp(...)` line per node, sources first, then `ret = ...`."""
  names: dict[UOp, str] = {}
  lines = [_PYRENDER_HEADER]
  for i, n in enumerate(u.toposort()):
    names[n] = f"u{i}"
    srcs = "".join(f"{names[s]}, " for s in n.src).removesuffix(" ")
    tag = f", tag={_py_arg(n.tag)}" if n.tag is not None else ""
    lines.append(f"{names[n]} = UOp({n.op!r}, {n.dtype!r}, ({srcs}), {_py_arg(n.arg)}{tag})")
  lines.append(f"ret = {names[u]}")
  return "\n".join(lines) + "\n"

def pretty_print(u: UOp, max_nodes: int = 40) -> str:
  nodes = list(u.toposort())
  if len(nodes) > max_nodes: return f"UOp({u.op}, {u.dtype!r}, arg={u.arg!r}, <{len(u.src)} srcs, {len(nodes)} nodes>)"
  names = {n: f"x{i}" for i, n in enumerate(nodes)}
  lines = []
  for n in nodes:
    srcs = ", ".join(names[s] for s in n.src)
    lines.append(f"{names[n]} = UOp({n.op}, {n.dtype!r}, ({srcs}), arg={n.arg!r})")
  return "\n".join(lines)

def toposort_all(roots: Iterable[UOp], gate: Callable[[UOp], bool] | None = None) -> dict[UOp, None]:
  """The nodes under `roots`, sources before users: each root's toposort in turn, less what an earlier root listed (one
  walk where many roots share most of their nodes, as an unrolled reduction group's bodies do); `gate(node)` False
  lists a node without walking below it."""
  visited: dict[UOp, None] = {}
  for root in roots:
    stack: list[tuple[UOp, bool]] = [(root, False)]
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
