"""What the weight-file readers share: the typed error every malformed file raises, and the size and range checks made
before anything is allocated. Each reader makes its tensors with `Tensor.from_file` (lazy, over a byte range of the
memory-mapped file) once the ranges are checked.

The readers (safetensors in `ember.nn.state`, PyTorch zip checkpoints in `ember.nn.pth`, GGUF in `ember.nn.gguf`)
treat a file as untrusted: every count, length, shape and offset it holds is checked against the file's size before it
sizes an allocation or a loop, names are unique, tensors' byte ranges do not overlap, and nesting is bounded. Whatever
is wrong raises a `WeightFormatError` subclass naming the file, the byte offset and the field.

>>> check_shape(WeightFormatError, "model.bin: tensor 'w' at offset 8", [2, 3], itemsize=4)
(2, 3)
"""
from __future__ import annotations
from ember.errors import EmberError

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

__all__ = ["WeightFormatError", "check_shape", "check_disjoint", "INT64_MAX"]
