"""Every Tensor primitive against numpy, and the typed errors bad input raises (naming both operands)."""
from __future__ import annotations
import math
import re
import numpy as np
import pytest
from ember import Tensor, dtypes
from ember.errors import AxisError, DTypeError, ShapeError, GradientError

rng = np.random.default_rng(0)
A = rng.standard_normal((3, 4)).astype(np.float32)
B = rng.standard_normal((3, 4)).astype(np.float32)
P = (np.abs(A) + 0.5).astype(np.float32)  # positive, for log/sqrt

def close(t: Tensor, ref, rtol=1e-5, atol=1e-6):
  out = t.numpy()
  ref = np.asarray(ref)
  assert out.shape == ref.shape, (out.shape, ref.shape)
  np.testing.assert_allclose(out, ref, rtol=rtol, atol=atol)

# ** creation **

def test_creation():
  close(Tensor.zeros(2, 3), np.zeros((2, 3)))
  close(Tensor.ones(4), np.ones(4))
  close(Tensor.full((2, 2), 7.5), np.full((2, 2), 7.5))
  assert Tensor.full((2,), 3).dtype is dtypes.default_int
  close(Tensor.arange(5), np.arange(5))
  close(Tensor.arange(2, 11, 3), np.arange(2, 11, 3))
  close(Tensor.arange(0.5, 3.0, 0.5), np.arange(0.5, 3.0, 0.5))
  close(Tensor.arange(5, 0, -2), np.arange(5, 0, -2))
  assert Tensor.arange(0).shape == (0,)
  close(Tensor.eye(3), np.eye(3))
  close(Tensor.eye(2, 4), np.eye(2, 4))
  e = Tensor.empty(2, 3)
  assert e.shape == (2, 3) and e.dtype is dtypes.default_float

def test_from_numpy_and_lists_round_trip():
  for arr in (A, np.arange(6, dtype=np.int64).reshape(2, 3), np.array([True, False]), np.arange(4, dtype=np.uint8)):
    t = Tensor(arr)
    assert t.numpy().dtype == arr.dtype
    np.testing.assert_array_equal(t.numpy(), arr)
  assert Tensor([[1, 2], [3, 4]]).tolist() == [[1, 2], [3, 4]]
  assert Tensor([1.5]).item() == 1.5
  with pytest.raises(ShapeError):
    Tensor([[1, 2], [3]])

def test_rand_is_uniform_deterministic_and_seeded():
  Tensor.manual_seed(3)
  a = Tensor.rand(2000).numpy()
  Tensor.manual_seed(3)
  b = Tensor.rand(2000).numpy()
  np.testing.assert_array_equal(a, b)
  assert a.min() >= 0.0 and a.max() < 1.0
  assert abs(a.mean() - 0.5) < 0.03 and abs(a.var() - 1 / 12) < 0.01
  c = Tensor.rand(2000).numpy()
  assert not np.array_equal(a, c)  # the counter advances

def test_randn_moments():
  Tensor.manual_seed(1)
  x = Tensor.randn(4000).numpy()
  assert abs(x.mean()) < 0.06 and abs(x.std() - 1) < 0.06

# ** elementwise **

UNARY = [
  ("neg", lambda t: -t, lambda a: -a, A), ("exp", Tensor.exp, np.exp, A), ("exp2", Tensor.exp2, np.exp2, A),
  ("log", Tensor.log, np.log, P), ("log2", Tensor.log2, np.log2, P), ("sqrt", Tensor.sqrt, np.sqrt, P),
  ("rsqrt", Tensor.rsqrt, lambda a: 1 / np.sqrt(a), P), ("sin", Tensor.sin, np.sin, A), ("cos", Tensor.cos, np.cos, A),
  ("reciprocal", Tensor.reciprocal, lambda a: 1 / a, P), ("relu", Tensor.relu, lambda a: np.maximum(a, 0), A),
  ("sigmoid", Tensor.sigmoid, lambda a: 1 / (1 + np.exp(-a)), A), ("tanh", Tensor.tanh, np.tanh, A),
  ("abs", Tensor.abs, np.abs, A), ("trunc", Tensor.trunc, np.trunc, A * 3), ("floor", Tensor.floor, np.floor, A * 3),
  ("ceil", Tensor.ceil, np.ceil, A * 3), ("square", Tensor.square, np.square, A),
]

@pytest.mark.parametrize("name,fn,ref,x", UNARY, ids=[u[0] for u in UNARY])
def test_unary(name, fn, ref, x):
  close(fn(Tensor(x)), ref(x), rtol=2e-5, atol=2e-6)

BINARY = [
  ("add", lambda a, b: a + b), ("sub", lambda a, b: a - b), ("mul", lambda a, b: a * b), ("div", lambda a, b: a / b),
  ("maximum", lambda a, b: np.maximum(a, b) if isinstance(a, np.ndarray) else a.maximum(b)),
  ("minimum", lambda a, b: np.minimum(a, b) if isinstance(a, np.ndarray) else a.minimum(b)),
  ("lt", lambda a, b: a < b), ("gt", lambda a, b: a > b), ("le", lambda a, b: a <= b), ("ge", lambda a, b: a >= b),
  ("eq", lambda a, b: a == b), ("ne", lambda a, b: a != b),
]

@pytest.mark.parametrize("name,fn", BINARY, ids=[b[0] for b in BINARY])
def test_binary_float(name, fn):
  close(fn(Tensor(A), Tensor(B)), fn(A, B))

@pytest.mark.parametrize("shape_a,shape_b", [((3, 4), (4,)), ((3, 1), (1, 4)), ((2, 1, 4), (3, 1)), ((), (2, 3)),
                                             ((5,), ())])
def test_broadcasting(shape_a, shape_b):
  a = rng.standard_normal(shape_a).astype(np.float32)
  b = rng.standard_normal(shape_b).astype(np.float32)
  close(Tensor(a) * Tensor(b) + Tensor(b), a * b + b)

def test_python_scalars_on_either_side():
  t = Tensor(A)
  close(2 - t, 2 - A)
  close(3 / (t * t + 1), 3 / (A * A + 1))
  close(t ** 2, A ** 2, rtol=1e-5)
  close(Tensor(P) ** 0.5, P ** 0.5, rtol=1e-5)
  close(2.0 ** t, 2.0 ** A, rtol=1e-5)

def test_pow_of_negative_bases():
  x = np.array([-2.0, -1.5, 0.0, 2.0], np.float32)
  close(Tensor(x) ** 3, x ** 3, rtol=1e-5)
  close(Tensor(x) ** 2.0, x ** 2.0, rtol=1e-5)
  out = (Tensor(x) ** 0.5).numpy()
  assert np.isnan(out[0]) and np.isnan(out[1]) and out[3] == pytest.approx(math.sqrt(2), rel=1e-6)

INTS = np.array([-7, -3, 0, 3, 7, 10], np.int32)
DIVS = np.array([2, -2, 3, 4, -3, 3], np.int32)

def test_int_arithmetic_follows_python_floor_semantics():
  a, b = Tensor(INTS), Tensor(DIVS)
  np.testing.assert_array_equal((a // b).numpy(), INTS // DIVS)
  np.testing.assert_array_equal((a % b).numpy(), INTS % DIVS)
  np.testing.assert_array_equal(a.div(b, rounding_mode="trunc").numpy(), np.trunc(INTS / DIVS).astype(np.int32))
  np.testing.assert_array_equal((a * b - a).numpy(), INTS * DIVS - INTS)
  close(a / b, INTS / DIVS)

def test_float_floordiv_and_mod():
  close(Tensor(A * 5) // Tensor(P), np.floor_divide(A * 5, P), rtol=1e-5)
  close(Tensor(A * 5) % Tensor(P), np.mod(A * 5, P), rtol=1e-4, atol=1e-5)

def test_bitwise_and_shifts():
  a = np.array([0b1100, 0b1010, -1, 7], np.int32)
  b = np.array([0b1010, 0b0110, 5, 1], np.int32)
  ta, tb = Tensor(a), Tensor(b)
  np.testing.assert_array_equal((ta & tb).numpy(), a & b)
  np.testing.assert_array_equal((ta | tb).numpy(), a | b)
  np.testing.assert_array_equal((ta ^ tb).numpy(), a ^ b)
  np.testing.assert_array_equal((~ta).numpy(), ~a)
  np.testing.assert_array_equal((ta << 2).numpy(), a << 2)
  np.testing.assert_array_equal((ta >> 1).numpy(), a >> 1)
  u = np.array([1, 200, 255], np.uint8)
  np.testing.assert_array_equal((~Tensor(u)).numpy(), ~u)
  m = np.array([True, False, True])
  np.testing.assert_array_equal((Tensor(m) & Tensor([True, True, False])).numpy(), m & np.array([True, True, False]))
  np.testing.assert_array_equal((~Tensor(m)).numpy(), ~m)

def test_int_overflow_wraps():
  a = np.array([127, -128, 100], np.int8)
  with np.errstate(over="ignore"):
    b = np.array([1, -1, 100], np.int8)
    np.testing.assert_array_equal((Tensor(a) + Tensor(b)).numpy(), a + b)

def test_where():
  cond = A > 0
  close(Tensor(cond).where(Tensor(A), Tensor(B)), np.where(cond, A, B))
  close((Tensor(A) > 0).where(Tensor(A), 0.0), np.where(cond, A, 0.0))

@pytest.mark.parametrize("src,dst", [(np.float32, np.int32), (np.int32, np.float32), (np.float32, np.float16),
                                     (np.int32, np.int8), (np.float64, np.float32), (np.int32, np.bool_),
                                     (np.bool_, np.float32),
                                     (np.uint8, np.int32)])
def test_cast_matches_numpy(src, dst):
  x = (np.array([-3.7, -1.0, 0.0, 0.5, 2.5, 100.2]) * (1 if np.issubdtype(src, np.floating) else 1)).astype(src)
  out = Tensor(x).cast(dtypes.from_np(dst) if dst is not np.bool_ else dtypes.bool).numpy()
  np.testing.assert_array_equal(out, x.astype(dst))

def test_bitcast():
  x = np.array([1.0, -2.5, 0.0], np.float32)
  np.testing.assert_array_equal(Tensor(x).bitcast(dtypes.int32).numpy(), x.view(np.int32))
  np.testing.assert_array_equal(Tensor(x).bitcast(dtypes.uint16).numpy(), x.view(np.uint16))

# ** reductions **

R = rng.standard_normal((2, 3, 4)).astype(np.float32)

@pytest.mark.parametrize("axis", [None, 0, 1, 2, -1, (0, 2), (1, 2)])
@pytest.mark.parametrize("keepdim", [False, True])
def test_reductions(axis, keepdim):
  t = Tensor(R)
  close(t.sum(axis, keepdim), R.sum(axis=axis, keepdims=keepdim), rtol=1e-5, atol=1e-5)
  close(t.max(axis, keepdim), R.max(axis=axis, keepdims=keepdim))
  close(t.min(axis, keepdim), R.min(axis=axis, keepdims=keepdim))
  close(t.mean(axis, keepdim), R.mean(axis=axis, keepdims=keepdim), rtol=1e-5, atol=1e-6)
  close(t.prod(axis, keepdim), R.prod(axis=axis, keepdims=keepdim), rtol=1e-5, atol=1e-6)

def test_int_and_bool_reductions():
  x = np.arange(12, dtype=np.int8).reshape(3, 4) * 20
  s = Tensor(x).sum(1)
  assert s.dtype is dtypes.int32
  np.testing.assert_array_equal(s.numpy(), x.astype(np.int32).sum(1))
  u = np.array([[1, 250], [3, 4]], np.uint8)
  np.testing.assert_array_equal(Tensor(u).min(1).numpy(), u.min(1))
  m = np.array([[True, False], [False, False]])
  np.testing.assert_array_equal(Tensor(m).max(1).numpy(), m.max(1))
  np.testing.assert_array_equal(Tensor(m).sum().numpy(), m.sum())

def test_reductions_of_empty_dims():
  e = Tensor.zeros(0, 3)
  close(e.sum(0), np.zeros(3))
  close(e.prod(0), np.ones(3))
  with pytest.raises(ShapeError):
    e.max(0)

# ** movement **

M = np.arange(24, dtype=np.float32).reshape(2, 3, 4)

def test_movement_ops():
  t = Tensor(M)
  close(t.reshape(6, 4), M.reshape(6, 4))
  close(t.reshape(-1, 2), M.reshape(-1, 2))
  close(t.permute(2, 0, 1), M.transpose(2, 0, 1))
  close(t.transpose(0, 2), M.swapaxes(0, 2))
  close(t[:, :1].expand(2, 5, 4), np.broadcast_to(M[:, :1], (2, 5, 4)))
  close(t.pad(((1, 0), (0, 2), (1, 1))), np.pad(M, ((1, 0), (0, 2), (1, 1))))
  close(t.pad(((0, 0), (1, 1), (0, 0)), value=-3.0), np.pad(M, ((0, 0), (1, 1), (0, 0)), constant_values=-3.0))
  close(t.shrink(((0, 1), (1, 3), (2, 4))), M[0:1, 1:3, 2:4])
  close(t.flip(1), M[:, ::-1])
  close(t.flip((0, 2)), M[::-1, :, ::-1])
  close(t.flatten(), M.flatten())
  close(t.unsqueeze(1), M[:, None])
  close(t[:1].squeeze(0), M[0])

def test_chained_movement_ops_are_index_math():
  t = Tensor(M)
  out = t.permute(1, 0, 2).reshape(3, 8).pad(((1, 1), (0, 0))).flip(0).shrink(((1, 4), (2, 6))) * 2
  ref = np.pad(M.transpose(1, 0, 2).reshape(3, 8), ((1, 1), (0, 0)))[::-1][1:4, 2:6] * 2
  close(out, ref)

@pytest.mark.parametrize("idx", [(1,), (slice(None), 2), (..., 1), (slice(1, None), slice(None, None, 2)),
                                 (slice(None, None, -1),), (None, 0), (-1, -2, -3), (slice(0, 3, 2), None, 1)])
def test_getitem(idx):
  close(Tensor(M)[idx], M[idx])

def test_getitem_with_list_indices():
  close(Tensor(M)[[1, 0]], M[[1, 0]])
  close(Tensor(M)[:, [2, 0, 2]], M[:, [2, 0, 2]])

def test_getitem_with_tensor_indices():
  close(Tensor(M)[Tensor([1, 0])], M[[1, 0]])

def test_cat_and_stack():
  a, b = Tensor(A), Tensor(B)
  close(Tensor.cat(a, b, dim=1), np.concatenate([A, B], axis=1))
  close(Tensor.cat(a, b), np.concatenate([A, B]))
  close(a.stack(b, dim=1), np.stack([A, B], axis=1))

# ** matmul **

@pytest.mark.parametrize("sa,sb", [((3, 4), (4, 5)), ((4,), (4, 2)), ((3, 4), (4,)), ((4,), (4,)), ((2, 3, 4), (4, 5)),
                                   ((2, 3, 4), (2, 4, 5)), ((1, 3, 4), (2, 4, 2))])
def test_matmul(sa, sb):
  a = rng.standard_normal(sa).astype(np.float32)
  b = rng.standard_normal(sb).astype(np.float32)
  close(Tensor(a) @ Tensor(b), a @ b, rtol=1e-5, atol=1e-5)

def test_int_matmul():
  a = np.arange(6, dtype=np.int32).reshape(2, 3)
  b = np.arange(12, dtype=np.int32).reshape(3, 4)
  np.testing.assert_array_equal((Tensor(a) @ Tensor(b)).numpy(), a @ b)

# ** realize, contiguous, assign, to **

def test_contiguous_realize():
  t = Tensor(A).permute(1, 0).contiguous().realize()
  close(t, A.T)
  assert t.uop.is_realized

@pytest.mark.parametrize("name", ["transpose", "flip", "shift", "broadcast_row", "row_mean", "reshape_only"])
def test_assign_of_a_value_reading_the_target_elsewhere(name: str) -> None:
  # one kernel writing t while reading t at other positions read elements it had already overwritten
  # (t.assign(t.T.reshape(2, 3)) gave [[1, 4, 4], [5, 4, 6]]); reshapes of the contiguous target keep positions
  x = np.arange(1, 7, dtype=np.float32).reshape(2, 3)
  fns = {"transpose": (lambda t: t.T.reshape(2, 3), lambda a: a.T.reshape(2, 3)),
         "flip": (lambda t: t.flip(1) * 2, lambda a: a[:, ::-1] * 2),
         "shift": (lambda t: t.pad(((0, 0), (1, 0)))[:, :3] + t, lambda a: np.pad(a, ((0, 0), (1, 0)))[:, :3] + a),
         "broadcast_row": (lambda t: t[0:1].expand(2, 3) - t, lambda a: a[0:1] - a),
         "row_mean": (lambda t: t - t.mean(1, keepdim=True), lambda a: a - a.mean(1, keepdims=True)),
         "reshape_only": (lambda t: t.reshape(3, 2).reshape(2, 3) * 3, lambda a: a * 3)}
  ours, want = fns[name]
  t = Tensor(x.copy()).contiguous().realize()
  t.assign(ours(t)).realize()
  np.testing.assert_array_equal(t.numpy(), want(x))

def test_assign():
  buf = Tensor.zeros(3, 4).contiguous().realize()
  buf.assign(Tensor(A) + 1).realize()
  close(buf, A + 1)
  buf.assign(buf * 2).realize()
  close(buf, (A + 1) * 2)
  with pytest.raises(ShapeError):
    buf.assign(Tensor.zeros(4, 3))

def test_to_null_and_back_keeps_shape():
  t = Tensor(A).to("NULL")
  assert t.device == "NULL" and t.shape == A.shape
  close(Tensor(A).to("PYTHON:1"), A)

def test_laziness():
  t = Tensor(A) + 1
  assert not t.uop.is_realized
  t.realize()
  assert t.uop.is_realized

# ** typed errors **

def test_shape_mismatch_names_both_shapes():
  with pytest.raises(ShapeError, match=r"\(3, 4\).*\(2, 4\)"):
    Tensor(A) + Tensor(np.zeros((2, 4), np.float32))
  with pytest.raises(ShapeError, match=r"\(3, 4\) @ \(3, 4\)"):
    Tensor(A) @ Tensor(B)
  with pytest.raises(ShapeError, match="24"):
    Tensor(M).reshape(5, 5)
  with pytest.raises(ShapeError):
    Tensor(M).expand(2, 3, 5)
  with pytest.raises(ShapeError):
    Tensor.cat(Tensor(A), Tensor(M), dim=0)

def test_invalid_axes():
  for bad in (lambda: Tensor(M).sum(3), lambda: Tensor(M).permute(0, 1, 5), lambda: Tensor(M).transpose(0, 5),
              lambda: Tensor(M).flip(-4), lambda: Tensor(M)[2], lambda: Tensor(M).unsqueeze(5)):
    with pytest.raises(AxisError):
      bad()
  with pytest.raises(ShapeError):  # a repeated dim is no out-of-range dim: torch raises RuntimeError, not IndexError
    Tensor(M).permute(0, 1, 1)

def test_bitwise_error_names_both_original_operands():
  with pytest.raises(DTypeError, match=r"float32.*int32|int32.*float32"):
    Tensor(A) & Tensor(np.ones((3, 4), np.int32))

def test_bitwise_ops_on_floats_are_dtype_errors():
  with pytest.raises(DTypeError):
    Tensor(A) & Tensor(np.ones((3, 4), np.int32))
  with pytest.raises(DTypeError, match="float32"):
    Tensor(A) | Tensor(B)
  with pytest.raises(DTypeError):
    ~Tensor(A)

def test_errors_leave_nothing_half_built():
  t = Tensor(A)
  before = t.uop
  with pytest.raises(ShapeError):
    t.assign(Tensor.zeros(2, 2))
  assert t.uop is before
  with pytest.raises(GradientError):
    Tensor(A).sum().backward()

def test_bool_of_a_tensor():
  assert bool(Tensor([1.0])) and not bool(Tensor([0]))
  with pytest.raises(ValueError):
    bool(Tensor(A))

def test_symbolic_slices_with_bound_variables():
  from ember import Variable
  x = np.arange(20, dtype=np.float32).reshape(5, 4)
  for n in (2, 4):
    v = Variable("n", 1, 5).bind(n)
    np.testing.assert_allclose(Tensor(x)[:v].sum(0).numpy(), x[:n].sum(0))
    np.testing.assert_allclose(Tensor(x)[1:v, 2].sum().numpy(), x[1:n, 2].sum())

def test_symbolic_views_materialised_and_reshaped_with_a_symbolic_size():
  # a permuted or flattened view over a bound Variable's dim is stored contiguous (its strides and flat index hold
  # the variable), and reshape/expand take a symbolic size given alone, not only in a tuple
  from ember import Variable
  x = np.arange(40, dtype=np.float32).reshape(10, 4)
  w = np.linspace(-1, 1, 4, dtype=np.float32)
  for n in (1, 3, 10):
    v = Variable("n", 1, 10).bind(n)
    xs = Tensor(x)[:v]
    t = xs.permute(1, 0).contiguous()  # (4, n)
    np.testing.assert_allclose((t * t).sum(1).numpy(), (x[:n].T ** 2).sum(1))
    np.testing.assert_allclose(t.max(1).numpy(), x[:n].max(0))
    flat = xs.contiguous().reshape(v * 4)
    np.testing.assert_allclose((flat.reshape(v, 4) * Tensor(w)).sum(0).numpy(), (x[:n] * w).sum(0), rtol=1e-6)
    assert flat.shape[0] is not None and Tensor(x)[:v].reshape(v * 4).sum().item() == x[:n].sum()
    np.testing.assert_allclose(Tensor(w).reshape(4, 1).expand(4, v).sum(1).numpy(), w * n, rtol=1e-6)

def test_concrete_indexing_of_a_symbolic_dim_is_a_shape_error():
  # int indices, int-bounded slices, tensor indices and assignments need the dim's size: a typed error naming the
  # indexing, not a TypeError from comparing with a UOp
  from ember import Variable
  x = Tensor(np.arange(20, dtype=np.float32).reshape(5, 4))[:Variable("n", 1, 5).bind(3)]
  for index in (1, -1, slice(0, 2), slice(None, None, 2), [0, 1]):
    with pytest.raises(ShapeError, match="concrete sizes.*symbolic"):
      x[index]
  with pytest.raises(ShapeError, match="concrete sizes"):
    x[0:1] = 1.0

def test_ops_needing_concrete_sizes_name_themselves_for_a_symbolic_dim():
  from ember import Variable
  x = Tensor(A)[:Variable("n", 1, 3).bind(2)]
  idx = Tensor([[0, 1, 0, 1]])
  for name, call in (("split", lambda: x.split(1, 0)), ("gather", lambda: x.gather(0, idx)),
                     ("sort", lambda: x.sort(0)), ("numpy()", x.numpy), ("nbytes", lambda: x.nbytes()),
                     ("len()", lambda: len(x))):
    with pytest.raises(ShapeError, match=rf"{re.escape(name)} needs concrete sizes"): call()

def test_a_tensor_from_data_on_a_tuple_of_devices_says_how_to_replicate_or_shard():
  from ember.errors import DeviceError
  with pytest.raises(DeviceError, match=r"builds on one device.*\.to\(.*\.shard\("):
    Tensor([1.0, 2.0], device=("PYTHON", "PYTHON:1"))

def test_einsum_of_a_non_tensor_is_a_type_error_like_torch():
  from torch_oracle import torch
  with pytest.raises(TypeError, match="einsum operands must be Tensors"):
    Tensor.einsum("i,i->", Tensor([1.0, 2.0]), [1.0, 2.0])
  with pytest.raises(TypeError):
    torch.einsum("i,i->", torch.tensor([1.0, 2.0]), [1.0, 2.0])

def test_two_size_changing_bitcasts_of_one_buffer_keep_their_own_bytes():
  # regression: the memory planner reused the memory a bitcast view aliased
  from ember import dtypes
  t = Tensor(np.arange(8, dtype=np.uint8))
  a, b = t[0:2].bitcast(dtypes.uint16), t[2:4].bitcast(dtypes.uint16)
  raw = np.arange(8, dtype=np.uint8)
  want = raw[0:2].view(np.uint16).astype(np.int32) * 1000 + raw[2:4].view(np.uint16)
  np.testing.assert_array_equal((a.cast(dtypes.int32) * 1000 + b.cast(dtypes.int32)).numpy(), want)
