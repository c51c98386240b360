"""The profiler: every kernel launch, copy, codegen, compile, allocation and TinyJit replay, with its time.

    with ember.profile("step.json") as p:   # or PROFILE=1 / PROFILE=path for the whole program
      step(x, y)
    print(p.table())                         # kernels ranked by total time: count, GFLOP/s, GB/s

The trace is Chrome's trace-event JSON (Perfetto, chrome://tracing): one process per device, one thread per queue
(compute, copy, copy queue, memory, codegen, compile, jit). Kernels are timed one by one while recording (each launch
waits for its kernel, as at DEBUG=2): by the device's own timer where it has one (the HCQ timeline's timestamp signals
on NV and AMD, MOCK included, which also time the copy queue's copies; the times are moved onto the host clock
through an offset measured once per device), else by the host's `perf_counter` around the launch. A TinyJit replay
runs its kernels one by one while recording, so each gets its own event, instead of through the device's graph.

Off, the engine checks one module-level flag (`enabled`) per launch and records nothing. `trace_events()` returns
what the open (or last) profiles recorded, as trace-event dicts, for other tools (VIZ shows them as a timeline).
"""
from __future__ import annotations
import atexit
import json
import os
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, TypeVar
from ember.errors import ProfileError
from ember.helpers import ContextVar, getenv

T = TypeVar("T")

PROFILE = ContextVar("PROFILE", "")  # 1: record the whole program, write the trace to a temporary file; else a path

enabled = False  # a profile is recording: the one flag the engine checks per launch

_EPOCH_NS = time.perf_counter_ns()  # trace times are microseconds since ember was imported

def now_us() -> float:
  """The host clock of the trace: microseconds since ember was imported (`perf_counter`)."""
  return (time.perf_counter_ns() - _EPOCH_NS) / 1e3

@dataclass
class Event:
  """One thing that ran: `kind` (kernel, copy, alloc, codegen, compile, jit), its name, the device and queue (the
  trace's process and thread), start and duration in microseconds on the trace's clock, and details in `args`."""
  kind: str
  name: str
  device: str
  queue: str
  start_us: float
  dur_us: float
  args: dict[str, Any] = field(default_factory=dict)

# what the profiles open now record, in order of completion; a new list when a profile opens with none open, so the
# events of closed profiles are kept by those profiles only (a program profiling each step does not grow forever)
_log: list[Event] = []
_recording: list[Profile] = []  # the profiles open now (nested `with` blocks, PROFILE's whole-program one)
_clock_offset_ns: dict[str, int] = {}  # per device: host perf_counter_ns minus the device timer, for device timestamps

def record(kind: str, name: str, device: str, queue: str, start_us: float, dur_us: float, **args: Any) -> None:
  """Add an event (callers check `enabled` first)."""
  _log.append(Event(kind, name, device, queue, start_us, max(dur_us, 0.0), args))

def _thread_queue(queue: str) -> str:
  """Work on a helper thread (parallel compiles) goes on that thread's track, named after it: events overlapping in
  time on one track would read as nested."""
  thread = threading.current_thread()
  return queue if thread is threading.main_thread() else thread.name

class span:
  """`with span("copy", "copy CPU -> NV", "NV", "copy", bytes=n):` records the block as one event."""
  __slots__ = ("kind", "name", "device", "queue", "args", "start")
  def __init__(self, kind: str, name: str, device: str, queue: str, **args: Any) -> None:
    self.kind, self.name, self.device, self.queue, self.args = kind, name, device, _thread_queue(queue), args
  def __enter__(self) -> span:
    self.start = now_us()
    return self
  def __exit__(self, *exc: Any) -> None:
    record(self.kind, self.name, self.device, self.queue, self.start, now_us() - self.start, **self.args)

def timed(kind: str, name: str, device: str, queue: str, fn: Callable[..., T], *fn_args: Any) -> T:
  """`fn(*fn_args)` recorded as one event (for work submitted to a thread pool)."""
  with span(kind, name, device, queue): return fn(*fn_args)

def _device_start_us(device: str, dev: Any, start_ns: int) -> float:
  """A device timer reading on the trace's clock. The offset between the clocks is measured once per device and
  profile: the host time halfway through a submission that only writes the device's timer."""
  if (offset := _clock_offset_ns.get(device)) is None:
    before = time.perf_counter_ns()
    stamp = dev.timer_ns()
    offset = _clock_offset_ns[device] = (before + time.perf_counter_ns()) // 2 - stamp
  return (start_ns + offset - _EPOCH_NS) / 1e3

def device_event(kind: str, name: str, dev: Any, queue: str, start_ns: int, end_ns: int, **args: Any) -> None:
  """Record work the device timed itself (`start_ns`/`end_ns` on its timer), e.g. an HCQ copy."""
  record(kind, name, dev.device, queue, _device_start_us(dev.device, dev, start_ns), (end_ns - start_ns) / 1e3,
         timer="device", device_start_ns=start_ns, device_end_ns=end_ns, **args)

def kernel(runner: Any, host_start_us: float, seconds: float | None, jit: bool = False) -> None:
  """Record a kernel launched with wait=True: `seconds` is what its Program returned (the time DEBUG=2 prints)."""
  from ember.device import Device
  spec, dev = runner.spec, Device[runner.device]
  dur_us = (seconds or 0.0) * 1e6
  args: dict[str, Any] = {"ops": spec.estimates.ops, "bytes": spec.estimates.mem,
                          "global_size": list(spec.global_size or []), "local_size": list(spec.local_size or []),
                          "jit": jit, "timer": "host"}
  start_us = host_start_us
  # the device's stamps are this launch's when they give the time its Program returned (a launch that bypassed the
  # timestamped queue, e.g. another runtime on the device, leaves older stamps there: it is timed on the host)
  stamps = dev.launch_timestamps_ns()
  if stamps is not None and seconds is not None and abs((stamps[1] - stamps[0]) / 1e9 - seconds) < 1e-9:
    args.update(timer="device", device_start_ns=stamps[0], device_end_ns=stamps[1])
    start_us = _device_start_us(runner.device, dev, stamps[0])
  if dur_us > 0:
    args["GFLOP/s"] = spec.estimates.ops / dur_us / 1e3
    args["GB/s"] = spec.estimates.mem / dur_us / 1e3
  record("kernel", spec.name, runner.device, "compute", start_us, dur_us, **args)

# ** profiles **

class Profile:
  """What ran while the profile was open. `with ember.profile(path) as p:`; after the block, `p.events` holds the
  events, `p.trace_events()` the Chrome trace-event dicts, `p.table()` the kernel summary; `path` (if given) gets
  the trace JSON when the block ends."""
  def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
    self.path = None if path is None else os.fspath(path)
    if self.path is not None and not os.path.isdir(os.path.dirname(os.path.abspath(self.path))):
      raise ProfileError(f"the folder of the profile path {self.path!r} does not exist; create it or pass another path")
    self._start: int | None = None
    self._end: int | None = None
    self._log: list[Event] = []
  def __enter__(self) -> Profile:
    global enabled, _log
    if self._start is not None: raise ProfileError("this profile was already started; make a new ember.profile()")
    if not _recording:
      _log = []
      _clock_offset_ns.clear()  # device clocks drift from the host's: measure again per profile
    self._log, self._start = _log, len(_log)
    _recording.append(self)
    enabled = True
    return self
  def __exit__(self, *exc: Any) -> None:
    global enabled
    _recording.remove(self)
    enabled = bool(_recording)
    self._end = len(self._log)
    if self.path is not None: self.save(self.path)
  @property
  def events(self) -> list[Event]:
    """The events recorded since the profile started (up to now while it is open)."""
    return [] if self._start is None else self._log[self._start:self._end]
  def trace_events(self) -> list[dict[str, Any]]: return to_trace_events(self.events)
  def save(self, path: str | os.PathLike[str]) -> str:
    """Write the Chrome trace JSON to `path`; returns the path."""
    path = os.fspath(path)
    with open(path, "w") as f: json.dump({"traceEvents": self.trace_events(), "displayTimeUnit": "ms"}, f)
    return path
  def kernels(self) -> list[KernelStats]: return kernel_stats(self.events)
  def table(self, limit: int | None = 30) -> str:
    """The kernels ranked by total time: launches, total and mean time, share, GFLOP/s and GB/s (from the kernels'
    op and byte estimates). `limit` rows at most (None: all)."""
    return format_table(self.kernels(), limit)

def profile(path: str | os.PathLike[str] | None = None) -> Profile:
  """Record every kernel, copy, codegen, compile, allocation and TinyJit replay in a `with` block:

      with ember.profile("trace.json") as p: model(x).realize()
      print(p.table())
  """
  return Profile(path)

def trace_events() -> list[dict[str, Any]]:
  """What the profiles open now have recorded (all of the outermost one's events), or when none is open, what the
  last outermost profile recorded, as Chrome trace-event dicts."""
  return to_trace_events(list(_log))

# ** the trace-event format **

def to_trace_events(events: list[Event]) -> list[dict[str, Any]]:
  """`events` as Chrome trace events: "X" complete events (ts and dur in microseconds), preceded by "M" metadata that
  names a process per device (`process_name`) and a thread per queue (`thread_name`)."""
  pids: dict[str, int] = {}
  tids: dict[tuple[str, str], int] = {}
  meta: list[dict[str, Any]] = []
  out: list[dict[str, Any]] = []
  for e in events:
    if (pid := pids.get(e.device)) is None:
      pid = pids[e.device] = len(pids) + 1
      meta.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": e.device}})
      meta.append({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0, "args": {"sort_index": pid}})
    if (tid := tids.get((e.device, e.queue))) is None:
      tid = tids[(e.device, e.queue)] = len(tids) + 1
      meta.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": e.queue}})
    out.append({"name": e.name, "cat": e.kind, "ph": "X", "ts": e.start_us, "dur": e.dur_us, "pid": pid, "tid": tid,
                "args": dict(e.args)})
  return meta + out

# ** the kernel table **

@dataclass
class KernelStats:
  """One kernel's launches together: how many, their total seconds, and the ops and bytes they did (estimates)."""
  name: str
  device: str
  count: int = 0
  seconds: float = 0.0
  ops: int = 0
  mem: int = 0
  @property
  def gflops(self) -> float: return self.ops / self.seconds / 1e9 if self.seconds > 0 else 0.0
  @property
  def gbs(self) -> float: return self.mem / self.seconds / 1e9 if self.seconds > 0 else 0.0

def kernel_stats(events: list[Event]) -> list[KernelStats]:
  """The kernel events grouped by (name, device), the longest total first."""
  stats: dict[tuple[str, str], KernelStats] = {}
  for e in events:
    if e.kind != "kernel": continue
    s = stats.setdefault((e.name, e.device), KernelStats(e.name, e.device))
    s.count, s.seconds = s.count + 1, s.seconds + e.dur_us / 1e6
    s.ops, s.mem = s.ops + e.args["ops"], s.mem + e.args["bytes"]
  return sorted(stats.values(), key=lambda s: -s.seconds)

def format_table(stats: list[KernelStats], limit: int | None = 30) -> str:
  total = sum(s.seconds for s in stats)
  lines = [f"{'kernel':40s} {'device':8s} {'count':>6s} {'total ms':>10s} {'mean us':>10s} {'%':>6s} "
           f"{'GFLOP/s':>9s} {'GB/s':>8s}"]
  for s in stats[:limit]:
    share = 100 * s.seconds / total if total > 0 else 0.0
    lines.append(f"{s.name:40s} {s.device:8s} {s.count:6d} {s.seconds * 1e3:10.3f} {s.seconds / s.count * 1e6:10.2f} "
                 f"{share:6.1f} {s.gflops:9.2f} {s.gbs:8.2f}")
  if limit is not None and len(stats) > limit: lines.append(f"... {len(stats) - limit} more kernels")
  launches = sum(s.count for s in stats)
  lines.append(f"{len(stats)} kernels, {launches} launches, {total * 1e3:.3f} ms")
  return "\n".join(lines)

# ** DEBUG=2's table at exit, PROFILE's whole-program profile **

_debug_stats: dict[tuple[str, str], KernelStats] = {}
_DEBUG_TABLE_AT_EXIT = getenv("DEBUG", 0) >= 2  # the program runs at DEBUG=2 (not just a Context(DEBUG=2) block)

def debug_kernel(name: str, device: str, seconds: float, ops: int, mem: int) -> None:
  """A kernel DEBUG=2 printed: a row of the table written to stderr at exit when the program runs with DEBUG>=2 set
  in its environment (the first one registers it)."""
  if not _DEBUG_TABLE_AT_EXIT: return
  if not _debug_stats: atexit.register(_write_debug_table)
  s = _debug_stats.setdefault((name, device), KernelStats(name, device))
  s.count, s.seconds, s.ops, s.mem = s.count + 1, s.seconds + seconds, s.ops + ops, s.mem + mem

def _write_debug_table() -> None:
  sys.stderr.write("kernels by total time (DEBUG=2):\n")
  sys.stderr.write(format_table(sorted(_debug_stats.values(), key=lambda s: -s.seconds)) + "\n")

def _profile_path(value: str) -> str:
  if value == "1": return os.path.join(tempfile.gettempdir(), f"ember-profile-{os.getpid()}.json")
  return value

def _start_program_profile(value: str) -> None:
  p = Profile(_profile_path(value))
  p.__enter__()
  def finish() -> None:
    if p in _recording: p.__exit__(None, None, None)
    sys.stderr.write(f"PROFILE: wrote {len(p.events)} events to {p.path} (open it in https://ui.perfetto.dev or "
                     "chrome://tracing)\n")
  atexit.register(finish)

if PROFILE.value not in ("", "0"): _start_program_profile(PROFILE.value)

__all__ = ["profile", "Profile", "Event", "KernelStats", "trace_events", "PROFILE"]
