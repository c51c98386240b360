"""UPat matching, PatternMatcher dispatch and composition, graph_rewrite fixed points (top-down and bottom-up)."""
from __future__ import annotations
import pytest
from ember.dtype import dtypes
from ember.uop.ops import UOp, Ops, Variable
from ember.uop.rewrite import UPat, PatternMatcher, graph_rewrite, substitute, RewriteLoopError

x, y, z = Variable("x", 0, 10), Variable("y", 0, 10), Variable("z", 0, 10)
def c(v: int) -> UOp: return UOp.const(dtypes.int32, v)

# ** UPat **

def test_op_dtype_and_arg_filters():
  assert UPat(Ops.ADD).match(x + y, {}) == [{}]
  assert UPat(Ops.MUL).match(x + y, {}) == []
  assert UPat({Ops.MUL, Ops.ADD}).match(x + y, {}) == [{}]
  assert UPat(dtype=dtypes.int32).match(x, {}) == [{}]
  assert UPat(dtype=dtypes.float32).match(x, {}) == []
  assert UPat(dtype=(dtypes.float32, dtypes.int32)).match(x, {}) == [{}]
  assert UPat.const(dtypes.int32, 3).match(c(3), {}) == [{}]
  assert UPat.const(dtypes.int32, 3).match(c(4), {}) == []
  assert UPat.const(None, 1).match(UOp.const(dtypes.bool, True), {}) == []  # True is not the int 1
  assert UPat.const(None, 0.0).match(UOp.const(dtypes.float32, 0.0), {}) != []

def test_named_capture():
  m = UPat(Ops.ADD, src=(UPat.var("a"), UPat.cvar("k")), name="root").match(x + 3, {})
  assert len(m) == 1 and m[0]["a"] is x and m[0]["k"] is c(3) and m[0]["root"] is (x + 3)

def test_tuple_sources_match_in_order_only():
  pat = UPat(Ops.ADD, src=(UPat.cvar("k"), UPat.var("a")))
  assert pat.match(x + 3, {}) == []  # constant is on the right
  assert pat.match(UOp(Ops.ADD, dtypes.int32, (c(3), x)), {})[0]["a"] is x

def test_list_sources_match_any_permutation():
  pat = UPat(Ops.ADD, src=[UPat.cvar("k"), UPat.var("a")])
  for node in (x + 3, UOp(Ops.ADD, dtypes.int32, (c(3), x))):
    ms = pat.match(node, {})
    assert len(ms) >= 1 and ms[0]["k"] is c(3) and ms[0]["a"] is x

def test_list_sources_give_every_binding():
  ms = UPat(Ops.ADD, src=[UPat.var("p"), UPat.var("q")]).match(x + y, {})
  assert {(m["p"], m["q"]) for m in ms} == {(x, y), (y, x)}

def test_same_name_must_bind_the_same_node():
  pat = UPat(Ops.ADD, src=(UPat.var("a"), UPat.var("a")))
  assert pat.match(x + x, {})[0]["a"] is x
  assert pat.match(x + y, {}) == []

def test_any_length_sources():
  w = UOp(Ops.SINK, dtypes.void, (x, y, z))
  assert UPat(Ops.SINK, src=(UPat.var("first"),)).match(w, {}) == []
  ms = UPat(Ops.SINK, src=(UPat.var("first"),), allow_any_len=True).match(w, {})
  assert ms[0]["first"] is x
  assert UPat(Ops.SINK, src=(UPat.var(), UPat.var(), UPat.var(), UPat.var()), allow_any_len=True).match(w, {}) == []

def test_single_upat_source_must_match_every_source():
  pat = UPat(Ops.SINK, src=UPat(Ops.DEFINE_VAR))
  assert pat.match(UOp(Ops.SINK, dtypes.void, (x, y, z)), {}) == [{}]
  assert pat.match(UOp(Ops.SINK, dtypes.void, (x, c(1))), {}) == []

def test_upat_any():
  pat = UPat.any(UPat(Ops.ADD, name="n"), UPat(Ops.MUL, name="n"))
  assert pat.match(x + y, {})[0]["n"] is (x + y)
  assert pat.match(x * y, {})[0]["n"] is (x * y)
  assert pat.match(x // y, {}) == []
  named = UPat.any(UPat(Ops.ADD), UPat(Ops.MUL)).named("top")
  assert named.match(x * y, {})[0]["top"] is (x * y)

def test_pattern_sugar_builds_commutative_patterns():
  pat = UPat.var("a") + 0
  assert (x + 0).op is Ops.ADD and pat.match(x + 0, {})[0]["a"] is x
  node = UOp(Ops.ADD, dtypes.int32, (c(0), x))
  assert pat.match(node, {})[0]["a"] is x

# ** PatternMatcher **

def test_rewrite_calls_callback_with_captures_and_ctx():
  seen = []
  def cb(ctx, a):
    seen.append(ctx)
    return a
  pm = PatternMatcher([(UPat(Ops.MUL, src=(UPat.var("a"), UPat.const(dtypes.int32, 1))), cb)])
  assert pm.rewrite(x * 1, ctx="C") is x and seen == ["C"]
  assert pm.rewrite(x * 2, ctx="C") is None

def test_first_matching_rule_wins_and_none_falls_through():
  pm = PatternMatcher([
    (UPat(Ops.ADD, name="n"), lambda n: None),  # declines
    (UPat(Ops.ADD, name="n"), lambda n: n.src[0]),
    (UPat(Ops.ADD, name="n"), lambda n: n.src[1]),
  ])
  assert pm.rewrite(x + y) is x

def test_returning_the_same_node_is_no_rewrite():
  pm = PatternMatcher([(UPat(Ops.ADD, name="n"), lambda n: n)])
  assert pm.rewrite(x + y) is None

def test_matchers_compose_with_plus():
  pm1 = PatternMatcher([(UPat(Ops.ADD, src=(UPat.var("a"), UPat.const(dtypes.int32, 0))), lambda a: a)])
  pm2 = PatternMatcher([(UPat(Ops.MUL, src=(UPat.var("a"), UPat.const(dtypes.int32, 1))), lambda a: a)])
  both = pm1 + pm2
  assert both.rewrite(x + 0) is x and both.rewrite(x * 1) is x
  assert pm1.rewrite(x * 1) is None

def test_early_reject_skips_rules_whose_source_ops_are_absent():
  calls = []
  def cb(k):
    calls.append(k)
    return None
  pm = PatternMatcher([(UPat(Ops.ADD, src=(UPat(Ops.RANGE), UPat.cvar("k"))), cb)])
  pm.rewrite(x + 1)  # no RANGE source: the callback never runs
  assert calls == []
  pm.rewrite(UOp.range(4, 0) + 1)
  assert calls == [c(1)]

def test_rule_for_any_op():
  true = UOp.const(dtypes.bool, True)
  pm = PatternMatcher([(UPat(name="n", dtype=dtypes.bool), lambda n: true if n.op is not Ops.CONST else None)])
  assert pm.rewrite(x.lt(3)) is UOp.const(dtypes.bool, True)

def test_op_rules_come_before_any_op_rules_and_any_op_rules_reach_every_op():
  """A node is tried against the rules for its op, in table order, then the rules for any op (also where its op has
  no rules of its own, and where a table has no rule for it at all, nothing)."""
  pm = PatternMatcher([
    (UPat(name="n"), lambda n: n.src[1] if n.op is Ops.ADD else n.src[0] if n.op is Ops.MUL else None),
    (UPat(Ops.ADD, name="n"), lambda n: n.src[0]),
  ])
  assert pm.rewrite(x + y) is x and pm.rewrite(x * y) is x and pm.rewrite(x) is None
  assert PatternMatcher([(UPat(Ops.ADD, name="n"), lambda n: n.src[0])]).rewrite(x * y) is None

# ** graph_rewrite **

def test_uops_compare_by_identity():
  """graph_rewrite and substitute find a node's sources unchanged by comparing the source tuples with `==`: that is
  the identity check only while UOp keeps object's __eq__ (hash-consing makes equal structure the same object)."""
  assert UOp.__eq__ is object.__eq__
  assert (x + y,) == (x + y,) and (x + y,) != (y + x,)

pm_fold_add = PatternMatcher([
  (UPat(Ops.ADD, src=(UPat.cvar("a"), UPat.cvar("b"))), lambda a, b: UOp.const(dtypes.int32, a.arg + b.arg)),
  (UPat(Ops.ADD, src=(UPat.var("a"), UPat.const(dtypes.int32, 0))), lambda a: a),
])

def test_graph_rewrite_reaches_a_fixed_point():
  # ((1+2)+(3+4)) + 0 -> 10: every new node is rewritten again
  e = UOp(Ops.ADD, dtypes.int32, (UOp(Ops.ADD, dtypes.int32, (c(1) + c(2), c(3) + c(4))), c(0)))
  assert graph_rewrite(e, pm_fold_add) is c(10)

def test_graph_rewrite_rewrites_inside_and_keeps_untouched_nodes():
  e = (x + (c(1) + c(2))) * y
  out = graph_rewrite(e, pm_fold_add)
  assert out is (x + 3) * y
  untouched = x * y
  assert graph_rewrite(untouched, pm_fold_add) is untouched

def test_graph_rewrite_result_of_a_rule_is_rewritten_again():
  # rule 1 makes a+0 from a*1; rule 2 only then can remove the +0
  pm = PatternMatcher([
    (UPat(Ops.MUL, src=(UPat.var("a"), UPat.const(dtypes.int32, 1))), lambda a: UOp(Ops.ADD, dtypes.int32, (a, c(0)))),
    (UPat(Ops.ADD, src=(UPat.var("a"), UPat.const(dtypes.int32, 0))), lambda a: a),
  ])
  assert graph_rewrite((x * 1) * 1 + y, pm) is x + y

def test_graph_rewrite_shared_nodes_rewrite_once():
  calls = []
  def cb(a, b):
    calls.append((a.arg, b.arg))
    return UOp.const(dtypes.int32, a.arg + b.arg)
  pm = PatternMatcher([(UPat(Ops.ADD, src=(UPat.cvar("a"), UPat.cvar("b"))), cb)])
  shared = c(5) + c(6)
  out = graph_rewrite((x * shared) + (y * shared), pm)
  assert out is (x * 11) + (y * 11)
  assert calls.count((5, 6)) == 1

def test_graph_rewrite_remembers_what_nodes_became():
  # a later rewrite with the same table (the kernel's next opt, the next kernel) takes the nodes it walked before as
  # done: its rules run on the new nodes only, and the result is what a fresh walk gives
  tried = []
  def fold(a, b):
    tried.append((a.arg, b.arg))
    return UOp.const(dtypes.int32, a.arg + b.arg)
  pm = PatternMatcher([(UPat(Ops.ADD, src=(UPat.cvar("a"), UPat.cvar("b"))), fold)])
  first = x * (c(20) + c(1))
  assert graph_rewrite(first, pm) is x * 21
  bigger = first + (c(30) + c(2))
  assert graph_rewrite(bigger, pm) is x * 21 + 32
  assert tried == [(20, 1), (30, 2)]
  assert graph_rewrite(bigger, PatternMatcher(pm.patterns)) is x * 21 + 32  # another table walks it all again
  assert tried == [(20, 1), (30, 2), (20, 1), (30, 2)]

def test_ops_under_and_the_walk_it_saves():
  # a table's rules match a few root ops; a subgraph holding none of them is left unwalked, one holding them deep down
  # is still rewritten
  from ember.uop.rewrite import ops_under
  e = (x // 2 + 1) * 3
  assert ops_under(e) == sum(1 << op.value for op in (Ops.MUL, Ops.ADD, Ops.IDIV, Ops.DEFINE_VAR, Ops.CONST))
  assert ops_under(x) == 1 << Ops.DEFINE_VAR.value
  tried = []
  def halve(a):
    tried.append(a)
    return a * 5
  pm = PatternMatcher([(UPat(Ops.IDIV, src=(UPat.var("a"), UPat.const(dtypes.int32, 2))), halve)])
  assert pm.root_ops == 1 << Ops.IDIV.value
  assert graph_rewrite(e, pm) is (x * 5 + 1) * 3
  assert graph_rewrite(y * 7 + z, pm) is y * 7 + z
  assert tried == [x]

def test_graph_rewrite_with_ctx_walks_every_time():
  # rules that read ctx may give another result for the same node under another ctx: nothing is remembered
  pm = PatternMatcher([(UPat(Ops.DEFINE_VAR, name="v"), lambda ctx, v: ctx.get(v.arg[0]))])
  assert graph_rewrite(x + y, pm, ctx={"x": c(2)}) is c(2) + y
  assert graph_rewrite(x + y, pm, ctx={"x": c(3)}) is c(3) + y

def test_graph_rewrite_passes_ctx():
  pm = PatternMatcher([(UPat(Ops.DEFINE_VAR, name="v"), lambda ctx, v: ctx.get(v.arg[0]))])
  assert graph_rewrite(x + y, pm, ctx={"x": c(2)}) is c(2) + y

def test_bottom_up_sees_the_parent_before_its_sources():
  # (x+0)*1: top-down rewrites x+0 first; bottom-up matches the outer node while its source is still (x+0)
  order_td, order_bu = [], []
  def spy(order):
    def cb(n):
      order.append(n.op)
      return None
    return PatternMatcher([(UPat({Ops.ADD, Ops.MUL}, name="n"), cb)])
  e = (x + y) * z
  graph_rewrite(e, spy(order_td))
  graph_rewrite(e, spy(order_bu), bottom_up=True)
  assert order_td == [Ops.ADD, Ops.MUL]
  assert order_bu == [Ops.MUL, Ops.ADD]

def test_bottom_up_rewrites_to_a_fixed_point_too():
  e = UOp(Ops.ADD, dtypes.int32, (UOp(Ops.ADD, dtypes.int32, (c(1) + c(2), c(3) + c(4))), c(0)))
  assert graph_rewrite(e, pm_fold_add, bottom_up=True) is c(10)
  # a rule that unwraps a node bottom-up, then the unwrapped result is matched again
  unwrap = PatternMatcher([(UPat(Ops.NEG, src=(UPat(Ops.NEG, src=(UPat.var("a"),)),)), lambda a: a)])
  f = x.cast(dtypes.float32)
  for _ in range(4): f = UOp(Ops.NEG, dtypes.float32, (f,))
  assert graph_rewrite(f, unwrap, bottom_up=True) is x.cast(dtypes.float32)

def test_a_rule_that_never_settles_raises():
  pm = PatternMatcher([(UPat(Ops.DEFINE_VAR, name="v"), lambda v: v.replace(arg=(v.arg[0], v.arg[1], v.arg[2] + 1)))])
  with pytest.raises(RewriteLoopError):
    graph_rewrite(x, pm, bottom_up=True)

def test_substitute_replaces_by_identity_without_rewriting_again():
  e = (x + y) * x
  out = substitute(e, {x: y + 0})
  assert out is ((y + 0) + y) * (y + 0)
  assert e.substitute({}) is e

# ** the written-out rules (PatternMatcher.rewrite) against the matchers (UPat.match, which traced_rewrite uses) **

def _reference(pm: PatternMatcher, node: UOp, ctx: object = None) -> UOp | None:
  return pm.traced_rewrite(node, ctx, lambda *_: None)

def test_written_rules_call_back_once_per_match_in_match_order():
  # a commutative pattern with two commutative sources: every binding, in UPat.match's order, until one rewrites
  pat = UPat(Ops.ADD, src=[UPat(Ops.MUL, src=[UPat.var("a"), UPat.var("b")]), UPat.var("c")])
  node = (x * y) + (y * z)
  seen: list[tuple[UOp, UOp, UOp]] = []
  def cb(a, b, c):
    seen.append((a, b, c))
    return None
  assert PatternMatcher([(pat, cb)]).rewrite(node) is None
  assert seen == [(m["a"], m["b"], m["c"]) for m in pat.match(node, {})] and len(seen) == 4
  # the third binding rewrites: the fourth is never tried
  seen.clear()
  def third(a, b, c):
    seen.append((a, b, c))
    return c if len(seen) == 3 else None
  assert PatternMatcher([(pat, third)]).rewrite(node) is pat.match(node, {})[2]["c"] and len(seen) == 3

def test_written_rules_keep_names_dtypes_args_and_lengths():
  fx = UOp(Ops.DEFINE_VAR, dtypes.float32, arg=("f", 0, 1))
  buf = UOp(Ops.PARAM, dtypes.float32.ptr(4), (), 0)
  rules = [
    (UPat(Ops.ADD, src=(UPat.var("a"), UPat.var("a"))), lambda a: a * 2),  # the same name binds the same node
    (UPat(Ops.MUL, src=[UPat.var("a", dtype=dtypes.float32), UPat.cvar("k")]), lambda a, k: a),
    (UPat(Ops.INDEX, src=(UPat(dtype=dtypes.float32, name="b"),), allow_any_len=True, name="i"), lambda b, i: b),
    (UPat(Ops.CMPLT, src=(UPat.var("a"), UPat.const(None, 1))), lambda a: a),  # True is not the int 1
    (UPat(Ops.WHERE, name="w"), lambda w: None),  # declines: falls through to the rule for any op
    (UPat(name="n", dtype=dtypes.bool), lambda n: UOp.const(dtypes.bool, False) if n.op is Ops.WHERE else None),
  ]
  pm = PatternMatcher(rules)
  nodes = [x + x, x + y, fx * UOp.const(dtypes.float32, 2.0), UOp.const(dtypes.float32, 2.0) * fx, x * 3,
           UOp(Ops.INDEX, dtypes.float32.ptr(4), (buf, c(1))), UOp(Ops.INDEX, dtypes.float32.ptr(4), (buf,)),
           x.lt(1), x.lt(UOp.const(dtypes.bool, True).cast(dtypes.int32)), x.lt(2).where(x.lt(3), x.lt(4))]
  for n in nodes: assert pm.rewrite(n) is _reference(pm, n), n
  assert pm.rewrite(x + x) is x * 2 and pm.rewrite(x + y) is None
  assert pm.rewrite(UOp(Ops.INDEX, dtypes.float32.ptr(4), (buf, c(1)))) is buf  # a pointer matches its base dtype

def test_rules_not_written_out_run_through_their_matchers():
  # alternatives, a pattern every source must match and a name that is no identifier keep the matcher's semantics
  pm = PatternMatcher([
    (UPat.any(UPat(Ops.ADD, name="n"), UPat(Ops.MUL, name="n")), lambda n: n.src[0]),
    (UPat(Ops.SINK, src=UPat(Ops.DEFINE_VAR)), lambda **kw: c(0)),
    (UPat(Ops.MAX, src=(UPat.var("odd-name"), UPat.var())), lambda **kw: kw["odd-name"]),
    (UPat.any(UPat(Ops.IDIV, name="n")), lambda ctx, n: ctx),  # one that takes ctx, after one that does not
  ])
  for n in (x + y, x * y, x // y, UOp(Ops.SINK, dtypes.void, (x, y)), UOp(Ops.SINK, dtypes.void, (x, c(1))),
            x.maximum(y)):
    assert pm.rewrite(n, c(7)) is _reference(pm, n, c(7)), n
  assert pm.rewrite(x.maximum(y)) is x and pm.rewrite(x // y, c(7)) is c(7)
