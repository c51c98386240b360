"""TinyJit: runs normally on call 1, captures on call 2, replays the captured kernels with new inputs afterwards."""
from __future__ import annotations
import numpy as np
import pytest
from ember import Tensor, TinyJit, GlobalCounters, Context
from ember.errors import JitError
from ember.engine import realize as engine

def _inputs(seed: int) -> tuple[np.ndarray, np.ndarray]:
  r = np.random.default_rng(seed)
  return r.standard_normal((4, 3)).astype(np.float32), r.standard_normal((3, 5)).astype(np.float32)

def test_capture_on_call_two_and_replay_with_new_inputs():
  calls = []
  @TinyJit
  def f(a: Tensor, b: Tensor) -> Tensor:
    calls.append(1)
    return ((a @ b).relu() * 2).contiguous()
  for i in range(5):
    a, b = _inputs(i)
    out = f(Tensor(a).realize(), Tensor(b).realize())
    np.testing.assert_allclose(out.numpy(), np.maximum(a @ b, 0) * 2, rtol=1e-5, atol=1e-6)
  assert len(calls) == 2  # the Python function runs for call 1 and the capture; calls 3..5 replay
  assert f.captured and all(runner is not None for runner, _, _ in f.captured)

def test_replay_launches_only_captured_kernels_and_no_new_compiles():
  @TinyJit
  def f(a: Tensor) -> Tensor:
    return (a * 3 + 1).sum(0)
  for i in range(2): f(Tensor(np.full((4, 4), i, np.float32)).realize())
  n_captured = len(f.captured)
  cache_size = len(engine._runner_cache)
  GlobalCounters.reset()
  x = np.arange(16, dtype=np.float32).reshape(4, 4)
  out = f(Tensor(x).realize())
  assert GlobalCounters.kernel_count == n_captured
  assert len(engine._runner_cache) == cache_size
  np.testing.assert_allclose(out.numpy(), (x * 3 + 1).sum(0))

def test_weak_inputs_raise():
  f = TinyJit(lambda x: (x + 1).realize())
  with pytest.raises(JitError, match="weak"):
    f(Tensor(2.0))

def test_changed_shapes_raise_after_capture():
  f = TinyJit(lambda x: (x * 2).contiguous())
  for _ in range(2): f(Tensor(np.ones(4, np.float32)).realize())
  with pytest.raises(JitError, match="changed"):
    f(Tensor(np.ones(5, np.float32)).realize())

def test_changed_dtypes_raise_after_capture():
  f = TinyJit(lambda x: (x * 2).contiguous())
  for _ in range(2): f(Tensor(np.ones(4, np.float32)).realize())
  with pytest.raises(JitError):
    f(Tensor(np.ones(4, np.int32)).realize())

def test_jit_off_runs_the_function_every_time():
  calls = []
  def fn(x: Tensor) -> Tensor:
    calls.append(1)
    return (x + 1).contiguous()
  f = TinyJit(fn)
  with Context(JIT=0):
    for i in range(3):
      out = f(Tensor(np.full(3, i, np.float32)).realize())
      np.testing.assert_array_equal(out.numpy(), np.full(3, i + 1, np.float32))
  assert len(calls) == 3

def test_prune_decorator_syntax():
  @TinyJit(prune=True)
  def f(x: Tensor) -> Tensor:
    return (x - 1).contiguous()
  for i in range(3):
    out = f(Tensor(np.full(2, i, np.float32)).realize())
    np.testing.assert_array_equal(out.numpy(), np.full(2, i - 1, np.float32))

def test_reset_starts_over():
  f = TinyJit(lambda x: (x * 5).contiguous())
  for _ in range(3): f(Tensor(np.ones(2, np.float32)).realize())
  f.reset()
  assert f.cnt == 0 and f.captured == []
  out = f(Tensor(np.ones(3, np.float32)).realize())  # a new shape is fine after reset
  np.testing.assert_array_equal(out.numpy(), np.full(3, 5, np.float32))

def test_bound_variables_change_without_recapture():
  from ember import Variable
  data = np.arange(40, dtype=np.float32).reshape(10, 4)
  cache = Tensor(data).realize()
  @TinyJit
  def f(x: Tensor, pos) -> Tensor:
    return (cache[:pos].sum(0) + x).realize()
  for n in (2, 3, 5, 7, 9):
    out = f(Tensor(np.ones(4, np.float32)), Variable("pos", 1, 10).bind(n)).numpy()
    np.testing.assert_allclose(out, data[:n].sum(0) + 1)
  assert len(f.captured) >= 1 and f.cnt == 5
