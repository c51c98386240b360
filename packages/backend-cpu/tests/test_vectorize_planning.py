"""The vector planner's shortcuts (ember_cpu.vectorize) against the plain computations they stand for: where each uop
is evaluated once the groups print (recomputed only for the uops that can move), the order test of a resource's
events (one sort instead of every pair), an address's terms (memoised per ADD node)."""
from __future__ import annotations
import itertools
import random
from typing import Any, Callable
import numpy as np
import pytest
from ember import Tensor
from ember.codegen import get_program
from ember.plugin import Ops, UOp, dtypes
from ember_cpu import vectorize
from ember_cpu.renderer import ClangRenderer

def _rand(*shape: int, seed: int = 0) -> Tensor:
  return Tensor(np.random.default_rng(seed).standard_normal(shape).astype(np.float32)).realize()

def _program(t: Tensor) -> list[UOp]:
  """The linear program of `t`'s last kernel."""
  item = [it for it in t.schedule() if it.kind != "copy"][-1]
  return get_program(item.ast, ClangRenderer(), "").uops

PROGRAMS: dict[str, Callable[[], Tensor]] = {
  "a@b": lambda: _rand(64, 128) @ _rand(128, 64, seed=1),
  "(a@b + bias) * 0.5": lambda: (_rand(48, 128) @ _rand(128, 96, seed=1) + _rand(96, seed=2)) * 0.5,
  "row sums": lambda: _rand(16, 1024).sum(axis=1),
  "a@b.T": lambda: _rand(64, 96) @ _rand(80, 96, seed=1).transpose(-1, -2),
}

def _points(uops: list[UOp], users: dict[UOp, list[UOp]], inlined: set[UOp],
            emit: dict[UOp, int]) -> dict[UOp, tuple[int, ...]]:
  """Where each uop is evaluated, the whole program walked: at its group's statement, at its users' places (an INDEX
  or an inlined value), else on its own line."""
  pos = {u: i for i, u in enumerate(uops)}
  points: dict[UOp, tuple[int, ...]] = {}
  for u in reversed(uops):
    if u in emit: points[u] = (emit[u],)
    elif u.op is Ops.INDEX or u in inlined: points[u] = tuple(sorted({p for x in users[u] for p in points[x]}))
    else: points[u] = (pos[u],)
  return points

@pytest.mark.parametrize("name", list(PROGRAMS))
def test_moved_places_match_the_whole_program_walked(name: str) -> None:
  uops = _program(PROGRAMS[name]())
  inlined = ClangRenderer()._plan_inlining(uops)
  if (vp := vectorize.plan(uops, inlined, 64)) is None: pytest.fail(f"{name}: no lane groups")
  users, pos = vectorize.program_users(uops), {u: i for i, u in enumerate(uops)}
  indexes = [u for u in uops if u.op is Ops.INDEX]
  old = vectorize._scalar_points(uops, pos, users, inlined, indexes)
  assert old == _points(uops, users, inlined, {})
  emit = {u: max(pos[x] for x in g.uops) for u, (g, _) in vp.lane_of.items()}
  named = (inlined - vp.inlined) - vp.lane_of.keys()
  new, moved = vectorize._moved_points(old, pos, users, vp.inlined, indexes, emit, named)
  want = _points(uops, users, vp.inlined, emit)
  assert new == want
  assert moved == {u for u in uops if want[u] != old[u]} and moved

def test_same_order_is_every_pair_keeping_its_order() -> None:
  """Events of one place each (many ties: two events at one place, reads and writes) order alike before and after
  exactly when every pair of them does, a read before a write at one place."""
  lanes = [UOp.const(dtypes.int32, i) for i in range(6)]
  rng = random.Random(0)
  seen = set()
  for _ in range(3000):
    n = rng.randint(2, 6)
    old: dict[UOp, tuple[int, ...]] = {u: (rng.randint(0, 3),) for u in lanes[:n]}
    new: dict[UOp, tuple[int, ...]] = {u: (rng.randint(0, 3),) for u in lanes[:n]}
    evs: list[Any] = [(u, rng.random() < 0.5, None) for u in lanes[:n]]
    key = lambda e, places: 2 * places[e[0]][0] + e[1]  # noqa: E731
    want = all((key(a, old) < key(b, old)) == (key(a, new) < key(b, new)) for a, b in itertools.permutations(evs, 2))
    assert vectorize._same_order(evs, old, new) == want, (evs, old, new)
    seen.add(want)
  assert seen == {True, False}
  # events with several places (or none) are left to the pairwise test
  several: dict[UOp, tuple[int, ...]] = {lanes[0]: (1, 2), lanes[1]: (0,)}
  assert not vectorize._same_order([(lanes[0], True, None), (lanes[1], False, None)], several, several)

def _flat_address(index: UOp) -> tuple[tuple[Any, ...], int]:
  """An INDEX's buffer, gate, terms (a multiset) and constant, its ADD tree walked node by node."""
  terms, const, stack = [], 0, [index.src[1]]
  while stack:
    x = stack.pop()
    if x.op is Ops.CONST: const += x.arg
    elif x.op is Ops.ADD: stack.extend(x.src)
    else: terms.append(x)
  return (index.src[0], index.src[2] if len(index.src) == 3 else None, tuple(sorted(terms, key=id))), const

def test_addresses_memoised_per_node_match_the_tree_walked() -> None:
  sums: dict[UOp, Any] = {}  # shared by every program, as a grower shares it by all addresses of one
  count = 0
  for make in PROGRAMS.values():
    for u in _program(make()):
      if u.op is Ops.INDEX and len(u.src) >= 2:
        assert vectorize._address(u, sums) == _flat_address(u)
        count += 1
  assert count > 100
