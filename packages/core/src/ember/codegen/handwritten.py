"""Codegen of hand-written kernels (`Tensor.custom_kernel`): a SINK of statements, linearized as written.

A scheduler kernel is one STORE whose loops codegen chooses. A hand-written kernel says where its loops are:

* statements: `idx.store(v)`, `stmt.end(*ranges)` (the statement inside those loops), `UOp.group(*stmts)` (in order),
  `UOp.barrier(*stmts)` (the threads of a block wait), `buf.after(*stmts)` (the buffer once they ran);
* values: ALU ops of loads, `x.reduce(*ranges, arg=op)` (an accumulator over its own loops), ranges and specials;
* buffers: GLOBAL placeholders (kernel arguments), LOCAL (shared by a block's threads), REG (one thread's registers).

Ranges by axis type: UPCAST ranges are unrolled (so REG buffers indexed by them become single registers); on GPU
renderers (`has_local`) GLOBAL ranges are blocks (`gidx`) and LOCAL ranges threads (`lidx`), with no loop; LOOP and
REDUCE ranges are serial loops. On the other renderers (CPU, PYTHON) GLOBAL and LOCAL ranges are loops and a kernel's
threads run one after another: each stretch of code between barriers loops over the LOCAL ranges on its own (thread
loops close at a BARRIER and open again after it), and LOCAL and REG buffers become scratch buffers appended to the
kernel's arguments. On every renderer a REG buffer indexed by a loop variable is scratch memory too, a slice per
thread (`scratch_buffers` says which buffers).

The linearizer opens a range where a statement first needs it (an END opens its ranges first, outermost last) and
closes it at its END. A value is computed once in the innermost open loop it depends on (an accumulator before the
loop that reads it); only loads from buffers the kernel never writes move out of the loop they are used in.
"""
from __future__ import annotations
import functools
import itertools
from dataclasses import dataclass, field
from ember.dtype import DType, PtrDType, dtypes
from ember.errors import CompileError, DTypeError, EmberError
from ember.helpers import NUM_CPU_THREADS, SPEC
from ember.renderer import Renderer, ProgramSpec
from ember.uop.ops import Ops, UOp, AxisType, GroupOp
from ember.uop.rewrite import graph_rewrite, PatternMatcher, UPat
from ember.uop.symbolic import symbolic
from ember.uop.spec import type_verify
from ember.codegen import estimate, pm_safe_division
from ember.codegen.linearize import reduce_identity

_STATEMENTS = (Ops.STORE, Ops.END, Ops.GROUP, Ops.BARRIER)
_THREADS = (AxisType.GLOBAL, AxisType.LOCAL)

def _ranges(ast: UOp, axis_type: AxisType) -> list[UOp]:
  return sorted((n for n in ast.toposort() if n.op is Ops.RANGE and n.arg[1] is axis_type), key=lambda r: r.arg[0])

def buffer_of(x: UOp) -> UOp:
  """The buffer under `buf.after(...)` chains."""
  while x.op is Ops.AFTER: x = x.src[0]
  return x

def _end_of(x: UOp) -> int:
  if x.src[0].op is not Ops.CONST: raise CompileError(f"range {x.arg} needs a constant size here, not {x.src[0]}")
  return int(x.src[0].arg)

# ** UPCAST ranges: unrolled **

def unroll_upcasts(ast: UOp) -> UOp:
  """Every statement or reduction over UPCAST ranges repeated once per value of those ranges."""
  memo: dict[UOp, UOp] = {}
  for n in ast.toposort():
    new = n.replace(src=tuple(memo[s] for s in n.src))
    if n.op in (Ops.END, Ops.REDUCE):
      ups = [r for r in new.src[1:] if r.arg[1] is AxisType.UPCAST]
      if ups:
        rest = tuple(r for r in new.src[1:] if r.arg[1] is not AxisType.UPCAST)
        copies = [new.src[0].substitute({r: UOp.const(r.dtype, v) for r, v in zip(ups, vals)})
                  for vals in itertools.product(*(range(_end_of(r)) for r in ups))]
        if n.op is Ops.END:
          body = UOp.group(*copies)
          new = body.end(*rest) if rest else body
        else:  # one accumulator per unrolled value (partial sums a compiler vectorises), combined after the loop
          parts = [UOp(Ops.REDUCE, c.dtype, (c, *rest), n.arg) for c in copies] if rest else copies
          new = parts[0]
          for c in parts[1:]: new = new.alu(n.arg, c)
    memo[n] = new
  return memo[ast]

# ** hardware mapping **

def _to_specials(ast: UOp) -> tuple[UOp, list[int], list[int]]:
  """GPU renderers: GLOBAL ranges become block indices, LOCAL ranges thread indices (gidx/lidx 0..2); their ENDs go.
  Returns the kernel, the grid and the block size."""
  mapping: dict[UOp, UOp] = {}
  sizes: dict[str, list[int]] = {"gidx": [], "lidx": []}
  for prefix, axis_type in (("gidx", AxisType.GLOBAL), ("lidx", AxisType.LOCAL)):
    rngs = _ranges(ast, axis_type)
    if len(rngs) > 3: raise CompileError(f"a kernel has at most 3 {axis_type.name} ranges on GPUs, got {len(rngs)}")
    for i, r in enumerate(rngs):
      mapping[r] = UOp.special(_end_of(r), f"{prefix}{i}")
  for s in ast.toposort():
    if s.op is Ops.SPECIAL:
      if any(m.arg == s.arg for m in mapping.values()):
        raise CompileError(f"special {s.arg} is also made by a {'GLOBAL' if s.arg[0] == 'g' else 'LOCAL'} range; use "
                           "one or the other")
      mapping[s] = s
  for s in mapping.values():
    kind, dim = s.arg[:4], int(s.arg[4])
    while len(sizes[kind]) <= dim: sizes[kind].append(1)
    sizes[kind][dim] = int(s.src[0].arg)
  ast = graph_rewrite(ast, pm_drop_hardware_ends, name="drop ends of hardware ranges")
  ast = ast.substitute({r: s for r, s in mapping.items() if r.op is Ops.RANGE})
  return ast, (sizes["gidx"] + [1, 1, 1])[:3], (sizes["lidx"] + [1, 1, 1])[:3]

def _drop_hardware_ends(n: UOp) -> UOp | None:
  keep = tuple(r for r in n.src[1:] if r.arg[1] not in _THREADS)
  if len(keep) == len(n.src) - 1: return None
  return n.replace(src=(n.src[0], *keep)) if keep else n.src[0]

pm_drop_hardware_ends = PatternMatcher([
  (UPat(Ops.END, name="n"), _drop_hardware_ends),  # end(x, gidx-range, r) -> end(x, r): a block index is no loop
])

def _specials_to_ranges(ast: UOp) -> UOp:
  """CPU and PYTHON: a hardware index is a loop (gidx a GLOBAL range, lidx a LOCAL one)."""
  base = max((n.arg[0] for n in ast.toposort() if n.op is Ops.RANGE), default=-1) + 1
  mapping: dict[UOp, UOp] = {}
  for s in sorted((n for n in ast.toposort() if n.op is Ops.SPECIAL), key=lambda n: n.arg):
    axis = AxisType.GLOBAL if s.arg.startswith("g") else AxisType.LOCAL
    mapping[s] = UOp.range(int(s.src[0].arg), base + len(mapping), axis)
  return ast.substitute(mapping) if mapping else ast

# ** scratch buffers **

@dataclass(frozen=True)
class Scratch:
  """A scratch buffer a kernel needs as its argument `slot`: `size` elements of `dtype`."""
  slot: int
  dtype: DType
  size: int

def _ptr(u: UOp) -> PtrDType:
  assert isinstance(u.dtype, PtrDType)
  return u.dtype

def _threads(ast: UOp) -> tuple[UOp, int]:
  """A flat id of the kernel's threads that can run at once, and how many there are: on GPUs every block's every
  thread (the specials), elsewhere the threads of one block (the LOCAL ranges; blocks run one after another)."""
  tid, count = UOp.const(dtypes.int32, 0), 1
  specials = sorted((n for n in ast.toposort() if n.op is Ops.SPECIAL), key=lambda n: n.arg)
  for idx in specials or _ranges(ast, AxisType.LOCAL):
    tid, count = tid * _end_of(idx) + idx, count * _end_of(idx)
  return tid, count

def _dynamic(ast: UOp, buf: UOp) -> bool:
  """Whether some index into `buf` is not a constant (a loop variable): no register file is indexed that way."""
  return any(n.op is Ops.INDEX and buffer_of(n.src[0]) is buf and n.src[1].op is not Ops.CONST for n in ast.toposort())

def _scratch_plan(ast: UOp, has_local: bool) -> list[tuple[UOp, int]]:
  """The buffers of a prepared kernel that live in scratch memory, and their sizes: without block-shared memory every
  LOCAL buffer (and every REG buffer of a kernel whose threads run one after another), everywhere the REG buffers
  indexed by loop variables (a slice per thread)."""
  _, threads = _threads(ast)
  fission = not has_local and bool(_ranges(ast, AxisType.LOCAL))
  plan = []
  for buf in sorted((n for n in ast.toposort() if n.op in (Ops.DEFINE_LOCAL, Ops.DEFINE_REG)),
                    key=lambda b: (b.op is Ops.DEFINE_REG, str(b.arg))):
    if buf.op is Ops.DEFINE_LOCAL and not has_local: plan.append((buf, _ptr(buf).size))
    elif buf.op is Ops.DEFINE_REG and (fission or _dynamic(ast, buf)): plan.append((buf, _ptr(buf).size * threads))
  return plan

@functools.lru_cache(maxsize=256)
def _prepare(ast: UOp, has_local: bool) -> tuple[UOp, list[int] | None, list[int] | None]:
  """The kernel with UPCAST ranges unrolled and the hardware mapping applied, its grid and block (GPUs)."""
  sink = graph_rewrite(ast, symbolic, name="simplify hand-written kernel")
  sink = unroll_upcasts(sink)  # UPCAST ranges: one copy per value, REG indices become constants
  if has_local: sink, gsize, lsize = _to_specials(sink)  # GLOBAL/LOCAL ranges are the hardware's indices
  else: sink, gsize, lsize = _specials_to_ranges(sink), None, None  # threads as loops
  return graph_rewrite(sink, symbolic, name="simplify index math"), gsize, lsize

def _nparams(ast: UOp) -> int: return max((n.arg + 1 for n in ast.toposort() if n.op is Ops.PARAM), default=0)

def scratch_buffers(ast: UOp, renderer: Renderer) -> list[Scratch]:
  """The scratch buffers a hand-written kernel needs on `renderer`, as arguments after its own (`_scratch_plan`)."""
  if ast.op is not Ops.SINK: return []
  sink, _, _ = _prepare(ast, renderer.has_local)
  return [Scratch(_nparams(ast) + i, _ptr(buf).base, size) for i, (buf, size) in
          enumerate(_scratch_plan(sink, renderer.has_local))]

def _to_scratch(ast: UOp, plan: list[tuple[UOp, int]], nparams: int) -> UOp:
  """The planned buffers as extra arguments; a REG buffer's slice is its thread's."""
  if not plan: return ast
  tid, _ = _threads(ast)
  params = {buf: UOp(Ops.PARAM, _ptr(buf).base.ptr(size), (), nparams + i) for i, (buf, size) in enumerate(plan)}
  new: dict[UOp, UOp] = {}
  for n in ast.toposort():
    if n in params:
      new[n] = params[n]
      continue
    rebuilt = n.replace(src=tuple(new[s] for s in n.src))
    if n.op is Ops.INDEX and (buf := buffer_of(n.src[0])) in params and buf.op is Ops.DEFINE_REG:
      rebuilt = rebuilt.replace(src=(rebuilt.src[0], rebuilt.src[1] + tid * _ptr(buf).size, *rebuilt.src[2:]))
    new[n] = rebuilt
  return new[ast]

# ** the linearizer **

@dataclass
class _Loop:
  orig: UOp           # the RANGE of the kernel AST
  lin: UOp            # its RANGE in the linear program (a fresh axis id when the range opens again)
  body: list[UOp] = field(default_factory=list)
  emitted: list[UOp] = field(default_factory=list)  # AST nodes computed inside: out of scope once the loop closes

class _Linearizer:
  def __init__(self, ast: UOp, fission: bool, serial: bool):
    self.fission = fission  # threads run one after another: LOCAL loops close at barriers (no block-shared memory)
    self.serial = serial  # GLOBAL loops share scratch memory: no interpreter may run their iterations side by side
    self.head: dict[UOp, None] = {}  # arguments, block-shared arrays and constants: before any code
    self.root: list[UOp] = []
    self.placed: set[UOp] = set()  # every uop of the program once: a value computed again is a distinct uop
    self.loops: list[_Loop] = []
    self.done: dict[UOp, UOp] = {}
    self.where: dict[UOp, int] = {}  # node -> depth (number of open loops) it was computed at
    self.stmts: set[UOp] = set()  # statements already emitted (never again, unlike values)
    self.stmt_at: dict[UOp, tuple[UOp, ...]] = {}  # statement -> the loops open once it ran (their linear RANGEs)
    self.next_axis = max((n.arg[0] for n in ast.toposort() if n.op is Ops.RANGE), default=-1) + 1
    self.opened: set[UOp] = set()
    self.accs = 0
    self.regs: dict[tuple[UOp, int], UOp] = {}
    stores = [n for n in ast.toposort() if n.op is Ops.STORE and n.src[0].op is Ops.INDEX]
    self.written = {buffer_of(n.src[0].src[0]) for n in stores}
    self.deps: dict[UOp, frozenset[UOp]] = {}
    self.impure: dict[UOp, bool] = {}
    self.unordered: dict[UOp, bool] = {}  # reads a written buffer directly, not through an AFTER that orders the read
    for n in ast.toposort():
      d = frozenset().union(*(self.deps[s] for s in n.src)) if n.src else frozenset()
      if n.op is Ops.RANGE: d = d | {n}
      if n.op in (Ops.REDUCE, Ops.END): d = d - frozenset(n.src[1:])  # what reads after END is outside its loops
      self.deps[n] = d
      self.impure[n] = (n.op is Ops.LOAD and buffer_of(n.src[0].src[0]) in self.written) or \
        n.op is Ops.DEFINE_REG or any(self.impure[s] for s in n.src if s.op is not Ops.AFTER)
      self.unordered[n] = (n.op is Ops.LOAD and n.src[0].src[0].op is not Ops.AFTER and self.impure[n]) or \
        any(self.unordered[s] for s in n.src if s.op is not Ops.AFTER)
    self.reduces: dict[tuple[UOp, ...], list[UOp]] = {}
    self.inner: dict[UOp, frozenset[UOp]] = {}  # the reductions inside each reduction's value
    for n in ast.toposort():
      if n.op is not Ops.REDUCE: continue
      self.reduces.setdefault(n.src[1:], []).append(n)
      self.inner[n] = frozenset(m for m in n.src[0].toposort() if m.op is Ops.REDUCE)
    self.has_barrier: dict[UOp, bool] = {}
    for n in ast.toposort(): self.has_barrier[n] = n.op is Ops.BARRIER or any(self.has_barrier[s] for s in n.src)

  # ** where code goes **
  def block(self, depth: int) -> list[UOp]: return self.loops[depth - 1].body if depth else self.root
  def append(self, u: UOp, depth: int | None = None) -> UOp:
    if u in self.placed: u = u.replace(tag=("again", len(self.placed)))  # computed again after its loop closed
    self.placed.add(u)
    self.block(len(self.loops) if depth is None else depth).append(u)
    return u
  def depth_of(self, n: UOp) -> int:
    """The number of open loops value `n` needs: the innermost loop of a range it depends on (all loops for code
    whose value can change inside the current loop: loads of written buffers, registers)."""
    # a reduction that reads written buffers only after named statements runs where those place it (reduce())
    if self.impure[n] and (n.op is not Ops.REDUCE or self.unordered[n]): return len(self.loops)
    open_at = {lp.orig: i + 1 for i, lp in enumerate(self.loops)}
    return max((open_at.get(r, len(self.loops)) for r in self.deps[n]), default=0)

  # ** loops **
  def open(self, r: UOp) -> UOp:
    for lp in self.loops:
      if lp.orig is r: return lp.lin
    end = self.value(r.src[0])
    # serial loops are REDUCE ranges in the linear program: no interpreter runs their iterations side by side
    lin_type = AxisType.GLOBAL if r.arg[1] is AxisType.GLOBAL and not self.serial else AxisType.REDUCE
    lin = UOp(Ops.RANGE, r.dtype, (end,), (r.arg[0] if r not in self.opened else self.next_axis, lin_type))
    if r in self.opened: self.next_axis += 1
    self.opened.add(r)
    self.loops.append(_Loop(r, lin))
    return lin
  def close(self) -> None:
    lp = self.loops.pop()
    for n in lp.emitted:
      self.done.pop(n, None)
      self.where.pop(n, None)
    self.append(lp.lin)
    self.block(len(self.loops)).extend(lp.body)
    self.append(UOp(Ops.END, dtypes.void, (lp.lin,)))
  def close_ranges(self, rngs: tuple[UOp, ...]) -> None:
    want = set(rngs)
    # (without block-shared memory, thread loops opened inside close with the loop around them)
    while self.loops and (self.loops[-1].orig in want or self.is_thread_loop(self.loops[-1])):
      want.discard(self.loops[-1].orig)
      self.close()
    still = [r for r in want if any(lp.orig is r for lp in self.loops)]
    if still:
      inner = self.loops[-1].orig
      raise CompileError(f"END closes range {still[0].arg} but range {inner.arg}, opened inside it, is still open; end "
                         f"{inner.arg} in an inner END first")
  def is_thread_loop(self, lp: _Loop) -> bool: return self.fission and lp.orig.arg[1] is AxisType.LOCAL
  def close_threads(self) -> None:
    """A barrier without block-shared memory: the threads so far finish before any goes on (their loops close)."""
    while self.loops and self.loops[-1].orig.arg[1] is AxisType.LOCAL: self.close()
    if any(lp.orig.arg[1] is AxisType.LOCAL for lp in self.loops):
      raise CompileError("a BARRIER is inside a loop nested in a LOCAL range; on a device without block-shared memory "
                         "threads run one after another, so end the inner loop before the barrier")

  # ** values **
  def value(self, n: UOp) -> UOp:
    if (got := self.done.get(n)) is not None: return got
    if n.op is Ops.RANGE: return self.open(n)
    if n.op in (Ops.PARAM, Ops.DEFINE_VAR, Ops.DEFINE_LOCAL, Ops.CONST):
      self.head[n] = None
      return self.remember(n, n, 0)
    if n.op is Ops.AFTER:
      for d in n.src[1:]: self.statement(d) if d.op in _STATEMENTS else self.value(d)
      return self.value(n.src[0])
    if n.op is Ops.REDUCE: return self.reduce(n)
    if n.op is Ops.LOAD and n.src[0].op is Ops.INDEX and buffer_of(n.src[0].src[0]).op is Ops.DEFINE_REG:
      return self.reg(n.src[0])
    srcs = tuple(self.value(s) for s in n.src)
    depth = max([self.depth_of(n)] + [self.where.get(s, 0) for s in n.src])
    new = n if srcs == n.src else UOp(n.op, n.dtype, srcs, n.arg, n.tag)
    return self.remember(n, self.append(new, depth), depth)
  def remember(self, n: UOp, lin: UOp, depth: int) -> UOp:
    self.done[n], self.where[n] = lin, depth
    if depth and n.op is not Ops.CONST: self.loops[depth - 1].emitted.append(n)
    return lin
  def siblings(self, n: UOp) -> list[UOp]:
    """`n` and the other pure reductions over the same ranges whose loops can be `n`'s: their other ranges are open
    and neither feeds the other (an unrolled partial sum, the two int maxima of a float max on CPU)."""
    if self.impure[n]: return [n]
    open_now = {lp.orig for lp in self.loops}
    out = [n]
    for sib in self.reduces.get(n.src[1:], ()):
      if sib is n or sib in self.done or self.impure[sib] or not self.deps[sib] <= open_now: continue
      if any(sib in self.inner[o] or o in self.inner[sib] for o in out): continue
      out.append(sib)
    return out
  def reduce(self, n: UOp) -> UOp:
    for r in sorted(self.deps[n], key=lambda r: r.arg[0]): self.open(r)  # the loops it varies with are outside its own
    group = self.siblings(n)
    computed = max((self.where.get(s, 0) for m in group for s in m.src[0].toposort() if s in self.done), default=0)
    # after what it reads that is already computed and the statements it reads after; a reduction reading a buffer the
    # kernel writes still runs once where its ranges and those statements place it, not again in each inner loop
    depth = max([computed] + [self.depth_of(m) for m in group] + [self.ordered_after(m) for m in group])
    saved, self.loops = self.loops[depth:], self.loops[:depth]  # the accumulator's loops go before the inner ones
    accs = []
    for m in group:
      init = self.value(UOp.const(m.dtype, reduce_identity(m.arg, m.dtype)))
      accs.append(self.append(UOp(Ops.DEFINE_ACC, m.dtype, (init,), self.new_acc())))
    for r in reversed(n.src[1:]): self.open(r)
    vals = [self.value(m.src[0]) for m in group]
    for m, acc, val in zip(group, accs, vals):
      upd = self.append(UOp(m.arg, m.dtype, (acc, val)))
      self.append(UOp(Ops.ASSIGN, m.dtype, (acc, upd)))
    for _ in n.src[1:]: self.close()
    self.loops += saved
    for m, acc in zip(group, accs): self.remember(m, acc, depth)
    return accs[0]
  def new_acc(self) -> int:
    self.accs += 1
    return self.accs - 1
  def reg(self, index: UOp) -> UOp:
    """A register: element k of a REG buffer is accumulator-like (DEFINE_ACC, written by ASSIGN), declared once in the
    innermost open GLOBAL loop (a thread's scope)."""
    for d in _after_deps(index): self.statement(d)  # what the register is read after
    idx = graph_rewrite(index.src[1], symbolic, name="register index")
    if idx.op is not Ops.CONST:
      raise CompileError(f"a REG buffer is indexed by {idx.render()}, which is not constant; index registers with "
                         "constants or UPCAST ranges (which are unrolled)")
    key = (buffer_of(index.src[0]), int(idx.arg))
    if (acc := self.regs.get(key)) is None:
      depth = max((i + 1 for i, lp in enumerate(self.loops) if lp.orig.arg[1] in _THREADS), default=0)
      base = _ptr(key[0]).base
      acc = UOp(Ops.DEFINE_ACC, base, (self.value(UOp.const(base, 0)),), self.new_acc())
      self.append(acc, depth)
      self.regs[key] = acc
    return acc

  # ** statements **
  def statement(self, n: UOp) -> None:
    if n in self.stmts: return
    self.stmts.add(n)
    self.emit_statement(n)
    self.stmt_at[n] = tuple(lp.lin for lp in self.loops)
  def ordered_after(self, n: UOp) -> int:
    """The open loops value `n` must be computed in to follow the statements its AFTERs name: those of the loops open
    when the last of them ran that are still open (the same loop instances)."""
    lins = [lp.lin for lp in self.loops]
    depth = 0
    for x in n.toposort():
      if x.op is not Ops.AFTER: continue
      for d in x.src[1:]:
        if (at := self.stmt_at.get(d)) is None: continue
        same = next((i for i, (a, b) in enumerate(zip(at, lins)) if a is not b), min(len(at), len(lins)))
        depth = max(depth, same)
    return depth
  def emit_statement(self, n: UOp) -> None:
    if n.op is Ops.GROUP:
      for s in n.src: self.statement(s) if s.op in _STATEMENTS else self.value(s)
    elif n.op is Ops.END:
      # without block-shared memory a loop with a barrier inside runs all threads in each step: threads so far finish
      if self.fission and self.has_barrier[n]: self.close_threads()
      # a statement the body reads after runs before each serial loop of this END it does not vary with (once, not in
      # every iteration of a loop that would overwrite what it wrote): a buffer filled, then read inside the loop
      before = [d for d in _after_deps(n.src[0]) if d not in self.stmts] if n.src[0].op is Ops.STORE else []
      for i in range(len(n.src) - 1, 0, -1):
        r, inner = n.src[i], frozenset(n.src[1:i + 1])
        if r.arg[1] in (AxisType.LOOP, AxisType.REDUCE):
          for d in before:
            if not self.deps[d] & inner: self.statement(d)
        if not (self.fission and r.arg[1] is AxisType.LOCAL): self.open(r)
      self.statement(n.src[0]) if n.src[0].op in _STATEMENTS else self.value(n.src[0])
      self.close_ranges(n.src[1:])
    elif n.op is Ops.BARRIER:
      for s in n.src: self.statement(s) if s.op in _STATEMENTS else self.value(s)
      if self.fission: self.close_threads()
      else: self.append(UOp(Ops.BARRIER, dtypes.void, ()))
    elif n.op is Ops.STORE:
      # the statements it reads after run first: they may close loops (barriers) its values would be computed in
      for d in _after_deps(n): self.statement(d)
      index, val = n.src
      if index.op is not Ops.INDEX: raise CompileError(f"a STORE writes to an INDEX of a buffer, not to {index.op}")
      if buffer_of(index.src[0]).op is Ops.DEFINE_REG:
        acc = self.reg(index)
        self.append(UOp(Ops.ASSIGN, acc.dtype, (acc, self.value(val))))
        return
      srcs = (self.value(index), self.value(val))
      self.append(UOp(Ops.STORE, dtypes.void, srcs))
    else: raise CompileError(f"{n.op} is not a statement of a kernel; a kernel's SINK holds stores, END, GROUP and "
                             "BARRIER")

  def run(self, sink: UOp) -> list[UOp]:
    for s in sink.src: self.statement(s) if s.op in _STATEMENTS else self.value(s)
    while self.loops: self.close()
    head = sorted((u for u in self.head if u.op is Ops.PARAM), key=lambda u: u.arg)
    head += sorted((u for u in self.head if u.op is Ops.DEFINE_VAR), key=lambda u: u.arg)
    head += sorted((u for u in self.head if u.op is Ops.DEFINE_LOCAL), key=lambda u: u.arg)
    return head + [u for u in self.head if u.op is Ops.CONST] + self.root

def _after_deps(n: UOp) -> list[UOp]:
  """The statements `n` reads after (its AFTERs' dependencies), not those nested inside them, nor those inside the loop
  of a reduction it reads: a statement that varies with a reduction's range (a store of each element summed) runs in
  that reduction's loop, where the reduction computes it, not before it."""
  out: list[UOp] = []
  seen: set[tuple[UOp, frozenset[UOp]]] = set()
  stack: list[tuple[UOp, frozenset[UOp]]] = [(s, frozenset()) for s in reversed(n.src)]
  while stack:
    x, inside = stack.pop()
    if (x, inside) in seen or x.op in _STATEMENTS: continue
    seen.add((x, inside))
    if x.op is Ops.AFTER:
      out += [d for d in x.src[1:] if d.op in _STATEMENTS and not (inside and inside & set(d.toposort()))]
    if x.op is Ops.REDUCE: inside = inside | frozenset(x.src[1:])
    stack += [(s, inside) for s in reversed(x.src[:1] if x.op is Ops.AFTER else x.src)]
  return out

def linearize_handwritten(ast: UOp, fission: bool = False, serial: bool = False) -> list[UOp]:
  """The linear program of a hand-written kernel (see the module docstring)."""
  return _Linearizer(ast, fission, serial).run(ast)

def split_over_threads(uops: list[UOp], renderer: Renderer) -> tuple[list[UOp], list[int] | None]:
  """CPU renderers: a kernel that is one GLOBAL loop (blocks, independent) splits it over the cores, as codegen's
  `apply_opts` splits a scheduler kernel's outermost loop."""
  depth, roots = 0, []
  for u in uops:
    if u.op is Ops.RANGE:
      if depth == 0: roots.append(u)
      depth += 1
    elif u.op is Ops.END: depth -= 1
  if not renderer.has_threads or len(roots) != 1 or roots[0].arg[1] is not AxisType.GLOBAL: return uops, None
  if roots[0].src[0].op is not Ops.CONST or estimate(uops).ops < 1 << 15: return uops, None
  n = min(NUM_CPU_THREADS.value or (renderer.global_max[0] if renderer.global_max else 1), roots[0].src[0].arg)
  if n < 2: return uops, None
  new: dict[UOp, UOp] = {roots[0]: roots[0].replace(arg=(roots[0].arg[0], AxisType.THREAD))}
  out = []
  for u in uops:
    if u not in new and any(s in new for s in u.src): new[u] = u.replace(src=tuple(new.get(s, s) for s in u.src))
    out.append(new.get(u, u))
  return out, [n, 1, 1]

# ** the pipeline **

_TENSOR_LEVEL = {Ops.BUFFER, Ops.REDUCE_AXIS, Ops.CONTIGUOUS, Ops.COPY, Ops.ASSIGN, Ops.DEVICE, Ops.CUSTOM_KERNEL}

def _check(ast: UOp) -> None:
  for n in ast.toposort():
    if n.op in _TENSOR_LEVEL:
      raise CompileError(f"a hand-written kernel holds the tensor-level {n.op}; index placeholder buffers instead")
    if n.op is Ops.STORE and isinstance(n.src[0].dtype, PtrDType) and n.src[1].dtype is not n.src[0].dtype.base:
      raise DTypeError(f"kernel {ast.arg.name}: a store of a {n.src[1].dtype!r} value into a buffer of "
                       f"{n.src[0].dtype.base!r}; cast it first: .cast({n.src[0].dtype.base!r})")
    if n.op is Ops.INDEX and n.src[0].op in GroupOp.Movement:
      raise CompileError("index a placeholder's view with buf[i, j], not .index(): .index() takes a flat index")

def prebuilt_program(ast: UOp, device: str = "") -> ProgramSpec:
  """A kernel written as source: PROGRAM(SINK over its buffer placeholders, SOURCE[, BINARY]). The device's compiler
  compiles the SOURCE unless a BINARY (its output) comes with it; it runs once (a grid of one), over the buffers by
  slot."""
  sink = ast.src[0]
  source = next((s.arg for s in ast.src[1:] if s.op is Ops.SOURCE), None)
  binary = next((s.arg for s in ast.src[1:] if s.op is Ops.BINARY), None)
  if not isinstance(source, str):
    raise CompileError(f"a PROGRAM needs a SOURCE with the kernel's text, got sources {[s.op for s in ast.src[1:]]}")
  if binary is not None and not isinstance(binary, bytes):
    raise CompileError(f"a PROGRAM's BINARY holds bytes (the compiler's output), not {type(binary).__name__}")
  params = sorted({n for n in sink.toposort() if n.op is Ops.PARAM}, key=lambda p: p.arg)
  slots = [p.arg for p in params]
  return ProgramSpec(sink.arg.name, source, device, params, slots, [], slots, slots, [1, 1, 1], None,
                     aux={"binary": binary} if binary is not None else {})

def handwritten_program(ast: UOp, renderer: Renderer, device: str = "") -> ProgramSpec:
  """Codegen a hand-written kernel for `renderer`: the passes of `full_rewrite` that apply to it, around its own
  linearizer (see the module docstring)."""
  if ast.op is Ops.PROGRAM: return prebuilt_program(ast, device)
  _check(ast)
  sink, gsize, lsize = _prepare(ast, renderer.has_local)
  plan = _scratch_plan(sink, renderer.has_local)
  sink = _to_scratch(sink, plan, _nparams(ast))  # LOCAL memory without hardware, per-thread register arrays
  serial = bool(plan) and not renderer.has_local  # blocks as loops share the scratch memory: one after another
  sink = graph_rewrite(sink, symbolic, name="simplify index math")
  if {Ops.EXP2, Ops.LOG2, Ops.SIN} - set(renderer.code_for_op):
    from ember.codegen.transcendental import pm_transcendental
    sink = graph_rewrite(sink, pm_transcendental, ctx=frozenset(renderer.code_for_op), name="decompose transcendentals")
  sink = graph_rewrite(sink, pm_safe_division, name="guard integer division")
  if renderer.extra_matcher is not None: sink = graph_rewrite(sink, renderer.extra_matcher, name="renderer rewrites")
  try: uops = linearize_handwritten(sink, fission=not renderer.has_local, serial=serial)
  except EmberError: raise
  except Exception as e:  # a kernel shape the linearizer does not handle: say which kernel, keep the cause
    raise CompileError(f"ember's linearizer failed on hand-written kernel {ast.arg.name} ({type(e).__name__}: {e}); "
                       "this is a bug in ember: report it with the kernel's `sink.pyrender()`") from e
  if not renderer.has_local and not serial: uops, gsize = split_over_threads(uops, renderer)
  if SPEC.value: type_verify(uops, f"hand-written kernel {ast.arg.name}")
  name = ast.arg.name
  try: src = renderer.render(uops, name)
  except CompileError: raise
  except Exception as e: raise CompileError(f"{type(renderer).__name__} failed to render kernel {name}: {e}") from e
  params = [u for u in uops if u.op is Ops.PARAM]
  outs = sorted({u.src[0].src[0].arg for u in uops if u.op is Ops.STORE and u.src[0].src[0].op is Ops.PARAM})
  ins = sorted({u.src[0].src[0].arg for u in uops if u.op is Ops.LOAD and u.src[0].src[0].op is Ops.PARAM})
  variables = [u for u in uops if u.op is Ops.DEFINE_VAR]
  return ProgramSpec(name, src, device, uops, [p.arg for p in params], variables, outs, ins, gsize, lsize,
                     estimate(uops))
