"""Running schedules: GlobalCounters, the DEBUG output, the runner cache, bounds errors on the PYTHON device and the
NULL device."""
from __future__ import annotations
import numpy as np
import pytest
from ember import Tensor, Context, Device, GlobalCounters
from ember.device.base import Buffer
from ember.dtype import dtypes
from ember.engine.realize import get_runner, run_schedule
from ember.errors import MemoryAccessError
from ember.schedule import CallKind, ScheduleItem
from ember.uop.ops import KernelInfo
from ember.uop.ops import UOp, Ops, AxisType

def n_kernels(t: Tensor) -> int: return sum(it.kind == "kernel" for it in t.schedule())

def test_global_counters_count_kernels_ops_and_bytes():
  a = np.ones((8, 8), np.float32)
  t = (Tensor(a) * 2 + 1).sum(1)
  expected = n_kernels(t)
  GlobalCounters.reset()
  t.realize()
  assert GlobalCounters.kernel_count == expected == 1
  assert GlobalCounters.global_ops >= 8 * 8  # at least one op per element
  assert GlobalCounters.global_mem >= a.nbytes + 8 * 4  # reads the input, writes the output
  GlobalCounters.reset()
  assert (GlobalCounters.kernel_count, GlobalCounters.global_ops, GlobalCounters.global_mem) == (0, 0, 0)

def test_debug_2_prints_one_line_per_kernel(capfd):
  x = Tensor(np.ones(16, np.float32))
  t = ((x * 2).contiguous() + 1).contiguous() * 3
  expected = n_kernels(t)
  assert expected == 3
  capfd.readouterr()
  with Context(DEBUG=2):
    t.realize()
  err = capfd.readouterr().err
  lines = [ln for ln in err.splitlines() if ln.startswith("***")]
  assert len(lines) == expected
  assert all(Device.DEFAULT in ln and "GFLOP/s" in ln and "GB/s" in ln for ln in lines)

def test_debug_1_prints_a_summary_and_debug_4_the_source(capfd):
  capfd.readouterr()
  with Context(DEBUG=1):
    (Tensor(np.ones(4, np.float32)) + 5).realize()
  err = capfd.readouterr().err
  assert sum("realize:" in ln for ln in err.splitlines()) == 1
  t = Tensor(np.ones(4, np.float32)) * 7
  from ember.codegen import get_program
  expected = get_program(t.schedule()[-1].ast, Device[Device.DEFAULT].renderer).src
  with Context(DEBUG=4):
    t.realize()
  assert expected.strip() in capfd.readouterr().err  # the renderer's own source, whatever language it is

def test_debug_0_prints_nothing(capfd):
  capfd.readouterr()
  (Tensor(np.ones(4, np.float32)) - 2).realize()
  captured = capfd.readouterr()
  assert captured.err == "" and captured.out == ""

def test_runner_is_cached_per_ast():
  ast = [it for it in (Tensor(np.ones(4, np.float32)) * 9).schedule() if it.kind == "kernel"][0].ast
  assert get_runner("PYTHON", ast) is get_runner("PYTHON", ast)

# ** a hand-built kernel: out[i] = in[i + shift] over n lanes **

def _shift_kernel(n: int, size: int, shift: int, gated: bool = False) -> UOp:
  r = UOp.range(n, 0, AxisType.GLOBAL)
  out = UOp(Ops.PARAM, dtypes.float32.ptr(size), (), 0)
  inp = UOp(Ops.PARAM, dtypes.float32.ptr(size), (), 1)
  idx = r + shift
  src = inp.index(idx, idx.lt(size)) if gated else inp.index(idx)
  return UOp(Ops.SINK, dtypes.void, (out.index(r).store(src.load()),), KernelInfo(1))

def _run(ast: UOp, data: np.ndarray) -> np.ndarray:
  out = Buffer("PYTHON", data.size, dtypes.float32)
  inp = Buffer("PYTHON", data.size, dtypes.float32).copyin(memoryview(data).cast("B"))
  run_schedule([ScheduleItem(CallKind.KERNEL, "PYTHON", [out, inp], ast)])
  return out.numpy()

def test_in_bounds_kernel_runs():
  data = np.arange(8, dtype=np.float32)
  np.testing.assert_array_equal(_run(_shift_kernel(6, 8, 2), data)[:6], data[2:8])

def test_out_of_bounds_read_raises_memory_access_error():
  with pytest.raises(MemoryAccessError, match=r"out of bounds.*slot 1.*8 elements"):
    _run(_shift_kernel(8, 8, 1), np.arange(8, dtype=np.float32))

def test_negative_index_raises_memory_access_error():
  with pytest.raises(MemoryAccessError, match="index -3"):
    _run(_shift_kernel(8, 8, -3), np.arange(8, dtype=np.float32))

def test_gated_lanes_never_touch_memory():
  data = np.arange(8, dtype=np.float32)
  out = _run(_shift_kernel(8, 8, 3, gated=True), data)
  np.testing.assert_array_equal(out, np.concatenate([data[3:], np.zeros(3, np.float32)]))

def test_out_of_bounds_write_raises():
  r = UOp.range(8, 0, AxisType.GLOBAL)
  out = UOp(Ops.PARAM, dtypes.float32.ptr(8), (), 0)
  ast = UOp(Ops.SINK, dtypes.void, (out.index(r * 2).store(UOp.const(dtypes.float32, 1.0)),), KernelInfo(1))
  buf = Buffer("PYTHON", 8, dtypes.float32)
  with pytest.raises(MemoryAccessError, match="wrote"):
    run_schedule([ScheduleItem(CallKind.KERNEL, "PYTHON", [buf], ast)])

def test_copy_items_run():
  x = np.arange(5, dtype=np.float32)
  t = Tensor(x).to("PYTHON:1")
  np.testing.assert_array_equal(t.numpy(), x)
  assert t.device == "PYTHON:1"

# ** NULL **

def test_null_device_schedules_and_runs_without_computing():
  a = Tensor(np.ones((4, 4), np.float32), device="NULL")
  t = (a @ a).relu().sum()
  assert n_kernels(t) >= 1
  GlobalCounters.reset()
  t.realize()
  assert GlobalCounters.kernel_count >= 1
  assert t.numpy().shape == ()  # NULL reads back zeros of the right shape

def test_codegen_runs_without_cyclic_garbage_collections(monkeypatch):
  """A first call's codegen builds and drops tens of thousands of objects per kernel; a cyclic collection inside it
  walks every live object of the process and finds nothing there. The engine pauses them while it generates a kernel
  (collections are on again after it, also when codegen raises) and the result is correct."""
  import gc
  import ember.codegen
  from ember.engine.realize import gc_paused
  collections: list[int] = []
  generating = [0]
  def count(phase: str, info: dict) -> None:
    if phase == "start" and generating[0]: collections.append(info["generation"])
  get_program = ember.codegen.get_program
  def counted(*args, **kwargs):
    generating[0] += 1
    try: return get_program(*args, **kwargs)
    finally: generating[0] -= 1
  monkeypatch.setattr(ember.codegen, "get_program", counted)
  a = np.random.default_rng(0).standard_normal((24, 40)).astype(np.float32)
  b = np.random.default_rng(1).standard_normal((40, 56)).astype(np.float32)
  out = ((Tensor(a) @ Tensor(b)).relu() + 1).sum(axis=0)
  items = out.schedule()
  ast = next(it.ast for it in items if it.kind == "kernel")
  gc.callbacks.append(count)
  thresholds = gc.get_threshold()
  try:
    gc.set_threshold(1)  # a collection at every allocation, where collections are on
    with Context(CACHELEVEL=0): get_runner("PYTHON", ast)  # tests-core has no CPU backend
    assert collections == [] and gc.isenabled()
    with gc_paused(): pass
    gc.collect()
    assert collections == [] and gc.isenabled()  # the count sees collections outside codegen: none there
    generating[0] += 1
    gc.collect()
    assert 2 in collections  # ... and sees them where they happen
    generating[0] -= 1
    with pytest.raises(ZeroDivisionError):
      with gc_paused():
        assert not gc.isenabled()
        raise ZeroDivisionError
    assert gc.isenabled()
    gc.disable()
    with gc_paused(): pass
    assert not gc.isenabled()  # left as it was
    gc.enable()
  finally:
    gc.set_threshold(*thresholds)
    gc.callbacks.remove(count)
  np.testing.assert_allclose(out.numpy(), np.maximum(a @ b, 0).sum(axis=0) + 24, rtol=1e-4, atol=1e-4)
