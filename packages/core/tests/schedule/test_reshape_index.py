"""A reshape indexes each run of dims that it splits or joins on its own (`reshape_groups`), and a kernel's index width
comes from its buffers, dims and those runs, not from the size of a view: a conv's window view at a batch of 10,000
holds 10**11 elements, yet every index of its kernel fits int32 (the whole-shape flat index left a div/mod chain in
the inner loop past 6,710 images, and int64 index math past 210)."""
from __future__ import annotations
from typing import Any, Callable
import numpy as np
import pytest
import ember.schedule.kernel
from ember import Tensor, dtypes
from ember.codegen import get_program
from ember.device.python import PythonRenderer
from ember.schedule.kernel import reshape_groups
from ember.uop.ops import Ops, UOp

def index_dtypes(uops: list[UOp]) -> set[Any]:
  return {u.dtype for u in uops if u.op is Ops.RANGE} | {u.src[1].dtype for u in uops if u.op is Ops.INDEX}

@pytest.mark.parametrize("old,new,groups", [
  ((6, 20, 5), (6, 1, 20, 5), [([0], [0]), ([1], [2]), ([2], [3])]),  # a unit dim in: every dim its own run
  ((2, 3, 4), (6, 4), [([0, 1], [0]), ([2], [1])]),
  ((2, 3, 4), (2, 12), [([0], [0]), ([1, 2], [1])]),
  ((4, 6), (2, 4, 3), [([0, 1], [0, 1, 2])]),  # 4 = 2*2 does not end a run of the new dims: one run
  ((1, 5, 1), (5,), [([1], [0])]),
  ((1,), (1, 1), []),
])
def test_reshape_groups(old: tuple[int, ...], new: tuple[int, ...], groups: list[Any]) -> None:
  assert reshape_groups(old, new) == groups

def test_reshape_groups_leave_symbolic_and_empty_shapes_whole() -> None:
  from ember.uop.ops import Variable
  assert reshape_groups((Variable("n", 1, 8), 4), (4, Variable("n", 1, 8))) is None
  assert reshape_groups((0, 4), (4, 0)) is None

def _kernels(t: Tensor) -> list[UOp]: return [it.ast for it in t.schedule() if it.kind == "kernel"]

# the ResNet conv at 1,024 images: its padded copy (220M elements) fits int32, at 10,000 it would not
@pytest.mark.parametrize("build,large", [
  (lambda b: Tensor.empty(b, 32, 24, 24, device="NULL").conv2d(Tensor.empty(32, 32, 5, 5, device="NULL")), 10000),
  (lambda b: Tensor.empty(b, 64, 56, 56, device="NULL").conv2d(Tensor.empty(64, 64, 3, 3, device="NULL"), padding=1),
   1024),
  (lambda b: Tensor.empty(b, 32, 24, 24, device="NULL").max_pool2d(), 10000),
], ids=["conv5x5", "conv3x3_pad", "max_pool"])
def test_large_batch_views_keep_int32_indices(build: Callable[[int], Tensor], large: int) -> None:
  few, many = _kernels(build(8)), _kernels(build(large))
  assert len(few) == len(many)
  for small_ast, large_ast in zip(few, many):
    prog_few, prog_many = get_program(small_ast, PythonRenderer()), get_program(large_ast, PythonRenderer())
    assert index_dtypes(prog_many.uops) == {dtypes.int32}, prog_many.name
    # the same index math (constants aside: equal ones are shared): no div/mod chain that only the large batch's
    # whole-view flat index left behind
    def ops(uops: list[UOp]) -> list[Ops]: return [u.op for u in uops if u.op is not Ops.CONST]
    assert ops(prog_many.uops) == ops(prog_few.uops), prog_many.name

@pytest.fixture
def small_int32(monkeypatch: pytest.MonkeyPatch) -> None:
  """Indices over 200 count as too wide for int32: the choice runs at sizes a test can afford."""
  monkeypatch.setattr(ember.schedule.kernel, "INT32_MAX", 200)

VIEWS: dict[str, tuple[Callable[[Any], Any], Callable[[np.ndarray], np.ndarray]]] = {
  # (6, 10) -> (6, 2, 5): the view holds 60 elements, its runs 10; the expand makes 6 * 40 = 240
  "expand_split": (lambda t: t[:, :1].expand(6, 40).reshape(6, 8, 5).sum(2),
                   lambda a: np.broadcast_to(a[:, :1], (6, 40)).reshape(6, 8, 5).sum(2)),
  "permute_merge": (lambda t: t.permute(1, 0).reshape(2, 5, 6)[:, 1:4].sum(1),
                    lambda a: a.T.reshape(2, 5, 6)[:, 1:4].sum(1)),
  "unit_dims": (lambda t: t.reshape(6, 1, 10, 1).expand(6, 5, 10, 1).reshape(6, 5, 2, 5).max(1),
                lambda a: np.broadcast_to(a.reshape(6, 1, 10, 1), (6, 5, 10, 1)).reshape(6, 5, 2, 5).max(1)),
  "pool": (lambda t: t.reshape(1, 1, 6, 10)._pool((3, 3), (1, 2), (1, 1)).sum((4, 5)),
           lambda a: np.lib.stride_tricks.sliding_window_view(a, (3, 3))[None, None, :, ::2].sum((4, 5))),
}

@pytest.mark.parametrize("name", list(VIEWS))
def test_views_larger_than_the_index_limit_compute_what_numpy_does(name: str, small_int32: None) -> None:
  a = np.random.default_rng(0).standard_normal((6, 10)).astype(np.float32)
  build, want = VIEWS[name]
  out = build(Tensor(a, device="PYTHON"))
  (ast,) = _kernels(out)
  assert index_dtypes(get_program(ast, PythonRenderer()).uops) == {dtypes.int32}
  np.testing.assert_allclose(out.numpy(), want(a), rtol=1e-5, atol=1e-5)
