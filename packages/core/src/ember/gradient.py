"""Autograd: gradient rules over tensor-level UOps, applied in reverse topological order.

Each rule maps (the node's output gradient, the node) to one gradient per source (None: no gradient flows there).
Rules are written with Tensor methods on wrapped UOps so the backward graph fuses like any forward graph.
"""
from __future__ import annotations
import math
from typing import Callable
from ember.dtype import dtypes
from ember.uop.ops import Ops, UOp

def _t(u: UOp):
  from ember.tensor import Tensor
  return Tensor(u)

def _reduce_grad(g, node: UOp):
  x = _t(node.src[0])
  op, axes = node.arg
  if op is Ops.ADD: return (g.expand(x.shape),)
  out = _t(node)
  if op is Ops.MAX:
    top = out.expand(x.shape)
    # NaN is the max where it occurs (it propagates): the gradient goes to the NaN elements, as in torch
    is_max = ((x == top) | (x.isnan() & top.isnan())).cast(g.dtype)
    count = is_max.sum(axes, keepdim=True).expand(x.shape)
    return ((is_max / count) * g.expand(x.shape),)
  if op is Ops.MUL:
    # d(prod)/dx_i = prod of the others; computed without dividing by x so zeros are handled
    return (_prod_others(x, axes) * g.expand(x.shape),)
  from ember.errors import GradientError
  raise GradientError(f"no gradient for reduce {op}")

def _prod_others(x, axes: tuple[int, ...]):
  """For each element, the product of all other elements along `axes` (exclusive products from both sides)."""
  from ember.tensor import Tensor
  flat_axes = list(axes)
  keep = [i for i in range(x.ndim) if i not in flat_axes]
  perm = keep + flat_axes
  xp = x.permute(perm)
  kept_shape = tuple(x.shape[i] for i in keep)
  n = 1
  for a in flat_axes: n *= x.shape[a]
  xf = xp.reshape(*kept_shape, n)
  ones = Tensor.ones(*kept_shape, 1, dtype=x.dtype, device=x.device)
  # prefix[i] = prod(x[:i]), suffix[i] = prod(x[i+1:]) via masked products over an (n, n) window
  idx = Tensor.arange(n, device=x.device)
  mask = idx.reshape(n, 1) != idx.reshape(1, n)  # (n, n): True where j != i
  expanded = xf.unsqueeze(-2).expand(*kept_shape, n, n)
  others = mask.where(expanded, ones.unsqueeze(-1).expand(*kept_shape, n, n)).prod(-1)
  inv = [0] * len(perm)
  for i, p in enumerate(perm): inv[p] = i
  return others.reshape(*kept_shape, *(x.shape[a] for a in flat_axes)).permute(inv)

def _max_grad(g, node: UOp):
  a, b = _t(node.src[0]), _t(node.src[1])
  # torch's rule: the larger side gets g, a tie splits it, and with NaN on either side both get g
  ga = (a < b).where(0.0, (a == b).where(g * 0.5, g))
  gb = (b < a).where(0.0, (a == b).where(g * 0.5, g))
  return ga, gb

def _pad_grad(g, node: UOp):
  return (g.shrink(tuple((b, b + s) for (b, _), s in zip(node.arg, node.src[0].shape))),)

def _shrink_grad(g, node: UOp):
  return (g.pad(tuple((b, s - e) for (b, e), s in zip(node.arg, node.src[0].shape))),)

def _expand_grad(g, node: UOp):
  src_shape = node.src[0].shape
  axes = tuple(i for i, (s, n) in enumerate(zip(src_shape, node.arg)) if s != n)
  acc = dtypes.float32 if g.dtype in (dtypes.float16, dtypes.bfloat16) else g.dtype
  return (g.cast(acc).sum(axes, keepdim=True).cast(g.dtype),)

ROW_LANES = 16  # float32 lanes of a 64-byte line (an AVX-512 register): a kernel's stores vectorise along its rows

def _sum_in_permuted_order(shape: tuple, order: tuple[int, ...]) -> bool:
  """Whether a gradient sum of `shape` followed by the permute back to `order`'s source is better computed in that
  order: where the rows it would then store are whole lines (a multiple of ROW_LANES) or no shorter than its own.
  A weight of 10 columns keeps its sum in the (10, n) order and the small transposing copy: stored 10 to a row, the
  sum's multiply-adds stayed scalar (0.7 ms against 0.03 ms + 4 us for a (512, 10) weight gradient)."""
  inv = [0] * len(order)
  for i, p in enumerate(order): inv[p] = i
  old, new = shape[-1], shape[inv[-1]]
  if not isinstance(old, int) or not isinstance(new, int): return False
  return new % ROW_LANES == 0 or new >= old

def _permute_grad(g, node: UOp):
  inv = [0] * len(node.arg)
  for i, p in enumerate(node.arg): inv[p] = i
  if g.uop.op is Ops.REDUCE_AXIS and _sum_in_permuted_order(g.uop.shape, node.arg):
    # a sum arriving here (an expand's gradient: a matmul's weight, whose forward read it transposed) is computed in
    # the permuted order instead of being permuted after: its kernel stores the gradient in the layout its consumer
    # (the optimizer, of the weight's shape) reads, with no transposing copy after it
    op, axes = g.uop.arg
    src = _t(g.uop.src[0]).permute(inv).uop
    return (_t(UOp(Ops.REDUCE_AXIS, g.uop.dtype, (src,), (op, tuple(sorted(node.arg[a] for a in axes))))),)
  return (g.permute(inv),)

LN2 = math.log(2)

def _custom_kernel_grad(g, node: UOp):
  """A custom kernel's backward is its `grad_fxn(grad of the first output, kernel)`: one gradient per input."""
  from ember.errors import GradientError
  info = node.arg
  if info.grad_fxn is None:
    raise GradientError(f"custom kernel {info.ast.arg.name if info.ast.op is Ops.SINK else 'program'} has no "
                        "gradient; pass grad_fxn= to Tensor.custom_kernel")
  grads = tuple(info.grad_fxn(g.uop, node))
  if len(grads) != len(node.src):
    raise GradientError(f"grad_fxn returned {len(grads)} gradients for a custom kernel of {len(node.src)} inputs; "
                        "return one per input (None where none flows)")
  return tuple(None if x is None else _t(x) if isinstance(x, UOp) else x for x in grads)

def custom_gradient(value, inputs: tuple, backward: Callable):
  """`value` (a Tensor computed from `inputs`) whose gradient is `backward(grad, *inputs)`, one gradient (or None) per
  input, instead of what autograd would derive from value's own graph: for a backward that is cheaper written another
  way than the transpose of the forward graph (a convolution's input gradient as a transposed convolution)."""
  from ember.tensor import Tensor
  uop = UOp(Ops.CUSTOM_GRAD, value.dtype, (value.uop, *(x.uop for x in inputs)), backward)
  return Tensor(uop, requires_grad=value.requires_grad)

def _custom_grad(g, node: UOp):
  from ember.errors import GradientError
  grads = tuple(node.arg(g, *(_t(s) for s in node.src[1:])))
  if len(grads) != len(node.src) - 1:
    raise GradientError(f"a custom gradient returned {len(grads)} gradients for {len(node.src) - 1} inputs")
  return (None, *grads)

grad_rules: dict[Ops, Callable] = {
  Ops.CAST: lambda g, n: (g.cast(n.src[0].dtype),) if dtypes.is_float(n.src[0].dtype) else (None,),
  Ops.NEG: lambda g, n: (-g,),
  Ops.RECIPROCAL: lambda g, n: (-g * _t(n) * _t(n),),
  Ops.SIN: lambda g, n: (_t(n.src[0]).cos() * g,),
  Ops.LOG2: lambda g, n: (g / (_t(n.src[0]) * LN2),),
  Ops.EXP2: lambda g, n: (g * _t(n) * LN2,),
  Ops.SQRT: lambda g, n: (g / (_t(n) * 2),),
  Ops.TRUNC: lambda g, n: (g * 0,),
  Ops.ADD: lambda g, n: (g, g),
  Ops.SUB: lambda g, n: (g, -g),
  Ops.MUL: lambda g, n: (g * _t(n.src[1]), g * _t(n.src[0])),
  Ops.FDIV: lambda g, n: (g / _t(n.src[1]), -g * _t(n.src[0]) / (_t(n.src[1]) * _t(n.src[1]))),
  Ops.MAX: _max_grad,
  Ops.WHERE: lambda g, n: (None, _t(n.src[0]).where(g, 0.0), _t(n.src[0]).where(0.0, g)),
  Ops.REDUCE_AXIS: _reduce_grad,
  Ops.RESHAPE: lambda g, n: (g.reshape(n.src[0].shape),),
  Ops.PERMUTE: _permute_grad,
  Ops.EXPAND: _expand_grad,
  Ops.PAD: _pad_grad,
  Ops.SHRINK: _shrink_grad,
  Ops.FLIP: lambda g, n: (g.flip([i for i, f in enumerate(n.arg) if f]),),
  Ops.CONTIGUOUS: lambda g, n: (g,),
  Ops.CONTIGUOUS_BACKWARD: lambda g, n: (g.contiguous(),),
  Ops.COPY: lambda g, n: (g.to(n.src[0].device), None),
  # a custom kernel's output (its input buffer after it ran): the gradient goes to the kernel
  Ops.AFTER: lambda g, n: (None, g),
  Ops.CUSTOM_KERNEL: _custom_kernel_grad,
  Ops.CUSTOM_GRAD: _custom_grad,
}

# piecewise-constant or non-differentiable ops: no gradient flows through them (it is zero, not an error)
NO_GRADIENT = {Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ, Ops.IDIV, Ops.MOD, Ops.AND, Ops.OR, Ops.XOR, Ops.SHL, Ops.SHR,
               Ops.BITCAST, Ops.ASSIGN, Ops.DETACH, Ops.CONST, Ops.BUFFER}

def compute_gradient(root: UOp, root_grad: UOp, targets: set[UOp]) -> dict[UOp, UOp]:
  """Gradients of `root` (seeded with `root_grad`) with respect to every node on a path to a target."""
  # nodes that lead to a target: only these need gradients
  topo = list(root.toposort())
  leads: dict[UOp, bool] = {}
  for node in topo:
    leads[node] = node in targets or (node.op is not Ops.DETACH and any(leads.get(s, False) for s in node.src))
  grads: dict[UOp, object] = {root: _t(root_grad)}
  for node in reversed(topo):
    if node not in grads or node in targets and node is not root and not node.src: continue
    if not leads[node] or not node.src: continue
    rule = grad_rules.get(node.op)
    if rule is None:
      if any(leads.get(s, False) for s in node.src) and node.op not in NO_GRADIENT:
        from ember.errors import GradientError
        raise GradientError(f"no gradient rule for {node.op.name}")
      continue
    g = grads[node]
    for src, sg in zip(node.src, rule(g, node)):
      if sg is None or not leads.get(src, False): continue
      grads[src] = sg if src not in grads else grads[src] + sg
  return {k: v.uop for k, v in grads.items() if k in targets}  # type: ignore[attr-defined]
