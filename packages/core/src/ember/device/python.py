"""The PYTHON device: a bounds-checked numpy interpreter of linear programs, so all of core runs with no backend.

`PythonRenderer.render` writes a linear program (see docs/linear-program.md) as text: one JSON record per uop, each
followed by a readable comment, so `DEBUG` source listings are legible and the compiler cache key is stable.
`PythonCompiler` checks the text and passes it through; `PythonProgram` parses it back into UOps and interprets it.

How the interpreter runs a program:

* Loops over GLOBAL, THREAD and LOOP ranges run as numpy lanes: the range becomes `arange(end)` on its own array
  axis and the body runs once for all iterations. A range is only vectorised when no ASSIGN in its body updates an
  accumulator declared outside it (that would be a loop-carried dependency); REDUCE and UNROLL ranges, and ranges that
  would exceed `MAX_LANES` lanes, run as Python loops over a vectorised body. Range ends that differ between lanes
  (a triangular loop) run to the largest end with the other lanes masked off.
* Values are numpy arrays in the dtype's compute type: bool, the int types (which wrap), float16/32/64 natively, and
  bfloat16/fp8 (e4m3fn, e5m2) as float32 holding exactly representable values: every op result is rounded to the
  format with round-to-nearest-even, and memory holds the raw bits (uint16 / uint8).
* Every LOAD and STORE is bounds-checked against the element count of the buffer actually passed, for the lanes that
  are active and whose gate is true, and raises `MemoryAccessError` naming the kernel, the slot, the index and the
  size. Gated-off lanes never touch memory (a LOAD gives 0 there).

Semantics where C leaves things undefined (chosen to match `ember.uop.ops.exec_alu`, the constant folder):
integer IDIV/MOD by zero give 0 and never trap; INT_MIN / -1 wraps to INT_MIN; float -> int casts of NaN/inf give 0
and other out-of-range values wrap modulo 2**bits; shifts by a count outside [0, bits) give 0 (SHL, SHR of unsigned)
or the sign fill (SHR of signed); NEG of a bool is logical not. MULACC rounds `a*b` to the dtype before adding
(C without contraction). Casting to fp8e4m3 saturates at +-448 (inf included); fp8e5m2 and bfloat16 overflow to inf.

A program is checked when it is loaded: only linear-program ops, every RANGE closed by its END, no value used after
the loop that computes it has closed, LOAD/STORE dtypes equal to the buffer's. Violations raise `CompileError`.
"""
from __future__ import annotations
import ctypes
import json
import time
from typing import Any, Callable
import numpy as np
from ember.device.base import Allocator, BufferSpec, Compiled, Compiler
from ember.dtype import DType, PtrDType, AnyDType, dtypes, as_const, to_dtype
from ember.errors import CompileError, DeviceError, MemoryAccessError
from ember.renderer import Renderer
from ember.uop.ops import AxisType, GroupOp, Ops, QDOT_PLANE, UOp, render_expr

# a vectorised loop nest never holds more lanes than this; beyond it the innermost ranges run as Python loops
MAX_LANES = 1 << 22
PARALLEL_AXES = frozenset({AxisType.GLOBAL, AxisType.THREAD, AxisType.LOOP, AxisType.UPCAST})
LINEAR_OPS = frozenset({Ops.PARAM, Ops.DEFINE_VAR, Ops.CONST, Ops.RANGE, Ops.END, Ops.DEFINE_ACC, Ops.ASSIGN, Ops.INDEX,
                        Ops.LOAD, Ops.STORE, Ops.CAST, Ops.BITCAST, Ops.QDOT}) | GroupOp.ALU
FLOAT_ONLY_OPS = frozenset({Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.RECIPROCAL, Ops.TRUNC, Ops.FDIV})
INT_ONLY_OPS = frozenset({Ops.IDIV, Ops.MOD, Ops.AND, Ops.OR, Ops.XOR, Ops.SHL, Ops.SHR})
# arithmetic on bools runs in int8 and converts back with != 0 (C's int promotion followed by a bool conversion)
BOOL_VIA_INT_OPS = frozenset({Ops.ADD, Ops.SUB, Ops.MUL, Ops.IDIV, Ops.MOD, Ops.MAX, Ops.SHL, Ops.SHR, Ops.MULACC})

# ** dtype emulation **

_NP_TYPES: dict[DType, Any] = {
  dtypes.bool: np.bool_, dtypes.int8: np.int8, dtypes.uint8: np.uint8, dtypes.int16: np.int16, dtypes.uint16: np.uint16,
  dtypes.int32: np.int32, dtypes.uint32: np.uint32, dtypes.int64: np.int64, dtypes.uint64: np.uint64,
  dtypes.float16: np.float16, dtypes.float32: np.float32, dtypes.float64: np.float64,
  dtypes.bfloat16: np.float32, dtypes.fp8e4m3: np.float32, dtypes.fp8e5m2: np.float32,
}
# (exponent bits, mantissa bits, largest finite value, saturate on overflow) of the formats emulated in float32
_EMULATED: dict[DType, tuple[int, int, float, bool]] = {
  dtypes.bfloat16: (8, 7, (2 - 2.0 ** -7) * 2.0 ** 127, False),
  dtypes.fp8e4m3: (4, 3, 448.0, True),
  dtypes.fp8e5m2: (5, 2, 57344.0, False),
}

def np_compute_type(dt: DType) -> Any:
  """The numpy type values of `dt` are computed in (float32 for bfloat16 and fp8)."""
  if dt not in _NP_TYPES: raise CompileError(f"PYTHON cannot compute values of {dt!r}; use a concrete value dtype")
  return _NP_TYPES[dt]

def np_storage_type(dt: DType) -> Any:
  """The numpy type of `dt`'s bytes in memory: raw bits for bfloat16/fp8, uint8 for bool (any non-zero byte is true)."""
  if dt is dtypes.bool or dt in dtypes.fp8s: return np.uint8
  if dt is dtypes.bfloat16: return np.uint16
  return np_compute_type(dt)

def _fp8_decode_table(exp_bits: int, man_bits: int, finite_nan: bool) -> np.ndarray:
  """The float32 value of each of the 256 codes of an fp8 format (e4m3fn has no inf: only S.1111.111 is NaN)."""
  bias, exp_all, man_all = 2 ** (exp_bits - 1) - 1, (1 << exp_bits) - 1, (1 << man_bits) - 1
  out = np.empty(256, np.float32)
  for code in range(256):
    sign = -1.0 if code & 0x80 else 1.0
    exp, man = (code >> man_bits) & exp_all, code & man_all
    if finite_nan and exp == exp_all and man == man_all: out[code] = np.nan
    elif not finite_nan and exp == exp_all: out[code] = sign * np.inf if man == 0 else np.nan
    elif exp == 0: out[code] = sign * man * 2.0 ** (1 - bias - man_bits)
    else: out[code] = sign * (1 + man / 2 ** man_bits) * 2.0 ** (exp - bias)
  return out

_FP8_TABLES = {dtypes.fp8e4m3: _fp8_decode_table(4, 3, True), dtypes.fp8e5m2: _fp8_decode_table(5, 2, False)}
# the non-negative finite values in code order: they increase with the code, so a value's code is its sorted position
_FP8_POSITIVE = {dt: table[:0x7F if dt is dtypes.fp8e4m3 else 0x7C] for dt, table in _FP8_TABLES.items()}

def round_to_format(x: Any, dt: DType) -> np.ndarray:
  """Round to the nearest value of an emulated float format (ties to even), returned as float32."""
  exp_bits, man_bits, max_val, saturate = _EMULATED[dt]
  xd = np.asarray(x, np.float64)
  finite = np.isfinite(xd)
  # frexp gives x = m * 2**e with m in [0.5, 1): floor(log2|x|) is exactly e - 1, unlike a rounded log2
  _, exponent = np.frexp(np.where(finite, xd, 1.0))
  exponent = np.maximum(exponent - 1, 2 - 2 ** (exp_bits - 1))  # below the normal range the step stays fixed
  step = np.ldexp(1.0, exponent - man_bits)
  rounded = np.where(finite, np.rint(xd / step) * step, xd)
  overflow = np.abs(rounded) > max_val
  rounded = np.where(overflow, np.copysign(max_val if saturate else np.inf, xd), rounded)
  return np.asarray(rounded, np.float32)

def to_storage(x: Any, dt: DType) -> np.ndarray:
  """Values of `dt` (in its compute type) as the bits memory holds."""
  if dt is dtypes.bool: return np.asarray(x).astype(np.uint8)
  if dt is dtypes.bfloat16:
    bits = np.array(x, np.float32).view(np.uint32)
    return (bits >> np.uint32(16)).astype(np.uint16)
  if dt in _FP8_TABLES:
    xf = np.asarray(x, np.float32)
    code = np.searchsorted(_FP8_POSITIVE[dt], np.abs(xf)).astype(np.uint8)
    code = np.where(np.isinf(xf), np.uint8(0x7C), code)
    code = np.where(np.isnan(xf), np.uint8(0x7F), code)
    return np.where(np.signbit(xf), code | np.uint8(0x80), code).astype(np.uint8)
  return np.asarray(x).astype(np_compute_type(dt))

def from_storage(bits: Any, dt: DType) -> np.ndarray:
  """The bits memory holds as values of `dt` in its compute type."""
  if dt is dtypes.bool: return np.asarray(bits) != 0
  if dt is dtypes.bfloat16: return (np.asarray(bits).astype(np.uint32) << np.uint32(16)).view(np.float32)
  if dt in _FP8_TABLES: return _FP8_TABLES[dt][np.asarray(bits)]
  return np.asarray(bits)

def finish(x: Any, dt: DType) -> np.ndarray:
  """Bring a numpy result into `dt`'s compute type, rounding for the emulated formats."""
  if dt in _EMULATED: return round_to_format(x, dt)
  return np.asarray(x).astype(np_compute_type(dt), copy=False)

def cast_values(x: np.ndarray, src: DType, dst: DType) -> np.ndarray:
  """CAST with C semantics: float -> int truncates, -> bool is `!= 0`; see the module docstring for the C UB cases."""
  if dst is dtypes.bool: return np.asarray(x != 0)
  if dtypes.is_int(dst):
    if not dtypes.is_float(src): return np.asarray(x).astype(np_compute_type(dst))
    t = np.trunc(np.asarray(x, np.float64))
    t = np.fmod(np.where(np.isfinite(t), t, 0.0), 2.0 ** 64)  # exact: every float64 this large is an integer
    t = np.where(t >= 2.0 ** 63, t - 2.0 ** 64, np.where(t < -(2.0 ** 63), t + 2.0 ** 64, t))
    return t.astype(np.int64).astype(np_compute_type(dst))
  if dst in _EMULATED: return round_to_format(np.asarray(x).astype(np.float64), dst)
  return np.asarray(x).astype(np_compute_type(dst))

def bitcast_values(x: np.ndarray, src: DType, dst: DType) -> np.ndarray:
  bits = np.array(to_storage(x, src), order="C")  # a real copy: broadcast lanes have zero strides
  return from_storage(bits.view(np_storage_type(dst)), dst)

# ** ALU **

def _c_idiv(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  """Truncating division; x/0 gives 0 and INT_MIN/-1 wraps, where C would trap."""
  zero, minus_one = b == 0, (b == -1) if a.dtype.kind == "i" else np.zeros((), bool)
  safe = np.where(zero | minus_one, 1, b).astype(a.dtype)
  quotient = (a - np.fmod(a, safe)) // safe  # exact: a - fmod(a, b) is a multiple of b
  return np.where(zero, 0, np.where(minus_one, np.negative(a), quotient)).astype(a.dtype)

def _c_mod(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  """Remainder with the sign of the dividend (C `%`); x%0 and x%-1 give 0."""
  bad = (b == 0) | ((b == -1) if a.dtype.kind == "i" else np.zeros((), bool))
  return np.where(bad, 0, np.fmod(a, np.where(bad, 1, b).astype(a.dtype))).astype(a.dtype)

_numpy_alu: dict[Ops, Callable[..., Any]] = {
  Ops.NEG: np.negative, Ops.EXP2: np.exp2, Ops.LOG2: np.log2, Ops.SIN: np.sin, Ops.SQRT: np.sqrt,
  Ops.RECIPROCAL: np.reciprocal, Ops.TRUNC: np.trunc,
  Ops.ADD: np.add, Ops.SUB: np.subtract, Ops.MUL: np.multiply, Ops.FDIV: np.true_divide,
  Ops.IDIV: _c_idiv, Ops.MOD: _c_mod, Ops.MAX: np.maximum,  # np.maximum propagates NaN from either side
  Ops.CMPLT: np.less, Ops.CMPNE: np.not_equal, Ops.CMPEQ: np.equal,
  Ops.AND: np.bitwise_and, Ops.OR: np.bitwise_or, Ops.XOR: np.bitwise_xor,
  Ops.SHL: np.left_shift, Ops.SHR: np.right_shift,
  Ops.WHERE: np.where,
}

def exec_numpy_alu(op: Ops, dtype: DType, operand_dtype: DType, operands: list[np.ndarray]) -> np.ndarray:
  """One ALU op over numpy lanes with `dtype`'s semantics. `operand_dtype` is the (shared) dtype of the operands."""
  if operand_dtype is dtypes.bool and op is Ops.NEG: return np.logical_not(operands[0])
  if operand_dtype is dtypes.bool and op in BOOL_VIA_INT_OPS:
    operands = [np.asarray(x).astype(np.int8) for x in operands]
    return np.asarray((operands[0] * operands[1] + operands[2] if op is Ops.MULACC else _numpy_alu[op](*operands)) != 0)
  if op is Ops.MULACC: return finish(finish(operands[0] * operands[1], dtype) + operands[2], dtype)  # a*b rounds first
  return finish(_numpy_alu[op](*operands), dtype)

# ** serialisation: one JSON record per uop, each followed by a comment for people **

_FORMAT_TAG = "# ember-python-v1"

def _encode_arg(arg: Any) -> Any:
  if arg is None or isinstance(arg, (bool, int, str)): return arg
  if isinstance(arg, float): return {"float": arg.hex()}
  if isinstance(arg, AxisType): return {"axis": arg.name}
  if isinstance(arg, tuple): return {"tuple": [_encode_arg(a) for a in arg]}
  raise CompileError(f"PythonRenderer cannot serialise the arg {arg!r} of type {type(arg).__name__}")

def _decode_arg(arg: Any) -> Any:
  if not isinstance(arg, dict): return arg
  if "float" in arg: return float.fromhex(arg["float"])
  if "axis" in arg: return AxisType[arg["axis"]]
  if "tuple" in arg: return tuple(_decode_arg(a) for a in arg["tuple"])
  raise CompileError(f"PYTHON program has an unknown arg record {arg!r}")

def _encode_dtype(dt: AnyDType) -> Any:
  return {"ptr": dt.base.name, "size": dt.size} if isinstance(dt, PtrDType) else dt.name

def _decode_dtype(rec: Any) -> AnyDType:
  return to_dtype(rec["ptr"]).ptr(rec["size"]) if isinstance(rec, dict) else to_dtype(rec)

def _comment(u: UOp, names: list[str], i: int) -> str:
  """A Python-like rendering of one uop, for people reading the source."""
  me = f"v{i}"
  if u.op is Ops.PARAM: return f"{me} = buffer {u.arg}: {u.dtype!r}"
  if u.op is Ops.DEFINE_VAR: return f"{me} = var {u.arg[0]} in [{u.arg[1]}, {u.arg[2]}]"
  if u.op is Ops.CONST: return f"{me} = {u.arg!r}"
  if u.op is Ops.RANGE: return f"for {me} in range({names[0]}):  # {u.arg[1].name} axis {u.arg[0]}"
  if u.op is Ops.END: return f"end {names[0]}"
  if u.op is Ops.DEFINE_ACC: return f"{me} = acc {u.arg} = {names[0]}"
  if u.op is Ops.ASSIGN: return f"{names[0]} = {names[1]}"
  if u.op is Ops.INDEX: return f"{me} = &{names[0]}[{names[1]}]" + (f" if {names[2]}" if len(names) > 2 else "")
  if u.op is Ops.LOAD: return f"{me} = *{names[0]}"
  if u.op is Ops.STORE: return f"*{names[0]} = {names[1]}"
  if u.op in (Ops.CAST, Ops.BITCAST): return f"{me} = {u.op.name.lower()}<{u.dtype.name}>({names[0]})"
  if u.op is Ops.QDOT: return f"{me} = qdot{u.arg!r}({', '.join(names)})"
  return f"{me} = {PythonRenderer.code_for_op[u.op](*names)}"

def decode_program(src: str) -> list[UOp]:
  """Parse the text `PythonRenderer.render` wrote back into the linear program."""
  lines = src.splitlines()
  if not lines or not lines[0].startswith(_FORMAT_TAG):
    raise CompileError(f"not a PYTHON program: it must start with {_FORMAT_TAG!r}")
  decoder, uops = json.JSONDecoder(), list[UOp]()
  for lineno, line in enumerate(lines[1:], start=2):
    if not line.strip() or line.startswith("#"): continue
    try:
      rec, _ = decoder.raw_decode(line)
      if any(not 0 <= s < len(uops) for s in rec["src"]): raise IndexError(f"sources {rec['src']} not all earlier")
      srcs = tuple(uops[s] for s in rec["src"])
      tag = _decode_arg(rec["tag"]) if "tag" in rec else None
      uops.append(UOp(Ops[rec["op"]], _decode_dtype(rec["dtype"]), srcs, _decode_arg(rec["arg"]), tag))
    except (ValueError, KeyError, IndexError, TypeError) as e:
      raise CompileError(f"PYTHON program line {lineno} is malformed ({type(e).__name__}: {e}): {line[:120]!r}") from e
  return uops

class PythonRenderer(Renderer):
  """Writes linear programs for the PYTHON interpreter, which runs every op natively (no decompositions needed)."""
  device = "PYTHON"
  suffix = "py"
  has_local = False
  has_shared = False
  has_threads = False
  has_qdot = True
  native_floats = frozenset({dtypes.bfloat16, dtypes.fp8e4m3, dtypes.fp8e5m2})  # rounded after every op (above)
  code_for_op: dict[Ops, Callable[..., str]] = {
    Ops.NEG: lambda x: f"-{x}", Ops.EXP2: lambda x: f"exp2({x})", Ops.LOG2: lambda x: f"log2({x})",
    Ops.SIN: lambda x: f"sin({x})", Ops.SQRT: lambda x: f"sqrt({x})", Ops.RECIPROCAL: lambda x: f"1/{x}",
    Ops.TRUNC: lambda x: f"trunc({x})",
    Ops.ADD: lambda a, b: f"{a} + {b}", Ops.SUB: lambda a, b: f"{a} - {b}", Ops.MUL: lambda a, b: f"{a} * {b}",
    Ops.FDIV: lambda a, b: f"{a} / {b}", Ops.IDIV: lambda a, b: f"cdiv({a}, {b})",
    Ops.MOD: lambda a, b: f"cmod({a}, {b})",
    Ops.MAX: lambda a, b: f"max({a}, {b})", Ops.CMPLT: lambda a, b: f"{a} < {b}", Ops.CMPNE: lambda a, b: f"{a} != {b}",
    Ops.CMPEQ: lambda a, b: f"{a} == {b}", Ops.AND: lambda a, b: f"{a} & {b}", Ops.OR: lambda a, b: f"{a} | {b}",
    Ops.XOR: lambda a, b: f"{a} ^ {b}", Ops.SHL: lambda a, b: f"{a} << {b}", Ops.SHR: lambda a, b: f"{a} >> {b}",
    Ops.WHERE: lambda c, a, b: f"{a} if {c} else {b}", Ops.MULACC: lambda a, b, c: f"{a} * {b} + {c}",
  }
  def render(self, uops: list[UOp], name: str = "kernel") -> str:
    position = {u: i for i, u in enumerate(uops)}
    lines, depth = [f"{_FORMAT_TAG} {name}"], 0
    for i, u in enumerate(uops):
      if any(s not in position or position[s] >= i for s in u.src):
        raise CompileError(f"PythonRenderer: uop {i} ({u.op}) of {name!r} uses a source not earlier in the list")
      srcs = [position[s] for s in u.src]
      record = {"op": u.op.name, "dtype": _encode_dtype(u.dtype), "src": srcs, "arg": _encode_arg(u.arg)}
      if u.tag is not None: record["tag"] = _encode_arg(u.tag)  # a value computed again (hand-written kernels)
      if u.op is Ops.END: depth -= 1
      lines.append(f"{json.dumps(record)}  # {'  ' * max(depth, 0)}{_comment(u, [f'v{s}' for s in srcs], i)}")
      if u.op is Ops.RANGE: depth += 1
    return "\n".join(lines) + "\n"

class PythonCompiler(Compiler):
  """Checks that the source parses and passes it through: the PYTHON runtime interprets the text itself."""
  binary_format = "python"
  def __init__(self, cachekey: str | None = None):
    super().__init__(cachekey)
  def compile(self, src: str) -> bytes:
    decode_program(src)
    return src.encode()
  def disassemble(self, lib: bytes) -> str: return lib.decode()

# ** the interpreter **

def scalar_dtype(dt: AnyDType) -> DType:
  """The value dtype of a uop: a pointer's element dtype, or the dtype itself."""
  return dt.base if isinstance(dt, PtrDType) else dt

class _Plan:
  """What a program needs checked and precomputed once: loop extents, which loops vectorise, source positions."""
  def __init__(self, name: str, uops: list[UOp]):
    self.name, self.uops = name, uops
    position: dict[UOp, int] = {}
    for i, u in enumerate(uops):
      if u in position: raise CompileError(f"PYTHON kernel {name!r}: uop {i} ({u.op}) appears twice in the program")
      position[u] = i
    self.srcs = [tuple(position[s] for s in u.src) for u in uops]
    self.dtypes = [scalar_dtype(u.dtype) for u in uops]
    self.loop_end: dict[int, int] = {}
    self.vectorise: dict[int, bool] = {}
    self.consts: dict[int, np.ndarray] = {}
    self.var_positions: list[int] = []
    self.params: dict[int, DType] = {}
    self.lane_axes = 0
    open_ranges: list[int] = []
    scope_of: list[tuple[int, ...]] = []
    for i, u in enumerate(uops):
      self._check_op(i, u)
      if u.op is Ops.END:
        if not open_ranges or uops[open_ranges[-1]] is not u.src[0]:
          raise CompileError(f"PYTHON kernel {name!r}: END at uop {i} does not close the innermost open RANGE")
        self.loop_end[open_ranges.pop()] = i
      scope = tuple(open_ranges)
      scope_of.append(scope)
      # a value computed inside a loop cannot be used after that loop closes (consts and arguments are everywhere)
      for s in self.srcs[i]:
        if uops[s].op not in (Ops.CONST, Ops.PARAM, Ops.DEFINE_VAR) and scope_of[s] != scope[:len(scope_of[s])]:
          raise CompileError(f"PYTHON kernel {name!r}: uop {i} ({u.op}) uses uop {s} ({uops[s].op}) after the loop "
                             "that computes it has closed")
      if u.op is Ops.RANGE: open_ranges.append(i)
      if u.op is Ops.PARAM: self.params[u.arg] = self.dtypes[i]
      if u.op is Ops.DEFINE_VAR: self.var_positions.append(i)
      if u.op is Ops.CONST: self.consts[i] = self._const(u.arg, self.dtypes[i])
    if open_ranges:
      raise CompileError(f"PYTHON kernel {name!r}: RANGE at uop {open_ranges[-1]} is never closed by an END")
    for start, end in self.loop_end.items():
      carried = any(uops[j].op is Ops.ASSIGN and self.srcs[j][0] < start for j in range(start + 1, end))
      self.vectorise[start] = uops[start].arg[1] in PARALLEL_AXES and not carried
    for i in range(len(uops)):
      self.lane_axes = max(self.lane_axes, sum(self.vectorise.get(r, False) for r in scope_of[i]))

  def _check_op(self, i: int, u: UOp) -> None:
    where = f"PYTHON kernel {self.name!r}, uop {i} ({u.op})"
    if u.op not in LINEAR_OPS: raise CompileError(f"{where}: not a linear-program op; see docs/linear-program.md")
    if (u.op in (Ops.PARAM, Ops.INDEX)) != isinstance(u.dtype, PtrDType):
      raise CompileError(f"{where}: PARAM and INDEX, and only they, have a pointer dtype; got {u.dtype!r}")
    if u.op is Ops.INDEX and (u.src[0].op is not Ops.PARAM or len(u.src) not in (2, 3)):
      raise CompileError(f"{where}: INDEX needs (PARAM, idx) or (PARAM, idx, gate)")
    if u.op in (Ops.LOAD, Ops.STORE) and u.src[0].op is not Ops.INDEX:
      raise CompileError(f"{where}: the first source must be an INDEX")
    if u.op is Ops.LOAD and u.dtype is not scalar_dtype(u.src[0].dtype):
      raise CompileError(f"{where}: loads {u.dtype!r} from a buffer of {scalar_dtype(u.src[0].dtype)!r}; "
                         "load the buffer's dtype and cast after")
    if u.op is Ops.STORE and u.src[1].dtype is not scalar_dtype(u.src[0].dtype):
      raise CompileError(f"{where}: stores {u.src[1].dtype!r} into a buffer of {scalar_dtype(u.src[0].dtype)!r}; "
                         "cast the value first")
    if u.op is Ops.ASSIGN and u.src[0].op is not Ops.DEFINE_ACC:
      raise CompileError(f"{where}: ASSIGN can only target a DEFINE_ACC")
    if u.op is Ops.BITCAST and u.dtype.itemsize != u.src[0].dtype.itemsize:
      raise CompileError(f"{where}: BITCAST {u.src[0].dtype!r} -> {u.dtype!r} changes the itemsize")
    if u.op in GroupOp.ALU:
      operand = u.src[-1].dtype
      if u.op in FLOAT_ONLY_OPS and not dtypes.is_float(operand):
        raise CompileError(f"{where}: float-only op on {operand!r}")
      if u.op in INT_ONLY_OPS and dtypes.is_float(operand):
        raise CompileError(f"{where}: integer-only op on {operand!r}")

  @staticmethod
  def _const(value: Any, dt: DType) -> np.ndarray:
    if dt in _EMULATED: return round_to_format(float(value), dt)
    return np.asarray(as_const(value, dt), np_compute_type(dt))

class _Run:
  """One execution of a program: `values[i]` holds uop i's current value (numpy lanes) while it is in scope."""
  def __init__(self, plan: _Plan, buffers: list[np.ndarray], var_values: tuple[int, ...]):
    self.plan, self.uops, self.srcs, self.dtypes, self.buffers = plan, plan.uops, plan.srcs, plan.dtypes, buffers
    self.values: list[Any] = [None] * len(plan.uops)
    for pos, value in zip(plan.var_positions, var_values):
      self.values[pos] = np.asarray(value, np_compute_type(self.dtypes[pos]))
    for pos, const in plan.consts.items(): self.values[pos] = const
    self.depth, self.lanes = 0, 1

  def block(self, start: int, stop: int, active: np.ndarray | None) -> None:
    """Run uops [start, stop) for the lanes where `active` is true (None: all lanes)."""
    i = start
    while i < stop:
      op, srcs = self.uops[i].op, self.srcs[i]
      if op is Ops.RANGE:
        self.loop(i, active)
        i = self.plan.loop_end[i] + 1
        continue
      if op in GroupOp.ALU:
        self.values[i] = exec_numpy_alu(op, self.dtypes[i], self.dtypes[srcs[-1]], [self.values[s] for s in srcs])
      elif op is Ops.LOAD: self.values[i] = self.load(i, active)
      elif op is Ops.QDOT: self.values[i] = self.qdot(i, active)
      elif op is Ops.STORE: self.store(i, active)
      elif op is Ops.INDEX: self.values[i] = [self.values[s] for s in srcs[1:]]
      elif op is Ops.CAST: self.values[i] = cast_values(self.values[srcs[0]], self.dtypes[srcs[0]], self.dtypes[i])
      elif op is Ops.BITCAST:
        self.values[i] = bitcast_values(self.values[srcs[0]], self.dtypes[srcs[0]], self.dtypes[i])
      elif op is Ops.DEFINE_ACC: self.values[i] = self.values[srcs[0]]
      elif op is Ops.ASSIGN:
        acc, new = srcs[0], self.values[srcs[1]]
        self.values[acc] = self.values[i] = new if active is None else np.where(active, new, self.values[acc])
      i += 1

  def loop(self, i: int, active: np.ndarray | None) -> None:
    end = np.asarray(self.values[self.srcs[i][0]])
    per_lane = end.ndim > 0
    if per_lane: biggest = int(end.max() if active is None else np.where(active, end, 0).max(initial=0))
    else: biggest = int(end)
    if biggest <= 0: return
    index_type, body_end = np_compute_type(self.dtypes[i]), self.plan.loop_end[i]
    if self.plan.vectorise[i] and self.depth < self.plan.lane_axes and self.lanes * biggest <= MAX_LANES:
      shape = [1] * self.plan.lane_axes
      shape[self.depth] = biggest
      ridx = np.arange(biggest, dtype=index_type).reshape(shape)
      self.values[i] = ridx
      inner = active if not per_lane else (ridx < end if active is None else (ridx < end) & active)
      self.depth, self.lanes = self.depth + 1, self.lanes * biggest
      try: self.block(i + 1, body_end, inner)
      finally: self.depth, self.lanes = self.depth - 1, self.lanes // biggest
      return
    for it in range(biggest):
      inner = active
      if per_lane:
        inner = it < end if active is None else (it < end) & active
        if not inner.any(): break  # `it` only grows, so no lane becomes active again
      self.values[i] = np.asarray(it, index_type)
      self.block(i + 1, body_end, inner)

  def _lanes(self, index_pos: int, active: np.ndarray | None) -> tuple[int, np.ndarray, np.ndarray, np.ndarray | None]:
    """The slot, memory, index lanes and lane mask (gate and active lanes; None: all) of an INDEX."""
    idx_and_gate = self.values[index_pos]
    gate = idx_and_gate[1] if len(idx_and_gate) > 1 else None
    mask = active if gate is None else (gate if active is None else gate & active)
    slot = self.uops[index_pos].src[0].arg
    return slot, self.buffers[slot], np.asarray(idx_and_gate[0]), mask

  def _check_bounds(self, i: int, slot: int, buf: np.ndarray, idx: np.ndarray, mask: np.ndarray | None) -> None:
    size = buf.shape[0]
    bad = (idx < 0) | (idx >= size)
    if mask is not None: bad = bad & mask
    if not bad.any(): return
    offending = np.broadcast_to(idx, bad.shape)[bad]
    verb = "read" if self.uops[i].op is Ops.LOAD else "wrote"
    expr = render_expr(self.uops[i].src[0].src[1])
    raise MemoryAccessError(
      f"kernel {self.plan.name!r} {verb} out of bounds: buffer slot {slot} holds {size} elements of "
      f"{self.plan.params[slot].name} (valid indices 0..{size - 1}) but uop {i} ({self.uops[i].op.name}) used index "
      f"{int(offending[0])} ({offending.size} lane(s) out of range); index expression: {expr[:300]}. "
      "Fix the indexing or gate the access.")

  def load(self, i: int, active: np.ndarray | None) -> np.ndarray:
    dt = self.dtypes[i]
    slot, buf, idx, mask = self._lanes(self.srcs[i][0], active)
    if mask is None:
      self._check_bounds(i, slot, buf, idx, None)
      return from_storage(buf[idx], dt)
    shape = np.broadcast_shapes(idx.shape, np.shape(mask))
    idx, mask = np.broadcast_to(idx, shape), np.broadcast_to(mask, shape)
    zero = np.zeros(shape, np_compute_type(dt))
    if not mask.any(): return zero  # every lane is gated off: memory is not touched at all
    self._check_bounds(i, slot, buf, idx, mask)
    return np.where(mask, from_storage(buf[np.where(mask, idx, 0)], dt), zero)

  def _block_rows(self, i: int, pos: int, per_block: int, active: np.ndarray | None) -> np.ndarray:
    """QDOT source `pos`: each lane's `blocks` * `per_block` elements from its address, (lanes..., blocks, per_block),
    bounds-checked for the active lanes."""
    blocks = self.uops[i].arg[0]
    slot, buf, idx, mask = self._lanes(self.srcs[i][pos], active)
    if mask is not None: idx = np.where(mask, idx, 0)
    span = np.arange(blocks * per_block)
    for end in (idx, idx + span[-1]): self._check_bounds(i, slot, buf, np.asarray(end), mask)
    values = from_storage(buf[np.asarray(idx)[..., None] + span], self.plan.params[slot])
    return values.reshape(*values.shape[:-1], blocks, per_block)

  def qdot(self, i: int, active: np.ndarray | None) -> np.ndarray:
    """QDOT (UOp.qdot): integer dot products per block, scaled and summed in float64, rounded to float32."""
    _, bits, zero, planes = self.uops[i].arg
    raw = self._block_rows(i, 0, 16 if bits == 4 else 32, active).astype(np.int64)
    codes = np.concatenate([raw & 15, raw >> 4], axis=-1) if bits == 4 else raw
    scale, xq, xd, xs = (self._block_rows(i, p, n, active) for p, n in ((1, 1), (2, 32 * planes), (3, 1), (4, 1)))
    xq = xq.reshape(*xq.shape[:-1], planes, 32).astype(np.int64)
    ints = (codes[..., None, :] * xq).sum(-1) * QDOT_PLANE ** np.arange(planes - 1, -1, -1)  # exact, as in int32
    dots = ints.sum(-1, keepdims=True).astype(np.float64) / QDOT_PLANE ** (planes - 1)
    per_block = scale.astype(np.float64) * (xd * dots - zero * xs.astype(np.float64))
    if len(self.srcs[i]) == 6: per_block = per_block + self._block_rows(i, 5, 1, active).astype(np.float64) * xs
    return per_block.sum(axis=(-2, -1)).astype(np.float32)

  def store(self, i: int, active: np.ndarray | None) -> None:
    slot, buf, idx, mask = self._lanes(self.srcs[i][0], active)
    bits = to_storage(self.values[self.srcs[i][1]], self.dtypes[self.srcs[i][1]])
    shape = np.broadcast_shapes(idx.shape, bits.shape, *(() if mask is None else (np.shape(mask),)))
    idx, bits = np.broadcast_to(idx, shape), np.broadcast_to(bits, shape)
    if mask is not None:
      lanes = np.broadcast_to(mask, shape)
      idx, bits = idx[lanes], bits[lanes]
      if idx.size == 0: return
    self._check_bounds(i, slot, buf, idx, None)
    if not buf.flags.writeable:
      raise DeviceError(f"kernel {self.plan.name!r} writes buffer slot {slot}, but the memory passed is read-only")
    buf[idx] = bits

def _host_array(buf: Any, dt: DType, slot: int, name: str) -> np.ndarray:
  """A numpy view of the memory passed for one buffer slot, in the slot's storage type."""
  try: mv = memoryview(buf)
  except TypeError as e:
    raise DeviceError(f"PYTHON kernel {name!r}: buffer slot {slot} is a {type(buf).__name__}, not host memory") from e
  if mv.format != "B" or mv.ndim != 1: mv = mv.cast("B")
  storage = np.dtype(np_storage_type(dt))
  return np.frombuffer(mv, dtype=storage, count=mv.nbytes // storage.itemsize)

class PythonProgram:
  """A PYTHON kernel: parses and checks the program text once, then interprets it on each call."""
  def __init__(self, name: str, lib: bytes):
    self.name = name
    self.plan = _Plan(name, decode_program(lib.decode()))

  def __call__(self, *bufs: Any, global_size: tuple[int, ...] = (1, 1, 1), local_size: tuple[int, ...] | None = None,
               vals: tuple[int, ...] = (), wait: bool = False) -> float | None:
    start = time.perf_counter()
    # like every compiled kernel's signature: one buffer per PARAM the program declares, in slot order (the engine
    # passes ProgramSpec.globals; a slot simplification dropped is no argument)
    slots = sorted(self.plan.params)
    if len(bufs) != len(slots):
      raise DeviceError(f"PYTHON kernel {self.name!r} takes {len(slots)} buffers, got {len(bufs)}; pass the buffers of "
                        f"slots {slots} in that order (ProgramSpec.globals)")
    if len(vals) != len(self.plan.var_positions):
      raise DeviceError(f"PYTHON kernel {self.name!r} takes {len(self.plan.var_positions)} variable values, "
                        f"got {len(vals)}")
    for pos, value in zip(self.plan.var_positions, vals):
      var_name, lo, hi = self.plan.uops[pos].arg
      if not lo <= value <= hi:
        raise DeviceError(f"PYTHON kernel {self.name!r}: variable {var_name!r} = {value} is outside its range "
                          f"[{lo}, {hi}]")
    arrays = [np.empty(0)] * (slots[-1] + 1 if slots else 0)
    for slot, buf in zip(slots, bufs): arrays[slot] = _host_array(buf, self.plan.params[slot], slot, self.name)
    with np.errstate(all="ignore"):
      _Run(self.plan, arrays, tuple(vals)).block(0, len(self.plan.uops), None)
    return time.perf_counter() - start if wait else None

# ** memory and the device **

class PythonAllocator(Allocator):
  """Host memory in bytearrays; a handle is a writable byte memoryview, so views and zero-copy access are slices."""
  def _alloc(self, size: int, options: BufferSpec) -> memoryview:
    if options.external_ptr is not None:
      return memoryview((ctypes.c_char * size).from_address(options.external_ptr)).cast("B")
    return memoryview(bytearray(size))
  def _as_buffer(self, src: memoryview) -> memoryview: return src
  def _offset(self, buf: memoryview, size: int, offset: int) -> memoryview: return buf[offset:offset + size]
  def _copyin(self, dest: memoryview, src: memoryview) -> None: dest[:] = src
  def _copyout(self, dest: memoryview, src: memoryview) -> None: dest[:] = src

class PythonDevice(Compiled):
  """The PYTHON device: slow but exact and bounds-checked; every core feature can be tested on it."""
  def __init__(self, device: str = "PYTHON", renderer: Renderer | None = None, compiler: Compiler | None = None):
    super().__init__(device, PythonAllocator(), renderer if renderer is not None else PythonRenderer(),
                     compiler if compiler is not None else PythonCompiler(), PythonProgram)
