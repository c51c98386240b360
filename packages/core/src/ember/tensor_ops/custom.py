"""`Tensor.custom_kernel`: run a kernel written by hand in the UOp IR (or as source text) over tensors' buffers.

`fxn` gets one placeholder per input (a GLOBAL `UOp.placeholder` of the input's shape and dtype, argument slot i) and
returns the kernel: a SINK of statements (`buf[i].store(v).end(i).sink()`, see ember.codegen.handwritten), or a
PROGRAM of a SINK, a SOURCE and optionally a BINARY (a kernel written as source text). The result is one tensor per
input: input i's buffer once the kernel ran (the kernel writes its outputs into its inputs). An input that is not one
whole buffer (a view, a lazy result) is first computed into a buffer of its own.

`grad_fxn(grad, kernel)` is the kernel's backward: `grad` is the gradient of the first output (a UOp), `kernel` the
CUSTOM_KERNEL UOp whose sources are the inputs; it returns one gradient (a UOp or Tensor, or None) per input.
"""
from __future__ import annotations
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable
from ember.dtype import dtypes
from ember.errors import DTypeError, ShapeError, DeviceError
from ember.uop.ops import Ops, UOp, KernelInfo, int_shape
if TYPE_CHECKING:
  from ember.tensor import Tensor, _is_contiguous_buffer

LATE_NAMES = ("Tensor", "_is_contiguous_buffer")

@dataclass(frozen=True, eq=False)
class CustomKernel:
  """The arg of a CUSTOM_KERNEL UOp: the kernel (a SINK or PROGRAM over placeholders), its backward and the device."""
  ast: UOp
  device: str
  grad_fxn: Callable[..., Any] | None = None

def _kernel_name(fxn: Callable[..., Any]) -> str:
  name = re.sub(r"\W", "_", getattr(fxn, "__name__", "kernel"))
  return f"custom_{name}" if name != "_lambda_" else "custom_kernel"

def _named(ast: Any, fxn: Callable[..., Any]) -> UOp:
  """The kernel `fxn` returned, its SINK named (a SINK without a named KernelInfo gets the function's name)."""
  if not isinstance(ast, UOp) or ast.op not in (Ops.SINK, Ops.PROGRAM):
    raise DTypeError(f"custom_kernel: fxn must return a kernel SINK (stmt.sink()) or a PROGRAM UOp, got "
                     f"{getattr(ast, 'op', type(ast).__name__)}")
  sink = ast if ast.op is Ops.SINK else ast.src[0]
  if sink.op is not Ops.SINK: raise DTypeError(f"custom_kernel: a PROGRAM's first source is its SINK, not {sink.op}")
  if isinstance(sink.arg, KernelInfo) and sink.arg.name is not None: return ast
  named = sink.replace(arg=KernelInfo(name=_kernel_name(fxn)))
  return named if ast.op is Ops.SINK else ast.replace(src=(named, *ast.src[1:]))

class CustomMixin:
  __slots__ = ()
  @staticmethod
  def custom_kernel(*tensors: Tensor, fxn: Callable[..., UOp], grad_fxn: Callable[..., Any] | None = None) \
      -> tuple[Tensor, ...]:
    """Run the kernel `fxn(*placeholders)` builds over the buffers of `tensors`; returns each input after the kernel.
    Sharded inputs (all over the same devices) run it once per device, over that device's shards.

    >>> from ember import UOp
    >>> from ember.uop.ops import AxisType
    >>> def add_one(out: UOp, x: UOp) -> UOp:
    ...   i = UOp.range(x.shape[0], 0, AxisType.GLOBAL)
    ...   return out[i].store(x[i] + 1).end(i).sink()
    >>> x = Tensor([1.0, 2.0, 3.0])
    >>> Tensor.custom_kernel(Tensor.empty_like(x), x, fxn=add_one)[0].tolist()
    [2.0, 3.0, 4.0]
    """
    if not tensors: raise ShapeError("custom_kernel needs at least one tensor (the kernel writes into its inputs)")
    if (bad := next((t for t in tensors if not isinstance(t, Tensor)), None)) is not None:
      raise DTypeError(f"custom_kernel takes tensors, got {type(bad).__name__}")
    if any(t.sharding is not None for t in tensors): return _per_shard(tensors, fxn, grad_fxn)
    devices = {t.device for t in tensors}
    if len(devices) != 1:
      raise DeviceError(f"custom_kernel inputs must be on one device, got {sorted(map(str, devices))}; move them with "
                        ".to(device)")
    if (weak := next((t for t in tensors if t.dtype.weak), None)) is not None:
      raise DTypeError(f"custom_kernel: an input of weak dtype {weak.dtype!r} has no buffer; cast it to a concrete "
                       "dtype first")
    # a buffer, or another custom kernel's output (its input's buffer after that kernel) as it is: no copy
    bufs = [t if _is_contiguous_buffer(_under_after(t.uop)) else t.contiguous() for t in tensors]
    # an input given twice (custom_kernel(x, x, ...)) is one kernel argument: buffers of a kernel never overlap
    bases = [_under_after(t.uop).base for t in bufs]
    slot: dict[UOp, int] = {}
    for i, b in enumerate(bases): slot.setdefault(b, i)
    placeholders = [UOp.placeholder(int_shape(t.shape, "custom_kernel"), t.dtype, slot[b]) for t, b in zip(bufs, bases)]
    ast = _named(fxn(*placeholders), fxn)
    device = str(next(iter(devices)))
    kernel = UOp(Ops.CUSTOM_KERNEL, dtypes.void, tuple(t.uop for t in bufs), CustomKernel(ast, device, grad_fxn))
    # output i is input i's buffer after the kernel: later reads of it are ordered after the kernel's writes
    return tuple(Tensor(UOp(Ops.AFTER, t.dtype, (t.uop, kernel))) for t in bufs)

def _under_after(u: UOp) -> UOp:
  """The tensor under custom kernels' outputs (AFTER chains; codegen.handwritten.buffer_of is the same walk over a
  kernel's AST, kept apart so that Tensor does not import codegen)."""
  while u.op is Ops.AFTER: u = u.src[0]
  return u

def _per_shard(tensors: tuple[Tensor, ...], fxn: Callable[..., UOp], grad_fxn: Callable[..., Any] | None) \
    -> tuple[Tensor, ...]:
  """Sharded inputs (all over the same devices): the kernel runs once per device over that device's shards, and each
  output is sharded as its input was."""
  from ember.multi import Sharding
  shardings = [t.sharding for t in tensors]
  devices = {sh.devices if sh is not None else t.device for sh, t in zip(shardings, tensors)}
  if len(devices) != 1 or any(sh is None for sh in shardings):
    raise DeviceError(f"custom_kernel over sharded tensors needs every input sharded over the same devices, got "
                      f"{sorted(map(str, devices))}; shard the others with .shard(devices, axis)")
  sharded = [sh for sh in shardings if sh is not None]
  per_device = [Tensor.custom_kernel(*(sh.shards[d] for sh in sharded), fxn=fxn, grad_fxn=grad_fxn)
                for d in range(len(sharded[0].shards))]
  return tuple(Tensor.from_sharding(Sharding([outs[i] for outs in per_device], sh.axis))
               for i, sh in enumerate(sharded))
