"""MemoryStats counts the bytes of allocated Buffers and the peak since a reset, from the allocations themselves."""
from __future__ import annotations
import gc
from ember.device import Buffer, MemoryStats
from ember.dtype import dtypes

def test_allocations_and_frees_move_used_and_peak() -> None:
  gc.collect()
  base = MemoryStats.used
  MemoryStats.reset_peak()
  a = Buffer("PYTHON", 1000, dtypes.float32).ensure_allocated()
  b = Buffer("PYTHON", 250, dtypes.int64).ensure_allocated()
  assert MemoryStats.used - base == 4000 + 2000
  view = Buffer("PYTHON", 10, dtypes.float32, base=a, offset=40).ensure_allocated()  # views hold no memory of their own
  assert MemoryStats.used - base == 6000
  del a, view
  gc.collect()
  assert MemoryStats.used - base == 2000
  assert MemoryStats.peak - base == 6000  # the most held at once
  MemoryStats.reset_peak()
  assert MemoryStats.peak == MemoryStats.used
  del b
  gc.collect()
  assert MemoryStats.used == base

def test_unallocated_buffers_hold_nothing() -> None:
  gc.collect()
  base = MemoryStats.used
  lazy = Buffer("PYTHON", 1 << 20, dtypes.float32)
  assert MemoryStats.used == base and not lazy.is_allocated
