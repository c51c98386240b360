"""Movement and indexing ops of ember.Tensor against torch/numpy: values, dtypes and gradients."""
from __future__ import annotations
import functools
from typing import Any
import numpy as np
import pytest
from ember import Tensor, dtypes
from ember.errors import AxisError, DTypeError, ShapeError

torch = pytest.importorskip("torch")

from torch_oracle import check  # noqa: E402
check = functools.partial(check, tol=1e-6, grad_tol=1e-5)

rng = np.random.default_rng(0)
X = rng.standard_normal((3, 4, 5)).astype(np.float32)
M = rng.standard_normal((4, 5)).astype(np.float32)

def test_repeat_and_repeat_interleave() -> None:
  check(lambda t: t.repeat(2, 1, 3), lambda t: t.repeat(2, 1, 3), X)
  check(lambda t: t.repeat((2, 1, 1, 2)), lambda t: t.repeat(2, 1, 1, 2), X)
  check(lambda t: t.repeat_interleave(3, 1), lambda t: t.repeat_interleave(3, 1), X)
  check(lambda t: t.repeat_interleave(2), lambda t: t.repeat_interleave(2), M)
  with pytest.raises(ShapeError): Tensor(M).repeat(2)

@pytest.mark.parametrize("sizes,dim", [(2, 1), ([1, 3], 1), (3, -1), ([2, 0, 3], 2)])
def test_split(sizes: Any, dim: int) -> None:
  ours, want = Tensor(X).split(sizes, dim), torch.tensor(X).split(sizes, dim)
  assert len(ours) == len(want)
  for o, w in zip(ours, want): np.testing.assert_array_equal(o.numpy(), w.numpy())
  with pytest.raises(ShapeError): Tensor(X).split([1, 1], 1)

@pytest.mark.parametrize("chunks,dim", [(2, 1), (3, 2), (6, 2), (1, 0)])
def test_chunk(chunks: int, dim: int) -> None:
  ours, want = Tensor(X).chunk(chunks, dim), torch.tensor(X).chunk(chunks, dim)
  assert len(ours) == len(want)
  for o, w in zip(ours, want): np.testing.assert_array_equal(o.numpy(), w.numpy())

def test_unfold() -> None:
  check(lambda t: t.unfold(2, 2, 1), lambda t: t.unfold(2, 2, 1), X)
  check(lambda t: t.unfold(1, 3, 2), lambda t: t.unfold(1, 3, 2), X)
  check(lambda t: t.unfold(0, 3, 3), lambda t: t.unfold(0, 3, 3), X)

@pytest.mark.parametrize("k", [0, 1, -2, 4])
def test_diag_diagonal_tril_triu(k: int) -> None:
  v = rng.standard_normal(4).astype(np.float32)
  check(lambda t: t.diag(k), lambda t: torch.diag(t, k), v)
  check(lambda t: t.diag(k), lambda t: torch.diag(t, k), M)
  check(lambda t: t.diagonal(k, 0, 2), lambda t: torch.diagonal(t, k, 0, 2), X)
  check(lambda t: t.diagonal(k, -1, 1), lambda t: torch.diagonal(t, k, -1, 1), X)
  check(lambda t: t.tril(k), lambda t: torch.tril(t, k), X)
  check(lambda t: t.triu(k), lambda t: torch.triu(t, k), X)
  b = M > 0
  np.testing.assert_array_equal(Tensor(b).triu(k).numpy(), np.triu(b, k))

def test_roll_unflatten() -> None:
  check(lambda t: t.roll(2, 1), lambda t: torch.roll(t, 2, 1), X)
  check(lambda t: t.roll((1, -3), (0, 2)), lambda t: torch.roll(t, (1, -3), (0, 2)), X)
  check(lambda t: t.roll(7), lambda t: torch.roll(t, 7), X)
  check(lambda t: t.unflatten(2, (5, 1)), lambda t: t.unflatten(2, (5, 1)), X)
  check(lambda t: t.unflatten(-2, (2, -1)), lambda t: t.unflatten(-2, (2, -1)), X)

def test_gather() -> None:
  idx = rng.integers(0, 4, (3, 2, 5))
  check(lambda t: t.gather(1, Tensor(idx.astype(np.int32))), lambda t: torch.gather(t, 1, torch.tensor(idx)), X)
  idx2 = rng.integers(0, 5, (2, 3, 7))
  check(lambda t: t.gather(-1, Tensor(idx2.astype(np.int32))), lambda t: torch.gather(t, -1, torch.tensor(idx2)), X)
  with pytest.raises(ShapeError): Tensor(X).gather(1, Tensor([[1]]))
  with pytest.raises(DTypeError): Tensor(X).gather(1, Tensor(idx.astype(np.float32)))

@pytest.mark.filterwarnings("ignore:The reduce argument of torch.scatter")
def test_scatter() -> None:
  base = np.zeros((3, 5), np.float32)
  idx = np.array([[0, 1, 2, 0], [2, 0, 0, 1]])
  src = rng.standard_normal((2, 4)).astype(np.float32)
  check(lambda b, s: b.scatter(0, Tensor(idx.astype(np.int32)), s), lambda b, s: b.scatter(0, torch.tensor(idx), s),
        base, src)
  uniq = np.array([[1, 0, 3], [4, 2, 0]])
  check(lambda b, s: b.scatter(1, Tensor(uniq.astype(np.int32)), s), lambda b, s: b.scatter(1, torch.tensor(uniq), s),
        base, src[:, :3].copy())
  ours = Tensor(base).scatter(1, Tensor(uniq.astype(np.int32)), 7.5).numpy()
  np.testing.assert_array_equal(ours, torch.tensor(base).scatter(1, torch.tensor(uniq), 7.5).numpy())
  for reduce in ("add", "multiply"):
    ours = Tensor(base + 2).scatter(0, Tensor(idx.astype(np.int32)), Tensor(src), reduce=reduce).numpy()
    want = torch.tensor(base + 2).scatter(0, torch.tensor(idx), torch.tensor(src), reduce=reduce).numpy()
    np.testing.assert_allclose(ours, want, rtol=1e-6)

@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce(reduce: str, include_self: bool) -> None:
  base = rng.standard_normal((3, 5)).astype(np.float32)
  idx = np.array([[0, 1, 2, 0], [2, 0, 0, 1]])
  src = rng.standard_normal((2, 4)).astype(np.float32)
  check(lambda b, s: b.scatter_reduce(0, Tensor(idx.astype(np.int32)), s, reduce, include_self=include_self),
        lambda b, s: b.scatter_reduce(0, torch.tensor(idx), s, reduce, include_self=include_self), base, src,
        grad=reduce in ("sum", "mean", "prod"))
  ib, isrc = (base * 10).astype(np.int32), (src * 10).astype(np.int32)
  check(lambda b, s: b.scatter_reduce(0, Tensor(idx.astype(np.int32)), s, reduce, include_self=include_self),
        lambda b, s: b.scatter_reduce(0, torch.tensor(idx), s, reduce, include_self=include_self), ib, isrc)

def test_one_hot_masked_fill_masked_select() -> None:
  labels = np.array([[0, 3], [2, 1]], np.int32)
  ours = Tensor(labels).one_hot(5)
  assert ours.dtype == dtypes.int32
  np.testing.assert_array_equal(ours.numpy(), torch.nn.functional.one_hot(torch.tensor(labels).long(), 5).numpy())
  np.testing.assert_array_equal(Tensor(labels).one_hot().numpy().shape, (2, 2, 4))
  mask = M > 0.3
  check(lambda t: t.masked_fill(Tensor(mask), -1.5), lambda t: t.masked_fill(torch.tensor(mask), -1.5), M)
  check(lambda t: t.masked_fill(Tensor(mask[0]), 2), lambda t: t.masked_fill(torch.tensor(mask[0]), 2),
        M.astype(np.int32))
  check(lambda t: t.masked_select(Tensor(mask)), lambda t: t.masked_select(torch.tensor(mask)), M)
  check(lambda t: t.masked_select(Tensor(mask[1])), lambda t: t.masked_select(torch.tensor(mask[1])), M)
  assert Tensor(M).masked_select(Tensor(M > 100)).shape == (0,)

def test_nonzero() -> None:
  data = np.array([[0, 1, 0], [2, 0, 3]], np.int32)
  np.testing.assert_array_equal(Tensor(data).nonzero().numpy(), torch.tensor(data).nonzero().numpy())
  assert Tensor(data).nonzero().dtype == dtypes.int32
  np.testing.assert_array_equal(Tensor(data).nonzero(size=5, fill_value=-7).numpy(), np.concatenate(
    [np.argwhere(data), np.full((2, 2), -7)]))
  np.testing.assert_array_equal(Tensor(data).nonzero(size=2).numpy(), np.argwhere(data)[:2])
  assert Tensor(np.zeros(3, np.int32)).nonzero().shape == (0, 1)

@pytest.mark.parametrize("dim,descending", [(-1, False), (0, True), (1, False)])
def test_sort_argsort_topk(dim: int, descending: bool) -> None:
  data = np.round(X * 2) / 2  # ties
  vals, idx = Tensor(data).sort(dim, descending)
  want = torch.sort(torch.tensor(data), dim=dim, descending=descending, stable=True)
  np.testing.assert_array_equal(vals.numpy(), want.values.numpy())
  np.testing.assert_array_equal(idx.numpy(), want.indices.numpy())
  assert idx.dtype == dtypes.int32
  np.testing.assert_array_equal(Tensor(data).argsort(dim, descending).numpy(), want.indices.numpy())
  check(lambda t: t.sort(dim, descending)[0], lambda t: torch.sort(t, dim, descending)[0], X)
  for largest in (True, False):
    v, i = Tensor(X).topk(2, dim, largest)
    w = torch.topk(torch.tensor(X), 2, dim, largest)
    np.testing.assert_array_equal(v.numpy(), w.values.numpy())
    np.testing.assert_array_equal(i.numpy(), w.indices.numpy())
    check(lambda t, lg=largest: t.topk(2, dim, lg)[0], lambda t, lg=largest: torch.topk(t, 2, dim, lg)[0], X)
  nan = np.array([3.0, np.nan, 1.0, -np.inf], np.float32)
  np.testing.assert_array_equal(Tensor(nan).sort()[1].numpy(), torch.sort(torch.tensor(nan), stable=True)[1].numpy())
  with pytest.raises(ShapeError): Tensor(X).topk(9)

GETITEMS: list[Any] = [
  (1, slice(None, None, -2)), (Ellipsis, [0, 2]), ([1, 0], slice(1, 3), [4, 0]), ([[0], [2]], [1, 3]),
  (slice(None), [0, 0, 3], None), (-1, [2, 1], [0, 4]), ([0, 2], Ellipsis, 1),
]

@pytest.mark.parametrize("index", GETITEMS, ids=[str(i) for i in range(len(GETITEMS))])
def test_fancy_getitem_matches_numpy(index: Any) -> None:
  np.testing.assert_array_equal(Tensor(X)[index].numpy(), X[index])
  tensor_index = tuple(Tensor(np.array(i, np.int32)) if isinstance(i, list) else i for i in index)
  np.testing.assert_array_equal(Tensor(X)[tensor_index].numpy(), X[index])
  if not any(isinstance(i, slice) and (i.step or 1) < 0 for i in index):  # torch has no negative steps
    check(lambda t: t[index], lambda t: t[index], X)
  with pytest.raises(AxisError): Tensor(X)[0, [9]]

MASK_INDEXES: list[Any] = [
  ([True, False, True],), (slice(None), [False, True, True, False]), (1, slice(None), [True] * 5),
  ([[True, False, True, True], [False, False, False, True], [True, True, False, False]],),
  (Ellipsis, [False, True, False, True, True]), ([True, False, False], [0, 3]), ([False, False, False],),
]

@pytest.mark.parametrize("index", MASK_INDEXES, ids=[str(i) for i in range(len(MASK_INDEXES))])
def test_list_of_bools_is_a_mask_as_in_torch(index: Any) -> None:
  # a list of bools selects where it is True (over as many dims as it has levels); cast to int32, it picked rows 1 and 0
  want = torch.tensor(X)[index].numpy()
  np.testing.assert_array_equal(Tensor(X)[index].numpy(), want)
  arrays = tuple(np.array(i) if isinstance(i, list) else i for i in index)  # numpy arrays index as the lists do
  np.testing.assert_array_equal(Tensor(X)[arrays].numpy(), want)

@pytest.mark.parametrize("index", [True, False, (0, True), (Ellipsis, False), (True, 1, slice(None), 2),
                                   (None, True, 0)], ids=[str(i) for i in range(6)])
def test_python_bool_index_adds_a_dim_as_in_torch(index: Any) -> None:
  # True adds a dim of size 1 (as None), False one of size 0; neither consumes a dim (it raised IndexingError)
  want = torch.tensor(X)[index].numpy()
  got = Tensor(X)[index].numpy()
  assert got.shape == want.shape
  np.testing.assert_array_equal(got, want)
  parts = index if isinstance(index, tuple) else (index,)
  numpy_bools = tuple(np.bool_(i) if isinstance(i, bool) else i for i in parts)  # as numpy reads its bool scalars
  np.testing.assert_array_equal(Tensor(X)[numpy_bools].numpy(), X[numpy_bools])

@pytest.mark.parametrize("case", range(4))
def test_bool_tensor_mask_index_as_in_torch(case: int) -> None:
  # x[mask] reads the mask on the host (a sync, as torch's) and selects its True positions, gradients included
  fns = [lambda a: a[a > 0], lambda a: a[:, a[0, :, 0] > 0], lambda a: a[(a > 9).all(-1).all(-1)],
         lambda a: a[a.sum(-1) > 0, 2]]
  check(fns[case], fns[case], X)
  t, want = Tensor(X.copy()), X.copy()
  t[t < 0], want[want < 0] = 0.0, 0.0
  np.testing.assert_array_equal(t.numpy(), want)

def test_list_indices_are_checked_on_the_host() -> None:
  from ember.engine.realize import GlobalCounters
  from ember.errors import IndexingError, IndexRangeError
  t = Tensor(X).realize()
  GlobalCounters.reset()
  lazy = t[[2, -3, 0], [1, 3, 0]] + t[:, [True, False, False, True]].sum()
  assert GlobalCounters.kernel_count == 0, "a list index's range check ran kernels (a sync) though its values are known"
  np.testing.assert_allclose(lazy.numpy(), X[[2, -3, 0], [1, 3, 0]] + X[:, [True, False, False, True]].sum(),
                             rtol=1e-5)
  with pytest.raises(IndexRangeError, match="index 3 is out of range"): t[[0, 3]]
  with pytest.raises(IndexRangeError, match="index -6 is out of range"): t[0, 0, [-6]]
  with pytest.raises(IndexingError, match="must hold ints"): t[[0.5, 1.7]]  # int32 made rows 0 and 1 of it
  with pytest.raises(IndexingError, match="must hold ints"): t[:, ["a"]]
  with pytest.raises(IndexingError, match="rectangular"): t[[[0, 1], [2]]]
  with pytest.raises(IndexError): t[[True, False]]  # a mask one short of the dim

def test_zero_d_tensor_index_of_a_vector_is_a_scalar() -> None:
  # the index leaves no dims at all: a 0-d result, as numpy (it raised TypeError from reshape())
  v = np.array([3.0, 1.0, 4.0], np.float32)
  got = Tensor(v)[Tensor(np.array(2, np.int32))]
  assert got.shape == () and got.item() == v[np.array(2)]
  np.testing.assert_array_equal(Tensor(X)[Tensor(np.array(-1, np.int32)), 1].numpy(), X[np.array(-1), 1])

SETITEMS: list[Any] = [
  ((1, slice(1, 3)), 5.0), ((Ellipsis, 0), np.arange(4, dtype=np.float32)),
  ((slice(None, None, 2), 1, slice(None, None, -2)), -1.0), (([0, 2], [3, 1]), np.ones(5, np.float32)),
  ((0,), np.full((4, 5), 2.0, np.float32)), ((slice(1, 2), None, [0, 3]), 9.0),
]

@pytest.mark.parametrize("index,value", SETITEMS, ids=[str(i) for i in range(len(SETITEMS))])
def test_setitem_matches_numpy(index: Any, value: Any) -> None:
  t = Tensor(X.copy())
  want = X.copy()
  t[index] = value if not isinstance(value, np.ndarray) else Tensor(value)
  want[index] = value
  np.testing.assert_array_equal(t.numpy(), want)

def test_setitem_twice_and_int_dtype() -> None:
  t = Tensor.zeros(3, 4, dtype=dtypes.int32).contiguous().realize()
  t[1, :] = 7
  t[[0, 2], [3, 0]] = Tensor([1, 2])
  t[:, 1] = 2.9  # cast to the tensor's dtype
  want = np.zeros((3, 4), np.int32)
  want[1, :] = 7
  want[[0, 2], [3, 0]] = [1, 2]
  want[:, 1] = 2
  np.testing.assert_array_equal(t.numpy(), want)
  assert t.dtype == dtypes.int32
