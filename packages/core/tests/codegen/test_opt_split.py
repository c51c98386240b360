"""SPLIT over reductions of several ranges: the innermost range becomes the partial-sum lanes.

Every optimised kernel runs against the unoptimised one on the same random inputs, and the tensors the kernels come
from are checked against numpy, on the default device (PYTHON in the core suite, CPU where the backend is installed).
"""
from __future__ import annotations
import numpy as np
import pytest
from ember import Device, Tensor, dtypes
from ember.codegen.opt import KernelOptError, Opt, apply_opt, hand_coded_opts, split_reduce
from ember.codegen.search import _buffers, _compile, _outputs
from ember.uop.ops import Ops, UOp
from ember.uop.rewrite import graph_rewrite
from ember.uop.symbolic import symbolic

def _kernel(t: Tensor) -> UOp:
  items = [it for it in t.schedule() if it.kind != "copy"]
  assert items
  return graph_rewrite(items[-1].ast, symbolic, name="test: simplify")

def _run(ast: UOp, opts: list[Opt]) -> list[np.ndarray]:
  runner = _compile(ast, Device[Device.DEFAULT].renderer, Device.DEFAULT, opts)
  bufs = _buffers(runner.spec, Device.DEFAULT, 0)
  runner(bufs, {}, wait=True)
  return _outputs(bufs, runner.spec)

def _same_as_unoptimised(ast: UOp, opts: list[Opt]) -> None:
  want, got = _run(ast, []), _run(ast, opts)
  assert len(want) == len(got) >= 1
  for g, w in zip(got, want): np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)

def _realized(*shape: int, seed: int = 0) -> Tensor:
  return Tensor(np.random.default_rng(seed).standard_normal(shape).astype(np.float32)).realize()

def _reduces(ast: UOp) -> list[UOp]: return [n for n in ast.toposort() if n.op is Ops.REDUCE]

@pytest.mark.parametrize("op", ["sum", "max"])
@pytest.mark.parametrize("amt", [2, 4, 8, 16])
def test_split_of_two_range_reduction_matches_unoptimised(op: str, amt: int) -> None:
  x = _realized(6, 5, 16)
  ast = _kernel(getattr(x, op)(axis=(1, 2)))
  assert [len(r.src) - 1 for r in _reduces(ast)] == [2]
  _same_as_unoptimised(ast, [Opt("SPLIT", 0, amt)])

def test_split_of_three_range_reduction() -> None:
  a = np.random.default_rng(1).standard_normal((2, 3, 4, 16)).astype(np.float32)
  t = Tensor(a).realize().sum(axis=(1, 2, 3))
  ast = _kernel(t)
  assert [len(r.src) - 1 for r in _reduces(ast)] == [3]
  for amt in (2, 8, 16): _same_as_unoptimised(ast, [Opt("SPLIT", 0, amt)])
  # realized with the device's own opts (on CPU: the hand-coded 16-lane split) against numpy
  np.testing.assert_allclose(t.numpy(), a.astype(np.float64).sum(axis=(1, 2, 3)), rtol=1e-5, atol=1e-5)

def test_lane_split_drops_the_one_iteration_loop() -> None:
  # splitting an innermost range of 16 by 16 leaves 16 partial sums over the outer range alone
  ast = _kernel(_realized(4, 9, 16).sum(axis=(1, 2)))
  red = _reduces(ast)[0]
  out = split_reduce(ast, red, 16)
  parts = _reduces(out)
  assert len(parts) == 16 and all(len(p.src) == 2 and p.src[1].src[0].arg == 9 for p in parts)
  _same_as_unoptimised(ast, [Opt("SPLIT", 0, 16)])

def test_blockwise_dot_product_lanes_match_numpy() -> None:
  # the shape of a quantised matvec: (rows, blocks, 16 lanes) products summed over blocks and lanes in one kernel
  rng = np.random.default_rng(2)
  q = rng.integers(0, 256, (12, 18, 16), dtype=np.uint8)
  x = rng.standard_normal((1, 18, 32)).astype(np.float32)
  d = rng.random((12, 18, 1)).astype(np.float32)
  qi = Tensor(q).realize().cast(dtypes.int32)
  xt = Tensor(x).realize()
  t = ((xt[..., :16] * (qi & 15).cast(dtypes.float32) + xt[..., 16:] * (qi >> 4).cast(dtypes.float32))
       * Tensor(d).realize()).sum(axis=(1, 2))
  ast = _kernel(t)
  for amt in (4, 16): _same_as_unoptimised(ast, [Opt("SPLIT", 0, amt)])
  want = ((x[..., :16] * (q & 15) + x[..., 16:] * (q >> 4)) * d).astype(np.float64).sum(axis=(1, 2))
  np.testing.assert_allclose(t.numpy(), want, rtol=1e-4, atol=1e-4)

class _SimdRenderer:
  simd_width = 16

# 16 lanes, 128 per reduction, and its 4 rows reduced 2 at a time, 2 rows apart
@pytest.mark.parametrize("shape,want", [((4, 8, 16), [Opt("UPCAST_STRIDED", 0, 2), Opt("SPLIT", 0, 16)]),
                                        ((4, 8, 15), []),  # the innermost range does not divide the width
                                        ((4, 2, 16), [])])  # 32 elements: too short to pay for combining 16 lanes
def test_hand_coded_split_of_several_ranges(shape: tuple[int, int, int], want: list[Opt]) -> None:
  ast = _kernel(_realized(*shape).sum(axis=(1, 2)))
  assert hand_coded_opts(ast, _SimdRenderer()) == want  # type: ignore[arg-type]

def test_split_needs_a_dividing_innermost_range() -> None:
  ast = _kernel(_realized(4, 8, 10).sum(axis=(1, 2)))
  with pytest.raises(KernelOptError, match="innermost range is 10 does not divide"): apply_opt(ast, Opt("SPLIT", 0, 4))

@pytest.mark.parametrize("rows,want", [(3072, [Opt("THREADS", 0, 1)]),  # summing 16 lanes per row: one thread
                                       (1 << 17, [])])  # 2M elements: large enough to split over threads
def test_short_reductions_stay_on_one_thread(rows: int, want: list[Opt]) -> None:
  ast = _kernel(Tensor.ones(rows, 16).contiguous().realize().sum(-1))
  assert hand_coded_opts(ast, _SimdRenderer()) == want  # type: ignore[arg-type]
  assert hand_coded_opts(_kernel(_realized(64, 40).sum(-1)), _SimdRenderer()) == []  # 40 > 16 per output: not short
  small = _kernel(_realized(48, 16).sum(-1))
  _same_as_unoptimised(small, [Opt("THREADS", 0, 1)])
