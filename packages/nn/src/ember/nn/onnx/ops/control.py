"""Control flow (If, Loop, Scan), sequences and optionals.

Bodies are traced: an If reads its condition (realizing it) and runs one branch; a Loop runs its body in Python once
per iteration, so trip counts and conditions are read each step. A sequence value is a Python list of Tensors, an empty
optional is None."""
from __future__ import annotations
from typing import Any
from ember import Tensor, dtypes
from ember.errors import EmberError, ShapeError
from ember.nn.onnx.errors import UnsupportedOpError
from ember.nn.onnx.registry import NodeContext, onnx_op
from ember.nn.onnx.ops.common import dim, axis as norm_axis, ints, scalar

@onnx_op("If", ctx=True)
def if_(cond: Tensor, then_branch: Any, else_branch: Any, *, ctx: NodeContext) -> list[Any]:
  return ctx.run_graph(then_branch if bool(scalar(cond)) else else_branch, [], ctx.scope)

@onnx_op("Loop", ctx=True)
def loop(trip_count: Tensor | None, cond: Tensor | None, *carried: Any, body: Any, ctx: NodeContext) -> list[Any]:
  limit = int(scalar(trip_count)) if trip_count is not None else None
  keep_going = bool(scalar(cond)) if cond is not None else True
  values = list(carried)
  n_carried = len(values)
  scans: list[list[Tensor]] | None = None
  i = 0
  while keep_going and (limit is None or i < limit):
    out = ctx.run_graph(body, [Tensor(i, dtype=dtypes.int64, device=ctx.device),
                               Tensor(keep_going, dtype=dtypes.bool, device=ctx.device), *values], ctx.scope)
    keep_going, values = bool(scalar(out[0])), out[1:1 + n_carried]
    if scans is None: scans = [[] for _ in out[1 + n_carried:]]
    for acc, t in zip(scans, out[1 + n_carried:]): acc.append(t)
    i += 1
  if scans is None: return [*values, *_empty_scans(body, values, len(ctx.outputs) - n_carried, ctx)]
  return [*values, *[acc[0].stack(*acc[1:], dim=0) for acc in scans]]

def _empty_scans(body: Any, carried: list[Any], n_scan: int, ctx: NodeContext) -> list[Tensor]:
  """The scan outputs of a Loop that ran no iteration: (0, *shape) of what the body would emit, as ONNX Runtime
  infers it. The body is traced once, lazily (nothing of it is computed unless it reads a value to decide); where
  that fails, the shapes the body declares are used if they are fully known."""
  if not n_scan: return []
  specs = body.outputs[-n_scan:]
  try:
    out = ctx.run_graph(body, [Tensor(0, dtype=dtypes.int64, device=ctx.device),
                               Tensor(True, dtype=dtypes.bool, device=ctx.device), *carried], ctx.scope)
    return [Tensor.zeros(0, *t.shape, dtype=t.dtype, device=ctx.device) for t in out[-n_scan:]]
  except EmberError as e:
    if all(s.shape is not None and s.dtype is not None and all(isinstance(d, int) for d in s.shape) for s in specs):
      return [Tensor.zeros(0, *s.shape, dtype=s.dtype, device=ctx.device) for s in specs]
    raise UnsupportedOpError(f"Loop ran zero iterations and the shape of its scan outputs is unknown: tracing its "
                             f"body failed ({e}) and the body declares no full shape for "
                             f"{[s.name for s in specs]}") from e

@onnx_op("Scan", since=9, ctx=True)
def scan(*inputs: Tensor, body: Any, num_scan_inputs: int, scan_input_axes: list[int] | None = None,
         scan_input_directions: list[int] | None = None, scan_output_axes: list[int] | None = None,
         scan_output_directions: list[int] | None = None, ctx: NodeContext) -> list[Any]:
  n_state = len(inputs) - num_scan_inputs
  state, xs = list(inputs[:n_state]), list(inputs[n_state:])
  in_axes = [norm_axis(a, x.ndim) for a, x in zip(scan_input_axes or [0] * len(xs), xs)]
  in_dirs = scan_input_directions or [0] * len(xs)
  steps = {dim(x, a) for x, a in zip(xs, in_axes)}
  if len(steps) != 1: raise ShapeError(f"Scan inputs have different lengths along their scan axes: {sorted(steps)}")
  n = steps.pop()
  outs: list[list[Tensor]] = []
  for t in range(n):
    slices = []
    for x, a, d in zip(xs, in_axes, in_dirs):
      j = n - 1 - t if d else t
      slices.append(x.shrink([(j, j + 1) if k == a else None for k in range(x.ndim)]).squeeze(a))
    res = ctx.run_graph(body, [*state, *slices], ctx.scope)
    state = res[:n_state]
    if not outs: outs = [[] for _ in res[n_state:]]
    for acc, v in zip(outs, res[n_state:]): acc.append(v)
  if n == 0:  # no step ran: the final state is the initial one and each scan output is empty along its axis
    sample = [Tensor.zeros(*[d for k, d in enumerate(x.shape) if k != a], dtype=x.dtype, device=ctx.device)
              for x, a in zip(xs, in_axes)]
    ys = ctx.run_graph(body, [*state, *sample], ctx.scope)[n_state:]  # traced lazily, for the shapes only
    axes = [norm_axis(a, y.ndim + 1) for a, y in zip(scan_output_axes or [0] * len(ys), ys)]
    return [*state, *[Tensor.zeros(*y.shape[:a], 0, *y.shape[a:], dtype=y.dtype, device=ctx.device)
                      for y, a in zip(ys, axes)]]
  out_axes = scan_output_axes or [0] * len(outs)
  out_dirs = scan_output_directions or [0] * len(outs)
  stacked = []
  for acc, a, d in zip(outs, out_axes, out_dirs):
    seq = acc[::-1] if d else acc
    stacked.append(seq[0].stack(*seq[1:], dim=norm_axis(a, seq[0].ndim + 1)))
  return [*state, *stacked]

# ** sequences **

@onnx_op("SequenceConstruct", since=11)
def sequence_construct(*xs: Tensor) -> list[Tensor]: return list(xs)

@onnx_op("SequenceEmpty", since=11)
def sequence_empty(dtype: int | None = None) -> list[Tensor]: return []

def _position(pos: Tensor | None, n: int, default: int) -> int:
  p = int(scalar(pos)) if pos is not None else default
  return p + n if p < 0 else p

@onnx_op("SequenceAt", since=11)
def sequence_at(seq: list[Tensor], pos: Tensor) -> Tensor: return seq[_position(pos, len(seq), 0)]

@onnx_op("SequenceInsert", since=11)
def sequence_insert(seq: list[Tensor], t: Tensor, pos: Tensor | None = None) -> list[Tensor]:
  out = list(seq)
  out.insert(_position(pos, len(seq), len(seq)), t)
  return out

@onnx_op("SequenceErase", since=11)
def sequence_erase(seq: list[Tensor], pos: Tensor | None = None) -> list[Tensor]:
  out = list(seq)
  del out[_position(pos, len(seq), len(seq) - 1)]
  return out

@onnx_op("SequenceLength", since=11)
def sequence_length(seq: list[Tensor]) -> Tensor: return Tensor(len(seq), dtype=dtypes.int64)

@onnx_op("SplitToSequence", since=11)
def split_to_sequence(x: Tensor, split: Tensor | None = None, axis: int = 0, keepdims: int = 1) -> list[Tensor]:
  a = norm_axis(axis, x.ndim)
  size = dim(x, a)
  if split is None:
    parts = [x.shrink([(j, j + 1) if k == a else None for k in range(x.ndim)]) for j in range(size)]
    return parts if keepdims else [p.squeeze(a) for p in parts]
  sizes = ints(split) or []
  if split.ndim == 0: sizes = [sizes[0]] * (size // sizes[0]) + ([size % sizes[0]] if size % sizes[0] else [])
  out, start = [], 0
  for s in sizes:
    out.append(x.shrink([(start, start + s) if k == a else None for k in range(x.ndim)]))
    start += s
  return out

@onnx_op("ConcatFromSequence", since=11)
def concat_from_sequence(seq: list[Tensor], axis: int, new_axis: int = 0) -> Tensor:
  if new_axis: return seq[0].stack(*seq[1:], dim=norm_axis(axis, seq[0].ndim + 1))
  return seq[0].cat(*seq[1:], dim=norm_axis(axis, seq[0].ndim))

@onnx_op("SequenceMap", since=17, ctx=True)
def sequence_map(seq: list[Tensor], *extra: Any, body: Any, ctx: NodeContext) -> Any:
  results: list[list[Tensor]] = []
  for i, t in enumerate(seq):
    args = [t, *(e[i] if isinstance(e, list) else e for e in extra)]
    out = ctx.run_graph(body, args, ctx.scope)
    if not results: results = [[] for _ in out]
    for acc, v in zip(results, out): acc.append(v)
  if not results: results = [[] for _ in ctx.outputs]
  return results[0] if len(results) == 1 else tuple(results)

# ** optionals **

@onnx_op("Optional", since=15)
def optional(x: Any = None, type: Any = None) -> Any: return x  # noqa: A002

@onnx_op("OptionalHasElement", since=15)
def optional_has_element(x: Any = None) -> Tensor: return Tensor(x is not None, dtype=dtypes.bool)

@onnx_op("OptionalGetElement", since=15)
def optional_get_element(x: Any) -> Any:
  if x is None: raise ShapeError("OptionalGetElement of an empty optional")
  return x
