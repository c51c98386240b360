"""The scheduler: cut a tensor graph into kernels.

Elementwise chains fuse into one kernel, elementwise inputs fuse into a reduction, a reduction fuses into its single
elementwise consumer, and movement ops become index math. A node is materialised into a buffer only where it must
be: realize targets, CONTIGUOUS, COPY, ASSIGN, a reduction whose result is reused, expanded or reduced again, and a
computed value that a broadcast would otherwise recompute many times.

`create_schedule` runs four stages, each its own function:

1. `lower_schedule`: fusion (`find_realize`) and lowering each realized node to a kernel AST or a copy, over BUFFER
   UOps (`LoweredCall`);
2. `bind_buffers`: each BUFFER UOp gets its device `Buffer` (views for copies of slices and size-changing bitcasts);
3. `pack_operands`: a kernel the device's renderer packs (a CPU matmul) becomes a PACK call that copies its B operand
   into a scratch buffer, then the kernel over that copy (codegen/pack.py);
4. `memory_plan`: intermediate buffers, scratch buffers included, share memory when their lifetimes do not overlap.

The result is a list of `ScheduleItem`s, each a `CallKind` (KERNEL, PACK, COPY) on one device over bound buffers.
"""
from __future__ import annotations
import weakref
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any
from ember.device.base import Buffer
from ember.dtype import dtypes, strong_dtype
from ember.errors import DeviceError, EmberError
from ember.helpers import prod
from ember.uop.ops import Ops, UOp, BufferArg, GroupOp, next_unique
from ember.uop import rewrite as uop_rewrite
from ember.schedule.kernel import lower_kernel, strides_for
if TYPE_CHECKING: from ember.codegen.pack import PackPlan

_buffers: weakref.WeakKeyDictionary[UOp, Buffer] = weakref.WeakKeyDictionary()

def attach_buffer(uop: UOp, buf: Buffer) -> None:
  """Bind a runtime Buffer to a BUFFER uop: the buffer lives as long as the uop does."""
  _buffers[uop] = buf

def buffer_of(uop: UOp) -> Buffer:
  u = uop
  while u.op is Ops.RESHAPE: u = u.src[0]
  if u.op is not Ops.BUFFER: raise DeviceError(f"{uop.op} is not backed by a buffer; realize it first")
  if (buf := _buffers.get(u)) is None:
    buf = Buffer(u.arg.device, u.arg.size, u.dtype)  # type: ignore[arg-type]
    _buffers[u] = buf
  return buf

class CallKind(str, Enum):
  """What a schedule item runs (a closed set: the engine handles each)."""
  KERNEL = "kernel"  # a compiled kernel; bufs[0] is its output
  PACK = "pack"      # a compiled kernel that copies a matmul's B operand into the register-block layout of the next
  COPY = "copy"      # bytes from bufs[1] to bufs[0] (across devices, or out of a slice)

@dataclass
class ScheduleItem:
  """One call on `device` over bound buffers. KERNEL and PACK run a kernel with `var_vals`; COPY copies bufs[1] into
  bufs[0]. `bufs[0]` is the output. `ast` is the kernel as the scheduler made it; a kernel whose B operand a PACK call
  packed (`packed`) runs `packed.main` instead, over its buffers plus the scratch buffer (its last)."""
  kind: CallKind
  device: str
  bufs: list[Buffer]
  ast: UOp | None = None
  var_vals: dict[str, int] = field(default_factory=dict)
  packed: PackPlan | None = None
  @property
  def program(self) -> UOp | None:
    """The SINK the engine compiles and runs for this item."""
    return self.packed.main if self.packed is not None else self.ast

@dataclass
class LoweredCall:
  """A call before binding: a kernel over BUFFER UOps, or a copy of `size` elements from `offset` of `src`."""
  kind: CallKind
  device: str
  buf_uops: list[UOp]
  ast: UOp | None = None
  var_vals: dict[str, int] = field(default_factory=dict)
  offset: int = 0
  size: int = 0

def _new_buffer_uop(node: UOp) -> UOp:
  size = prod(node.shape)
  if isinstance(size, UOp): size = size.vmax
  dev = node.device
  return UOp(Ops.BUFFER, strong_dtype(node.dtype), (), BufferArg(next_unique(), dev, int(size)))  # type: ignore[arg-type]

def _ubound(x: int | UOp) -> int:
  """An int upper bound of a possibly symbolic size."""
  return x if isinstance(x, int) else int(x.vmax)

def _is_buffer_like(u: UOp) -> bool:
  """A BUFFER, possibly reshaped: already materialised in order."""
  while u.op is Ops.RESHAPE: u = u.src[0]
  return u.op is Ops.BUFFER

def contiguous_range(u: UOp) -> tuple[UOp, int, int] | None:
  """If `u` is a contiguous run of a buffer's elements (reshapes and a leading-dim shrink), (buffer, offset, size)."""
  offset = 0
  node = u
  while node.op in (Ops.RESHAPE, Ops.SHRINK):
    if node.op is Ops.SHRINK:
      src_shape = node.src[0].shape
      inner = [i for i, ((b, e), s) in enumerate(zip(node.arg, src_shape)) if (b, e) != (0, s)]
      if len(inner) > 1 or any(not isinstance(x, int) for x in src_shape): return None
      if inner:
        d = inner[0]
        if any(s != 1 for s in src_shape[:d]): return None
        offset += node.arg[d][0] * strides_for(src_shape)[d]
    node = node.src[0]
  if node.op is not Ops.BUFFER: return None
  return node, offset, int(prod(u.shape))

_EXPENSIVE = {Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.FDIV, Ops.RECIPROCAL, Ops.REDUCE_AXIS}

def _expensive_to_recompute(u: UOp, realize: set[UOp]) -> bool:
  """A computed value worth a buffer before a broadcast repeats it: transcendentals, divisions or a long chain of ops
  on data (math on aranges and constants only folds into the kernel's loop counters; a realized node is a load)."""
  if u.base.op not in GroupOp.ALU | {Ops.CAST, Ops.REDUCE_AXIS}: return False
  nodes = u.toposort(gate=lambda n: n.op is not Ops.BUFFER and (n is u or n not in realize))
  data: set[UOp] = set()
  for n in nodes:
    if n.op is Ops.BUFFER or (n is not u and n in realize) or any(s in data for s in n.src): data.add(n)
  computed = [n for n in nodes if n is u or n not in realize]
  return any(n.op in _EXPENSIVE for n in computed) or sum(1 for n in computed if n in data and n.op in GroupOp.ALU) >= 6

def _reads_target_elsewhere(value: UOp, target: UOp, realized: set[UOp]) -> bool:
  """Whether `value` reads the buffer under `target` other than through `target` itself at the element being written:
  through another view of the buffer, or through a movement op (reshapes of a contiguous target keep the position)
  above anything that reads it. What `realized` nodes read is their kernels' (run before the assign's), not its."""
  base, inside = target.base, set(target.toposort())  # the target's own view chain reads it where it writes
  reads: dict[UOp, bool] = {}
  for u in value.toposort(gate=lambda n: n is value or n not in realized):
    if u is not value and u in realized:
      reads[u] = False
      continue
    reads[u] = u is target or u is base or any(reads[s] for s in u.src)
    if u in inside: continue
    if base in u.src: return True
    if u.op in GroupOp.Movement and u.op is not Ops.RESHAPE and any(reads[s] for s in u.src): return True
  return False

def find_realize(targets: list[UOp], order_overwrites: bool = True) -> tuple[list[UOp], dict[UOp, list[UOp]]]:
  """Which nodes become buffers, in dependency order (and each ASSIGN after the readers of the old value its result
  does not feed, with `order_overwrites`: `_overwrites_last`)."""
  sink = UOp(Ops.SINK, dtypes.void, tuple(targets))
  topo = [n for n in sink.toposort() if n is not sink]
  consumers: dict[UOp, list[UOp]] = {n: [] for n in topo}
  for n in topo:
    for s in (n.src[:1] if n.op is Ops.CUSTOM_GRAD else n.src):  # a custom gradient's inputs are not read through it
      if n not in consumers[s]: consumers[s].append(n)
  realize: set[UOp] = {t for t in targets if not _is_buffer_like(t) and Ops.CONST not in (t.op, t.base.op)}
  deferred: list[UOp] = []  # broadcasts of row statistics (softmax's max and sum), which may fuse with their rows
  for n in topo:
    if n.op in (Ops.CONTIGUOUS, Ops.COPY, Ops.ASSIGN): realize.add(n)
    if n.op is Ops.CUSTOM_KERNEL:  # a hand-written kernel runs over whole buffers (views are computed into one first)
      realize.update({n, *(s for s in n.src if not _is_buffer_like(s))})
    if n.op is Ops.AFTER: realize.add(n)  # a custom kernel's output: its input's buffer, read after the kernel ran
    if n.op is Ops.COPY and contiguous_range(n.src[0]) is None and not _is_buffer_like(n.src[0]): realize.add(n.src[0])
    if n.op is Ops.BITCAST and n.src[0].dtype.itemsize != n.dtype.itemsize:
      realize.add(n)
      if not _is_buffer_like(n.src[0]): realize.add(n.src[0])
    if n.op is Ops.ASSIGN:
      target, value = n.src
      # the value may read the target's buffer only at the element it overwrites: one kernel reading it elsewhere (a
      # transpose, flip, shift or broadcast of the target) would read elements it already overwrote
      if _reads_target_elsewhere(value, target, realize) and value.op is not Ops.CONTIGUOUS: realize.add(value)
  # a broadcast's value gets a buffer by what computing it costs given the buffers below it, so the values are decided
  # base by base in toposort order, every broadcast of one base against the same state: a base below this one is
  # decided first in any order of the targets, one beside it cannot change its cost (in the order the broadcasts came
  # in, a base's buffer depended on whether another consumer of a base below it happened to be visited first)
  expands: dict[UOp, list[UOp]] = {}
  for n in topo:
    if n.op is Ops.EXPAND and _ubound(prod(n.arg)) >= 2 * _ubound(prod(n.src[0].shape)):
      expands.setdefault(n.src[0].base, []).append(n)
  for base in [n for n in topo if n in expands]:
    costly = [n for n in expands[base] if _expensive_to_recompute(n.src[0], realize)]
    deferred += [n for n in costly if _row_broadcast_reduces(n)]  # decided with the reductions it broadcasts
    if any(not _row_broadcast_reduces(n) for n in costly): realize.add(base)
  fused = {n for n in topo if n.op is Ops.REDUCE_AXIS and n not in realize
           and _row_fusion_end(n, consumers, realize) is not None}
  for n in deferred:
    # a broadcast row statistic whose reductions do not fuse with their rows is worth a buffer (a reciprocal per
    # element), decided before the reductions are: one may then fuse into it
    if not _row_broadcast_reduces(n) <= fused: realize.add(n.src[0].base)
  # which reductions get a buffer is decided the same whatever the order of the targets: each against the buffers
  # decided so far, the others first, as none of them depends on another's decision, then the matmul-like ones, whose
  # epilogue's selects are looked for up to the others' buffers too (in toposort order, a matmul-like sum looked into
  # a reduction of a compare that was not decided yet, or stopped at its buffer: cross-entropy's division fused into
  # its sum in some processes only)
  reduces = [n for n in topo if n.op is Ops.REDUCE_AXIS and n not in realize and n not in fused]
  plain = {n for n in reduces if not _is_matmul_like(n) and _reduce_must_realize(n, consumers, realize)}
  buffers = realize | plain
  realize |= {n for n in reduces if _is_matmul_like(n) and _reduce_must_realize(n, consumers, realize, buffers)} | plain
  order = [n for n in topo if n in realize and n.op is not Ops.BUFFER]
  return (_overwrites_last(order, realize) if order_overwrites else order), consumers

class OverwriteOrderError(EmberError, RuntimeError):
  """One schedule cannot both read a buffer's old value and overwrite it: a kernel reading the old value needs the
  new one too. Realize the readers of the old value first (what `Tensor.assign` does where this is raised)."""

def _overwrites_last(order: list[UOp], realize: set[UOp]) -> list[UOp]:
  """`order` with every ASSIGN after the kernels that read the buffer it overwrites (its old value): write after read.
  Data dependencies alone leave a reader that the ASSIGN's value does not need free to come after it (a train step's
  whole backward and its parameter updates in one schedule: the backward of the first layer reads the second layer's
  weights, which the second layer's update overwrites). A reader that needs the ASSIGN's result reads the new value
  and stays after it. Raises OverwriteOrderError where no order satisfies both."""
  targets: dict[UOp, list[UOp]] = {}  # buffer -> the ASSIGNs overwriting it (or parts of it)
  for n in order:
    if n.op is Ops.ASSIGN and n.src[0].base.op is Ops.BUFFER: targets.setdefault(n.src[0].base, []).append(n)
  if not targets: return order
  deps: dict[UOp, list[UOp]] = {}  # realized node -> the realized nodes its kernel reads
  readers: dict[UOp, list[UOp]] = {}  # ASSIGN -> the other realized nodes whose kernels read its target's buffer
  for node in order:
    deps[node] = []
    stack, seen = list(node.src), set()
    while stack:
      u = stack.pop()
      if u in seen: continue
      seen.add(u)
      if u in realize and u.op is not Ops.BUFFER: deps[node].append(u)
      elif u.op is Ops.BUFFER:  # (another assign's target counts: two writes of one buffer keep no order here)
        for a in targets.get(u, ()):
          if a is not node: readers.setdefault(a, []).append(node)
      else: stack.extend(u.src)
  if not readers: return order
  after: dict[UOp, set[UOp]] = {a: set() for a in readers}  # ASSIGN -> the realized nodes that need its result
  for node in order:
    for a, needs in after.items():
      if any(d is a or d in needs for d in deps[node]): needs.add(node)
  extra = {a: [r for r in rs if r not in after[a]] for a, rs in readers.items()}
  index = {n: i for i, n in enumerate(order)}
  if all(index[r] < index[a] for a, rs in extra.items() for r in rs): return order
  out: list[UOp] = []
  state: dict[UOp, int] = {}  # 1: being placed, 2: placed
  def place(n: UOp) -> None:
    todo = [(n, iter([*deps[n], *extra.get(n, ())]))]
    state[n] = 1
    while todo:
      cur, it = todo[-1]
      nxt = next(it, None)
      if nxt is None:
        todo.pop()
        state[cur] = 2
        out.append(cur)
      elif (st := state.get(nxt)) == 1: raise OverwriteOrderError(f"a kernel reads both the old and the new value "
                                                                 f"of the buffer an {nxt.op} overwrites")
      elif st is None:
        state[nxt] = 1
        todo.append((nxt, iter([*deps[nxt], *extra.get(nxt, ())])))
  for n in order:
    if n not in state: place(n)
  return out

_SELECTS = {Ops.WHERE, Ops.MAX, Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ}

def _is_matmul_like(r: UOp) -> bool:
  """A reduction of products (a matmul, a conv as an implicit GEMM): codegen's register-blocked path."""
  src = r.src[0]
  while src.op is Ops.CAST: src = src.src[0]
  return src.op is Ops.MUL

def _selects(c: UOp, node: UOp, realize: set[UOp]) -> bool:
  """Whether consumer `c` of `node` selects or compares, itself or in its other operands up to realized buffers."""
  if c.op in _SELECTS: return True
  return any(n.op in _SELECTS for s in c.src if s is not node for n in s.toposort(gate=lambda n: n not in realize))

ROW_FUSION_MAX = 1 << 16  # elements per row up to which a row statistic fuses into the kernel that writes the row
# elementwise: the same index in and out
_PASS = GroupOp.ALU | {Ops.CAST, Ops.DETACH, Ops.CONTIGUOUS_BACKWARD, Ops.CUSTOM_GRAD}

def _row_reduce(r: UOp) -> bool:
  """A reduction of whole rows: constant sizes, at most ROW_FUSION_MAX elements each, over trailing dims (every kept
  dim before every reduced one, so the kept dims are the outer loops of a kernel over the input's shape)."""
  shape = r.src[0].shape
  if not all(isinstance(s, int) for s in shape): return False
  reduced = [i for i in r.arg[1] if shape[i] != 1]
  kept = [i for i, s in enumerate(shape) if s != 1 and i not in reduced]
  return bool(reduced) and prod(shape[i] for i in reduced) <= ROW_FUSION_MAX and (not kept or max(kept) < min(reduced))

def _row_broadcast_reduces(e: UOp) -> set[UOp]:
  """The reductions an EXPAND broadcasts back over the rows they reduced (softmax's `e * e.sum(-1).reciprocal()`),
  each seen through elementwise ops and reshapes; empty when it broadcasts anything else."""
  src = e.src[0]
  reds = {n for n in src.toposort(gate=lambda n: n.op not in (Ops.REDUCE_AXIS, Ops.BUFFER)) if n.op is Ops.REDUCE_AXIS}
  ok = all(src.shape == r.shape and e.arg == r.src[0].shape and _row_reduce(r) for r in reds)
  return reds if ok else set()

def _outputs_loop(device: str | tuple[str, ...] | None) -> bool:
  """Whether the device's kernels run their outputs as nested loops (CPU-like renderers), where codegen computes a
  row statistic once per row, before the loop over the row opens; GPU renderers run one thread per output."""
  if not isinstance(device, str): return False
  from ember.device import Device
  return not Device[device].renderer.has_local

def _row_fusion_end(r: UOp, consumers: dict[UOp, list[UOp]], realize: set[UOp]) -> UOp | None:
  """The realized node whose kernel computes row reduction `r` itself, or None. A row statistic (softmax's max and
  sum of exp, layernorm's mean and variance) fuses into the kernel that writes the rows it reduced when everything
  reading it, other such statistics of the same rows included, is elementwise up to that one node: the kernel then
  reads each row from memory once and writes it once (softmax was three kernels, a max, a sum and the scaling)."""
  full = r.src[0].shape
  if not _row_reduce(r) or not _outputs_loop(r.device): return None
  end: UOp | None = None
  todo, seen = [r], {r}
  while todo:
    n = todo.pop()
    for c in consumers[n]:
      if c in seen: continue
      if c in realize:
        if c.shape != full or c.op not in _PASS | {Ops.CONTIGUOUS} or end not in (None, c): return None
        end = c
        continue
      seen.add(c)
      if c.op is Ops.EXPAND: ok = c.src[0].shape == r.shape and c.arg == full and bool(_row_broadcast_reduces(c))
      elif c.op is Ops.REDUCE_AXIS: ok = c.src[0].shape == full and c.arg[1] == r.arg[1] and _row_reduce(c)
      elif c.op is Ops.RESHAPE: ok = n.shape != full and prod(c.shape) == prod(r.shape)
      else: ok = c.op in _PASS and c.shape in (full, r.shape)
      if not ok: return None
      todo.append(c)
  return end

def _reduce_must_realize(r: UOp, consumers: dict[UOp, list[UOp]], realize: set[UOp],
                         buffers: set[UOp] | None = None) -> bool:
  """A reduction fuses into its single chain of elementwise consumers. It gets a buffer when read twice (x * sigmoid(x),
  a relu written as a where), and a matmul-like one also when its epilogue selects or compares (relu and its backward
  mask, max, a where): the
  matmul then keeps its register-blocked kernel and the epilogue is one cheap elementwise kernel, where the fused
  kernel lost the fast path (256x512x512 on one core: 2.3 ms vs 20-30 ms). The epilogue's other operands are looked
  into up to `buffers` (default `realize`), the chain itself up to `realize`."""
  node = r
  while True:
    cs = consumers[node]
    if node in realize and node is not r: return False
    if len(cs) == 0: return False
    if len(cs) > 1: return True
    c = cs[0]
    if _is_matmul_like(r) and _selects(c, node, realize if buffers is None else buffers): return True
    if c in realize: return False
    if c.op is Ops.REDUCE_AXIS or (c.op in GroupOp.Movement and c.op is not Ops.RESHAPE): return True
    if c.op in (Ops.COPY, Ops.ASSIGN, Ops.BITCAST): return True
    node = c

def lower_schedule(targets: list[UOp], order_overwrites: bool = True) -> tuple[list[LoweredCall], dict[UOp, UOp],
                                                                              list[UOp]]:
  """Fusion and lowering: the calls that compute `targets` over BUFFER UOps, what each realized target becomes (a
  buffer view), and the views a size-changing BITCAST makes (output, source: `bind_buffers` makes them views)."""
  order, _ = find_realize(targets, order_overwrites)
  realized: dict[UOp, UOp] = {}
  calls: list[LoweredCall] = []
  becomes: dict[UOp, UOp] = {}
  bitcast_views: list[UOp] = []
  for node in order:
    if _ubound(prod(node.shape)) == 0:
      realized[node] = _new_buffer_uop(node)
      continue
    if node.op is Ops.COPY:
      src = node.src[0]
      src_buf_uop = realized.get(src, src)
      rng = contiguous_range(src_buf_uop) if src not in realized else (realized[src], 0, int(prod(src.shape)))
      if rng is None: raise DeviceError(f"copy source {src.op} is not a contiguous buffer")
      out = _new_buffer_uop(node)
      sbuf, offset, size = rng
      calls.append(LoweredCall(CallKind.COPY, str(node.device), [out, sbuf], offset=offset, size=size))
      realized[node] = out
      continue
    if node.op is Ops.CUSTOM_KERNEL:
      calls.append(_custom_call(node, realized))
      continue
    if node.op is Ops.AFTER:
      realized[node] = realized.get(node.src[0], node.src[0].base)
      continue
    if node.op is Ops.BITCAST and node.src[0].dtype.itemsize != node.dtype.itemsize:
      out = _new_buffer_uop(node)
      bitcast_views += [out, realized.get(node.src[0], node.src[0])]
      realized[node] = out
      continue
    if node.op is Ops.ASSIGN:
      target_base = node.src[0].base
      out_buf_uop = target_base if target_base.op is Ops.BUFFER else realized[target_base]
    else:
      out_buf_uop = _new_buffer_uop(node)
    if node.device is None or not isinstance(node.device, str):
      raise DeviceError(f"cannot schedule {node.op} without a device")
    ast, buf_uops, var_vals = lower_kernel(node, out_buf_uop, realized)
    calls.append(LoweredCall(CallKind.KERNEL, node.device, buf_uops, ast, var_vals))
    realized[node] = out_buf_uop if node.op is not Ops.ASSIGN else node.src[0]
  for t in targets:
    if t in realized:
      r = realized[t]
      becomes[t] = r if r.shape == t.shape else UOp(Ops.RESHAPE, r.dtype, (r,), t.shape)
      if t.dtype.weak and not r.dtype.weak: becomes[t] = UOp(Ops.CAST, t.dtype, (becomes[t],))
  for n, r in realized.items():
    if n.op is Ops.ASSIGN and n not in becomes: becomes[n] = r
  return calls, becomes, bitcast_views

def _custom_call(node: UOp, realized: dict[UOp, UOp]) -> LoweredCall:
  """A custom kernel over its inputs' buffers, plus the scratch buffers its target needs (ember.codegen.handwritten).
  A bound Variable in the kernel (a loop over a decode step's positions) is read as its variable, valued at launch:
  one program serves every value, as for a scheduler kernel."""
  from ember.device import Device
  from ember.codegen.handwritten import scratch_buffers
  info = node.arg
  binds = {b: b.src[0] for b in info.ast.toposort() if b.op is Ops.BIND}
  ast = info.ast.substitute(binds) if binds else info.ast
  sink = ast if ast.op is Ops.SINK else ast.src[0]
  scratch = [UOp(Ops.BUFFER, sc.dtype, (), BufferArg(next_unique(), info.device, sc.size))
             for sc in scratch_buffers(sink, Device[info.device].renderer)]
  var_vals = {b.src[0].arg[0]: b.src[1].arg for b in binds}
  return LoweredCall(CallKind.KERNEL, info.device, [realized.get(s, s.base) for s in node.src] + scratch, ast, var_vals)

def bind_buffers(calls: list[LoweredCall], bitcast_views: list[UOp]) -> tuple[list[ScheduleItem], set[int]]:
  """Each BUFFER UOp gets its device Buffer; a copy of a slice reads a view of its source, a size-changing bitcast's
  output is a view of its source. Returns the bound items and the buffers the memory planner must leave alone."""
  pinned: set[int] = set()
  for i in range(0, len(bitcast_views), 2):
    out, viewed = bitcast_views[i], bitcast_views[i + 1]
    sb = buffer_of(viewed)
    attach_buffer(out, sb.view(out.arg.size, out.dtype, 0))  # type: ignore[arg-type]
    pinned.add(id(sb.base))  # the view aliases this memory: the planner must not hand it to another buffer
  items: list[ScheduleItem] = []
  for c in calls:
    if c.kind is CallKind.COPY:
      src = buffer_of(c.buf_uops[1])
      whole = c.offset == 0 and c.size == src.size
      view = src if whole else src.view(c.size, src.dtype, c.offset * src.dtype.itemsize)
      items.append(ScheduleItem(CallKind.COPY, c.device, [buffer_of(c.buf_uops[0]), view]))
    else: items.append(ScheduleItem(c.kind, c.device, [buffer_of(b) for b in c.buf_uops], c.ast, c.var_vals))
  return items, pinned

_pack_plans: dict[tuple[str, str, UOp, int, int], PackPlan | None] = {}

def _pack_plan(device: str, ast: UOp, nbufs: int) -> PackPlan | None:
  from ember.device import Device
  from ember.codegen.pack import plan_packing
  from ember.helpers import NOOPT, NUM_CPU_THREADS
  dev = Device[device]
  key = (device, repr(dev.renderer), ast, NUM_CPU_THREADS.value, NOOPT.value)
  if key not in _pack_plans:
    plan = plan_packing(ast, dev.renderer) if dev.compiler is not None else None
    _pack_plans[key] = plan if plan is not None and plan.scratch_slot == nbufs else None
  return _pack_plans[key]

# A B operand that no call of its schedule writes (a weight between optimizer steps, a frozen layer's) and that has no
# host view (Buffer.exposed: a KV cache written through numpy) is packed into a scratch buffer kept with it while it
# lives, and its PACK call is skipped while the copy is fresh: neither the source's write count (Buffer.writes) nor
# the scratch's moved since the pack ran (a transformer block re-packed 11 MB of weights per call). The engine asks
# `pack_is_fresh` before a PACK call and says `note_packed` after one; TinyJit runs such packs before a replay, where
# stale.
_kept: weakref.WeakKeyDictionary[Buffer, dict[tuple[int, UOp], Buffer]] = weakref.WeakKeyDictionary()
_kept_ids: weakref.WeakValueDictionary[int, Buffer] = weakref.WeakValueDictionary()
# id(scratch) -> (the source's base, its writes, the scratch's writes); the source by reference, not by id: a new
# buffer may take a dead one's id and write count (a JIT input made afresh per call)
_fresh: dict[int, tuple[weakref.ref[Buffer], int, int]] = {}

def _kept_scratch(src: Buffer, plan: PackPlan) -> Buffer:
  per = _kept.setdefault(src.base, {})
  if (scratch := per.get(key := (src.offset, plan.pack))) is None:
    scratch = per[key] = Buffer(src.device, plan.size, plan.dtype)
    _kept_ids[id(scratch)] = scratch
    _fresh.pop(id(scratch), None)  # a record of a dead scratch that had this id
  return scratch

def is_kept(scratch: Buffer) -> bool:
  """Whether `scratch` holds a packed copy kept between calls."""
  return _kept_ids.get(id(scratch)) is scratch

def pack_is_fresh(scratch: Buffer, src: Buffer) -> bool:
  """Whether the kept `scratch` holds `src` packed as it is now (nothing wrote either since `note_packed`)."""
  if not is_kept(scratch) or src.base.exposed or (rec := _fresh.get(id(scratch))) is None: return False
  return rec[0]() is src.base and rec[1:] == (src.base.writes, scratch.base.writes)

def note_packed(scratch: Buffer, src: Buffer) -> None:
  """A PACK call just copied `src` into `scratch`."""
  if is_kept(scratch): _fresh[id(scratch)] = (weakref.ref(src.base), src.base.writes, scratch.base.writes)

def _written(items: list[ScheduleItem]) -> set[int]:
  """The base buffers (ids) the items write: a copy's destination, the params a scheduled kernel stores to, every
  buffer of a hand-written kernel."""
  out: set[int] = set()
  for it in items:
    ast = it.ast
    if it.kind is CallKind.COPY or ast is None: out.add(id(it.bufs[0].base))
    elif ast.op is Ops.SINK and ast.arg.name is None:
      slots = {n.src[0].src[0].arg for n in ast.toposort() if n.op is Ops.STORE and n.src[0].op is Ops.INDEX
               and n.src[0].src[0].op is Ops.PARAM}
      out |= {id(b.base) for i, b in enumerate(it.bufs) if i in slots or not slots}
    else: out |= {id(b.base) for b in it.bufs}
  return out

def pack_operands(items: list[ScheduleItem]) -> list[ScheduleItem]:
  """A kernel whose renderer packs its B operand (codegen/pack.py) runs as a PACK call into a scratch buffer, then the
  kernel over the packed copy; the scratch buffer is an ordinary buffer the memory planner places, or one kept with
  a B no item writes (`_kept`)."""
  out: list[ScheduleItem] = []
  written = _written(items)
  for it in items:
    ast = it.ast if it.kind is CallKind.KERNEL else None
    scheduled = ast is not None and ast.op is Ops.SINK and ast.arg.name is None  # hand-written kernels run as written
    plan = _pack_plan(it.device, ast, len(it.bufs)) if ast is not None and scheduled else None
    if plan is None:
      out.append(it)
      continue
    src = it.bufs[plan.src_slot]
    # a B written by this schedule, or through a host view, is packed into an ordinary scratch buffer every time
    keep = id(src.base) not in written and not src.base.exposed
    scratch = _kept_scratch(src, plan) if keep else Buffer(it.device, plan.size, plan.dtype)
    out.append(ScheduleItem(CallKind.PACK, it.device, [scratch, it.bufs[plan.src_slot]], plan.pack))
    out.append(ScheduleItem(CallKind.KERNEL, it.device, [*it.bufs, scratch], it.ast, it.var_vals, packed=plan))
  return out

def create_schedule(targets: list[UOp], order_overwrites: bool = True) -> tuple[list[ScheduleItem], dict[UOp, UOp]]:
  """The calls that compute `targets`, and what each realized target becomes (a buffer view). `order_overwrites`:
  each ASSIGN after the kernels reading the old value of what it overwrites (`_overwrites_last`), else in dependency
  order only."""
  if (tracer := uop_rewrite.TRACER) is not None and targets:  # VIZ shows the graph this schedule cuts into kernels
    tracer.record_graph("tensor graph", targets[0].sink(*targets[1:]))
  from ember.codegen import timed_pass
  with timed_pass("schedule"): calls, becomes, bitcast_views = lower_schedule(targets, order_overwrites)
  items, pinned = bind_buffers(calls, bitcast_views)
  with timed_pass("plan packing"): items = pack_operands(items)
  held = {id(buffer_of(r)) for r in becomes.values() if r.base.op is Ops.BUFFER} | pinned
  held |= {id(it.bufs[0]) for it in items if it.kind is CallKind.PACK and is_kept(it.bufs[0])}
  return memory_plan(items, held), becomes

# a free pool block serves a smaller buffer only while the buffer fills at least this share of it: a small temporary
# must not pin a large block that a later large one needs
MIN_FILL = 4

def memory_plan(items: list[ScheduleItem], held: set[int]) -> list[ScheduleItem]:
  """Reuse the memory of intermediate buffers: one that is dead before another is first written can hold it.

  Intermediates go into pool blocks in the order they are first written. A block that is free (its last reader ran
  before the buffer's first write) on the same device with the same options serves the buffer: an exact size match
  first, else the smallest block at least as large (best fit) that the buffer fills to at least 1/MIN_FILL, else the
  largest smaller block grows to the buffer's size. A block whose buffers all match in size and dtype is the first
  buffer itself; any other is one byte arena that its buffers view at offset 0 (on devices whose allocator has
  views; elsewhere only exact matches share)."""
  span: dict[int, list[int]] = {}
  for i, it in enumerate(items):
    for j, b in enumerate(it.bufs):
      fresh = j == 0 and id(b) not in span and id(b) not in held and not b.is_allocated and b._base is None
      if fresh: span[id(b)] = [i, i]
      if id(b) in span: span[id(b)][1] = i
  blocks: list[_Block] = []
  placed: set[int] = set()
  for i, it in enumerate(items):
    out = it.bufs[0]
    if id(out) not in span or span[id(out)][0] != i or id(out) in placed: continue
    placed.add(id(out))
    free = [blk for blk in blocks if blk.last < i and blk.device == out.device and blk.options == out.options]
    blk = _fit(free, out)
    if blk is None: blocks.append(blk := _Block(out.device, out.options, hasattr(out.allocator, "_offset")))
    blk.uniform = not blk.bufs or blk.exact(out)
    blk.bufs.append(out)
    blk.nbytes, blk.last = max(blk.nbytes, out.nbytes), span[id(out)][1]
  assign = {id(b): phys for blk in blocks for b, phys in blk.placements()}
  for it in items: it.bufs = [assign.get(id(b), b) for b in it.bufs]
  return items

@dataclass(eq=False)
class _Block:
  """One allocation of the memory plan and the buffers it holds, one after another."""
  device: str
  options: Any
  views: bool  # the device's allocator makes views, so buffers of other sizes or dtypes may share this block
  bufs: list[Buffer] = field(default_factory=list)
  nbytes: int = 0
  last: int = -1  # index of the item that last uses the block
  uniform: bool = True  # all its buffers match the first in size and dtype: the first buffer is the block
  def exact(self, b: Buffer) -> bool:
    return self.uniform and self.bufs[0].nbytes == b.nbytes and self.bufs[0].dtype == b.dtype
  def placements(self) -> list[tuple[Buffer, Buffer]]:
    if self.uniform: return [(b, self.bufs[0]) for b in self.bufs]
    arena = Buffer(self.device, self.nbytes, dtypes.uint8, self.options)
    return [(b, arena.view(b.size, b.dtype, 0)) for b in self.bufs]

def _fit(free: list[_Block], b: Buffer) -> _Block | None:
  """The free block `b` goes into: exact match, best fit within MIN_FILL, else the largest smaller block to grow."""
  if exact := [blk for blk in free if blk.exact(b)]: return exact[0]
  if not hasattr(b.allocator, "_offset"): return None
  n, free = b.nbytes, [blk for blk in free if blk.views]
  if fits := [blk for blk in free if n <= blk.nbytes <= max(n * MIN_FILL, 1)]: return min(fits, key=lambda x: x.nbytes)
  if smaller := [blk for blk in free if blk.nbytes < n]: return max(smaller, key=lambda x: x.nbytes)
  return None
