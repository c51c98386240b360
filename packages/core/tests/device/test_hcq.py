"""The HCQ base classes with a host queue that performs its commands when submitted (the simplest conforming queue)."""
from __future__ import annotations
import ctypes
import pytest
from ember.device.base import BufferSpec
from ember.device.hcq import HCQAllocator, HCQArgs, HCQBuffer, HCQCompiled, HCQGraph, HCQProgram, HCQSignal, HWQueue
from ember.errors import DeviceError

class HostQueue(HWQueue):
  """Commands become Python closures run in order at submit; an unmet wait is an error (nothing else would run)."""
  def __init__(self) -> None:
    super().__init__()
    self.ops: list[list] = []
  def _wait(self, signal, value):
    self.ops.append(["wait", signal, value])
  def _signal(self, signal, value): self.ops.append(["signal", signal, value])
  def _timestamp(self, signal): self.ops.append(["signal", signal, 12345])
  def _memory_barrier(self): self.ops.append(["barrier"])
  def _exec(self, prg, args, global_size, local_size): self.ops.append(["exec", prg, args, global_size, local_size])
  def _copy(self, dest, src, nbytes): self.ops.append(["copy", dest, src, nbytes])
  def _patch_value(self, command_index, value): self.ops[command_index][2] = value
  def _submit(self, device):
    for op in self.ops:
      if op[0] == "wait" and op[1].value < op[2]: raise DeviceError(f"wait for {op[2]} never satisfied")
      if op[0] == "signal": op[1].value = op[2]
      if op[0] == "copy": ctypes.memmove(op[1], op[2], op[3])
      if op[0] == "exec": op[1].run(op[2], op[3], op[4])

class HostProgram(HCQProgram):
  """out[i] = in[i] * k for i < n: arguments (out, in, k) as (8, 8, 4) bytes."""
  def __init__(self, device):
    super().__init__(device, "scale", [(0, 8), (8, 8), (16, 4)], 20)
  def run(self, args: HCQArgs, global_size, local_size):
    raw = ctypes.string_at(args.buf.va_addr, 20)
    out, inp = int.from_bytes(raw[:8], "little"), int.from_bytes(raw[8:16], "little")
    k = int.from_bytes(raw[16:], "little")
    n = global_size[0] * local_size[0]
    src, dst = (ctypes.c_int32 * n).from_address(inp), (ctypes.c_int32 * n).from_address(out)
    for i in range(n): dst[i] = src[i] * k

class HostAllocator(HCQAllocator):
  def _alloc(self, size: int, options: BufferSpec) -> HCQBuffer:
    mem = (ctypes.c_uint8 * max(size, 1))()
    return HCQBuffer(ctypes.addressof(mem), size, mem)

class HostDevice(HCQCompiled):
  def __init__(self):
    sig = (ctypes.c_uint8 * 64)()
    self.sig = sig
    super().__init__("HOSTQ", HostAllocator(self), None, None, lambda name, lib: HostProgram(self), HostQueue,
                     HostQueue, HCQBuffer(ctypes.addressof(sig), 64, sig), kernargs_size=1024)

def test_queue_methods_are_fluent_and_record_one_command_each():
  dev = HostDevice()
  q = HostQueue()
  chained = q.wait(dev.timeline_signal, 0).signal(dev.timeline_signal, 1).memory_barrier()
  assert chained.timestamp(dev.timer_signals[0]) is q
  assert [name for name, _ in q.commands] == ["wait", "signal", "memory_barrier", "timestamp"]

def test_allocator_round_trip_through_the_copy_queue():
  dev = HostDevice()
  buf = dev.allocator.alloc(40)
  data = bytes(range(40))
  dev.allocator._copyin(buf, memoryview(data))
  out = bytearray(40)
  dev.allocator._copyout(memoryview(out), buf)
  assert bytes(out) == data
  assert dev.timeline_signal.value == dev.timeline_value - 1 == 2  # two submissions completed

def test_program_writes_kernargs_and_runs():
  dev = HostDevice()
  n = 8
  inp, out = dev.allocator.alloc(4 * n), dev.allocator.alloc(4 * n)
  dev.allocator._copyin(inp, memoryview(bytes((ctypes.c_int32 * n)(*range(n)))))
  prg = HostProgram(dev)
  prg(out, inp, global_size=(2, 1, 1), local_size=(4, 1, 1), vals=(5,))
  dev.synchronize()
  assert list((ctypes.c_int32 * n).from_address(out.va_addr)) == [5 * i for i in range(n)]
  with pytest.raises(DeviceError, match="takes 3 arguments"):
    prg.fill_kernargs((out,), ())

def test_kernarg_ring_wraps_after_synchronizing():
  dev = HostDevice()
  first = dev.kernargs_alloc(20)
  for _ in range(3): dev.kernargs_alloc(256)  # 1024 bytes: the 5th slot wraps to the start
  assert dev.kernargs_alloc(20).va_addr == first.va_addr

def test_signal_wait_times_out_with_both_values():
  sig_mem = ctypes.c_uint64(3)
  with pytest.raises(DeviceError, match="reach 5 \\(it is 3\\)"):
    HCQSignal(ctypes.addressof(sig_mem)).wait(5, timeout_s=0.01)

def _tripling() -> tuple[HostDevice, HostProgram, HCQBuffer, HCQBuffer, int]:
  """A host device, its program multiplying by 3, an input [1, 2, 3, 4] and an output of 4 int32s."""
  dev, n = HostDevice(), 4
  a, out = dev.allocator.alloc(4 * n), dev.allocator.alloc(4 * n)
  dev.allocator._copyin(a, memoryview(bytes((ctypes.c_int32 * n)(1, 2, 3, 4))))
  return dev, HostProgram(dev), a, out, n

def test_graph_replays_with_patched_timeline_and_swapped_inputs():
  dev, prg, a, out, n = _tripling()
  b = dev.allocator.alloc(4 * n)
  dev.allocator._copyin(b, memoryview(bytes((ctypes.c_int32 * n)(10, 20, 30, 40))))
  graph = HCQGraph(dev, [(prg, [out, a], (3,), (1, 1, 1), (n, 1, 1))])
  graph({})
  dev.synchronize()
  assert list((ctypes.c_int32 * n).from_address(out.va_addr)) == [3, 6, 9, 12]
  graph({id(a): b})
  dev.synchronize()
  assert list((ctypes.c_int32 * n).from_address(out.va_addr)) == [30, 60, 90, 120]

def test_graph_replay_is_one_submission_and_keeps_its_arguments_out_of_the_kernarg_ring():
  dev, prg, a, out, n = _tripling()
  graph = HCQGraph(dev, [(prg, [out, a], (3,), (1, 1, 1), (n, 1, 1))])
  for _ in range(5): dev.kernargs_alloc(256)  # the 1024-byte ring wraps: a graph argument block there is overwritten
  ctypes.memset(dev._kernargs.va_addr, 0xff, dev._kernargs.size)
  before = dev.submissions
  graph({})
  assert dev.submissions - before == 1
  dev.synchronize()
  assert list((ctypes.c_int32 * n).from_address(out.va_addr)) == [3, 6, 9, 12]
  (start, end), = graph.kernel_times_ns()
  assert start == end == 12345  # HostQueue's timer

def test_graph_gives_its_memory_back_when_closed_or_collected():
  import gc
  dev, prg, a, out, n = _tripling()
  held = len(dev._host_keep)
  graph = HCQGraph(dev, [(prg, [out, a], (3,), (1, 1, 1), (n, 1, 1))] * 3)
  assert len(dev._host_keep) == held + 2  # its kernel arguments and timestamps
  graph({})
  graph.close()
  assert len(dev._host_keep) == held
  assert list((ctypes.c_int32 * n).from_address(out.va_addr)) == [3, 6, 9, 12]  # the replay finished first
  with pytest.raises(DeviceError, match="closed"): graph({})
  graph.close()  # twice is fine
  for _ in range(3):  # graphs that are dropped without close() give theirs back too
    HCQGraph(dev, [(prg, [out, a], (3,), (1, 1, 1), (n, 1, 1))])({})
  gc.collect()
  assert len(dev._host_keep) == held

def test_outgrown_staging_memory_is_given_back():
  dev = HostDevice()
  small = dev.staging(16)
  assert small.va_addr in dev._host_keep
  big = dev.staging(small.size + 1)
  assert small.va_addr not in dev._host_keep and big.va_addr in dev._host_keep and dev.staging(8) is big
