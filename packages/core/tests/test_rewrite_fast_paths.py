"""The cheaper paths codegen takes for first-call speed give exactly what the reference paths give: rewrite_node /
rewrite_built against graph_rewrite, constants_last against graph_rewrite(pm_const_last), _unroll rewriting lanes as
it builds them against raw copies rewritten afterwards, UOp.const's int fast path against as_const."""
from __future__ import annotations
import itertools
import pytest
from ember.dtype import dtypes, as_const
from ember.uop.ops import Ops, UOp, AxisType
from ember.uop.rewrite import graph_rewrite, rewrite_node, PatternMatcher
from ember.uop.symbolic import symbolic
from ember.codegen.opt import _unroll, constants_last, pm_const_last, apply_opts_list, Opt

def _index_exprs() -> list[UOp]:
  """Index math of the kinds an unrolled kernel holds: lanes `r*amt + c` through reshapes, packed operands, pads."""
  r0, r1, k = UOp.range(16, 0, AxisType.GLOBAL), UOp.range(64, 1, AxisType.GLOBAL), UOp.range(32, 2, AxisType.REDUCE)
  o = UOp.range(8, 3, AxisType.GLOBAL)
  out = []
  for c in (0, 1, 5, 7):
    col = o * 8 + c
    out += [r0 * 64 + col, (col // 8) * 256 + k * 8 + col % 8, ((r0 * 64 + col) // 32) % 4, (r0 + c) * 3 + (k + 2),
            (r0 * 64 + (col + 1)) + 7, col.lt(60).where(col, col.const_like(59)) * 32 + k, (r1 + (k + c)) + r0 * 2]
  return out

def test_rewrite_node_is_graph_rewrite():
  for e in _index_exprs():
    # a fresh table each time: no memo shared with the reference
    fast, ref = PatternMatcher(symbolic.patterns), PatternMatcher(symbolic.patterns)
    assert rewrite_node(e, fast) is graph_rewrite(e, ref), e.render()

def _matmul_ast(rows: int = 12, cols: int = 64, red: int = 32) -> UOp:
  a = UOp(Ops.PARAM, dtypes.float32.ptr(rows * red), (), 0)
  b = UOp(Ops.PARAM, dtypes.float32.ptr(red * cols), (), 1)
  c = UOp(Ops.PARAM, dtypes.float32.ptr(rows * cols), (), 2)
  i, j = UOp.range(rows, 0, AxisType.GLOBAL), UOp.range(cols, 1, AxisType.GLOBAL)
  k = UOp.range(red, 2, AxisType.REDUCE)
  prod_ = a.index(i * red + k).load() * b.index((j // 16) * (red * 16) + k * 16 + j % 16).load()
  acc = UOp(Ops.REDUCE, dtypes.float32, (prod_, k), Ops.ADD)
  return UOp(Ops.SINK, dtypes.void, (c.index(i * cols + j).store(acc),))

@pytest.mark.parametrize("amt", [2, 4, 16])
def test_unroll_rewritten_lanes_match_raw_lanes(amt: int):
  ast = _matmul_ast()
  rng = next(r for r in ast.toposort() if r.op is Ops.RANGE and r.arg[0] == 1)
  outer = UOp.range(64 // amt, 1, AxisType.GLOBAL)
  lanes = [outer * amt + c for c in range(amt)]
  ref = graph_rewrite(ast.replace(src=_unroll(ast, rng, lanes)), PatternMatcher(symbolic.patterns))
  assert graph_rewrite(ast.replace(src=_unroll(ast, rng, lanes, symbolic)), symbolic) is ref

@pytest.mark.parametrize("opts", [[Opt("UPCAST_OUTER", 1, 16), Opt("UPCAST", 1, 4)],
                                  [Opt("UPCAST_OUTER", 1, 16), Opt("UPCAST_PADDED", 1, 5)], [Opt("UPCAST", 0, 4)]])
def test_constants_last_is_the_rewrite(opts: list[Opt]):
  ast = apply_opts_list(_matmul_ast(), opts)  # already constants-last: apply the opts without it
  from ember.codegen.opt import apply_opt
  raw = _matmul_ast()
  for o in opts: raw = apply_opt(raw, o)
  assert constants_last(raw) is graph_rewrite(raw, PatternMatcher(pm_const_last.patterns)) is ast

def test_const_int_fast_path_is_as_const():
  values = [0, 1, -1, 127, 128, 255, 256, -129, 2**31 - 1, 2**31, -2**31, -2**31 - 1, 2**63, 2**64 - 1, 2**64,
            True, False, 1.5, -0.0]
  for dt, v in itertools.product([*dtypes.ints, dtypes.bool, dtypes.float32, dtypes.weakint], values):
    got = UOp.const(dt, v).arg
    want = as_const(v, dt)
    assert type(got) is type(want) and got == want, (dt, v, got, want)
