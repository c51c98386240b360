"""Pattern matching and graph rewriting: `UPat`, `PatternMatcher`, `graph_rewrite`.

A `UPat` describes a UOp shape. `src` given as a tuple matches in order, as a list in any order (commutative), as a
single UPat every source must match it. A `PatternMatcher` is a table of `(UPat, callback)`; the callback gets the
named captures as keyword arguments (plus `ctx` if it declares it) and returns a replacement UOp or None.
"""
from __future__ import annotations
import inspect
import itertools
import keyword
import sys
import time
from typing import Any, Callable, Iterable, Protocol, cast
from ember.dtype import AnyDType, PtrDType
from ember.errors import EmberError
from ember.uop.ops import Ops, UOp, GroupOp

def _definition_site() -> tuple[str, int]:
  """file and line of the code that built a UPat (the line of its rule in a table), outside this module's sugar."""
  frame = sys._getframe(2)
  while frame.f_code.co_filename == __file__ and frame.f_back is not None: frame = frame.f_back
  return frame.f_code.co_filename, frame.f_lineno

class UPat:
  __slots__ = ("op", "dtype", "src", "arg", "name", "allow_any_len", "match_arg", "early_reject", "_any", "location",
               "_matcher")
  def __init__(self, op: Ops | Iterable[Ops] | None = None, dtype: AnyDType | Iterable[AnyDType] | None = None,
               src: UPat | tuple[UPat, ...] | list[UPat] | None = None, arg: Any = None, name: str | None = None,
               allow_any_len: bool = False, match_arg: bool | None = None):
    self.op: frozenset[Ops] | None = None if op is None else frozenset({op} if isinstance(op, Ops) else op)
    self.dtype: tuple[AnyDType, ...] | None
    if dtype is None: self.dtype = None
    elif isinstance(dtype, (tuple, list, set, frozenset)): self.dtype = tuple(dtype)
    else: self.dtype = (cast(AnyDType, dtype),)
    self.src = src
    self.arg, self.name, self.allow_any_len = arg, name, allow_any_len
    self.match_arg = (arg is not None) if match_arg is None else match_arg
    self._any: tuple[UPat, ...] | None = None
    self._matcher: MatchFn | None = None  # built by the first match (`_compile`)
    self.location = _definition_site()  # VIZ and TRACK_MATCH_STATS name a rule by where it is written
    # early reject: ops that must appear among the sources
    srcs = src if isinstance(src, (tuple, list)) else ()
    self.early_reject = frozenset(p.op.__iter__().__next__() for p in srcs if p.op is not None and len(p.op) == 1)

  @staticmethod
  def var(name: str | None = None, dtype: AnyDType | Iterable[AnyDType] | None = None) -> UPat:
    return UPat(dtype=dtype, name=name)
  @staticmethod
  def cvar(name: str | None = None, dtype: AnyDType | Iterable[AnyDType] | None = None) -> UPat:
    return UPat(Ops.CONST, dtype=dtype, name=name)
  @staticmethod
  def const(dtype: AnyDType | Iterable[AnyDType] | None, value: Any) -> UPat:
    return UPat(Ops.CONST, dtype=dtype, arg=value, match_arg=True)
  @staticmethod
  def any(*pats: UPat) -> UPat:
    ret = UPat()
    ret._any = pats
    return ret
  def named(self, name: str) -> UPat:
    ret = UPat(self.op, self.dtype, self.src, self.arg, name, self.allow_any_len, self.match_arg)
    ret._any = self._any
    return ret

  # sugar: arithmetic builds patterns; python scalars become constant patterns
  @staticmethod
  def _fix(x: Any) -> UPat: return x if isinstance(x, UPat) else UPat.const(None, x)
  def alu(self, op: Ops, *srcs: Any) -> UPat:
    all_src = (self, *(UPat._fix(s) for s in srcs))
    return UPat(op, src=list(all_src) if op in GroupOp.Commutative else all_src)
  def __add__(self, x: Any) -> UPat: return self.alu(Ops.ADD, x)
  def __radd__(self, x: Any) -> UPat: return self.alu(Ops.ADD, x)
  def __mul__(self, x: Any) -> UPat: return self.alu(Ops.MUL, x)
  def __rmul__(self, x: Any) -> UPat: return self.alu(Ops.MUL, x)
  def __floordiv__(self, x: Any) -> UPat: return self.alu(Ops.IDIV, x)
  def __mod__(self, x: Any) -> UPat: return self.alu(Ops.MOD, x)
  def __and__(self, x: Any) -> UPat: return self.alu(Ops.AND, x)
  def __or__(self, x: Any) -> UPat: return self.alu(Ops.OR, x)
  def lt(self, x: Any) -> UPat: return self.alu(Ops.CMPLT, x)
  def ne(self, x: Any) -> UPat: return self.alu(Ops.CMPNE, x)
  def eq(self, x: Any) -> UPat: return self.alu(Ops.CMPEQ, x)
  def maximum(self, x: Any) -> UPat: return self.alu(Ops.MAX, x)
  def where(self, x: Any, y: Any) -> UPat: return UPat(Ops.WHERE, src=(self, UPat._fix(x), UPat._fix(y)))
  def cast(self, dtype: AnyDType | None = None, name: str | None = None) -> UPat:
    return UPat(Ops.CAST, dtype, (self,), name=name)
  def load(self, name: str | None = None) -> UPat: return UPat(Ops.LOAD, src=(self,), name=name)
  def index(self, idx: UPat, name: str | None = None) -> UPat: return UPat(Ops.INDEX, src=(self, idx), name=name)

  def __repr__(self) -> str:
    return f"UPat({None if self.op is None else sorted(o.name for o in self.op)}, name={self.name!r}, arg={self.arg!r})"

  def match(self, uop: UOp, store: dict[str, UOp]) -> list[dict[str, UOp]]:
    """Every way `uop` matches this pattern, each as a dict of captures extending `store`."""
    return _matcher(self)(uop, store)

MatchFn = Callable[[UOp, dict[str, UOp]], list[dict[str, UOp]]]

def _compile(pat: UPat) -> MatchFn:
  """`pat`'s matcher: a closure over the pattern's fields, which reads none of the UPat's attributes per node (nor
  builds the permutations of a commutative pattern's sources each time). A pattern's fields must not change once it
  has matched. `_any`: the alternatives' matches in turn; `src` a tuple: in order, a list: in every order, one UPat:
  every source matches it."""
  if pat._any is not None:
    alts, any_name = [_matcher(p) for p in pat._any], pat.name
    def match_any(uop: UOp, store: dict[str, UOp]) -> list[dict[str, UOp]]:
      out: list[dict[str, UOp]] = []
      for alt in alts:
        for m in alt(uop, dict(store)):
          if any_name is not None:
            if any_name in m and m[any_name] is not uop: continue
            m[any_name] = uop
          out.append(m)
      return out
    return match_any
  ops, dts, arg, name, any_len = pat.op, pat.dtype, pat.arg, pat.name, pat.allow_any_len
  match_arg = pat.match_arg
  every = _matcher(pat.src) if isinstance(pat.src, UPat) else None
  orders: list[tuple[MatchFn, ...]] = []
  if isinstance(pat.src, (tuple, list)):
    subs = [_matcher(p) for p in pat.src]
    orders = list(itertools.permutations(subs)) if isinstance(pat.src, list) else [tuple(subs)]
  n, has_src = len(pat.src) if isinstance(pat.src, (tuple, list)) else 0, pat.src is not None
  def match(uop: UOp, store: dict[str, UOp]) -> list[dict[str, UOp]]:
    if ops is not None and uop.op not in ops: return []
    if dts is not None and uop.dtype not in dts:
      if not (isinstance(uop.dtype, PtrDType) and uop.dtype.base in dts): return []
    if match_arg and not _arg_eq(arg, uop.arg): return []
    if name is not None:
      if (prev := store.get(name)) is not None and prev is not uop: return []
      store = {**store, name: uop}
    if not has_src: return [store]
    if every is not None:
      stores = [store]
      for s in uop.src: stores = [m for st in stores for m in every(s, st)]
      return stores
    src = uop.src
    if len(src) != n and not (any_len and len(src) >= n): return []
    results: list[dict[str, UOp]] = []
    for order in orders:
      stores = [store]
      for sub, s in zip(order, src):
        stores = [m for st in stores for m in sub(s, st)]
        if not stores: break
      results.extend(stores)
    return results
  return match

def _matcher(pat: UPat) -> MatchFn:
  if pat._matcher is None: pat._matcher = _compile(pat)
  return pat._matcher

def _arg_eq(pat_arg: Any, arg: Any) -> bool:
  if isinstance(pat_arg, float) or isinstance(arg, float): return type(arg) is not bool and pat_arg == arg
  if isinstance(pat_arg, bool) != isinstance(arg, bool): return False
  return pat_arg == arg

RewriteFn = Callable[..., UOp | None]
TryHook = Callable[["UPat", RewriteFn, UOp, UOp | None, float], None]
OpRewrite = Callable[[UOp, Any], UOp | None]

class _RuleSource:
  """Python source of one op's rules (see `_compile_rules`): the lines, and the values they name."""
  def __init__(self) -> None:
    self.lines: list[str] = []
    self.names: dict[str, Any] = {"isinstance": isinstance, "PtrDType": PtrDType, "_arg_eq": _arg_eq}
    self.count = itertools.count()
  def name(self, value: Any, prefix: str) -> str:
    self.names[key := f"{prefix}{next(self.count)}"] = value
    return key

def _pattern_lines(pat: UPat, var: str, bound: dict[str, str], lines: list[str], src: _RuleSource,
                   root: bool) -> list[tuple[list[str], dict[str, str]]]:
  """Every way `pat` can match the node in variable `var`, in the order `UPat.match` lists them: per way, the lines
  that check it (`break` where it fails) and the names it binds, to variables. A list `src` is one way per order of
  its patterns; a tuple one way; the first of several occurrences of a name binds it, the others check identity. The
  root's op is not checked (its rules are the rules for its op)."""
  lines = list(lines)
  if not root and pat.op is not None:
    if len(pat.op) == 1: lines.append(f"if {var}.op is not {src.name(next(iter(pat.op)), 'op')}: break")
    else: lines.append(f"if {var}.op not in {src.name(pat.op, 'ops')}: break")
  if pat.dtype is not None:
    dts = src.name(pat.dtype, "dts")
    ptr = f"isinstance({var}.dtype, PtrDType) and {var}.dtype.base in {dts}"
    lines.append(f"if {var}.dtype not in {dts} and not ({ptr}): break")
  if pat.match_arg: lines.append(f"if not _arg_eq({src.name(pat.arg, 'arg')}, {var}.arg): break")
  if pat.name is not None:
    if (prev := bound.get(pat.name)) is not None: lines.append(f"if {var} is not {prev}: break")
    else: bound = {**bound, pat.name: var}
  if pat.src is None: return [(lines, bound)]
  assert isinstance(pat.src, (tuple, list))
  n, srcs = len(pat.src), f"s{next(src.count)}"
  lines.append(f"{srcs} = {var}.src")
  lines.append(f"if len({srcs}) {'<' if pat.allow_any_len else '!='} {n}: break")
  orders = itertools.permutations(pat.src) if isinstance(pat.src, list) else [tuple(pat.src)]
  ways: list[tuple[list[str], dict[str, str]]] = []
  for order in orders:
    partial = [(lines, bound)]
    for i, sub in enumerate(order):
      sub_var = f"v{next(src.count)}"
      take = f"{sub_var} = {srcs}[{i}]"
      partial = [way for ls, bd in partial for way in _pattern_lines(sub, sub_var, bd, [*ls, take], src, False)]
    ways += partial
  return ways

def _generated(pat: UPat) -> bool:
  """Whether `_compile_rules` writes `pat` as code: everything but alternatives (`UPat.any`), a single UPat that
  every source must match and names that are no Python identifiers (those rules run through their matcher)."""
  if pat._any is not None or isinstance(pat.src, UPat): return False
  if pat.name is not None and not (pat.name.isidentifier() and not keyword.iskeyword(pat.name)): return False
  return pat.src is None or all(_generated(p) for p in pat.src)

def _compile_rules(rules: list[tuple[UPat, RewriteFn, bool]]) -> OpRewrite:
  """One function that tries `rules` on a node (of one op) in order, as `PatternMatcher.rewrite` defines: the first
  replacement a callback returns (not None, not the node itself) wins. Each rule's pattern is written out as Python,
  one block per way it can match, so trying a rule on a node that does not match costs a few attribute checks
  instead of the calls of its matcher (most nodes of a pass match no rule)."""
  src = _RuleSource()
  body: list[str] = []
  for pat, fn, wants_ctx in rules:
    fn_name = src.name(fn, "fn")
    ctx_arg = ["ctx=ctx"] if wants_ctx else []
    if not _generated(pat):
      def tried(u: UOp, ctx: Any, match_fn: MatchFn = _matcher(pat), fn: RewriteFn = fn,
                wants_ctx: bool = wants_ctx) -> UOp | None:
        for match in match_fn(u, {}):
          ret = fn(ctx=ctx, **match) if wants_ctx else fn(**match)
          if ret is not None and ret is not u: return ret
        return None
      body += [f"r = {src.name(tried, 'rule')}(u, ctx)", "if r is not None: return r"]
      continue
    for lines, bound in _pattern_lines(pat, "u", {}, [], src, True):
      call = ", ".join(ctx_arg + [f"{k}={v}" for k, v in bound.items()])
      body += ["while True:", *(f"  {ln}" for ln in lines), f"  r = {fn_name}({call})",
               "  if r is not None and r is not u: return r", "  break"]
  code = "def rewrite(u, ctx):\n" + "".join(f"  {ln}\n" for ln in [*body, "return None"])
  exec(compile(code, "<ember rewrite rules>", "exec"), src.names)  # noqa: S102  code written from the patterns above
  return src.names["rewrite"]

def _no_rules(u: UOp, ctx: Any) -> None: return None

_memo_ids = itertools.count()

class PatternMatcher:
  """A table of rewrite rules, indexed by the root op so a node is only tried against rules that can match it.

  A rule's result depends on the node it matched alone (and on `ctx`, for rules that take it): a graph_rewrite without
  ctx remembers what each node it walked became (see `graph_rewrite`)."""
  def __init__(self, patterns: list[tuple[UPat, RewriteFn]]):
    self.patterns = patterns
    # the attribute under which a node keeps what this table's graph_rewrite made of it
    self.memo = f"_rewritten_{next(_memo_ids)}"
    self.pdict: dict[Ops, list[tuple[UPat, RewriteFn, bool, frozenset[Ops]]]] = {}
    self.any_op: list[tuple[UPat, RewriteFn, bool, frozenset[Ops]]] = []
    for pat, fn in patterns:
      entry = (pat, fn, "ctx" in inspect.signature(fn).parameters, pat.early_reject)
      if pat.op is None: self.any_op.append(entry)
      else:
        for op in pat.op: self.pdict.setdefault(op, []).append(entry)
    # the rules a node with each op is tried against (its op's, in table order, then those for any op) as one
    # function, written on the first node of that op (see `_compile_rules`)
    self.compiled: dict[Ops, OpRewrite] = {}
    # the ops a rule can match at its root, as a bit mask: a graph none of whose nodes has one of them is a fixed
    # point, which graph_rewrite leaves without walking it. None where a rule matches any op or sums (index math
    # is sums: such a table skips nothing, and the masks would cost more than they save)
    skips = not self.any_op and Ops.ADD not in self.pdict
    self.root_ops: int | None = sum(1 << op.value for op in self.pdict) if skips else None
  def __add__(self, other: PatternMatcher) -> PatternMatcher: return PatternMatcher(self.patterns + other.patterns)
  def rewrite(self, uop: UOp, ctx: Any = None) -> UOp | None:
    if (fn := self.compiled.get(uop.op)) is None: fn = self._compile(uop.op)
    return fn(uop, ctx)
  def _compile(self, op: Ops) -> OpRewrite:
    entries = [*self.pdict.get(op, ()), *self.any_op]
    fn = self.compiled[op] = _compile_rules([e[:3] for e in entries]) if entries else _no_rules
    return fn
  def traced_rewrite(self, uop: UOp, ctx: Any, on_try: TryHook) -> UOp | None:
    """`rewrite`, reporting every rule it tries to `on_try(pattern, callback, node, replacement or None, seconds)`:
    the VIZ / TRACK_MATCH_STATS recorder (ember.viz.record) rewrites through this; `rewrite` stays free of it."""
    src_ops = {s.op for s in uop.src}
    for pat, fn, wants_ctx, reject in itertools.chain(self.pdict.get(uop.op, ()), self.any_op):
      if not reject <= src_ops: continue
      start = time.perf_counter()
      ret = None
      for match in pat.match(uop, {}):
        ret = fn(ctx=ctx, **match) if wants_ctx else fn(**match)
        if ret is not None and ret is not uop: break
        ret = None
      on_try(pat, fn, uop, ret, time.perf_counter() - start)
      if ret is not None: return ret
    return None

class RewriteLoopError(EmberError, RuntimeError):
  """A rewrite table never reached a fixed point (two rules undo each other): a bug in the rules."""

class RewriteTracer(Protocol):
  """What VIZ and TRACK_MATCH_STATS install as `TRACER` (ember.viz.record.Recorder): every graph_rewrite goes through
  it, and codegen and the scheduler tell it which kernel the rewrites belong to (`ember.codegen.get_program`)."""
  def graph_rewrite(self, sink: UOp, pm: PatternMatcher, ctx: Any, bottom_up: bool, name: str | None) -> UOp: ...
  def record_graph(self, name: str, sink: UOp) -> None: ...
  def begin_kernel(self, ast: UOp, device: str) -> None: ...
  def note_opts(self, opts: list[Any]) -> None: ...
  def end_kernel(self, spec: Any) -> None: ...

# set by ember.viz when VIZ or TRACK_MATCH_STATS is on; while None, graph_rewrite costs one branch more than its walk
TRACER: RewriteTracer | None = None

def graph_rewrite(sink: UOp, pm: PatternMatcher, ctx: Any = None, bottom_up: bool = False,
                  name: str | None = None) -> UOp:
  """Rewrite the graph under `sink` with `pm` to a fixed point.

  Top-down (default): every node is rebuilt from its rewritten sources, then `pm` is applied until it returns None,
  rewriting each result in full. `bottom_up=True` applies `pm` to a node before descending into its sources. `name`
  labels the pass in VIZ and in errors.

  A top-down rewrite without ctx is a function of each node's subgraph (UOps are hash-consed): every node walked keeps
  its result, and a later rewrite with the same table (the next opt of the kernel, the next kernel) takes a node it
  meets again as done, without walking below it. A register-blocked kernel is rewritten once per opt, each time mostly
  the same nodes.
  """
  if TRACER is not None: return TRACER.graph_rewrite(sink, pm, ctx, bottom_up, name)
  return rewrite_walk(sink, pm.rewrite, ctx, bottom_up, name, pm.memo if ctx is None and not bottom_up else None,
                      pm.root_ops)

REWRITE_NODE_DEPTH = 32  # nodes below this depth of a rewrite_node recursion are left to graph_rewrite's walk

def rewrite_node(node: UOp, pm: PatternMatcher, depth: int = 0) -> UOp:
  """`graph_rewrite(node, pm)` for a table whose walks keep a memo (no ctx, top-down), by recursion over the nodes
  the memo does not hold: the same rewrite of each node from its rewritten sources, without the walk's stack and
  bookkeeping (what rules return is a few new nodes on rewritten ones, and a walk per rule that fired cost more than
  the rules). Below REWRITE_NODE_DEPTH (a large graph the memo has not seen) the walk takes over."""
  memo = pm.memo
  if (done := node.__dict__.get(memo)) is not None: return node if done is _SAME else done
  if depth > REWRITE_NODE_DEPTH or pm.root_ops is not None: return graph_rewrite(node, pm)
  srcs = []
  for s in node.src:
    done = s.__dict__.get(memo)
    srcs.append(s if done is _SAME else done if done is not None else rewrite_node(s, pm, depth + 1))
  # UOps compare by identity (no __eq__): `==` of the tuples is the identity check, in C
  rebuilt = node if (new_src := tuple(srcs)) == node.src else UOp(node.op, node.dtype, new_src, node.arg, node.tag)
  if rebuilt is not node and (done := rebuilt.__dict__.get(memo)) is not None: ret = rebuilt if done is _SAME else done
  else: ret = rewrite_built(rebuilt, pm, depth)
  node.__dict__[memo] = _SAME if ret is node else ret
  return ret

def rewrite_built(node: UOp, pm: PatternMatcher, depth: int = 0) -> UOp:
  """`rewrite_node` of a node whose sources are each already what `pm` rewrites them to (their own fixed points): its
  own rules, and a rewrite of what they return. What a kernel opt calls for each node of an unrolled kernel's lanes
  as it builds it from lanes it already rewrote (codegen/opt.py `_unroll`): raw copies of every lane, then a walk of
  them all, cost twice the nodes and the walk."""
  if (done := node.__dict__.get(pm.memo)) is not None: return node if done is _SAME else done
  if (fn := pm.compiled.get(node.op)) is None: fn = pm._compile(node.op)
  nxt = fn(node, None)
  ret = node if nxt is None else rewrite_node(nxt, pm, depth + 1)
  node.__dict__[pm.memo] = _SAME if ret is node else ret
  return ret

def ops_under(node: UOp) -> int:
  """The ops of every node under `node`, itself included, as a bit mask (1 << op.value); kept on each node."""
  if (mask := node.__dict__.get("_ops_under")) is not None: return mask
  for n in node.toposort(gate=lambda n: "_ops_under" not in n.__dict__):
    if "_ops_under" not in n.__dict__:
      mask = 1 << n.op.value
      for s in n.src: mask |= s.__dict__["_ops_under"]
      n.__dict__["_ops_under"] = mask
  return node.__dict__["_ops_under"]

_SAME: Any = object()  # a memo entry: the node rewrites to itself (the node itself would make a reference cycle)

def rewrite_walk(sink: UOp, rewrite: Callable[[UOp, Any], UOp | None], ctx: Any, bottom_up: bool,
                 name: str | None, memo: str | None = None, root_ops: int | None = None) -> UOp:
  """graph_rewrite's walk, applying `rewrite(node, ctx)` (a PatternMatcher's `rewrite`, or a traced one); `memo`
  names the node attribute holding a node's result from earlier walks with the same rules, read and written;
  `root_ops` (a mask of ops, see `ops_under`): a node with none of them under it is left as it is."""
  if memo is not None and (done := sink.__dict__.get(memo)) is not None: return sink if done is _SAME else done
  if root_ops is not None and not ops_under(sink) & root_ops: return sink
  replace: dict[UOp, UOp] = {}
  in_progress: set[UOp] = set()
  walked: list[UOp] = []  # the nodes this walk rewrote (the ones found in the memo are not walked below)
  rebuilt_fixed: list[UOp] = []  # nodes rebuilt on rewritten sources that no rule changed
  # stack entries: (original, stage, working node); a node is looked up in the memo before it is pushed
  stack: list[tuple[UOp, int, UOp]] = [(sink, 0, sink)]
  steps = 0
  while stack:
    steps += 1
    if steps > 5_000_000: raise RewriteLoopError(f"graph_rewrite {name or ''} did not converge")
    orig, stage, node = stack.pop()
    if stage == 0:
      if orig in replace: continue
      if bottom_up:
        for _ in range(1000):
          nxt = rewrite(node, ctx)
          if nxt is None: break
          node = nxt
        else: raise RewriteLoopError(f"graph_rewrite {name or ''}: a rule keeps rewriting {node.op}")
      in_progress.add(orig)
      stack.append((orig, 1, node))
      for s in reversed(node.src):
        if s in replace or s in in_progress: continue
        if memo is not None and (done := s.__dict__.get(memo)) is not None: replace[s] = s if done is _SAME else done
        elif root_ops is not None and not ops_under(s) & root_ops: replace[s] = s
        else: stack.append((s, 0, s))
    elif stage == 1:
      new_src = tuple([replace.get(s, s) for s in node.src])
      # UOps are hash-consed and compare by identity (no __eq__): `==` of the tuples is the identity check, in C
      rebuilt = node if new_src == node.src else UOp(node.op, node.dtype, new_src, node.arg, node.tag)
      nxt = None if bottom_up and rebuilt is node else rewrite(rebuilt, ctx)
      if nxt is None:
        replace[orig] = rebuilt
        in_progress.discard(orig)
        walked.append(orig)
        if rebuilt is not node: rebuilt_fixed.append(rebuilt)
      else:
        # rewrite the replacement fully, then map the original to its final form
        stack.append((orig, 2, nxt))
        if nxt in replace or nxt in in_progress: continue
        if memo is not None and (done := nxt.__dict__.get(memo)) is not None:
          replace[nxt] = nxt if done is _SAME else done
        elif root_ops is not None and not ops_under(nxt) & root_ops: replace[nxt] = nxt
        else: stack.append((nxt, 0, nxt))
    else:
      replace[orig] = replace.get(node, node)
      in_progress.discard(orig)
      walked.append(orig)
  if memo is not None:
    for k in walked: k.__dict__[memo] = _SAME if (v := replace[k]) is k else v
    # a node rebuilt on rewritten sources that no rule changed rewrites to itself: a later walk (the next lane's rule
    # results, built on it) stops there
    for k in rebuilt_fixed: k.__dict__.setdefault(memo, _SAME)
  return replace[sink]

def substitute(sink: UOp, mapping: dict[UOp, UOp], topo: Iterable[UOp] | None = None) -> UOp:
  """Replace nodes by identity, rebuilding their users (no fixed point: replacements are not rewritten again).
  `topo`: `sink.toposort()`, where the caller has it."""
  if not mapping: return sink
  replace: dict[UOp, UOp] = {}
  for node in sink.toposort() if topo is None else topo:
    if node in mapping:
      replace[node] = mapping[node]
      continue
    new_src = tuple([replace.get(s, s) for s in node.src])
    replace[node] = node if new_src == node.src else UOp(node.op, node.dtype, new_src, node.arg, node.tag)
  return replace[sink]
