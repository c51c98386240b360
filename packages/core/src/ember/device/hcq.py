"""HCQ: hardware command queues, the base of devices that drive a GPU by writing its command packets directly.

Generic for NV (GPFIFO + pushbuffer methods), AMD (PM4 + SDMA) and anything alike. A backend subclasses:

* `HWQueue`: a fluent builder, one hardware command per method (`wait`, `signal`, `exec`, `copy`, `timestamp`,
  `memory_barrier`), `submit(device)` hands the packets to the hardware. Subclasses implement the `_`-methods that
  write the packets.
* `HCQSignal`: a 64-bit word in memory the GPU writes (signal release) and waits on (acquire); each device has a
  timeline signal whose value counts completed submissions.
* `HCQAllocator`, `HCQProgram` (with `fill_kernargs`, the kernel-argument writer), `HCQCompiled` and `HCQGraph`
  (a captured JIT batched into one prebuilt queue, replayed with only its kernel arguments rewritten); `HCQJitGraph`
  is every HCQ device's `Compiled.graph`, so a TinyJit replay is one submission (`HCQCompiled.submissions` counts).
"""
from __future__ import annotations
import ctypes
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable
import ember.profiler as profiler
from ember.device.base import BufferSpec, Compiled, Compiler, LRUAllocator
from ember.errors import DeviceError

@dataclass(frozen=True)
class HCQBuffer:
  """A device allocation: its GPU virtual address and size (`meta` holds what the backend needs to free it)."""
  va_addr: int
  size: int
  meta: Any = None
  def offset(self, offset: int, size: int) -> HCQBuffer: return HCQBuffer(self.va_addr + offset, size, self.meta)

class HCQSignal:
  """A 64-bit value at `addr` (host-visible memory) that queues wait on and write to. `progress` is called while
  waiting, for devices that do work only when polled (a MOCK)."""
  def __init__(self, addr: int, progress: Callable[[], None] | None = None) -> None:
    self.addr, self.progress = addr, progress
  @property
  def value(self) -> int: return ctypes.c_uint64.from_address(self.addr).value
  @value.setter
  def value(self, v: int) -> None: ctypes.c_uint64.from_address(self.addr).value = v
  def wait(self, value: int, timeout_s: float = 30.0) -> None:
    """Block until the signal is >= `value`, or raise a DeviceError naming both values after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while self.value < value:
      if self.progress is not None: self.progress()
      if time.monotonic() > deadline:
        raise DeviceError(f"timeout waiting for signal at {self.addr:#x} to reach {value} (it is {self.value}); "
                          "the GPU is hung or a queue waits on a signal nobody releases")

class HWQueue(ABC):
  """One queue of hardware commands. Each method enqueues exactly one command and returns `self`."""
  def __init__(self) -> None:
    self.commands: list[tuple[str, tuple[Any, ...]]] = []  # what was enqueued, for graphs and debugging
    # set before enqueuing when the queue is submitted again and again (a graph): whatever a command keeps in device
    # memory beside the queue's own words (an NV launch's QMD) is then allocated for the queue, not from a reused
    # ring, and listed in `kept`, which the queue's owner gives back (`HCQCompiled._host_free`) when done with it
    self.persistent = False
    self.kept: list[HCQBuffer] = []
    self.kept_used = 0  # bytes used of the last block in `kept`
  def _record(self, name: str, *args: Any) -> HWQueue:
    self.commands.append((name, args))
    return self
  def wait(self, signal: HCQSignal, value: int) -> HWQueue:
    """The queue halts until `signal` is >= `value`; commands after it do not start before."""
    self._wait(signal, value)
    return self._record("wait", signal, value)
  def signal(self, signal: HCQSignal, value: int) -> HWQueue:
    """Once every earlier command of this queue has completed and its writes are visible, `signal` becomes `value`."""
    self._signal(signal, value)
    return self._record("signal", signal, value)
  def timestamp(self, signal: HCQSignal) -> HWQueue:
    """When the earlier commands have completed, the GPU's nanosecond timer is written to `signal`'s word."""
    self._timestamp(signal)
    return self._record("timestamp", signal)
  def memory_barrier(self) -> HWQueue:
    """Writes of earlier commands are visible to later commands of this queue and to the host."""
    self._memory_barrier()
    return self._record("memory_barrier")
  def exec(self, prg: HCQProgram, args: HCQArgs, global_size: tuple[int, int, int],
           local_size: tuple[int, int, int]) -> HWQueue:
    """Launch `prg` over `global_size` blocks of `local_size` threads reading its arguments from `args`; the launch
    starts after earlier commands have started (a `wait` or `memory_barrier` orders it after their completion)."""
    self._exec(prg, args, global_size, local_size)
    return self._record("exec", prg, args, global_size, local_size)
  def copy(self, dest: int, src: int, nbytes: int) -> HWQueue:
    """Copy `nbytes` between GPU virtual addresses; complete (and visible) before a following `signal` fires."""
    self._copy(dest, src, nbytes)
    return self._record("copy", dest, src, nbytes)
  def patch_wait(self, value: int) -> HWQueue:
    """Change the value of the first `wait` already enqueued (a prebuilt queue waits on a new timeline value)."""
    self._patch_value(next(i for i, (name, _) in enumerate(self.commands) if name == "wait"), value)
    return self
  def patch_signal(self, value: int) -> HWQueue:
    """Change the value of the last `signal` already enqueued."""
    self._patch_value(max(i for i, (name, _) in enumerate(self.commands) if name == "signal"), value)
    return self
  def submit(self, device: HCQCompiled) -> HWQueue:
    """Hand the enqueued commands to the hardware; they run asynchronously. A queue can be submitted again. Counted
    in `device.submissions`."""
    self._submit(device)
    device.submissions += 1
    return self
  @abstractmethod
  def _wait(self, signal: HCQSignal, value: int) -> None: ...
  @abstractmethod
  def _signal(self, signal: HCQSignal, value: int) -> None: ...
  @abstractmethod
  def _timestamp(self, signal: HCQSignal) -> None: ...
  @abstractmethod
  def _memory_barrier(self) -> None: ...
  @abstractmethod
  def _exec(self, prg: HCQProgram, args: HCQArgs, global_size: tuple[int, int, int],
            local_size: tuple[int, int, int]) -> None: ...
  @abstractmethod
  def _copy(self, dest: int, src: int, nbytes: int) -> None: ...
  @abstractmethod
  def _submit(self, device: HCQCompiled) -> None: ...
  @abstractmethod
  def _patch_value(self, command_index: int, value: int) -> None:
    """Rewrite the value operand of the wait/signal that was command number `command_index`."""

@dataclass
class HCQArgs:
  """A kernel's argument block in device memory: `buf` holds it, `layout` has (offset, size) per argument."""
  buf: HCQBuffer
  layout: list[tuple[int, int]]
  def update(self, index: int, value: int) -> None:
    """Rewrite argument `index` in place (a graph replay swaps a buffer address this way)."""
    offset, size = self.layout[index]
    ctypes.memmove(self.buf.va_addr + offset, int(value).to_bytes(size, "little", signed=value < 0), size)

class HCQProgram:
  """A loaded kernel. `fill_kernargs` writes the argument block (buffers' addresses, then values) into the device's
  kernarg memory; `__call__` launches once on the device's compute queue and signals the timeline."""
  def __init__(self, device: HCQCompiled, name: str, layout: list[tuple[int, int]], args_size: int) -> None:
    self.device, self.name, self.layout, self.args_size = device, name, layout, args_size
  def fill_kernargs(self, bufs: tuple[HCQBuffer, ...], vals: tuple[int, ...] = (),
                    kernargs: HCQBuffer | None = None) -> HCQArgs:
    """The argument block in `kernargs` (a graph's own memory), else in a slot of the device's kernarg ring."""
    if len(bufs) + len(vals) != len(self.layout):
      raise DeviceError(f"kernel {self.name} takes {len(self.layout)} arguments, got {len(bufs)} buffers and "
                        f"{len(vals)} values")
    args = HCQArgs(kernargs if kernargs is not None else self.device.kernargs_alloc(self.args_size), self.layout)
    for i, value in enumerate([b.va_addr for b in bufs] + list(vals)): args.update(i, value)
    return args
  def __call__(self, *bufs: HCQBuffer, global_size: tuple[int, ...] = (1, 1, 1),
               local_size: tuple[int, ...] | None = None, vals: tuple[int, ...] = (),
               wait: bool = False) -> float | None:
    dev = self.device
    grid, block = _dim3(global_size), _dim3(local_size or (1, 1, 1))
    args = self.fill_kernargs(bufs, vals)
    q = dev.compute_queue().wait(dev.timeline_signal, dev.timeline_value - 1)
    if wait: q.timestamp(dev.timer_signals[0])
    q.exec(self, args, grid, block)
    if wait: q.timestamp(dev.timer_signals[1])
    q.signal(dev.timeline_signal, dev.next_timeline()).submit(dev)
    if not wait: return None
    dev.synchronize()
    return (dev.timer_signals[1].value - dev.timer_signals[0].value) / 1e9

def _dim3(size: tuple[int, ...]) -> tuple[int, int, int]:
  return (int(size[0]), int(size[1]) if len(size) > 1 else 1, int(size[2]) if len(size) > 2 else 1)

class HCQAllocator(LRUAllocator):
  """Device memory addressed by GPU VA; host copies go through a host-visible staging buffer and the copy queue."""
  def __init__(self, device: HCQCompiled) -> None:
    super().__init__()
    self.device = device
  def _copyin(self, dest: HCQBuffer, src: memoryview) -> None:
    staging = self.device.staging(src.nbytes)
    ctypes.memmove(staging.va_addr, bytes(src), src.nbytes)
    self._queue_copy(dest.va_addr, staging.va_addr, src.nbytes, "host -> device")
  def _copyout(self, dest: memoryview, src: HCQBuffer) -> None:
    staging = self.device.staging(dest.nbytes)
    self._queue_copy(staging.va_addr, src.va_addr, dest.nbytes, "device -> host")
    ctypes.memmove((ctypes.c_char * dest.nbytes).from_buffer(dest), staging.va_addr, dest.nbytes)
  def _queue_copy(self, dest: int, src: int, nbytes: int, direction: str) -> None:
    """One copy-queue submission, waited for; while a profile records, the queue timestamps the copy and the profile
    gets it with the device's times."""
    dev = self.device
    q = dev.copy_queue().wait(dev.timeline_signal, dev.timeline_value - 1)
    if profiler.enabled: q.timestamp(dev.timer_signals[0])
    q.copy(dest, src, nbytes)
    if profiler.enabled: q.timestamp(dev.timer_signals[1])
    q.signal(dev.timeline_signal, dev.next_timeline()).submit(dev)
    dev.synchronize()
    if profiler.enabled:
      profiler.device_event("copy", f"{direction} {nbytes} B", dev, "copy queue", *dev.launch_timestamps_ns(),
                            bytes=nbytes)
  def _offset(self, opaque: HCQBuffer, size: int, offset: int) -> HCQBuffer: return opaque.offset(offset, size)

class HCQCompiled(Compiled):
  """An HCQ device: a timeline signal (value `timeline_value - 1` = everything submitted so far has completed once
  reached), queue factories, kernarg and staging memory from the backend (`_host_alloc`)."""
  def __init__(self, device: str, allocator: HCQAllocator, renderer: Any, compiler: Compiler | None,
               runtime: Callable[[str, bytes], Any], compute_queue: Callable[[], HWQueue],
               copy_queue: Callable[[], HWQueue], signal_memory: HCQBuffer, kernargs_size: int = 16 << 20) -> None:
    super().__init__(device, allocator, renderer, compiler, runtime,
                     lambda captured, input_buffers: HCQJitGraph(self, captured, input_buffers))
    self.compute_queue, self.copy_queue = compute_queue, copy_queue
    self.submissions = 0  # queue submissions so far (every HWQueue.submit to this device)
    signals = [HCQSignal(signal_memory.va_addr + 16 * i, self._progress) for i in range(3)]
    self.timeline_signal, self.timer_signals = signals[0], signals[1:]
    self.timeline_signal.value = 0
    self.timeline_value = 1
    self._kernargs = self._host_alloc(kernargs_size)
    self._kernargs_ptr = 0
    self._staging: HCQBuffer | None = None
  def next_timeline(self) -> int:
    """The value the next submission signals on completion."""
    self.timeline_value += 1
    return self.timeline_value - 1
  def synchronize(self) -> None: self.timeline_signal.wait(self.timeline_value - 1)
  def launch_timestamps_ns(self) -> tuple[int, int]:
    """The timestamps `HCQProgram.__call__(wait=True)` had the queue write around its kernel (the allocator's copies
    write them too while a profile records)."""
    return self.timer_signals[0].value, self.timer_signals[1].value
  def timer_ns(self) -> int:
    """The GPU timer now: a submission that only writes a timestamp, waited for."""
    self.compute_queue().wait(self.timeline_signal, self.timeline_value - 1).timestamp(self.timer_signals[0]) \
        .signal(self.timeline_signal, self.next_timeline()).submit(self)
    self.synchronize()
    return self.timer_signals[0].value
  def kernargs_alloc(self, size: int) -> HCQBuffer:
    """A 256-byte aligned slot of the kernarg ring; wrapping around first waits for every launch in flight."""
    size = -(-size // 256) * 256
    if self._kernargs_ptr + size > self._kernargs.size:
      self.synchronize()
      self._kernargs_ptr = 0
    buf = self._kernargs.offset(self._kernargs_ptr, size)
    self._kernargs_ptr += size
    return buf
  def staging(self, size: int) -> HCQBuffer:
    if self._staging is None or self._staging.size < size:
      if self._staging is not None:  # outgrown: given back once no copy in flight reads it
        self.synchronize()
        self._host_free(self._staging)
      self._staging = self._host_alloc(max(size, 1 << 20))
    return self._staging
  def _progress(self) -> None:
    """Called while waiting on a signal: hardware needs nothing, a MOCK executes submitted work here."""
  def _host_alloc(self, size: int) -> HCQBuffer:
    """Host-visible memory the GPU can read (kernargs, staging); the default is plain host memory."""
    mem = (ctypes.c_uint8 * size)()
    if not hasattr(self, "_host_keep"): self._host_keep: dict[int, Any] = {}
    self._host_keep[ctypes.addressof(mem)] = mem
    return HCQBuffer(ctypes.addressof(mem), size, mem)
  def _host_free(self, buf: HCQBuffer) -> None:
    """Give back memory of `_host_alloc` (or a backend's `_command_memory`) that no submitted work reads any more."""
    getattr(self, "_host_keep", {}).pop(buf.va_addr, None)

class HCQGraph:
  """Kernel launches batched into one prebuilt compute queue. Every kernel's arguments live in the graph's own kernarg
  memory and are written once; a replay rewrites only the arguments that changed (`update`) and submits the same
  packets once (`submit`). The queue writes the GPU timer before the first kernel and after each one
  (`kernel_times_ns`), so the kernels of the single submission can still be timed one by one."""
  def __init__(self, device: HCQCompiled, calls: list[tuple[HCQProgram, list[HCQBuffer], tuple[int, ...],
                                                             tuple[int, ...], tuple[int, ...]]]) -> None:
    self.device = device
    self.bufs = [list(bufs) for _, bufs, _, _, _ in calls]
    sizes = [-(-prg.args_size // 256) * 256 for prg, _, _, _, _ in calls]
    self.kernargs = device._host_alloc(max(sum(sizes), 256))
    # one 16-byte slot per timestamp, the first left free: a timestamp may also write the 8 bytes below its slot
    stamps = device._host_alloc(16 * (len(calls) + 2))
    self.timestamps = [HCQSignal(stamps.va_addr + 16 * (i + 1), device._progress) for i in range(len(calls) + 1)]
    for t in self.timestamps: t.value = 0
    self.queue = device.compute_queue()
    self.queue.persistent = True
    self.queue.wait(device.timeline_signal, 0).timestamp(self.timestamps[0])
    self.args: list[HCQArgs] = []
    offset = 0
    for (prg, bufs, vals, grid, block), size, stamp in zip(calls, sizes, self.timestamps[1:]):
      args = prg.fill_kernargs(tuple(bufs), vals, self.kernargs.offset(offset, size))
      offset += size
      self.args.append(args)
      self.queue.exec(prg, args, _dim3(grid), _dim3(block)).memory_barrier().timestamp(stamp)
    self.queue.signal(device.timeline_signal, 0)
    self.last_value = 0  # the timeline value the latest replay signals
    self._memory: list[HCQBuffer] | None = [self.kernargs, stamps]
  def close(self) -> None:
    """Give the graph's device memory back (its kernel arguments, timestamps and what its queue kept, e.g. NV QMDs)
    once its latest replay has finished; a closed graph cannot be replayed. Runs when the graph is collected."""
    if self._memory is None: return
    self.wait_idle()
    for buf in (*self._memory, *self.queue.kept): self.device._host_free(buf)
    self._memory, self.queue.kept = None, []
  def __del__(self) -> None:
    if getattr(self, "_memory", None) is not None: self.close()
  def __call__(self, replace: dict[int, HCQBuffer]) -> None:
    """Replay with buffers swapped: `replace` maps id() of a captured buffer to its replacement."""
    if self._memory is None: raise DeviceError("this HCQ graph was closed; capture the work again")
    self.wait_idle()
    for k, bufs in enumerate(self.bufs):
      for i, b in enumerate(bufs):
        if id(b) in replace: self.update(k, i, replace[id(b)].va_addr)
    self.submit()
  def wait_idle(self) -> None:
    """Block until the latest replay has finished: its arguments are read by the GPU until then."""
    self.device.timeline_signal.wait(self.last_value)
  def update(self, call: int, index: int, value: int) -> None:
    """Rewrite argument `index` of kernel `call` (a buffer address or a variable's value) in place; call `wait_idle`
    first."""
    self.args[call].update(index, value)
  def submit(self) -> None:
    """One submission of the whole queue, ordered after everything submitted before it."""
    dev = self.device
    self.queue.patch_wait(dev.timeline_value - 1)
    self.last_value = dev.next_timeline()
    self.queue.patch_signal(self.last_value)
    self.queue.submit(dev)
  def kernel_times_ns(self) -> list[tuple[int, int]]:
    """(start, end) of each kernel of the latest completed replay on the GPU timer; a kernel starts when the one
    before it has finished (each launch is followed by a memory barrier)."""
    t = [s.value for s in self.timestamps]
    return list(zip(t[:-1], t[1:]))

class HCQJitGraph:
  """TinyJit's graph runner on an HCQ device (`Compiled.graph`): the capture as one `HCQGraph`. A replay writes the new
  input buffers' addresses and the bound Variables' values into the kernel arguments that hold them, in place, and
  submits the graph's queue once (`device.submissions` grows by one per replay)."""
  takes_var_vals = True
  def __init__(self, device: HCQCompiled, captured: list[tuple[Any, list[Any], dict[str, int]]],
               input_buffers: list[Any]) -> None:
    position = {id(b): i for i, b in enumerate(input_buffers)}
    self.input_args: list[list[tuple[int, int]]] = [[] for _ in input_buffers]  # (kernel, argument) per input
    self.var_args: dict[str, list[tuple[int, int]]] = {}
    calls: list[tuple[HCQProgram, list[HCQBuffer], tuple[int, ...], tuple[int, ...], tuple[int, ...]]] = []
    for k, (runner, bufs, var_vals) in enumerate(captured):
      spec = runner.spec
      for j, b in enumerate(bufs):
        if (i := position.get(id(b))) is not None: self.input_args[i].append((k, j))
      for j, v in enumerate(spec.vars): self.var_args.setdefault(v.arg[0], []).append((k, len(bufs) + j))
      calls.append((runner.prg, [b.ensure_allocated()._buf for b in bufs], tuple(var_vals[v.arg[0]] for v in spec.vars),
                    tuple(spec.global_size or (1, 1, 1)), tuple(spec.local_size or (1, 1, 1))))
    self.graph = HCQGraph(device, calls)
  def __call__(self, input_buffers: list[Any], var_vals: dict[str, int] | None = None) -> None:
    graph = self.graph
    graph.wait_idle()
    for at, b in zip(self.input_args, input_buffers):
      if at:
        addr = b.ensure_allocated()._buf.va_addr
        for k, j in at: graph.update(k, j, addr)
    for name, value in (var_vals or {}).items():
      for k, j in self.var_args.get(name, ()): graph.update(k, j, value)
    graph.submit()
  def kernel_times_ns(self) -> list[tuple[int, int]]:
    """(start, end) of each captured kernel in the latest replay, on the GPU timer (waits for the replay to finish)."""
    self.graph.wait_idle()
    return self.graph.kernel_times_ns()

__all__ = ["HCQBuffer", "HCQSignal", "HWQueue", "HCQArgs", "HCQProgram", "HCQAllocator", "HCQCompiled", "HCQGraph",
           "HCQJitGraph", "BufferSpec"]
