"""The linear program (docs/linear-program.md): ordering, loop nesting, accumulators and hoisting, and what
`get_program` reports about it."""
from __future__ import annotations
import numpy as np
import pytest
from ember import Tensor, Variable
from ember.codegen import full_rewrite, get_program
from ember.codegen.linearize import linearize
from ember.device import Device
from ember.dtype import dtypes, PtrDType
from ember.errors import CompileError
from ember.uop.ops import Ops, UOp, GroupOp, AxisType

LINEAR_OPS = {Ops.PARAM, Ops.DEFINE_VAR, Ops.CONST, Ops.RANGE, Ops.END, Ops.DEFINE_ACC, Ops.ASSIGN, Ops.INDEX, Ops.LOAD,
              Ops.STORE, Ops.CAST, Ops.BITCAST} | GroupOp.ALU

def ast_of(t: Tensor) -> UOp:
  ks = [it for it in t.schedule() if it.kind == "kernel"]
  assert len(ks) == 1
  return ks[0].ast

def lin(t: Tensor) -> list[UOp]:
  uops = full_rewrite(ast_of(t), Device["PYTHON"].renderer)[0]
  return uops

def check_well_formed(uops: list[UOp]) -> None:
  pos = {u: i for i, u in enumerate(uops)}
  assert len(pos) == len(uops), "a uop appears twice"
  open_ranges: list[UOp] = []
  defined_in: dict[UOp, int] = {}  # loop depth at which each value is defined
  for i, u in enumerate(uops):
    assert u.op in LINEAR_OPS, u.op
    for s in u.src:
      assert s in pos and pos[s] < i, f"uop {i} ({u.op}) uses a later or missing source"
      # a value defined inside a loop is not used after the loop closed (accumulators are declared outside)
      assert defined_in[s] <= len(open_ranges) or u.op is Ops.END
    if u.op is Ops.END:
      assert open_ranges and open_ranges[-1] is u.src[0], "END closes the innermost open range"
      open_ranges.pop()
    defined_in[u] = len(open_ranges)
    if u.op is Ops.RANGE: open_ranges.append(u)
  assert not open_ranges, "every RANGE has an END"

def test_elementwise_program():
  a, b = Tensor(np.ones((4, 5), np.float32)), Tensor(np.ones((4, 5), np.float32))
  uops = lin(a * b + 1)
  check_well_formed(uops)
  params = [u for u in uops if u.op is Ops.PARAM]
  assert [p.arg for p in params] == [0, 1, 2]
  assert uops[:3] == params  # arguments come first, in slot order
  assert all(isinstance(p.dtype, PtrDType) for p in params)
  assert sum(u.op is Ops.STORE for u in uops) == 1
  assert sum(u.op is Ops.RANGE for u in uops) == sum(u.op is Ops.END for u in uops) >= 1
  assert not any(u.op is Ops.DEFINE_ACC for u in uops)

def test_reduce_program_has_an_accumulator_loop():
  x = Tensor(np.ones((4, 6), np.float32))
  uops = lin((x * 2).sum(1))
  check_well_formed(uops)
  accs = [u for u in uops if u.op is Ops.DEFINE_ACC]
  assert len(accs) == 1 and accs[0].src[0].op is Ops.CONST and accs[0].src[0].arg == 0
  assigns = [u for u in uops if u.op is Ops.ASSIGN]
  assert len(assigns) == 1 and assigns[0].src[0] is accs[0]
  reduce_rng = [u for u in uops if u.op is Ops.RANGE and u.arg[1] is AxisType.REDUCE]
  assert len(reduce_rng) == 1
  pos = {u: i for i, u in enumerate(uops)}
  assert pos[accs[0]] < pos[reduce_rng[0]] < pos[assigns[0]]
  assert not any(u.op is Ops.REDUCE for u in uops)

@pytest.mark.parametrize("op,identity", [("max", -np.inf), ("prod", 1)])
def test_reduce_identities(op, identity):
  x = Tensor(np.ones((3, 4), np.float32))
  uops = lin(getattr(x, op)(1))
  (acc,) = [u for u in uops if u.op is Ops.DEFINE_ACC]
  assert acc.src[0].arg == identity

def test_loop_invariant_loads_are_hoisted_out_of_the_reduce():
  # out[i] = sum_j a[i] * b[j]: the load of a[i] does not depend on j and must come before the j loop
  a, b = Tensor(np.ones((4, 1), np.float32)), Tensor(np.ones((1, 6), np.float32))
  uops = lin((a * b).sum(1))
  check_well_formed(uops)
  (red,) = [u for u in uops if u.op is Ops.RANGE and u.arg[1] is AxisType.REDUCE]
  pos = {u: i for i, u in enumerate(uops)}
  loads = [u for u in uops if u.op is Ops.LOAD]
  assert len(loads) == 2
  invariant = [ld for ld in loads if red not in ld.toposort()]
  assert len(invariant) == 1 and pos[invariant[0]] < pos[red]

def test_row_statistics_run_before_the_loop_over_the_row():
  """softmax in one kernel: the row's max and sum of exp (and the reciprocal of the sum) are computed once per row,
  before the loop that writes the row opens, not once per element."""
  x = np.random.default_rng(0).standard_normal((4, 24)).astype(np.float32)
  uops = lin(Tensor(x).softmax(-1))
  check_well_formed(uops)
  pos = {u: i for i, u in enumerate(uops)}
  outer, inner = sorted((u for u in uops if u.op is Ops.RANGE and u.arg[1] is AxisType.GLOBAL), key=lambda r: r.arg[0])
  accs = [u for u in uops if u.op is Ops.DEFINE_ACC]
  assert len(accs) >= 2 and all(pos[outer] < pos[a] < pos[inner] for a in accs)
  recip = [u for u in uops if u.op is Ops.RECIPROCAL]
  assert recip and all(pos[r] < pos[inner] for r in recip)

def test_first_call_cost_is_counted_per_pass():
  """Scheduling and codegen add their wall time to `ember.codegen.pass_seconds`, pass by pass (the bench reports a
  cold first call's split)."""
  from ember.codegen import pass_seconds
  before = dict(pass_seconds)
  t = Tensor(np.ones((4, 6), np.float32)).sum(1)
  get_program(ast_of(t), Device["PYTHON"].renderer)
  grew = {k for k, v in pass_seconds.items() if v > before.get(k, 0.0)}
  assert {"schedule", "plan packing", "simplify", "choose opts", "apply opts", "linearize", "render"} <= grew

def test_matmul_and_padded_programs_are_well_formed():
  a, b = Tensor(np.ones((3, 4), np.float32)), Tensor(np.ones((4, 5), np.float32))
  check_well_formed(lin((a @ b) * 2 + 1))  # a matmul with a fused epilogue
  gated = lin(Tensor(np.ones((3, 4), np.float32)).pad(((1, 1), (2, 0))) + 1)
  check_well_formed(gated)
  idx = [u for u in gated if u.op is Ops.INDEX and len(u.src) == 3]
  assert idx and all(u.src[2].dtype is dtypes.bool for u in idx)  # padding gates the load

def test_symbolic_shape_becomes_a_define_var():
  n = Variable("n", 1, 10)
  t = Tensor(np.ones(10, np.float32)).shrink(((0, n.bind(4)),)).sum()
  ast = ast_of(t)
  uops = full_rewrite(ast, Device["PYTHON"].renderer)[0]
  check_well_formed(uops)
  dvs = [u for u in uops if u.op is Ops.DEFINE_VAR]
  assert [d.arg[0] for d in dvs] == ["n"]
  first_non_arg = next(i for i, u in enumerate(uops) if u.op not in (Ops.PARAM, Ops.DEFINE_VAR))
  assert all(uops.index(d) < first_non_arg for d in dvs)

def test_linearize_needs_a_sink():
  with pytest.raises(CompileError):
    linearize(UOp.const(dtypes.int32, 1))

def test_get_program_reports_slots_name_and_estimates():
  x = Tensor(np.ones((4, 6), np.float32))
  ast = ast_of((x * 2).sum(1))
  spec = get_program(ast, Device["PYTHON"].renderer, "PYTHON")
  assert spec.name.startswith("r_")
  assert spec.outs == [0] and spec.ins == [1] and spec.globals == [0, 1]
  assert spec.estimates.ops >= 4 * 6  # at least one float op per reduced element
  assert spec.estimates.mem == 4 * 4 + 24 * 4  # every byte of both buffers
  e = get_program(ast_of(x + 1), Device["PYTHON"].renderer, "PYTHON")
  assert e.name.startswith("E_")

def test_render_is_deterministic():
  x = Tensor(np.ones((4, 6), np.float32))
  ast = ast_of(x.exp().sum(0))
  r = Device["PYTHON"].renderer
  assert get_program(ast, r).src == get_program(ast, r).src

def _gauss_jordan_inverse(ab: Tensor, n: int) -> Tensor:
  """[A | I] reduced by Gauss-Jordan with partial pivoting (selects and one-hot sums): A's inverse."""
  rows = Tensor.arange(n, dtype=dtypes.int32)
  m = ab
  for k in range(n):
    pick = (rows >= k).where(m[..., :, k].detach().abs(), -1).argmax(-1)
    is_p, is_k = (rows == pick.unsqueeze(-1)).unsqueeze(-1), (rows == k).unsqueeze(-1)
    picked = is_p.where(m, 0).sum(-2)
    m = is_k.where(picked.unsqueeze(-2), is_p.where(m[..., k, :].unsqueeze(-2), m))
    factor = is_k.squeeze(-1).where(0, m[..., :, k]).unsqueeze(-1)
    u = picked / picked[..., k].unsqueeze(-1)
    m = is_k.where(u.unsqueeze(-2), m - factor * u.unsqueeze(-2)).contiguous()
  return m[..., n:]

def test_unrolled_reduction_copy_that_folds_to_a_constant() -> None:
  # a backward kernel of batched Gauss-Jordan sums over 2 rows for 2 x 4 outputs; with its 4 columns unrolled, column
  # 0's copy reduces a constant (it moves with no output range) and ran before the output loop, taking its siblings,
  # which read the batch index, along: that range was emitted inside the reduction loop without an END (CompileError
  # on CPU:C, an IR parsing error on CPU:LLVM)
  from ember.codegen.opt import Opt
  a = Tensor(np.array([[[4.0, 1.0], [2.0, 3.0]], [[1.0, 5.0], [3.0, 2.0]]], np.float32), requires_grad=True)
  inv = _gauss_jordan_inverse(Tensor.cat(a, Tensor.eye(2).expand(2, 2, 2), dim=-1), 2)
  inv.square().sum().backward()
  assert a.grad is not None
  asts = [it.ast for it in a.grad.schedule() if it.kind == "kernel"]
  def shape(ast: UOp) -> list[tuple[int, bool]]:
    return sorted((r.src[0].arg, r.arg[1] is AxisType.REDUCE) for r in ast.toposort() if r.op is Ops.RANGE)
  shaped = [ast for ast in asts if shape(ast) == [(2, False), (2, True), (4, False)]]
  assert shaped, "the backward has a (2, 4) output summed over 2"
  for ast in shaped:
    axis = next(r.arg[0] for r in ast.toposort() if r.op is Ops.RANGE and r.src[0].arg == 4)
    check_well_formed(full_rewrite(ast, Device["PYTHON"].renderer, [Opt("UPCAST_OUTER", axis, 4)])[0])
  want = np.linalg.inv(a.numpy())
  np.testing.assert_allclose(inv.numpy(), want, rtol=1e-5)

def test_selects_inside_a_select_on_the_same_condition_fold() -> None:
  # c ? f(c ? a : b) : g(c ? d : e) is c ? f(a) : g(e) (pm_same_condition): the inner selects are gone from the kernel
  # (gcc 12 -O3 -mavx2 vectorised t = c ? v : 0; c ? (t < k ? u : 0) : 0 with the wrong mask)
  from ember.codegen import simplify_kernel
  hits = Tensor(np.array([0, 1, 2, 0, 1], np.int32))
  v, u = Tensor(np.linspace(-1, 1, 5).astype(np.float32)), Tensor(np.arange(5, dtype=np.float32))
  c = hits > 0
  t = c.where(v, 0.0)
  out = c.where((t < 0.5).where(u, 0.0), 0.0) + (~c).where(c.where(1.0, u), 2.0)
  sink = simplify_kernel(ast_of(out))
  wheres = [n for n in sink.toposort() if n.op is Ops.WHERE]
  for w in wheres:
    inner = [n for arm in w.src[1:] for n in arm.toposort() if n.op is Ops.WHERE and n.src[0] is w.src[0]]
    assert not inner, "a select on the same condition inside a select's arm"
  cn = np.array([0, 1, 2, 0, 1]) > 0
  want = np.where(cn, np.where(np.linspace(-1, 1, 5) < 0.5, np.arange(5), 0), 0) + np.where(cn, 2.0, np.arange(5))
  np.testing.assert_allclose(out.numpy(), want, rtol=1e-6)
