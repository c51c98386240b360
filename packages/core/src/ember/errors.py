"""The typed errors ember raises. Every user-facing error is an `EmberError`; messages name the component, the values
that did not fit, and the fix when there is one.

Each error also subclasses the builtin exceptions torch and numpy raise for the same mistake, so code that catches
builtins (`except IndexError`) works unchanged; docs/errors.md has the table."""
from __future__ import annotations

class EmberError(Exception):
  """Base class of every error ember raises on purpose."""

class ShapeError(EmberError, ValueError, RuntimeError):
  """Shapes or sizes do not fit together (broadcasting, matmul, reshape, cat, negative sizes ...). torch raises
  RuntimeError for these and numpy ValueError: this is both."""

class AxisError(EmberError, IndexError, ValueError):
  """An axis or dimension index is out of range (IndexError as in torch, and ValueError as numpy's AxisError)."""

class IndexRangeError(AxisError, RuntimeError):
  """An index tensor holds a value outside the dim it indexes (gather, scatter, one_hot, embedding ids, loss targets,
  `x[idx]`). torch raises IndexError for some of these and RuntimeError for others: this is both (and ValueError, as an
  AxisError)."""

class EmptyReductionError(ShapeError, IndexError):
  """max/min/argmax over zero elements: there is no identity element to return. torch raises IndexError when a dim
  is given and RuntimeError without one, numpy ValueError: this is all three."""

class ArgumentError(EmberError, ValueError, RuntimeError):
  """An argument outside what the op accepts: an unknown mode or option name, a probability outside [0, 1], an empty
  range (randint with low >= high), a Variable bound outside its range. torch raises ValueError or RuntimeError for
  these: this is both."""

class IntegerDivisionByZeroError(ArgumentError, ZeroDivisionError):
  """An int tensor divided (`//`, `%`, `div(rounding_mode=)`, `fmod`) by a Python 0: torch raises ZeroDivisionError
  (a RuntimeError on its devices). A divisor tensor's zeros are not checked (that would sync): they give 0."""

class ContextKeyError(ArgumentError, KeyError):
  """`Context(...)` given a setting name ember does not know (a KeyError, as a failed dict lookup is)."""

class IndexingError(EmberError, IndexError, TypeError, ValueError):
  """A tensor index ember cannot take: an unsupported index type (str, float), two ellipses, a zero slice step, a
  boolean mask (its result's shape depends on the data). torch raises IndexError or TypeError (ValueError for a zero
  step): this is all three."""

class DTypeError(EmberError, TypeError, RuntimeError):
  """A dtype cannot be used here (bitwise ops on floats, a float index, unknown dtype names ...). torch raises
  RuntimeError for an unsupported dtype and TypeError for a wrong Python type: this is both."""

class DTypeNotImplementedError(DTypeError, NotImplementedError):
  """An op that has no kernel for this dtype (frac, hardshrink or histc of ints, gcd of floats): torch raises
  NotImplementedError (a RuntimeError) there."""

class DeviceError(EmberError, RuntimeError):
  """A device cannot be found, loaded or used."""

class OutOfMemoryError(DeviceError, MemoryError):
  """A device could not allocate a buffer (the host's mmap or malloc, a GPU's heap). A MemoryError too, so code that
  catches MemoryError, and an allocator that frees its cache and retries, treat it as one."""

class PluginError(DeviceError):
  """A backend plugin is broken, incompatible or misconfigured."""

class CompileError(EmberError, RuntimeError):
  """A renderer or compiler failed on a kernel."""

class MemoryAccessError(EmberError, IndexError):
  """A kernel read or wrote outside its buffer (raised by the bounds-checked PYTHON device)."""

class JitError(EmberError, RuntimeError):
  """TinyJit was used in a way it cannot capture or replay."""

class GradientError(EmberError, RuntimeError):
  """Autograd was asked for something it cannot compute."""

class ShardingError(EmberError, RuntimeError):
  """An op cannot run on a sharded tensor as laid out (it would move items between shards, or devices disagree)."""

class VizError(EmberError, ValueError):
  """VIZ was given something it cannot show: a file that is not a saved VIZ trace, an unknown kernel or pass."""

class ProfileError(EmberError, ValueError, RuntimeError):
  """`ember.profile` used the wrong way: a trace path whose folder does not exist, a profile entered twice."""

__all__ = ["EmberError", "ShapeError", "AxisError", "IndexRangeError", "EmptyReductionError", "ArgumentError",
           "IntegerDivisionByZeroError", "ContextKeyError", "IndexingError", "DTypeError", "DTypeNotImplementedError",
           "DeviceError", "OutOfMemoryError", "PluginError",
           "CompileError",
           "MemoryAccessError", "JitError", "GradientError", "ShardingError", "VizError", "ProfileError"]
