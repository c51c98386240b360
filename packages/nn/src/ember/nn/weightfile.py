"""What the weight-file readers share: the typed error every malformed file raises, the size and range checks made
before anything is allocated, and lazy Tensors over byte ranges of a file.

The readers (safetensors in `ember.nn.state`, PyTorch zip checkpoints in `ember.nn.pth`, GGUF in `ember.nn.gguf`)
treat a file as untrusted: every count, length, shape and offset it holds is checked against the file's size before it
sizes an allocation or a loop, names are unique, tensors' byte ranges do not overlap, and nesting is bounded. Whatever
is wrong raises a `WeightFormatError` subclass naming the file, the byte offset and the field.

>>> fb = FileBytes("model.safetensors")  # doctest: +SKIP
>>> fb.tensor(offset=128, count=10, dtype=dtypes.float32).numpy()  # doctest: +SKIP  (read when realized)
"""
from __future__ import annotations
import os
from ember.device.base import Buffer
from ember.dtype import DType, dtypes
from ember.errors import EmberError
from ember.schedule import attach_buffer
from ember.tensor import Tensor
from ember.uop.ops import BufferArg, Ops, UOp, next_unique

INT64_MAX = 2**63 - 1

class WeightFormatError(EmberError, ValueError):
  """A weight file is truncated, corrupt, inconsistent or in a layout its reader does not handle. Each format's error
  (`SafetensorsError`, `CheckpointError`, `GGUFError`) is one of these."""

def check_shape(error: type[WeightFormatError], where: str, shape: object, itemsize: int) -> tuple[int, ...]:
  """`shape` as a tuple of ints, each >= 0, whose nonzero dims times `itemsize` fit in int64 (as numpy requires even
  of an empty array); `where` names the file, offset and field in the error."""
  if not isinstance(shape, (list, tuple)) or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
    raise error(f"{where}: the shape must be a list of integers, got {shape!r}")
  if any(d < 0 for d in shape): raise error(f"{where}: the shape {tuple(shape)} has a negative dimension")
  nbytes = itemsize
  for d in shape:
    nbytes *= max(d, 1)
    if nbytes > INT64_MAX:
      raise error(f"{where}: the shape {tuple(shape)} of {itemsize}-byte elements overflows int64 bytes")
  return tuple(shape)

def check_disjoint(error: type[WeightFormatError], path: str, ranges: list[tuple[str, int, int]],
                   what: str = "tensor") -> None:
  """Refuse two named byte ranges [begin, end) that share a byte (empty ranges share none)."""
  spans = sorted((begin, end, name) for name, begin, end in ranges if end > begin)
  for (b0, e0, n0), (b1, e1, n1) in zip(spans, spans[1:]):
    if b1 < e0:
      raise error(f"{path}: {what} {n1!r} at bytes {b1}..{e1} overlaps {what} {n0!r} at bytes {b0}..{e0}; each "
                  f"{what} needs its own bytes")

class FileBytes:
  """A file on the DISK device: lazy Tensors over its byte ranges, memory-mapped when realized."""
  def __init__(self, path: str):
    self.path, self.size = os.path.abspath(path), os.path.getsize(path)
    self.device = f"disk:{self.path}"
    self.base = Buffer(self.device, self.size, dtypes.uint8)

  def tensor(self, offset: int, count: int, dtype: DType, device: str | None = "disk") -> Tensor:
    """A lazy (count,) Tensor of `dtype` at byte `offset`, copied to `device` ("disk": left on the file; None: the
    default device) when realized. The caller has checked the range against the file's size."""
    if count == 0: return Tensor.zeros(0, dtype=dtype, device=None if device == "disk" else device)
    assert 0 <= offset and offset + count * dtype.itemsize <= self.size, (offset, count, dtype, self.size)
    uop = UOp(Ops.BUFFER, dtype, (), BufferArg(next_unique(), self.device, count))
    attach_buffer(uop, Buffer(self.device, count, dtype, base=self.base, offset=offset))
    t = Tensor(uop)
    return t if device == "disk" else t.to(device)

__all__ = ["WeightFormatError", "FileBytes", "check_shape", "check_disjoint", "INT64_MAX"]
