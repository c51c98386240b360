"""The IR as a language: UOps take Tensor's operators and methods, the kernel builders build what codegen expects,
`pyrender` prints Python that rebuilds a graph (checked on scheduler kernels and hand-written ones)."""
from __future__ import annotations
import math
import numpy as np
import pytest
from ember import Tensor, Device
from ember.dtype import dtypes
from ember.errors import DTypeError, ShapeError
from ember.uop.ops import AddrSpace, AxisType, KernelInfo, Ops, UOp, Variable, exec_alu

def _eval(u: UOp, **vals: int) -> object:
  """The value of an expression of Variables and constants, computed node by node with exec_alu."""
  env: dict[UOp, object] = {}
  for n in u.toposort():
    if n.op is Ops.CONST: env[n] = n.arg
    elif n.op is Ops.DEFINE_VAR: env[n] = vals[n.arg[0]]
    elif n.op is Ops.CAST: env[n] = exec_alu(Ops.ADD, n.dtype, (env[n.src[0]], 0)) if not dtypes.is_float(n.dtype) \
      else float(env[n.src[0]])  # type: ignore[arg-type]
    else: env[n] = exec_alu(n.op, n.dtype, tuple(env[s] for s in n.src))
  return env[u]

@pytest.mark.parametrize("expr, ref", [
  (lambda a, b: a + b * 3, lambda a, b: a + b * 3), (lambda a, b: 7 - a, lambda a, b: 7 - a),
  (lambda a, b: a // 3 + a % 3, lambda a, b: int(a / 3) + int(math.fmod(a, 3))),
  (lambda a, b: (a << 2) | (b >> 1), lambda a, b: (a << 2) | (b >> 1)), (lambda a, b: 1 << b, lambda a, b: 1 << b),
  (lambda a, b: (a < b).where(a, b), lambda a, b: min(a, b)),
  (lambda a, b: (a >= b).where(1, 0), lambda a, b: int(a >= b)),
  (lambda a, b: (a > b) & (a <= 9), lambda a, b: a > b and a <= 9),
  (lambda a, b: a.maximum(b) ^ 5, lambda a, b: max(a, b) ^ 5),
  (lambda a, b: a.minimum(b) * -1, lambda a, b: -min(a, b)), (lambda a, b: 100 // (b + 1), lambda a, b: 100 // (b + 1)),
])
def test_integer_operators_match_python(expr, ref):
  a, b = Variable("a", 0, 9), Variable("b", 0, 9)
  for av in range(10):
    for bv in range(10): assert _eval(expr(a, b), a=av, b=bv) == ref(av, bv), (av, bv)

def test_float_methods_promote_ints_and_follow_math():
  a = Variable("a", 1, 9)
  for av in (1, 4, 9):
    assert math.isclose(_eval(a.sqrt(), a=av), math.sqrt(av), rel_tol=1e-6)
    assert math.isclose(_eval(a.exp2() * 0.5, a=av), 2.0 ** av / 2, rel_tol=1e-6)
    assert math.isclose(_eval(a.log2(), a=av), math.log2(av), rel_tol=1e-6)
    assert math.isclose(_eval((a * 0.5).reciprocal(), a=av), 2 / av, rel_tol=1e-6)
  assert a.sqrt().dtype is dtypes.default_float and (a * 0.5).dtype is dtypes.default_float
  with pytest.raises(DTypeError, match="int operands"): a.sqrt() << 1

def test_placeholders_views_and_indexing():
  buf = UOp.placeholder((4, 8), dtypes.float32, 3)
  assert buf.shape == (4, 8) and buf.base.op is Ops.PARAM and buf.base.arg == 3 and buf.base.dtype.size == 32
  r, c = UOp.range(8, 0, AxisType.GLOBAL), UOp.range(4, 1)
  idx = buf.T[r, c]  # element (c, r) of the (4, 8) buffer
  assert idx.op is Ops.INDEX and idx.src[0] is buf.base
  for rv, cv in ((0, 0), (7, 3), (5, 2)):
    flat = idx.src[1].substitute({r: UOp.const(dtypes.int32, rv), c: UOp.const(dtypes.int32, cv)}).simplify()
    assert flat.arg == cv * 8 + rv
  assert (buf[1, 2] * 2).src[0].op is Ops.LOAD  # an element used as a value is loaded
  local = UOp.placeholder(16, dtypes.half, 1, AddrSpace.LOCAL)
  reg = UOp.placeholder((2, 2), dtypes.float32, 0, AddrSpace.REG)
  assert local.op is Ops.DEFINE_LOCAL and local.dtype == dtypes.half.ptr(16) and reg.base.op is Ops.DEFINE_REG
  after = buf.after(buf[0, 0].store(1.0))
  assert after[1, 1].src[0].op is Ops.AFTER and after[1, 1].src[0].src[0] is buf.base
  with pytest.raises(ShapeError, match="2 ints or UOps"): buf[1]
  with pytest.raises(ShapeError, match="cannot reshape"): buf.reshape(5, 5)
  with pytest.raises(ShapeError, match="placeholder shape"): UOp.placeholder((0, 2), dtypes.float32, 0)

def test_statement_builders():
  out = UOp.placeholder(4, dtypes.int32, 0)
  i = UOp.range(4, 0, AxisType.GLOBAL)
  st = out[i].store(i * 2)
  end = st.end(i)
  assert st.op is Ops.STORE and end.op is Ops.END and end.src == (st, i)
  assert UOp.group(st, st).op is Ops.GROUP and UOp.barrier(end).op is Ops.BARRIER
  assert i.sum(i).op is Ops.REDUCE and i.sum(i).arg is Ops.ADD and i.cast(dtypes.float32).max(i).arg is Ops.MAX
  assert UOp.special(64, "lidx1").arg == "lidx1" and UOp.special(64, "lidx1").vmax == 63
  with pytest.raises(ValueError, match="gidx0..2"): UOp.special(4, "tid")
  with pytest.raises(ShapeError, match="RANGEs"): st.end(out)
  t = Tensor.ones(2, 3).uop
  assert t.sum(1).op is Ops.REDUCE_AXIS and t.sum(1).arg == (Ops.ADD, (1,))

def test_pyrender_rebuilds_the_same_graph():
  x = Tensor(np.arange(6, dtype=np.float32)).reshape(2, 3)
  sched = ((x.exp() * -math.inf).maximum(0).sum(1) + x.max()).schedule()
  out, inp = UOp.placeholder(4, dtypes.float32, 0), UOp.placeholder((2, 2), dtypes.float32, 1)
  i, j = UOp.range(4, 0, AxisType.GLOBAL), UOp.range(2, 1, AxisType.UPCAST)
  hand = out[i].store(inp.T[i // 2, j].reduce(j, arg=Ops.MAX) + math.nan).end(i).sink(arg=KernelInfo(name="hand"))
  graphs = [it.ast for it in sched if it.ast is not None] + [hand, Variable("n", 1, 8).bind(3) * 2]
  for g in graphs:
    ns: dict = {}
    exec(g.pyrender(), ns)
    assert ns["ret"] is g

def test_hand_written_kernel_runs_where_it_is_rendered():
  def kernel(out: UOp, a: UOp) -> UOp:
    i, k = UOp.range(3, 0, AxisType.GLOBAL), UOp.range(5, 1, AxisType.REDUCE)
    return out[i].store((a[i, k] * a[i, k]).sum(k).sqrt()).end(i).sink()
  a_np = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)
  for dev in sorted({Device.DEFAULT, "PYTHON"}):
    got = Tensor.custom_kernel(Tensor.empty(3, device=dev), Tensor(a_np, device=dev), fxn=kernel)[0].numpy()
    np.testing.assert_allclose(got, np.sqrt((a_np * a_np).sum(1)), rtol=1e-6)

def test_wmma_builder_checks_the_instruction():
  from ember.codegen.tensorcore import TENSOR_CORES
  tc = TENSOR_CORES["mma_m16n8k16_f16_f32"]
  a = tuple(UOp.const(dtypes.float32, i) for i in range(tc.elements[0]))
  b = tuple(UOp.const(dtypes.float32, i) for i in range(tc.elements[1]))
  d = UOp.wmma(tc.name, a, b)
  assert len(d) == tc.elements[2] and all(x.op is Ops.WMMA and x.dtype is tc.dtype_acc for x in d)
  assert all(s.dtype is tc.dtype_in for s in d[0].src) and d[1].arg == (tc.name, 1, tc.elements[2])
  with pytest.raises(ValueError, match="no matrix instruction"): UOp.wmma("mma_nope", a, b)
  with pytest.raises(ShapeError, match="A and"): UOp.wmma(tc.name, a[:1], b)
