"""Codegen passes on the kernels the CPU renderer's opts unroll (register-blocked matmuls): tests of core's linearize
and rewrite engine that need those opts, so they run where the CPU backend is installed (tests-cpu)."""
from __future__ import annotations
import numpy as np
from ember import Tensor
from ember.codegen.linearize import linearize
from ember.device import Device
from ember.uop.ops import Ops, UOp
from ember.uop.rewrite import PatternMatcher, graph_rewrite

def ast_of(t: Tensor) -> UOp:
  ks = [it for it in t.schedule() if it.kind == "kernel"]
  assert len(ks) == 1
  return ks[0].ast

def check_well_formed(uops: list[UOp]) -> None:
  pos = {u: i for i, u in enumerate(uops)}
  assert len(pos) == len(uops), "a uop appears twice"
  open_ranges: list[UOp] = []
  for i, u in enumerate(uops):
    for s in u.src: assert s in pos and pos[s] < i, f"uop {i} ({u.op}) uses a later or missing source"
    if u.op is Ops.END:
      assert open_ranges and open_ranges[-1] is u.src[0], "END closes the innermost open range"
      open_ranges.pop()
    if u.op is Ops.RANGE: open_ranges.append(u)
  assert not open_ranges, "every RANGE has an END"

def _reference(pm: PatternMatcher, node: UOp, ctx: object = None) -> UOp | None:
  return pm.traced_rewrite(node, ctx, lambda *_: None)

def test_group_walk_and_range_deps_on_an_unrolled_matmul():
  """A register-blocked matmul's reduction group has one body per accumulator: its nodes are listed by one walk over
  all the bodies, in the order of each body's toposort less what an earlier body listed, and range_deps gives the same
  sets with the toposort given or not."""
  from ember.codegen import simplify_kernel
  from ember.codegen.linearize import range_deps
  from ember.uop.ops import toposort_all  # the walk linearize lists a group's bodies with
  from ember.codegen.opt import apply_opts_list, hand_coded_opts
  a, b = Tensor(np.ones((16, 32), np.float32)), Tensor(np.ones((32, 64), np.float32))
  renderer = Device["CPU"].renderer
  ast = simplify_kernel(ast_of(a @ b))
  sink = apply_opts_list(ast, hand_coded_opts(ast, renderer))
  roots = [r.src[0] for r in sink.toposort() if r.op is Ops.REDUCE]
  assert len(roots) >= 8  # unrolled: many accumulators
  listed: dict[UOp, None] = {}
  for root in roots:
    for n in root.toposort():
      if n not in listed: listed[n] = None
  assert list(toposort_all(roots)) == list(listed)
  want: dict[UOp, frozenset[UOp]] = {}  # the ranges under each node, less those a reduction on the way closes
  for n in sink.toposort():
    d = set().union(*(want[s] for s in n.src)) | ({n} if n.op is Ops.RANGE else set())
    want[n] = frozenset(d - set(n.src[1:]) if n.op is Ops.REDUCE else d)
  assert range_deps(sink) == want and range_deps(sink, list(sink.toposort())) == want
  check_well_formed(linearize(sink))

def test_written_rules_agree_with_the_matchers_on_kernels():
  """Every node of real kernels (a matmul unrolled by the kernel opts, a softmax) under codegen's own tables gives
  what the rule matchers give: the written code is the same rules."""
  import numpy as np
  from ember import Tensor
  from ember.codegen import pm_simplify
  from ember.codegen.opt import apply_opts_list, hand_coded_opts, pm_const_last
  from ember.device import Device
  from ember.uop.symbolic import symbolic
  a, b = Tensor(np.ones((16, 32), np.float32)), Tensor(np.ones((32, 64), np.float32))
  kernels = [si.program for t in (a @ b, (a @ b).softmax(-1)) for si in t.schedule() if si.program is not None]
  renderer = Device["CPU"].renderer
  tables = [symbolic, pm_simplify, pm_const_last] + ([renderer.extra_matcher] if renderer.extra_matcher else [])
  nodes: dict[UOp, None] = {}
  for k in kernels:
    nodes.update(k.toposort())
    nodes.update(apply_opts_list(graph_rewrite(k, pm_simplify), hand_coded_opts(k, renderer)).toposort())
  assert len(nodes) > 500
  for pm in tables:
    for n in nodes: assert pm.rewrite(n) is _reference(pm, n), n
