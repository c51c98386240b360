"""The NULL device: schedules and compiles like a real device but runs nothing, so tests can count kernels and check
codegen for any target (`DEV=NULL::gfx1100` renders AMD code) without hardware or memory.

Allocations are handles that own no memory, copyin is a no-op, copyout fills the destination with zeros, and every
program returns a time of 0.
"""
from __future__ import annotations
from dataclasses import dataclass
from typing import Any
from ember.device.base import Allocator, BufferSpec, Compiled, Compiler
from ember.renderer import Renderer

@dataclass(frozen=True, eq=False)
class NullHandle:
  """A stand-in for device memory: its size and offset in bytes, nothing else. Compared by identity like a pointer."""
  size: int
  offset: int = 0

class NullAllocator(Allocator):
  """Hands out `NullHandle`s: any size succeeds and costs nothing."""
  def _alloc(self, size: int, options: BufferSpec) -> NullHandle: return NullHandle(size)
  def _offset(self, buf: NullHandle, size: int, offset: int) -> NullHandle: return NullHandle(size, buf.offset + offset)
  def _copyin(self, dest: NullHandle, src: memoryview) -> None:
    """The data goes nowhere: NULL never computes with it."""
  def _copyout(self, dest: memoryview, src: NullHandle) -> None:
    dest[:] = bytes(dest.nbytes)  # deterministic zeros rather than whatever the caller's memory held

class NullProgram:
  """A kernel that does nothing when called; with `wait=True` it reports 0 seconds."""
  def __init__(self, name: str, lib: bytes):
    self.name, self.lib = name, lib
  def __call__(self, *bufs: Any, global_size: tuple[int, ...] = (1, 1, 1), local_size: tuple[int, ...] | None = None,
               vals: tuple[int, ...] = (), wait: bool = False) -> float | None:
    return 0.0 if wait else None

class NullDevice(Compiled):
  """NULL uses the renderer and compiler it is given (so it can generate any target's code); built directly with
  None it falls back to the PYTHON renderer and compiler, which need nothing installed."""
  holds_data = False
  def __init__(self, device: str = "NULL", renderer: Renderer | None = None, compiler: Compiler | None = None):
    from ember.device.python import PythonCompiler, PythonRenderer
    super().__init__(device, NullAllocator(), renderer if renderer is not None else PythonRenderer(),
                     compiler if compiler is not None else PythonCompiler(), NullProgram)
