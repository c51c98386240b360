"""DTypes, the promotion lattice, weak dtypes and the default dtypes (seeds-digest 2.10, 2.11 and 9.2 items 1-19)."""
from __future__ import annotations
import itertools
import math
import pickle
import numpy as np
import pytest
from ember import Tensor, dtypes, Context, TinyJit
from ember.dtype import DType, least_upper_dtype, least_upper_float, strong_dtype, sum_acc_dtype, as_const, to_dtype
from ember.errors import DTypeError, JitError, EmberError

strong = list(dtypes.all)
value_dtypes = strong + [dtypes.weakint, dtypes.weakfloat]

# ** the dtype objects **

def test_dtypes_are_singletons_that_survive_pickling():
  for dt in value_dtypes:
    assert pickle.loads(pickle.dumps(dt)) is dt
    assert to_dtype(dt.name) is dt
    assert dt.scalar() is dt  # item 18

def test_aliases():
  assert dtypes.half is dtypes.float16 and dtypes.float is dtypes.float32 and dtypes.double is dtypes.float64
  assert dtypes.int is dtypes.int32 and dtypes.long is dtypes.int64 and dtypes.uchar is dtypes.uint8

@pytest.mark.parametrize("dt", [d for d in strong if d.fmt is not None])
def test_itemsize_min_max_match_numpy(dt):
  npdt = np.dtype(dt.fmt)
  assert dt.itemsize == npdt.itemsize
  if dtypes.is_int(dt):
    assert (dt.min, dt.max) == (int(np.iinfo(npdt).min), int(np.iinfo(npdt).max))
  assert dtypes.from_np(npdt) is dt

def test_groups_and_predicates():
  assert set(dtypes.floats) == {dtypes.fp8e4m3, dtypes.fp8e5m2, dtypes.float16, dtypes.bfloat16, dtypes.float32,
                                dtypes.float64}
  assert set(dtypes.uints) == {dtypes.uint8, dtypes.uint16, dtypes.uint32, dtypes.uint64}
  assert set(dtypes.sints) == {dtypes.int8, dtypes.int16, dtypes.int32, dtypes.int64}
  assert dtypes.weaks == (dtypes.weakint, dtypes.weakfloat)
  assert all(dtypes.is_weak(d) for d in dtypes.weaks) and not any(dtypes.is_weak(d) for d in strong)
  assert dtypes.is_bool(dtypes.bool) and not dtypes.is_int(dtypes.bool)
  assert dtypes.finfo(dtypes.float16) == (5, 10) and dtypes.finfo(dtypes.bfloat16) == (8, 7)
  with pytest.raises(DTypeError):
    dtypes.finfo(dtypes.int32)

def test_unknown_dtype_name_is_a_typed_error():
  with pytest.raises(DTypeError, match="floaty"):
    to_dtype("floaty")

# ** item 1: from_py **

def test_from_py():
  assert dtypes.from_py(True) is dtypes.bool
  assert dtypes.from_py(2) is dtypes.weakint
  assert dtypes.from_py(3.0) is dtypes.weakfloat
  assert dtypes.from_py([]) is dtypes.default_float and dtypes.from_py(()) is dtypes.default_float
  assert dtypes.from_py([True]) is dtypes.bool
  assert dtypes.from_py([1, 2]) is dtypes.default_int
  assert dtypes.from_py([1, 2.5]) is dtypes.default_float
  assert dtypes.from_py([[True], [2]]) is dtypes.default_int
  with pytest.raises(DTypeError):
    dtypes.from_py("text")

# ** item 2: defaults through Context **

def test_default_dtypes_follow_context_and_restore():
  assert dtypes.default_float is dtypes.float32 and dtypes.default_int is dtypes.int32
  with Context(DEFAULT_FLOAT=dtypes.half, DEFAULT_INT=dtypes.int16):
    assert dtypes.default_float is dtypes.half and dtypes.default_int is dtypes.int16
  assert dtypes.default_float is dtypes.float32 and dtypes.default_int is dtypes.int32

@pytest.mark.parametrize("dt", list(dtypes.floats))
def test_every_float_can_be_the_default_float(dt):
  with Context(DEFAULT_FLOAT=dt):
    assert dtypes.default_float is dt
    assert Tensor(1.5).cast(dtypes.default_float).dtype is dt

@pytest.mark.parametrize("dt", list(dtypes.floats))
def test_lists_follow_every_default_float(dt):
  with Context(DEFAULT_FLOAT=dt):
    assert Tensor([1.5]).dtype is dt

@pytest.mark.parametrize("dt", list(dtypes.sints))
def test_every_signed_int_can_be_the_default_int(dt):
  with Context(DEFAULT_INT=dt):
    assert dtypes.default_int is dt
    assert Tensor([1]).dtype is dt

@pytest.mark.parametrize("key,bad", [("DEFAULT_FLOAT", dtypes.int32), ("DEFAULT_INT", dtypes.float32),
                                     ("DEFAULT_INT", dtypes.uint8), ("DEFAULT_FLOAT", dtypes.weakfloat)])
def test_bad_defaults_are_rejected(key, bad):
  with pytest.raises(DTypeError):
    Context(**{key: bad}).__enter__()  # entering is what validates: the bad value is never set
  assert dtypes.default_float is dtypes.float32 and dtypes.default_int is dtypes.int32

# ** the promotion lattice **

def test_lub_is_commutative_idempotent_and_associative():
  for a in value_dtypes:
    assert least_upper_dtype(a, a) is a
    for b in value_dtypes:
      ab = least_upper_dtype(a, b)
      assert ab is least_upper_dtype(b, a)
      # the lub is an upper bound: promoting either side to it changes nothing
      assert least_upper_dtype(ab, a) is ab and least_upper_dtype(ab, b) is ab
  for a, b, cc in itertools.product(value_dtypes, repeat=3):
    assert least_upper_dtype(least_upper_dtype(a, b), cc) is least_upper_dtype(a, least_upper_dtype(b, cc))

# regression: fp8 once had two float parents, which made promotion order-dependent
def test_fp8_promotion_is_associative():
  e4, e5, bf = dtypes.fp8e4m3, dtypes.fp8e5m2, dtypes.bfloat16
  assert least_upper_dtype(least_upper_dtype(e4, e5), bf) is least_upper_dtype(e4, least_upper_dtype(e5, bf))

# numpy promotes uint64 with a signed int to float64; ember (like JAX) gives weakfloat, so those pairs are left out
@pytest.mark.parametrize("a,b", [(x, y) for x in strong for y in strong
                                 if x.fmt and y.fmt and not dtypes.is_float(x) and not dtypes.is_float(y) and
                                 not ({x, y} & {dtypes.uint64} and {x, y} & set(dtypes.sints))])
def test_int_promotion_agrees_with_numpy(a, b):
  assert least_upper_dtype(a, b) is dtypes.from_np(np.promote_types(a.fmt, b.fmt)) or \
    (np.promote_types(a.fmt, b.fmt) == np.bool_ and least_upper_dtype(a, b) is dtypes.bool)

def test_float_promotion():
  assert least_upper_dtype(dtypes.float16, dtypes.float32) is dtypes.float32
  assert least_upper_dtype(dtypes.float16, dtypes.bfloat16) is dtypes.float32
  assert least_upper_dtype(dtypes.int32, dtypes.float16) is dtypes.float16  # ints defer to any float
  assert least_upper_dtype(dtypes.int64, dtypes.bfloat16) is dtypes.bfloat16
  assert least_upper_dtype(dtypes.fp8e4m3, dtypes.float32) is dtypes.float32

def test_weak_dtypes_defer_to_concrete_ones():
  for dt in strong:
    if dtypes.is_int(dt) or dtypes.is_float(dt): assert least_upper_dtype(dt, dtypes.weakint) is dt
    if dtypes.is_float(dt): assert least_upper_dtype(dt, dtypes.weakfloat) is dt
    if dtypes.is_int(dt) or dt is dtypes.bool: assert least_upper_dtype(dt, dtypes.weakfloat) is dtypes.weakfloat
  assert least_upper_dtype(dtypes.bool, dtypes.weakint) is dtypes.weakint
  assert least_upper_dtype(dtypes.weakint, dtypes.weakfloat) is dtypes.weakfloat
  assert least_upper_dtype(dtypes.int64, dtypes.uint64) is dtypes.weakfloat  # item 13

def test_strong_dtype_and_least_upper_float():
  assert strong_dtype(dtypes.weakint) is dtypes.default_int and strong_dtype(dtypes.weakfloat) is dtypes.default_float
  assert strong_dtype(dtypes.int8) is dtypes.int8
  assert least_upper_float(dtypes.weakint) is dtypes.weakfloat  # item 11
  assert least_upper_float(dtypes.int32) is dtypes.default_float
  assert least_upper_float(dtypes.float16) is dtypes.float16
  with Context(DEFAULT_FLOAT=dtypes.float64):
    assert strong_dtype(dtypes.weakfloat) is dtypes.float64 and least_upper_float(dtypes.uint8) is dtypes.float64

def test_sum_acc_dtype():
  assert sum_acc_dtype(dtypes.uint8) is dtypes.uint32
  assert sum_acc_dtype(dtypes.uint64) is dtypes.uint64
  assert sum_acc_dtype(dtypes.int8) is dtypes.int32 and sum_acc_dtype(dtypes.bool) is dtypes.int32
  assert sum_acc_dtype(dtypes.int64) is dtypes.int64
  assert sum_acc_dtype(dtypes.float16) is dtypes.float32 and sum_acc_dtype(dtypes.float64) is dtypes.float64
  assert sum_acc_dtype(dtypes.weakfloat) is dtypes.float32

def test_promoting_a_pointer_is_a_typed_error():
  with pytest.raises(DTypeError):
    least_upper_dtype(dtypes.float32.ptr(4), dtypes.float32)

# ** constants **

@pytest.mark.parametrize("dt,np_dt", [(dtypes.int8, np.int8), (dtypes.uint8, np.uint8), (dtypes.int16, np.int16),
                                      (dtypes.uint32, np.uint32), (dtypes.int64, np.int64)])
def test_int_constants_wrap_like_numpy(dt, np_dt):
  for v in (300, -129, 2**40 + 5, -1):
    assert as_const(v, dt) == int(np.array(v).astype(np_dt))
  assert as_const(-3.9, dt) == int(np.array(-3.9).astype(np.int64).astype(np_dt))

def test_float_constants_round_to_their_format():
  assert as_const(0.1, dtypes.float32) == float(np.float32(0.1))
  assert as_const(0.1, dtypes.float16) == float(np.float16(0.1))
  assert as_const(1e6, dtypes.float16) == math.inf
  assert as_const(1.0 + 2**-9, dtypes.bfloat16) == 1.0  # below half an ulp (2**-8) rounds down
  assert as_const(1.0 + 3 * 2**-8, dtypes.bfloat16) == 1.0 + 2**-6  # a tie rounds to the even mantissa
  assert as_const(1000.0, dtypes.fp8e4m3) == 448.0  # e4m3fn saturates
  assert as_const(3, dtypes.bool) is True and as_const(0.0, dtypes.bool) is False

# ** items 3-10, 13, 14, 16: dtypes of Tensors built from Python values and literals **

def test_python_ints_the_default_int_cannot_hold_widen_or_raise():
  # int64, else uint64 (numpy's choice for one value; a list mixing them numpy makes float64, ember keeps exact),
  # never a silently wrapped value; an asked-for dtype that cannot hold the value is a typed error (torch, numpy 2)
  from ember.errors import ArgumentError
  for v in (2**31, -2**31 - 1, 2**40, -2**62, 2**63, 2**64 - 1):
    for data in (v, [v], [[1, v], [2, 3]]):
      want = np.array(data, dtype=np.int64 if v < 2**63 else np.uint64)
      got = Tensor(data).numpy()
      assert got.dtype == want.dtype and (got == want).all() and got.ravel()[-1 if np.ndim(data) < 2 else 1] == v, data
  for data, dt in ((2**64, None), ([2**64], None), (-2**63 - 1, None), (300, dtypes.uint8), ([300], dtypes.uint8),
                   (-1, dtypes.uint32), ([2**31], dtypes.int32)):
    with pytest.raises(ArgumentError, match="does not fit"): Tensor(data, dtype=dt)
  assert Tensor(2**70, dtype=dtypes.float32).item() == np.float32(2**70)
  assert Tensor(7).dtype is dtypes.weakint and (Tensor(7) + Tensor([1, 2], dtype=dtypes.int16)).dtype is dtypes.int16

def test_full_and_arange_widen_for_ints_the_default_int_cannot_hold():
  from ember.errors import ArgumentError
  np.testing.assert_array_equal(Tensor.full((2,), 2**40).numpy(), np.full(2, 2**40, np.int64))
  np.testing.assert_array_equal(Tensor.arange(2**31 - 1, 2**31 + 2).numpy(), np.arange(2**31 - 1, 2**31 + 2))
  np.testing.assert_array_equal(Tensor.arange(0, -2**33, -2**31).numpy(), np.arange(0, -2**33, -2**31))
  assert Tensor.full((2,), 7).dtype is dtypes.default_int and Tensor.arange(5).dtype is dtypes.default_int
  with pytest.raises(ArgumentError, match="does not fit"): Tensor.full((2,), 300, dtype=dtypes.uint8)

def test_tensor_from_python_values():
  assert Tensor(True).dtype is dtypes.bool
  assert Tensor(None).dtype is dtypes.weakfloat
  assert Tensor(2).dtype is dtypes.weakint
  assert Tensor(2.34).dtype is dtypes.weakfloat
  assert Tensor([]).dtype is dtypes.default_float
  assert Tensor([1]).dtype is dtypes.default_int
  with Context(DEFAULT_INT=dtypes.int64):
    assert Tensor([1]).dtype is dtypes.int64
  with pytest.raises(DTypeError):
    Tensor([1.0], dtype=dtypes.weakfloat)

@pytest.mark.parametrize("dt", strong)
def test_literals_defer_to_the_tensor_dtype(dt):
  t = Tensor.ones(4, 4, dtype=dt)
  fl = dt if dtypes.is_float(dt) else dtypes.weakfloat
  it = dt if (dtypes.is_float(dt) or dtypes.is_int(dt)) else dtypes.weakint
  assert (t + 2.3).dtype is fl
  assert (t + 2).dtype is it
  assert (t + True).dtype is dt
  assert t.maximum(2).dtype is it and t.maximum(2.5).dtype is fl
  assert t.pad(((1, 1), (0, 0)), value=2).dtype is it
  assert t.pad(((1, 1), (0, 0)), value=2.5).dtype is fl
  assert (t > 0).where(t, 2).dtype is it
  assert (t > 0).where(t, 2.5).dtype is fl

def test_pad_of_int_with_inf_is_weakfloat():  # item 5
  t = Tensor.arange(9).reshape(1, 1, 3, 3).pad((1, 2, 0, -1), value=-math.inf)
  assert t.dtype is dtypes.weakfloat and t.shape == (1, 1, 2, 6)
  expect = np.pad(np.arange(9, dtype=np.float32).reshape(1, 1, 3, 3)[:, :, :2, :], ((0, 0), (0, 0), (0, 0), (1, 2)),
                  constant_values=-np.inf)
  np.testing.assert_array_equal(t.numpy(), expect)

@pytest.mark.parametrize("a,b,dt", [(3.1, 3.2, dtypes.weakfloat), (3.1, 3, dtypes.weakfloat),
                                    (3.1, True, dtypes.weakfloat),
                                    (3, 2, dtypes.weakint), (3, True, dtypes.weakint)])
def test_where_with_two_scalars(a, b, dt):  # item 6
  cond = Tensor([True, False, True])
  out = cond.where(a, b)
  assert out.dtype is dt
  np.testing.assert_allclose(out.numpy(), np.where([True, False, True], float(a), float(b)).astype(out.numpy().dtype))

def test_where_needs_a_bool_condition():
  with pytest.raises(DTypeError, match="bool"):
    Tensor([1, 0, 2]).where(1, 0)

def test_division_dtypes():  # item 7
  assert (Tensor([1, 2], dtype=dtypes.int32) / 2).dtype is dtypes.default_float
  assert (Tensor([1, 2], dtype=dtypes.int32) / 2.0).dtype is dtypes.weakfloat
  assert (Tensor([1.0], dtype=dtypes.float16) / 2).dtype is dtypes.float16
  assert (Tensor([1.0], dtype=dtypes.float16) / 2.0).dtype is dtypes.float16
  for dt in (dtypes.float16, dtypes.float32, dtypes.float64):
    with Context(DEFAULT_FLOAT=dt):
      assert Tensor([1]).div(Tensor([2])).dtype is dt

def test_reductions_strip_weakness():  # item 8
  wf, wi = Tensor(2.0).expand(3), Tensor(2).expand(3)
  assert wf.dtype is dtypes.weakfloat and wi.dtype is dtypes.weakint
  for r in (wf.sum(), wf.max(), wf.prod()): assert r.dtype is dtypes.default_float
  for r in (wi.sum(), wi.max(), wi.prod()): assert r.dtype is dtypes.default_int
  assert (wf.sum() + Tensor([1], dtype=dtypes.float16)).dtype is dtypes.float32
  assert wf.sum().item() == 6.0 and wi.prod().item() == 8

def test_weak_tensors_materialise_at_the_default():  # item 9
  t = Tensor(2.5)
  assert t.dtype is dtypes.weakfloat
  assert t.data().itemsize == dtypes.default_float.itemsize
  assert t.numpy().dtype.itemsize == dtypes.default_float.itemsize
  assert t.item() == 2.5
  assert t.contiguous().dtype is dtypes.weakfloat and t.realize().dtype is dtypes.weakfloat
  cl = t.clone()
  assert cl.dtype is dtypes.default_float and cl.item() == 2.5
  with Context(DEFAULT_FLOAT=dtypes.float64):
    assert Tensor(2.5).numpy().dtype == np.float64
  h = t.cast(dtypes.float16).realize()
  assert h.dtype is dtypes.float16 and h.numpy().dtype == np.float16

def test_weak_tensors_cannot_move_devices():
  with pytest.raises(EmberError):
    Tensor(2.5).to("NULL").realize()

def test_assign_into_a_weak_tensor():  # item 10
  t = Tensor(3.0)
  t.assign(Tensor(1.0, dtype=dtypes.default_float))
  assert t.dtype is dtypes.default_float and t.item() == 1.0

def test_int64_plus_uint64_is_weakfloat():  # item 13
  s = Tensor([-1], dtype=dtypes.int64) + Tensor([3], dtype=dtypes.uint64)
  assert s.dtype is dtypes.weakfloat
  r = s + Tensor(0.5)
  assert r.dtype is dtypes.weakfloat
  np.testing.assert_allclose(r.numpy(), [2.5])
  with pytest.raises(JitError):
    TinyJit(lambda x: (x + 1).realize())(s)

def test_where_of_weak_branches_then_dot_int8():  # item 14
  out = Tensor([True, False]).where(Tensor(1), 2).dot(Tensor([1, 1], dtype=dtypes.int8))
  assert out.dtype is dtypes.int8 and out.item() == 1 + 2

def test_weak_transcendentals_defer_to_float16():  # item 16
  for fn in ("exp", "cos", "sigmoid"):
    w = getattr(Tensor(2), fn)()
    assert w.dtype is dtypes.weakfloat
    assert (w + Tensor([1.0], dtype=dtypes.float16)).dtype is dtypes.float16
  np.testing.assert_allclose(Tensor(2).exp().item(), math.exp(2), rtol=1e-6)
  np.testing.assert_allclose(Tensor(2).cos().item(), math.cos(2), rtol=1e-5, atol=1e-6)

def test_shift_dtype_rules():  # item 15, at the Tensor level
  assert (Tensor([1, 2], dtype=dtypes.int8) << 1).dtype is dtypes.int8
  assert (Tensor([1, 2], dtype=dtypes.int8) << Tensor([1, 1], dtype=dtypes.uint32)).dtype is dtypes.int8
  with pytest.raises(DTypeError):
    Tensor([1.0]) << 1
  with pytest.raises(DTypeError):
    Tensor([1], dtype=dtypes.int32) << Tensor([1.0], dtype=dtypes.float64)
  with pytest.raises(DTypeError):
    Tensor(1.5) << Tensor(2.5)
  np.testing.assert_array_equal((Tensor([1, 2, 3], dtype=dtypes.int8) << 2).numpy(), np.array([1, 2, 3], np.int8) << 2)

@pytest.mark.parametrize("default", [dtypes.float16, dtypes.float32, dtypes.float64])
@pytest.mark.parametrize("dt", [dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64])
def test_gradient_dtype_is_the_parameter_dtype(dt, default):  # item 19
  with Context(DEFAULT_FLOAT=default):
    p = Tensor([1.0, 2.0], dtype=dt, requires_grad=True)
    (p * p * 0.5).sum().backward()
    assert p.grad is not None and p.grad.dtype is dt
    np.testing.assert_allclose(p.grad.numpy().astype(np.float64), [1.0, 2.0])

def test_dtype_is_a_frozen_value():
  with pytest.raises(AttributeError):
    dtypes.float32.itemsize = 8  # type: ignore[misc]
  assert isinstance(dtypes.float32, DType)
