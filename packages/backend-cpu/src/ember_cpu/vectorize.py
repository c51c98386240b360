"""Lane groups: isomorphic scalar uops of a linear program that the C renderer prints once, as GCC vector code.

Register blocks and upcast loops reach the renderer unrolled: a 4 x 64 matmul block is 256 scalar accumulators and
256 `fmaf` lines a k step, which gcc's SLP vectoriser then re-discovers at 0.1-0.5 s of compile time per kernel. `plan`
finds the same work as groups of 16 (8, 4) lanes and the C renderer prints each group as one statement on a
`vector_size` type: 16 vector fmas a k step, compiled in a fraction of the time into the same machine code.

A group is seeded by a run of stores to consecutive addresses (lanes in address order), then by a run of accumulator
updates, and grows over its operands lane for lane:

| the operand's lanes | become |
| --- | --- |
| one value | a broadcast (`splat`) |
| constants | a vector constant |
| loads of consecutive addresses of one buffer, under one gate | one unaligned vector load |
| CASTs to 4-byte lanes of such loads of bytes or 16-bit ints, read by nothing else | one widening load (`_widen`) |
| one ALU op (`_FLOAT_OPS`, `_INT_OPS`), CAST or BITCAST; accumulators; their updates | a group, grown further |
| anything else | a vector built from the scalars (`gather`) |

Each lane computes what its scalar uop did, in the same order (a fused multiply-add stays one per lane), so the
program's results are the scalar program's bit for bit. A scalar still read elsewhere is its vector's lane (`v[i]`).

A group is printed where its last lane was. `plan` keeps only groups for which that moves no read of an accumulator
or of memory across a write to it, and no use of a value before its definition. A seed whose tree is mostly gathers,
or gathers loads, stays scalar (gcc's vectorisers do as well or better on those).
"""
from __future__ import annotations
from dataclasses import dataclass, field
from typing import Any
from ember.plugin import DType, Ops, UOp, dtypes, value_dtype

# dtypes a vector is made of: the narrow ones compute in int or float in C, which a vector op does not
_VECTOR_DTYPES = frozenset({dtypes.float32, dtypes.float64, dtypes.int32, dtypes.uint32, dtypes.int64, dtypes.uint64})
# narrow ints a vector is loaded in, only to be widened to 4-byte lanes: a run of consecutive byte (16-bit) loads
# feeding CASTs is one widening load instead of 16 scalar loads assembled lane by lane (a dequantising matvec's codes,
# the bits of half keys and values); no arithmetic is done on them (C promotes a narrow scalar to int, a narrow vector
# wraps)
_NARROW_DTYPES = frozenset({dtypes.uint8, dtypes.int8, dtypes.uint16, dtypes.int16})
# the ops printed on vectors, whose C operators mean on each lane what they mean on a scalar (comparisons give -1 on
# a vector, MAX reads NaNs and WHERE is a select, IDIV/MOD carry guards: those stay scalar)
_FLOAT_OPS = frozenset({Ops.ADD, Ops.SUB, Ops.MUL, Ops.FDIV, Ops.NEG, Ops.RECIPROCAL, Ops.MULACC})
_INT_OPS = frozenset({Ops.ADD, Ops.SUB, Ops.MUL, Ops.NEG, Ops.AND, Ops.OR, Ops.XOR, Ops.SHL, Ops.SHR})
# groups made of the program's uops (the others stand for operands: splat, const, gather)
_OWNING = frozenset({"load", "store", "alu", "cast", "bitcast", "widen", "acc", "assign"})
# sources defined for the whole of their scope, whatever moves: no use of them can come before their definition
_ALWAYS_DEFINED = frozenset({Ops.CONST, Ops.PARAM, Ops.DEFINE_VAR, Ops.RANGE, Ops.SPECIAL, Ops.INDEX,
                             Ops.DEFINE_LOCAL})
# the Ops members the planner's per-uop loops compare with, read once: on Python 3.11 every `Ops.X` goes through
# EnumType.__getattr__'s slow attribute path (0.17 us, ten times a global's), and a register block's program is
# thousands of uops walked several times
_CONST, _ADD, _INDEX, _LOAD, _STORE = Ops.CONST, Ops.ADD, Ops.INDEX, Ops.LOAD, Ops.STORE
_RANGE, _END, _DEFINE_ACC, _ASSIGN = Ops.RANGE, Ops.END, Ops.DEFINE_ACC, Ops.ASSIGN
_NOT_FOLLOWED = frozenset({Ops.DEFINE_ACC, Ops.ASSIGN, Ops.RANGE})  # _first_load does not look below these

@dataclass(eq=False)
class Lanes:
  """A group of `len(uops)` lanes: `kind` says what the vector is (see the module docstring), `srcs` its operands."""
  kind: str
  uops: tuple[UOp, ...]
  dtype: DType
  srcs: tuple[Lanes, ...] = ()
  @property
  def owns(self) -> bool: return self.kind in _OWNING

@dataclass
class VectorPlan:
  """The groups the C renderer prints: `lane_of` each grouped uop's group and lane, `emit_at` the uop whose place a
  group's statement takes, `inlined` the scalar inlining that stays (an operand of a group is named)."""
  lane_of: dict[UOp, tuple[Lanes, int]]
  emit_at: dict[UOp, Lanes]
  inlined: set[UOp]
  block: dict[UOp, int]
  unprinted: set[UOp]  # the addresses of lanes after a vector load's or store's first, and what is inlined in them
  silent: set[UOp] = field(default_factory=set)  # the uops the renderer prints nothing for: unprinted, or lanes
  names: dict[Lanes, str] = field(default_factory=dict)
  splats: dict[tuple[UOp, int, int], str] = field(default_factory=dict)  # (value, lanes, block) -> its broadcast

def lane_widths(dt: DType, vector_bytes: int) -> list[int]:
  """The lane counts of a group of `dt`: a full vector, then halves down to 16 bytes, at least 4 lanes."""
  widths, size = [], vector_bytes
  while size >= 16 and size // dt.itemsize >= 4:
    widths.append(size // dt.itemsize)
    size //= 2
  return widths

def _sum_terms(root: UOp, sums: dict[UOp, tuple[tuple[UOp, ...], int]]) -> tuple[tuple[UOp, ...], int]:
  """An integer value as the non-constant terms of its ADD tree and the sum of its constant terms; `sums` has those
  of the nodes seen before (the addresses of a register block share all but their constants)."""
  stack = [root]
  while stack:
    if (x := stack[-1]) in sums: stack.pop()
    elif x.op is _ADD:
      if missing := [s for s in x.src if s not in sums]: stack += missing
      elif len(x.src) == 2:
        (terms_a, const_a), (terms_b, const_b) = sums[x.src[0]], sums[x.src[1]]
        sums[stack.pop()] = (terms_a + terms_b, const_a + const_b)
      else:
        parts = [sums[s] for s in x.src]
        sums[stack.pop()] = (tuple(t for terms, _ in parts for t in terms), sum(const for _, const in parts))
    else: sums[stack.pop()] = ((), x.arg) if x.op is _CONST else ((x,), 0)
  return sums[root]

def _address(index: UOp, sums: dict[UOp, tuple[tuple[UOp, ...], int]]) -> tuple[tuple[Any, ...], int]:
  """An INDEX as (buffer, gate, its non-constant terms) and the sum of its constant terms."""
  terms, const = _sum_terms(index.src[1], sums)
  gate = index.src[2] if len(index.src) == 3 else None
  return (index.src[0], gate, tuple(sorted(terms, key=id)) if len(terms) > 1 else terms), const  # a multiset

def _reads_acc(u: UOp, memo: dict[UOp, bool]) -> bool:
  """Whether `u`'s value depends on an accumulator; `memo` has the answers for the nodes seen before."""
  if (hit := memo.get(u)) is None:
    for x in u.toposort(lambda x: x not in memo):  # sources before users: each one's sources are answered
      if x not in memo: memo[x] = x.op is _DEFINE_ACC or x.op is _ASSIGN or any(memo[s] for s in x.src)
    hit = memo[u]
  return hit

def program_users(uops: list[UOp]) -> dict[UOp, list[UOp]]:
  """Each uop's users in the program, in program order."""
  users: dict[UOp, list[UOp]] = {u: [] for u in uops}
  get = users.get
  for u in uops:
    for x in u.src:
      if (us := get(x)) is not None: us.append(u)
  return users

class _Grower:
  """Builds groups from seeds, memoised by their lanes; a seed's new groups can be taken back (`rollback`)."""
  def __init__(self, uops: list[UOp], users: dict[UOp, list[UOp]] | None = None,
               pos: dict[UOp, int] | None = None) -> None:
    self.pos = {u: i for i, u in enumerate(uops)} if pos is None else pos
    self.users = program_users(uops) if users is None else users
    self.block: dict[UOp, int] = {}
    self.by_op: dict[Ops, list[UOp]] = {}  # the uops of each op, in program order
    block, by_op, depth = self.block, self.by_op, 0
    for u in uops:
      if (op := u.op) is _RANGE or op is _END: depth += 1
      block[u] = depth  # uops between the same loop boundaries share a block number
      if (same := by_op.get(op)) is None: by_op[op] = [u]
      else: same.append(u)
    self.written = {u.src[0].src[0] for u in by_op.get(_STORE, ()) if u.src[0].op is _INDEX}  # buffers
    self.lane_of: dict[UOp, tuple[Lanes, int]] = {}
    self.memo: dict[tuple[UOp, ...], Lanes] = {}
    self.log: list[tuple[UOp, ...]] = []
    self.groups: list[Lanes] = []
    self.addresses: dict[UOp, tuple[tuple[Any, ...], int]] = {}
    self.sums: dict[UOp, tuple[tuple[UOp, ...], int]] = {}  # _sum_terms
    self.reads: dict[UOp, bool] = {}  # _reads_acc

  def rollback(self, mark: tuple[int, int]) -> None:
    for key in self.log[mark[0]:]: del self.memo[key]
    for g in self.groups[mark[1]:]:
      for u in g.uops: del self.lane_of[u]
    del self.log[mark[0]:], self.groups[mark[1]:]

  def mark(self) -> tuple[int, int]: return len(self.log), len(self.groups)

  def address(self, index: UOp) -> tuple[tuple[Any, ...], int]:
    if (hit := self.addresses.get(index)) is None: hit = self.addresses[index] = _address(index, self.sums)
    return hit

  def reads_acc(self, u: UOp) -> bool: return _reads_acc(u, self.reads)

  def own(self, g: Lanes) -> Lanes:
    for i, u in enumerate(g.uops): self.lane_of[u] = (g, i)
    self.groups.append(g)
    return g

  def grow(self, lanes: tuple[UOp, ...]) -> Lanes:
    if (hit := self.memo.get(lanes)) is not None: return hit
    g = self._make(lanes)
    self.memo[lanes] = g
    self.log.append(lanes)
    return g

  def _isomorphic(self, lanes: tuple[UOp, ...], narrow: bool = False) -> bool:
    first = lanes[0]
    op, dt, arg, n, lane_of, block = first.op, first.dtype, first.arg, len(first.src), self.lane_of, self.block
    where = block.get(first)
    return ((dt in _VECTOR_DTYPES or (narrow and dt in _NARROW_DTYPES)) and len(set(lanes)) == len(lanes)
            and all(u.op is op and u.dtype is dt and len(u.src) == n and (op is _DEFINE_ACC or u.arg == arg)
                    and u not in lane_of and block.get(u) == where for u in lanes))

  def _make(self, lanes: tuple[UOp, ...]) -> Lanes:
    first, dt = lanes[0], value_dtype(lanes[0])
    if all(u is first for u in lanes): return Lanes("const" if first.op is Ops.CONST else "splat", lanes, dt)
    if all(u.op is Ops.CONST for u in lanes): return Lanes("const", lanes, dt)
    if not self._isomorphic(lanes): return Lanes("gather", lanes, dt)
    op = first.op
    if op is Ops.LOAD and all(u.src[0].op is Ops.INDEX for u in lanes):
      addresses = [self.address(u.src[0]) for u in lanes]
      key, base = addresses[0]
      if all(k == key and c == base + i for i, (k, c) in enumerate(addresses)) and not self.reads_acc(first.src[0]):
        return self.own(Lanes("load", lanes, dt))
    elif op is Ops.DEFINE_ACC:
      return self.own(Lanes("acc", lanes, dt, (self.grow(tuple(u.src[0] for u in lanes)),)))
    elif op is Ops.ASSIGN:
      accs = tuple(u.src[0] for u in lanes)
      if (acc := self.grow(accs)).kind == "acc" and acc.uops == accs:
        return self.own(Lanes("assign", lanes, dt, (acc, self.grow(tuple(u.src[1] for u in lanes)))))
    elif op in (_FLOAT_OPS if dtypes.is_float(dt) else _INT_OPS) and all(s.dtype is dt for s in first.src):
      return self.own(Lanes("alu", lanes, dt, tuple(self.grow(tuple(u.src[k] for u in lanes))
                                                    for k in range(len(first.src)))))
    elif op in (Ops.CAST, Ops.BITCAST) and (sd := first.src[0].dtype) in _VECTOR_DTYPES and sd.itemsize == dt.itemsize \
        and all(u.src[0].dtype is sd for u in lanes):
      return self.own(Lanes(op.name.lower(), lanes, dt, (self.grow(tuple(u.src[0] for u in lanes)),)))
    elif op is Ops.CAST and dt.itemsize == 4 and (sd := first.src[0].dtype) in _NARROW_DTYPES \
        and all(u.src[0].dtype is sd for u in lanes) \
        and (src := self._narrow(tuple(u.src[0] for u in lanes))) is not None:
      return self.own(Lanes("widen", lanes, dt, (src,)))
    return Lanes("gather", lanes, dt)

  def _narrow(self, lanes: tuple[UOp, ...]) -> Lanes | None:
    """Narrow loads of consecutive addresses that only widening CASTs read, as one group (printed widened, `_widen`),
    or BITCASTs of such loads to a narrow int (a half's bits, which `pm_clang` widens with int ops) from a buffer the
    program never writes (the group reads the memory where the BITCASTs stand); None where they are not (the CASTs
    then gather their lanes)."""
    if (hit := self.memo.get(lanes)) is not None: return hit if hit.kind == "load" else None
    first = lanes[0]
    if not self._isomorphic(lanes, narrow=True) or not all(all(x.op is Ops.CAST for x in self.users[u]) for u in lanes):
      return None
    loads = lanes
    if first.op is Ops.BITCAST:
      loads = tuple(u.src[0] for u in lanes)
      if not all(x.op is Ops.LOAD and x.src[0].op is Ops.INDEX and x.dtype.itemsize == first.dtype.itemsize
                 and self.users[x] == [u] for x, u in zip(loads, lanes)) \
          or loads[0].src[0].src[0] in self.written:
        return None
    if loads[0].op is not _LOAD or self.reads_acc(loads[0].src[0]) or not all(x.src[0].op is _INDEX for x in loads):
      return None
    addresses = [self.address(x.src[0]) for x in loads]
    key, base = addresses[0]
    if not all(k == key and c == base + i for i, (k, c) in enumerate(addresses)): return None
    g = self.own(Lanes("load", lanes, value_dtype(first)))
    self.memo[lanes] = g
    self.log.append(lanes)
    return g

def _tree(g: Lanes) -> list[Lanes]:
  seen: dict[int, Lanes] = {}
  stack = [g]
  while stack:
    x = stack.pop()
    if id(x) not in seen:
      seen[id(x)] = x
      stack.extend(x.srcs)
  return list(seen.values())

def _worth_it(g: Lanes) -> bool:
  """A seed's groups pay when they are mostly vector work and read no memory lane by lane: strided loads gathered
  into a vector (a matmul with 10 columns read down a column of B) ran 3.5x slower than gcc's own vectorisation of
  the scalar program, which vectorises across another loop."""
  nodes = _tree(g)
  gathers = [n for n in nodes if n.kind == "gather"]
  if any(u.op is Ops.LOAD for n in gathers for u in n.uops): return False
  return 4 * len(gathers) <= sum(n.owns for n in nodes)

def _seed(grower: _Grower, make: Any, lanes: tuple[UOp, ...]) -> bool:
  if any(u in grower.lane_of for u in lanes): return False
  mark = grower.mark()
  g = make(lanes)
  if g is not None and g.owns and _worth_it(g): return True
  grower.rollback(mark)
  return False

def _chunks(run: list[UOp], widths: list[int], make: Any, grower: _Grower) -> None:
  """Seed groups along a run of lanes: full vectors from the run's start, narrower ones only for its tail. A full
  vector that does not pay leaves its lanes scalar rather than shifting the later groups off the vector boundaries the
  other rows of a register block use (their loads of B would then straddle two groups and stay scalar)."""
  i = 0
  while i + widths[-1] <= len(run):
    w = next(w for w in widths if i + w <= len(run))
    if not _seed(grower, make, tuple(run[i:i + w])) and w != widths[0]:
      w = next((n for n in widths if n < w and _seed(grower, make, tuple(run[i:i + n]))), widths[-1])
    i += w

def _store_group(grower: _Grower, lanes: tuple[UOp, ...]) -> Lanes | None:
  value = grower.grow(tuple(u.src[1] for u in lanes))
  if value.kind == "gather": return None
  return grower.own(Lanes("store", lanes, value.dtype, (value,)))

def _first_load(u: UOp) -> UOp | None:
  """The first load an accumulator update's value reads (depth first, its accumulator left out)."""
  stack = list(reversed(u.src[1:]))
  while stack:
    x = stack.pop()
    if x.op is _LOAD: return x if x.src[0].op is _INDEX else None
    if x.op not in _NOT_FOLLOWED: stack.extend(reversed(x.src))
  return None

def _address_runs(grower: _Grower, run: list[UOp], span: int) -> list[list[UOp]]:
  """Accumulator updates ordered by the address their first load reads, cut where that address jumps by more than
  `span` elements (a vector's lanes): a tree of partial sums reads its inputs in bit-reversed lane order (0, 8, 4, 12,
  ...), which these lanes then load as one vector, and partial sums of rows far apart (4 rows of 1000 floats, 8 lanes
  each) are a run per row, not 32 lanes chunked across rows into vectors that cannot load. Lanes reading one address
  (a broadcast), nearby ones or other buffers stay one run (updates reading no load first, in program order)."""
  unread: list[UOp] = []
  by_key: dict[Any, list[tuple[int, int, UOp]]] = {}
  for i, u in enumerate(run):
    if (load := _first_load(u)) is None: unread.append(u)
    else:
      key, const = grower.address(load.src[0])
      by_key.setdefault(key, []).append((const, i, u))
  runs: list[list[UOp]] = [unread]
  for group in by_key.values():
    last: int | None = None
    for const, _, u in sorted(group, key=lambda t: (t[0], t[1])):
      if last is not None and const - last > span: runs.append([])
      runs[-1].append(u)
      last = const
  return [r for r in runs if r]

def _seeds(grower: _Grower, vector_bytes: int) -> None:
  # runs of stores to consecutive addresses, in one block
  stores: dict[tuple[Any, ...], dict[int, UOp]] = {}
  for u in grower.by_op.get(_STORE, ()):
    if u.src[0].op is _INDEX and u.src[1].dtype in _VECTOR_DTYPES:
      key, const = grower.address(u.src[0])
      stores.setdefault((grower.block[u], u.src[1].dtype, *key), {}).setdefault(const, u)
  for (_, dt, *_), by_const in stores.items():
    if not (widths := lane_widths(dt, vector_bytes)): continue
    consts = sorted(by_const)
    start = 0
    for i in range(1, len(consts) + 1):
      if i == len(consts) or consts[i] != consts[i - 1] + 1:
        run = [by_const[c] for c in consts[start:i]]
        _chunks(run, widths, lambda lanes: _store_group(grower, lanes), grower)
        start = i
  # the updates of grouped accumulators: the k-th update of each lane in a block
  assigns: dict[UOp, list[UOp]] = {}
  for u in grower.by_op.get(_ASSIGN, ()): assigns.setdefault(u.src[0], []).append(u)
  for acc in [g for g in grower.groups if g.kind == "acc"]:
    per_lane = [assigns.get(u, []) for u in acc.uops]
    if all(len(a) == len(per_lane[0]) for a in per_lane):
      for lanes in zip(*per_lane): _seed(grower, grower.grow, tuple(lanes))
  # runs of accumulator updates not reached from a store (partial sums), in program order
  updates: dict[tuple[Any, ...], list[UOp]] = {}
  for u in grower.by_op.get(_ASSIGN, ()):
    if u not in grower.lane_of and u.dtype in _VECTOR_DTYPES:
      updates.setdefault((grower.block[u], u.dtype, u.src[1].op, u.src[1].arg), []).append(u)
  for (_, dt, *_), run in updates.items():
    if widths := lane_widths(dt, vector_bytes):
      for part in _address_runs(grower, run, widths[0]): _chunks(part, widths, grower.grow, grower)

# ** keeping the program's order **

def _scalar_points(uops: list[UOp], pos: dict[UOp, int], users: dict[UOp, list[UOp]], inlined: set[UOp],
                   indexes: list[UOp]) -> dict[UOp, tuple[int, ...]]:
  """Where each uop is evaluated in the scalar program: its user's place (inlined, or an INDEX at its loads and
  stores), else its own line."""
  points: dict[UOp, tuple[int, ...]] = {u: (i,) for i, u in enumerate(uops)}
  for u in sorted([*indexes, *inlined], key=pos.__getitem__, reverse=True):  # users before their sources
    us = users[u]
    points[u] = points[us[0]] if len(us) == 1 else tuple(sorted({p for x in us for p in points[x]}))
  return points

def _moved_points(old: dict[UOp, tuple[int, ...]], pos: dict[UOp, int], users: dict[UOp, list[UOp]],
                  inlined: set[UOp], indexes: list[UOp], emit: dict[UOp, int],
                  named: set[UOp]) -> tuple[dict[UOp, tuple[int, ...]], set[UOp]]:
  """Where each uop is evaluated once the groups are printed (a grouped uop at its group's statement, a formerly
  inlined one in `named` on its own line), and the uops whose places differ from `old`'s. Only those uops and the
  INDEXes and inlined values whose places come from theirs can move: the rest keep their scalar places."""
  affected = set(emit) | named
  stack = list(affected)
  placed_by_users = inlined.union(indexes)
  while stack:
    for s in stack.pop().src:
      if s in placed_by_users and s not in affected:
        affected.add(s)
        stack.append(s)
  new = old.copy()
  new.update({u: (at,) for u, at in emit.items()})
  new.update({u: (pos[u],) for u in named if u not in emit})
  derived = [u for u in affected if u not in emit and u not in named]  # INDEXes and inlined values
  for u in sorted(derived, key=pos.__getitem__, reverse=True):  # users before their sources
    us = users[u]
    new[u] = new[us[0]] if len(us) == 1 else tuple(sorted({p for x in us for p in new[x]}))
  return new, {u for u in affected if new[u] != old[u]}

_Event = tuple[UOp, bool, Any]  # a read or write (True) of a resource by a uop, at an address (buffers)
# a resource's events, its buffer events by their address's terms and constant, and by their terms alone
_Resource = tuple[list[_Event], dict[Any, dict[int, list[_Event]]], dict[Any, list[_Event]]]

def _events(by_op: dict[Ops, list[UOp]], users: dict[UOp, list[UOp]], address: Any) -> list[_Resource] | None:
  """The reads and writes of each accumulator and each written buffer, a buffer's indexed by its address's terms and
  constant (None: a program that reads memory some other way)."""
  if Ops.QDOT in by_op: return None
  events: dict[Any, list[_Event]] = {}
  for u in [*by_op.get(_DEFINE_ACC, ()), *by_op.get(_ASSIGN, ())]:  # its users read the accumulator by name
    evs = events.setdefault(u if u.op is _DEFINE_ACC else u.src[0], [])
    evs.append((u, True, None))
    evs += [(x, False, None) for x in users[u] if not (x.op is _ASSIGN and x.src[0] is u and x.src[1] is not u)]
  buffers = set()
  for u in [*by_op.get(_LOAD, ()), *by_op.get(_STORE, ())]:
    if u.src[0].op is not _INDEX: return None
    (buf, _, terms), const = address(u.src[0])
    events.setdefault(buf, []).append((u, u.op is _STORE, (terms, const)))
    buffers.add(buf)
  out: list[_Resource] = []
  for resource, evs in events.items():
    if resource not in buffers:  # an accumulator: written, at no address
      out.append((evs, {}, {}))
      continue
    if not any(w for _, w, _ in evs): continue
    by_terms: dict[Any, dict[int, list[_Event]]] = {}
    for e in evs:
      if e[2] is not None: by_terms.setdefault(e[2][0], {}).setdefault(e[2][1], []).append(e)
    out.append((evs, by_terms, {terms: [e for es in at.values() for e in es] for terms, at in by_terms.items()}))
  return out

def _same_order(evs: list[_Event], old: dict[UOp, tuple[int, ...]], new: dict[UOp, tuple[int, ...]]) -> bool:
  """Whether events of one place each are ordered alike before and after (ties included), so that no pair of them
  can break the program's order: sorted by their places before, their places after rise with them."""
  keys = []
  for b, wb, _ in evs:
    if len(old_b := old[b]) != 1 or len(new_b := new[b]) != 1: return False
    keys.append((2 * old_b[0] + wb, 2 * new_b[0] + wb))
  keys.sort()
  last_old, last_new = keys[0]
  for o, n in keys:
    if (o == last_old) != (n == last_new) or n < last_new: return False
    last_old, last_new = o, n
  return True

def _violations(pos: dict[UOp, int], users: dict[UOp, list[UOp]], old: dict[UOp, tuple[int, ...]],
                new: dict[UOp, tuple[int, ...]], moved: set[UOp], events: list[_Resource], inlined: set[UOp],
                lane_of: dict[UOp, tuple[Lanes, int]], emit: dict[UOp, int]) -> set[UOp] | None:
  """The uops of groups whose statements break the program's order (None: a break no group explains). `old` is
  where each uop was evaluated in the scalar program, `new` where it is with the groups printed at `emit`, `moved`
  the uops whose places differ."""
  bad: set[UOp] = set()
  printed = pos.copy()
  printed.update(emit)
  # a value is defined before every place that reads it, and before its reader's text is printed (a scalar's where
  # it stands, inlined or not): only a moved reader or a grouped source can break that
  get = printed.get
  for c in moved | {c for s in lane_of for c in users[s]}:
    read = printed[c]
    if (at := new[c]) and at[0] < read: read = at[0]  # places are sorted
    for s in c.src:
      # most sources are defined before the read (a missing one is looked up below, as a KeyError)
      if get(s, read) < read or s.op in _ALWAYS_DEFINED or s in inlined: continue
      if printed[s] >= read:
        if not (culprits := {x for x in (s, c) if x in lane_of}): return None
        bad |= culprits
  # reads and writes of one accumulator, and of one buffer where addresses may meet, keep their order: an event at
  # place p is 2p+1 for a write, 2p for a read (a read and a write at one place read first)
  for evs, by_terms, by_terms_only in events:
    if not (moved_evs := [e for e in evs if e[0] in moved]) or _same_order(evs, old, new): continue
    for a, wa, addr_a in moved_evs:
      if addr_a is None: meets = evs
      else:  # two addresses of the same terms meet only at the same constant offset
        meets = []
        for terms, at_terms in by_terms.items():
          if terms == addr_a[0]: meets += at_terms.get(addr_a[1], [])
          else: meets += by_terms_only[terms]
      if not (places_a := [(2 * o + wa, 2 * n + wa) for o, n in zip(old[a], new[a])]): continue
      single, (old_a, new_a) = len(places_a) == 1, places_a[0]  # the common case: one place, before and after
      for b, wb, _ in meets:
        if b is a or not (wa or wb): continue
        if single and len(old_b := old[b]) == 1 and len(new_b := new[b]) == 1:
          if (old_a < 2 * old_b[0] + wb) == (new_a < 2 * new_b[0] + wb): continue
        elif not any((oa < 2 * ob + wb) != (na < 2 * nb + wb)
                     for ob, nb in zip(old[b], new[b]) for oa, na in places_a): continue
        if not (culprits := {x for x in (a, b) if x in lane_of}): return None
        bad |= culprits
  return bad

def plan(uops: list[UOp], inlined: set[UOp], vector_bytes: int, users: dict[UOp, list[UOp]] | None = None,
         pos: dict[UOp, int] | None = None) -> VectorPlan | None:
  """The lane groups of a linear program (None: none pays), given the renderer's scalar inlining (and, where the
  caller has them, the program's users, `program_users`, and each uop's place)."""
  grower = _Grower(uops, users, pos)
  _seeds(grower, vector_bytes)
  if not grower.groups: return None
  pos, users, indexes = grower.pos, grower.users, grower.by_op.get(_INDEX, [])
  if (events := _events(grower.by_op, users, grower.address)) is None: return None
  old = _scalar_points(uops, pos, users, inlined, indexes)
  alive = {id(g): g for g in grower.groups}
  last = {id(g): max(pos[u] for u in g.uops) for g in grower.groups}
  while True:
    lane_of = {u: (g, i) for g in alive.values() for i, u in enumerate(g.uops)}
    if not lane_of: return None
    emit = {u: last[id(g)] for u, (g, _) in lane_of.items()}
    operands = {s for u in lane_of for s in u.src}
    kept = {u for u in inlined if u not in lane_of and u not in operands}
    new, moved = _moved_points(old, pos, users, kept, indexes, emit, (inlined - kept) - lane_of.keys())
    if (bad := _violations(pos, users, old, new, moved, events, kept, lane_of, emit)) is None: return None
    if not bad: break
    for u in bad: alive.pop(id(lane_of[u][0]), None)
  emit_at = {max(g.uops, key=pos.__getitem__): g for g in alive.values()}
  unprinted: set[UOp] = set()
  for u in sorted([*indexes, *kept], key=pos.__getitem__, reverse=True):  # users before their sources
    if u.op is _INDEX: unused = all((x in lane_of and lane_of[x][1] > 0 and lane_of[x][0].kind in ("load", "store"))
                                    for x in users[u])
    else: unused = users[u][0] in unprinted
    if unused and users[u]: unprinted.add(u)
  silent = unprinted | lane_of.keys()
  silent -= emit_at.keys()
  return VectorPlan(lane_of, emit_at, kept, grower.block, unprinted, silent=silent)

# ** printing the groups (ctx: the C renderer's per-render state) **

# a vector fused multiply-add in one instruction where the target has it (gcc and clang share these builtins), else
# lane by lane; -ffp-contract=off keeps gcc from fusing a plain `a*b + c`, as it should for a MULACC that is not one
_FMA_BUILTINS: dict[tuple[DType, int], tuple[str, str]] = {
  (dtypes.float32, 16): ("__AVX512F__", "__builtin_ia32_vfmaddps512_mask(a, b, c, (unsigned short)-1, 4)"),
  (dtypes.float32, 8): ("__FMA__", "__builtin_ia32_vfmaddps256(a, b, c)"),
  (dtypes.float32, 4): ("__FMA__", "__builtin_ia32_vfmaddps(a, b, c)"),
  (dtypes.float64, 8): ("__AVX512F__", "__builtin_ia32_vfmaddpd512_mask(a, b, c, (unsigned char)-1, 4)"),
  (dtypes.float64, 4): ("__FMA__", "__builtin_ia32_vfmaddpd256(a, b, c)")}

def vector_type(ctx: Any, dt: DType, lanes: int) -> str:
  """The vector type of `lanes` x `dt` (its unaligned twin, for loads and stores, is the name + `_u`)."""
  name = f"ember_{dt.name}x{lanes}"
  if name not in ctx.helpers:
    scalar, size = ctx.renderer.render_dtype(dt), lanes * dt.itemsize
    ctx.helpers[name] = f"typedef {scalar} {name} __attribute__((vector_size({size})));"
    unaligned = f"vector_size({size}), aligned({dt.itemsize}), may_alias"
    ctx.helpers[name + "_u"] = f"typedef {scalar} {name}_u __attribute__(({unaligned}));"
  return name

def _fma(ctx: Any, dt: DType, lanes: int) -> str:
  vt, fn = vector_type(ctx, dt, lanes), f"ember_fma_{dt.name}x{lanes}"
  if fn not in ctx.helpers:
    head = f"static inline {vt} {fn}({vt} a, {vt} b, {vt} c)"
    scalar = "__builtin_fmaf" if dt is dtypes.float32 else "__builtin_fma"
    loop = f"{head} {{ {vt} r; for (int i = 0; i < {lanes}; i++) r[i] = {scalar}(a[i], b[i], c[i]); return r; }}"
    if (builtin := _FMA_BUILTINS.get((dt, lanes))) is None: ctx.helpers[fn] = loop
    else:
      ctx.helpers[fn] = "\n".join([f"#if defined({builtin[0]})", f"{head} {{ return {builtin[1]}; }}", "#else", loop,
                                   "#endif"])
  return fn

def _operand(ctx: Any, vp: VectorPlan, g: Lanes, block: int) -> str:
  """A group's operand as an expression: a printed group's name, else a vector of the lanes' scalars."""
  if (name := vp.names.get(g)) is not None and vp.lane_of.get(g.uops[0], (None,))[0] is g: return name
  vt = vector_type(ctx, g.dtype, len(g.uops))
  if g.kind == "splat":
    u = g.uops[0]
    key = (u, len(g.uops), block)
    if (name := vp.splats.get(key)) is not None: return name
    text = f"({vt}){{{', '.join([ctx[u]] * len(g.uops))}}}"
    if u in vp.lane_of or u.op in (Ops.DEFINE_ACC, Ops.ASSIGN): return text  # read where it is used: it may change
    name = vp.splats[key] = ctx.fresh("alu") + "_v"
    ctx.emit(f"{vt} {name} = {text};")
    return name
  return f"({vt}){{{', '.join(ctx[u] for u in g.uops)}}}"

# widening loads of 16 narrow lanes in one instruction where the target has it (gcc and clang share these builtins)
_WIDEN_BUILTINS: dict[DType, str] = {dtypes.uint8: "pmovzxbd512", dtypes.int8: "pmovsxbd512",
                                     dtypes.uint16: "pmovzxwd512", dtypes.int16: "pmovsxwd512"}

def _widen(ctx: Any, g: Lanes) -> str:
  """Narrow loads of consecutive addresses as one vector of int32 lanes: a vector load widened by one vpmovzxbd
  (vpmovsxwd, ...) on AVX-512, else by __builtin_convertvector in steps that double the lane size (gcc 12 lowers a
  widening by 4 lane by lane, and built the vector from byte loads where the scalar program's lanes were 16 named
  loads of a register block's rows)."""
  narrow, lanes = g.dtype, len(g.uops)
  wide, fn = vector_type(ctx, dtypes.int32, lanes), f"ember_widen_{narrow.name}x{lanes}"
  if fn not in ctx.helpers:
    vn = vector_type(ctx, narrow, lanes)
    head = f"static inline {wide} {fn}(const void* p)"
    value = f"*(const {vn}_u*)p"
    if narrow.itemsize == 1:
      half = vector_type(ctx, dtypes.int16 if narrow is dtypes.int8 else dtypes.uint16, lanes)
      value = f"__builtin_convertvector({value}, {half})"
    steps = f"{head} {{ return __builtin_convertvector({value}, {wide}); }}"
    if lanes != 16: ctx.helpers[fn] = steps
    else:
      arg, scalar = ("ember_v16qi", "char") if narrow.itemsize == 1 else ("ember_v16hi", "short")
      raw = f"typedef {scalar} {arg} __attribute__((vector_size({16 * narrow.itemsize})));"
      builtin = (f"{head} {{ return __builtin_ia32_{_WIDEN_BUILTINS[narrow]}_mask(({arg})*(const {vn}_u*)p, "
                 f"({wide}){{{', '.join(['0'] * lanes)}}}, (unsigned short)-1); }}")
      ctx.helpers[fn] = "\n".join(["#if defined(__AVX512F__)", raw, builtin, "#else", steps, "#endif"])
  first = g.uops[0]
  return f"{fn}(&{ctx[first.src[0] if first.op is not Ops.BITCAST else first.src[0].src[0]]})"

def emit_group(ctx: Any, vp: VectorPlan, g: Lanes, block: int) -> None:
  """Print group `g` as one statement and name its lanes for the scalars that read them."""
  vt, first = vector_type(ctx, g.dtype, len(g.uops)), g.uops[0]
  srcs = [_operand(ctx, vp, s, block) for s in g.srcs]
  if g.kind in ("load", "store"):
    index = first.src[0] if first.op is not Ops.BITCAST else first.src[0].src[0]  # a narrow group's bitcast loads
    gate = ctx.gate(index)
    if g.kind == "store":
      store = f"*({vt}_u*)&{ctx[index]} = {srcs[0]};"
      ctx.emit(store if gate is None else f"if ({gate}) {store}")
      return
    text = f"*(const {vt}_u*)&{ctx[index]}"
    if g.dtype in _NARROW_DTYPES: vt, text = vector_type(ctx, dtypes.int32, len(g.uops)), _widen(ctx, g)
    if gate is not None: text = f"({gate} ? ({vt}){text} : ({vt}){{{', '.join(['0'] * len(g.uops))}}})"
    name = ctx.fresh("val") + "_v"
  elif g.kind == "acc":
    text, name = srcs[0], f"acc{first.arg}_v"
  elif g.kind == "assign":
    name = vp.names[g.srcs[0]]
    ctx.emit(f"{name} = {srcs[1]};")
  elif g.kind == "alu" and first.op is Ops.MULACC and first.arg == "fma":
    text, name = f"{_fma(ctx, g.dtype, len(g.uops))}({', '.join(srcs)})", ctx.fresh("alu") + "_v"
  elif g.kind == "alu":
    text, name = ctx.renderer.code_for_op[first.op](*srcs, dtype=g.dtype), ctx.fresh("alu") + "_v"
  elif g.kind == "cast":
    text, name = f"__builtin_convertvector({srcs[0]}, {vt})", ctx.fresh("cast") + "_v"
  elif g.kind == "widen":  # from a narrow load group, printed as int32 lanes
    text = srcs[0] if g.dtype is dtypes.int32 else f"__builtin_convertvector({srcs[0]}, {vt})"
    name = ctx.fresh("cast") + "_v"
  else:  # bitcast: a vector cast between vectors of one size reinterprets the bits
    text, name = f"(({vt})({srcs[0]}))", ctx.fresh("cast") + "_v"
  if g.kind != "assign": ctx.emit(f"{vt} {name} = {text};")
  vp.names[g] = name
  for i, u in enumerate(g.uops): ctx.names[u] = f"{name}[{i}]"
