"""The UOp node: hash-consing, derived properties (shape, device, vmin/vmax), construction sugar and `exec_alu`."""
from __future__ import annotations
import itertools
import math
import pickle
import numpy as np
import pytest
from ember.dtype import dtypes
from ember.uop.ops import UOp, Ops, Variable, AxisType, BufferArg, exec_alu, GroupOp

# ** hash-consing **

def test_structurally_equal_nodes_are_the_same_object():
  a = UOp(Ops.CONST, dtypes.int32, arg=3)
  b = UOp(Ops.CONST, dtypes.int32, arg=3)
  assert a is b
  x = Variable("x", 0, 10)
  assert (x + a) is (x + UOp.const(dtypes.int32, 3))
  assert UOp(Ops.ADD, dtypes.int32, (x, a)) is UOp(Ops.ADD, dtypes.int32, (x, a))

@pytest.mark.parametrize("field", ["op", "dtype", "src", "arg", "tag"])
def test_any_differing_field_gives_a_different_node(field):
  x = Variable("x", 0, 10)
  base = dict(op=Ops.ADD, dtype=dtypes.int32, src=(x, UOp.const(dtypes.int32, 1)), arg=None, tag=None)
  other = {"op": Ops.MUL, "dtype": dtypes.int64, "src": (x, UOp.const(dtypes.int32, 2)), "arg": 7, "tag": "t"}[field]
  assert UOp(**base) is not UOp(**{**base, field: other})

def test_constants_that_compare_equal_in_python_stay_distinct():
  # -0.0 == 0.0 and True == 1 in Python, but they are different constants
  assert UOp(Ops.CONST, dtypes.float32, arg=0.0) is not UOp(Ops.CONST, dtypes.float32, arg=-0.0)
  assert UOp(Ops.CONST, dtypes.int32, arg=1) is not UOp(Ops.CONST, dtypes.int32, arg=True)
  assert UOp(Ops.CONST, dtypes.float32, arg=1.0) is not UOp(Ops.CONST, dtypes.float32, arg=1)
  nan1, nan2 = UOp(Ops.CONST, dtypes.float32, arg=math.nan), UOp(Ops.CONST, dtypes.float32, arg=float("nan"))
  assert nan1 is nan2  # NaN is one constant even though nan != nan

def test_dead_nodes_leave_the_table():
  # the table holds nodes weakly: one nobody holds is gone from it, also when it died in a reference cycle (collected
  # by the garbage collector), and building it again gives a live node
  import gc
  from ember.uop.ops import UOpMetaClass
  gc.collect()
  before = len(UOpMetaClass.ucache)
  a = UOp(Ops.CONST, dtypes.int32, arg=918273645)
  b = UOp(Ops.NEG, dtypes.int32, (a,))
  assert len(UOpMetaClass.ucache) == before + 2
  del a, b
  assert len(UOpMetaClass.ucache) == before
  c = UOp(Ops.CONST, dtypes.int32, arg=918273646)
  c.__dict__["cycle"] = c
  del c
  gc.collect()
  assert len(UOpMetaClass.ucache) == before
  assert UOp(Ops.CONST, dtypes.int32, arg=918273646).arg == 918273646

def test_replace_without_change_returns_self_and_with_change_is_consed():
  x = Variable("x", 0, 10)
  y = x + 1
  assert y.replace() is y
  assert y.replace(src=y.src) is y
  z = y.replace(op=Ops.MUL)
  assert z is UOp(Ops.MUL, dtypes.int32, y.src)

def test_pickle_round_trip_gives_the_same_node():
  x = Variable("x", 0, 10)
  y = (x * 4 + 3) // 2
  assert pickle.loads(pickle.dumps(y)) is y

def test_key_is_a_content_hash():
  x = Variable("x", 0, 10)
  assert (x + 1).key == (x + 1).key
  assert (x + 1).key != (x + 2).key
  assert isinstance((x + 1).key, bytes)

def test_a_uop_has_no_truth_value():
  with pytest.raises(TypeError):
    bool(Variable("x", 0, 3))

# ** graph walks **

def test_toposort_puts_sources_before_users_and_visits_each_node_once():
  x, y = Variable("x", 0, 5), Variable("y", 0, 5)
  s = x + y
  root = (s * s) + x
  order = list(root.toposort())
  assert len(order) == len(set(order))
  pos = {u: i for i, u in enumerate(order)}
  for u in order:
    for src in u.src: assert pos[src] < pos[u]
  assert order[-1] is root
  assert {x, y, s} <= set(order)

def test_toposort_handles_very_deep_graphs():
  x = Variable("x", 0, 5)
  node = x
  for i in range(5000): node = UOp(Ops.ADD, dtypes.int32, (node, UOp.const(dtypes.int32, i)))
  assert len(node.toposort()) == 1 + 5000 + 5000  # x, 5000 distinct constants, 5000 adds

def test_toposort_gate_stops_descent():
  x = Variable("x", 0, 5)
  inner = x + 1
  root = inner * 2
  seen = root.toposort(gate=lambda u: u is not inner)
  assert inner in seen and x not in seen

# ** derived properties **

def _buf(n: int, dt=dtypes.float32, device="PYTHON") -> UOp:
  return UOp(Ops.BUFFER, dt, (), BufferArg(10**9 + n, device, n))

def test_shape_of_movement_ops():
  b = _buf(24)
  r = UOp(Ops.RESHAPE, b.dtype, (b,), (2, 3, 4))
  assert r.shape == (2, 3, 4)
  p = UOp(Ops.PERMUTE, b.dtype, (r,), (2, 0, 1))
  assert p.shape == (4, 2, 3)
  pad = UOp(Ops.PAD, b.dtype, (p,), ((1, 2), (0, 0), (3, 0)))
  assert pad.shape == (7, 2, 6)
  sh = UOp(Ops.SHRINK, b.dtype, (pad,), ((1, 5), (0, 2), (2, 4)))
  assert sh.shape == (4, 2, 2)
  e = UOp(Ops.EXPAND, b.dtype, (UOp(Ops.RESHAPE, b.dtype, (sh,), (4, 1, 2, 2)),), (4, 5, 2, 2))
  assert e.shape == (4, 5, 2, 2)
  assert UOp(Ops.FLIP, b.dtype, (e,), (True, False, False, True)).shape == (4, 5, 2, 2)
  red = UOp(Ops.REDUCE_AXIS, b.dtype, (r,), (Ops.ADD, (1,)))
  assert red.shape == (2, 1, 4)
  assert b.size == 24 and r.size == 24

def test_device_and_base():
  b = _buf(6, device="NULL")
  r = UOp(Ops.RESHAPE, b.dtype, (b,), (2, 3))
  p = UOp(Ops.PERMUTE, b.dtype, (r,), (1, 0))
  assert p.device == "NULL" and p.base is b and p.is_realized
  c = UOp(Ops.CONST, dtypes.float32, (UOp(Ops.DEVICE, arg="PYTHON"),), 1.0)
  assert c.device == "PYTHON"
  assert (p.buffers == frozenset({b}))

def test_vmin_vmax_of_basic_nodes():
  x = Variable("x", 2, 7)
  assert (x.vmin, x.vmax) == (2, 7)
  r = UOp.range(10, 0)
  assert (r.vmin, r.vmax) == (0, 9)
  assert ((x + r).vmin, (x + r).vmax) == (2, 16)
  assert ((x * -3).vmin, (x * -3).vmax) == (-21, -6)
  assert ((r // 4).vmin, (r // 4).vmax) == (0, 2)
  assert ((r % 4).vmin, (r % 4).vmax) == (0, 3)
  assert ((x % 10).vmin, (x % 10).vmax) == (2, 7)
  c = UOp.const(dtypes.int32, 5)
  assert (c.vmin, c.vmax) == (5, 5)
  lt = x.lt(8)
  assert (lt.vmin, lt.vmax) == (True, True)

def _c_div(a: int, b: int) -> int:
  q = abs(a) // abs(b)
  return q if (a >= 0) == (b > 0) else -q

def _eval(u: UOp, env: dict[str, int]) -> int:
  """An independent evaluator of int index expressions (C-style division), the oracle for value ranges."""
  if u.op is Ops.CONST: return u.arg
  if u.op is Ops.DEFINE_VAR: return env[u.arg[0]]
  v = [_eval(s, env) for s in u.src]
  if u.op is Ops.ADD: return v[0] + v[1]
  if u.op is Ops.MUL: return v[0] * v[1]
  if u.op is Ops.IDIV: return _c_div(v[0], v[1])
  if u.op is Ops.MOD: return v[0] - _c_div(v[0], v[1]) * v[1]
  if u.op is Ops.MAX: return max(v)
  if u.op is Ops.CMPLT: return v[0] < v[1]
  if u.op is Ops.NEG: return -v[0]
  raise AssertionError(f"the test evaluator has no rule for {u.op}")

@pytest.mark.parametrize("seed", range(8))
def test_vmin_vmax_bound_every_value(seed):
  rng = np.random.default_rng(seed)
  x, y = Variable("x", -3, 4), Variable("y", 0, 6)
  leaves = [x, y, UOp.const(dtypes.int32, 3), UOp.const(dtypes.int32, -2)]
  exprs = list(leaves)
  for _ in range(12):
    a, b = exprs[rng.integers(len(exprs))], exprs[rng.integers(len(exprs))]
    op = rng.choice(["add", "mul", "div", "mod", "max"])
    if op == "add": e = a + b
    elif op == "mul": e = a * b
    elif op == "max": e = a.maximum(b)
    else:
      d = UOp.const(dtypes.int32, int(rng.choice([2, 3, 5])))
      e = a // d if op == "div" else a % d
    exprs.append(e)
  for e in exprs[4:]:
    vals = [_eval(e, {"x": xv, "y": yv}) for xv, yv in itertools.product(range(-3, 5), range(0, 7))]
    assert e.vmin <= min(vals) and max(vals) <= e.vmax, e.render()

# ** construction sugar **

def test_variable_defaults_to_int_and_binds_in_range():
  v = Variable("n", 1, 10)
  assert v.dtype is dtypes.int32 and v.expr == "n"
  b = v.bind(4)
  assert b.op is Ops.BIND and b.unbind() == (v, 4)
  with pytest.raises(ValueError, match="out of range"):
    v.bind(11)
  with pytest.raises(ValueError):
    Variable("m", 5, 1)
  assert Variable("big", 0, 2**40, dtypes.int64).bind(2**35).unbind()[1] == 2**35

def test_binary_sugar_promotes_and_comparisons_are_bool():
  x = Variable("x", 0, 10)
  assert (x + 1).dtype is dtypes.int32
  assert x.lt(3).dtype is dtypes.bool and x.eq(3).dtype is dtypes.bool and x.ne(3).dtype is dtypes.bool
  f = UOp.const(dtypes.float32, 1.5)
  assert (x.cast(dtypes.float32) * f).dtype is dtypes.float32
  assert (x.cast(dtypes.int64) + x).dtype is dtypes.int64  # int32 promotes to int64
  assert x.lt(3).where(x, x + 1).dtype is dtypes.int32
  assert x.cast(dtypes.int32) is x

def test_range_node():
  r = UOp.range(16, 3, AxisType.REDUCE)
  assert r.op is Ops.RANGE and r.arg == (3, AxisType.REDUCE) and r.src[0].arg == 16
  assert r.render() == "ridx3"

def test_render_expr():
  x = Variable("x", 0, 10)
  assert ((x + 1) * 2).render() == "((x+1)*2)"
  assert x.lt(3).render() == "(x<3)"
  assert x.maximum(4).render() == "max(x, 4)"

# ** exec_alu: constant semantics, checked against Python math / numpy **

def test_exec_alu_transcendental_edge_cases():
  assert exec_alu(Ops.TRUNC, dtypes.float32, (math.inf,)) == math.inf
  assert exec_alu(Ops.TRUNC, dtypes.float32, (-math.inf,)) == -math.inf
  assert math.isnan(exec_alu(Ops.TRUNC, dtypes.float32, (math.nan,)))
  assert exec_alu(Ops.SQRT, dtypes.float32, (0.0,)) == 0.0
  assert math.isnan(exec_alu(Ops.SQRT, dtypes.float32, (-1.0,)))
  assert exec_alu(Ops.LOG2, dtypes.float32, (0.0,)) == -math.inf
  assert math.isnan(exec_alu(Ops.LOG2, dtypes.float32, (-1.0,)))
  assert exec_alu(Ops.EXP2, dtypes.float64, (3.0,)) == 8.0
  assert exec_alu(Ops.RECIPROCAL, dtypes.float32, (0.0,)) == math.inf
  assert exec_alu(Ops.TRUNC, dtypes.float32, (-2.7,)) == -2.0

@pytest.mark.parametrize("a,b", [(7, 2), (-7, 2), (7, -2), (-7, -2), (0, 3), (5, 7)])
def test_exec_alu_int_division_is_c_style(a, b):
  # numpy's fmod and trunc-division follow C
  assert exec_alu(Ops.IDIV, dtypes.int32, (a, b)) == int(np.trunc(a / b))
  assert exec_alu(Ops.MOD, dtypes.int32, (a, b)) == int(np.fmod(a, b))

@pytest.mark.parametrize("dt,np_dt", [(dtypes.int8, np.int8), (dtypes.uint8, np.uint8), (dtypes.int16, np.int16),
                                      (dtypes.uint32, np.uint32), (dtypes.int32, np.int32)])
def test_exec_alu_ints_wrap(dt, np_dt):
  info = np.iinfo(np_dt)
  with np.errstate(over="ignore"):
    assert exec_alu(Ops.ADD, dt, (int(info.max), 1)) == int(np.array(info.max, np_dt) + np.array(1, np_dt))
    assert exec_alu(Ops.MUL, dt, (int(info.max), 3)) == int(np.array(info.max, np_dt) * np.array(3, np_dt))

def test_exec_alu_float32_rounds():
  assert exec_alu(Ops.ADD, dtypes.float32, (0.1, 0.2)) == float(np.float32(0.1) + np.float32(0.2))
  a16, b16 = float(np.float16(1.1)), float(np.float16(3.3))  # constants hold values already rounded to their dtype
  assert exec_alu(Ops.MUL, dtypes.float16, (a16, b16)) == float(np.float16(a16) * np.float16(b16))

def test_exec_alu_max_propagates_nan_and_comparisons():
  assert math.isnan(exec_alu(Ops.MAX, dtypes.float32, (math.nan, 1.0)))
  assert math.isnan(exec_alu(Ops.MAX, dtypes.float32, (1.0, math.nan)))
  assert exec_alu(Ops.CMPNE, dtypes.bool, (math.nan, math.nan)) is True
  assert exec_alu(Ops.CMPLT, dtypes.bool, (1, 2)) is True
  assert exec_alu(Ops.WHERE, dtypes.int32, (False, 1, 2)) == 2
  assert exec_alu(Ops.MULACC, dtypes.int32, (3, 4, 5)) == 17

def test_group_op_sets_are_consistent():
  assert GroupOp.Commutative <= GroupOp.Binary
  assert GroupOp.Comparison <= GroupOp.Binary
  assert GroupOp.ALU == GroupOp.Unary | GroupOp.Binary | GroupOp.Ternary
  assert not (GroupOp.Movement & GroupOp.ALU)

def test_value_ranges_with_nan_operands_claim_nothing_and_are_kept_on_the_node():
  """A NaN bound orders nothing: a sum or product with one has its dtype's full range (the check runs only where some
  bound is unequal to itself, which no int is). A node's range and shape are computed on first read and kept."""
  f = UOp(Ops.DEFINE_VAR, dtypes.float32, arg=("f", 0, 1))
  nan = UOp.const(dtypes.float32, math.nan)
  for e in (f + nan, nan + f, f * nan, UOp(Ops.MAX, dtypes.float32, (f, nan))):
    assert (e.vmin, e.vmax) == (dtypes.min(dtypes.float32), dtypes.max(dtypes.float32)), e
  assert ((f + 1.5).vmin, (f + 1.5).vmax) == (1.5, 2.5)
  i = UOp.variable("i", 2, 5)
  e = i * 3 + 1
  assert (e.vmin, e.vmax) == (7, 16) and "_min_max" in e.__dict__
  t = UOp(Ops.RESHAPE, dtypes.float32, (UOp(Ops.BUFFER, dtypes.float32, arg=BufferArg(1, "CPU", 6)),), (2, 3))
  assert t.shape == (2, 3) and t.__dict__["shape"] == (2, 3)
  assert callable(UOp.shape.__get__)  # read on the class (help(), docs): the descriptor itself
