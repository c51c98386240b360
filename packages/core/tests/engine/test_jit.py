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

READS = {"item()": lambda t: t.sum().item(), "numpy()": lambda t: t.numpy(), "tolist()": lambda t: t.tolist(),
         "data()": lambda t: bytes(t.data()), "bool(tensor)": lambda t: bool(t.sum() > 4)}

@pytest.mark.parametrize("read", list(READS))
def test_reading_data_during_capture_raises(read: str):
  def fn(x: Tensor) -> Tensor:
    READS[read](x)  # a Python value from the data: a replay would reuse the capture's
    return (x * 2).contiguous()
  f = TinyJit(fn)
  f(Tensor(np.array([1, 2], np.float32)).realize())  # call 1 runs normally
  with pytest.raises(JitError, match=read.replace("(", r"\(").replace(")", r"\)")) as e:
    f(Tensor(np.array([2, 3], np.float32)).realize())
  assert isinstance(e.value, RuntimeError) and "fn" in str(e.value)

def test_value_read_in_the_function_is_never_baked_into_a_replay():
  def fn(x: Tensor) -> Tensor: return ((x + 1) * (x.sum().item() + 2)).contiguous()
  f = TinyJit(fn)
  results = []
  for v in ([1, 2], [2, 3], [3, 4]):
    x = np.array(v, np.float32)
    try: results.append(f(Tensor(x).realize()).numpy())
    except JitError: results.append(None)
    if results[-1] is not None: np.testing.assert_array_equal(results[-1], (x + 1) * (x.sum() + 2))
  assert results[1] is None and results[2] is None

def test_tensor_indexing_inside_a_capture_reads_no_data():
  table = np.arange(20, dtype=np.float32).reshape(10, 2)
  t = Tensor(table).realize()
  f = TinyJit(lambda idx: t[idx].contiguous())
  for i in range(4):
    idx = np.array([i, 9 - i, 3], np.int32)
    np.testing.assert_array_equal(f(Tensor(idx).realize()).numpy(), table[idx])

def _prunable(w: Tensor):
  def fn(x: Tensor) -> Tensor:
    scale = (w * w).sum(1).exp().contiguous()  # reads only w: the same every call
    return (x @ w).relu() * scale.sum()
  return fn

def test_prune_drops_kernels_that_do_not_depend_on_the_inputs():
  rng = np.random.default_rng(0)
  wn = rng.standard_normal((3, 3)).astype(np.float32) * 0.3
  w = Tensor(wn).realize()
  plain, pruned = TinyJit(_prunable(w)), TinyJit(_prunable(w), prune=True)
  for _ in range(4):
    xn = rng.standard_normal((2, 3)).astype(np.float32)
    want = np.maximum(xn @ wn, 0) * np.exp((wn * wn).sum(1)).sum()
    a, b = plain(Tensor(xn).realize()).numpy().copy(), pruned(Tensor(xn).realize()).numpy()
    np.testing.assert_allclose(a, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(a, b)
  assert 0 < len(pruned.captured) < len(plain.captured)
  GlobalCounters.reset()
  pruned(Tensor(np.ones((2, 3), np.float32)).realize())
  assert GlobalCounters.kernel_count == len(pruned.captured)

def test_prune_keeps_state_the_replay_changes():
  counter = Tensor(np.zeros(2, np.float32)).realize()
  def step(x: Tensor) -> Tensor:
    counter.assign(counter + 1).realize()  # reads no input, but each replay must advance it
    return (x + counter).contiguous()
  f = TinyJit(step, prune=True)
  for i in range(5):
    np.testing.assert_array_equal(f(Tensor(np.full(2, 10, np.float32)).realize()).numpy(), np.full(2, 11 + i))

def test_inputs_with_a_bound_variable_in_their_shape_replay_without_recapture():
  from ember import Variable
  data = np.arange(10, dtype=np.float32)
  big = Tensor(data).realize()
  calls = []
  def fn(x: Tensor) -> Tensor:
    calls.append(1)
    return (x * 2 + 1).contiguous()
  f = TinyJit(fn)
  for k in (3, 5, 2, 9, 1, 4):
    out = f(big[:Variable("n", 1, 10).bind(k)])
    np.testing.assert_array_equal(out.shrink(((0, k),)).numpy(), data[:k] * 2 + 1)
  assert len(calls) == 2 and f.cnt == 6

def test_bound_variable_tensors_realize():
  from ember import Variable, Device, dtypes
  assert Tensor(Variable("a", 0, 10).bind(7)).item() == 7
  assert Tensor(Variable("b", 0, 2**40, dtype=dtypes.int64).bind(2**35)).clone(Device.DEFAULT).item() == 2**35
  v = Tensor(Variable("c", 0, 10).bind(3), device="PYTHON")
  assert v.device == "PYTHON" and (v + Tensor([1, 2], device="PYTHON")).tolist() == [4, 5]

def test_bound_variable_arguments_of_two_widths_under_jit():
  from ember import Variable, Device, dtypes
  @TinyJit
  def f(a, b) -> Tensor: return (Tensor(a + b).clone(Device.DEFAULT) * 2).realize()
  for i in range(4):
    a = Variable("a", 0, 2**10, dtype=dtypes.int32).bind(i)
    b = Variable("b", 0, 2**40, dtype=dtypes.int64).bind(2**35)
    assert f(a, b).item() == (2**35 + i) * 2

def test_sharded_inputs_and_outputs_replay():
  devs = ("PYTHON", "PYTHON:1")
  f = TinyJit(lambda x: (x * 2 + 1).realize())
  for i in range(4):
    xn = np.arange(8, dtype=np.float32) + i
    out = f(Tensor(xn).shard(devs, 0).realize())
    assert out.device == devs
    np.testing.assert_array_equal(out.numpy(), xn * 2 + 1)

def test_replays_see_each_call_s_inputs_realized_lazy_or_views():
  # a replay of realized inputs skips realizing them and re-deriving their shapes; lazy inputs, views and reshaped
  # buffers go the general way: whichever way, every replay computes on its own call's values
  f = TinyJit(lambda a, b: (a @ b + 1).contiguous())
  kinds = ["realized", "realized", "realized", "lazy", "realized", "view", "reshaped", "realized", "lazy"]
  for i, kind in enumerate(kinds):
    a, b = _inputs(i)
    ta, tb = Tensor(a).realize(), Tensor(b).realize()
    if kind == "lazy": ta = Tensor(a * 2) * 0.5
    if kind == "view": tb = Tensor(np.ascontiguousarray(b.T)).realize().T
    if kind == "reshaped": ta = Tensor(a.reshape(12)).realize().reshape(4, 3)
    np.testing.assert_allclose(f(ta, tb).numpy(), a @ b + 1, rtol=1e-5, atol=1e-5, err_msg=f"call {i}: {kind}")

def test_replays_still_check_their_arguments():
  f = TinyJit(lambda x, s: (x * s).contiguous())
  x = np.arange(4, dtype=np.float32)
  for _ in range(4): np.testing.assert_array_equal(f(Tensor(x).realize(), 3.0).numpy(), x * 3)
  with pytest.raises(JitError, match="changed"): f(Tensor(np.ones(5, np.float32)).realize(), 3.0)
  with pytest.raises(JitError, match="changed"): f(Tensor(x.astype(np.int32)).realize(), 3.0)
  with pytest.raises(JitError, match="changed"): f(Tensor(x).realize(), Tensor(np.float32(3)).realize())
  with pytest.raises(JitError, match="changed"): f(Tensor(x).realize().shard(("PYTHON", "PYTHON:1"), 0), 3.0)
  np.testing.assert_array_equal(f(Tensor(x + 1).realize(), 3.0).numpy(), (x + 1) * 3)

def test_tensors_inside_lists_and_dicts_are_inputs() -> None:
  # they were baked into the capture: every replay read the first call's data
  @TinyJit
  def pair(xs: list[Tensor], d: dict[str, Tensor]) -> Tensor: return (xs[0] + xs[1] * d["w"]).realize()
  for i in range(5):
    out = pair([Tensor([float(i)]), Tensor([1.0])], {"w": Tensor([float(i * i)])})
    np.testing.assert_allclose(out.numpy(), [i + i * i])
  assert pair.cnt >= 3  # it replayed

def test_a_changed_python_argument_captures_again() -> None:
  # a scale baked into the capture: replays returned x * 1.0 for scale=3.0
  @TinyJit
  def scaled(x: Tensor, scale: float = 1.0, flags: tuple[bool, ...] = (False,)) -> Tensor:
    return (x * scale + (1 if flags[0] else 0)).realize()
  x = Tensor([1.0, 2.0]).realize()
  calls = [(1.0, (False,))] * 3 + [(3.0, (False,))] * 3 + [(3.0, (True,))] * 3 + [(float("nan"), (False,))] * 3
  with pytest.warns(UserWarning, match="Python argument changed"):
    for scale, flags in calls:
      want = np.array([1.0, 2.0]) * scale + flags[0]
      np.testing.assert_allclose(scaled(x, scale=scale, flags=flags).numpy(), want)
  assert scaled.cnt >= 2  # the last value (NaN, equal to itself here) replays

def test_replays_take_each_call_s_variable_value_between_general_calls():
  # a bound Variable argument replays with the value bound on each call, whether the tensors are plain buffers (the
  # replay reads the value straight from the binding) or need realizing; another Variable is a changed input
  from ember import Variable
  data = np.arange(40, dtype=np.float32).reshape(10, 4)
  cache = Tensor(data).realize()
  f = TinyJit(lambda x, pos: (cache[:pos].sum(0) + x).realize())
  for i, n in enumerate((2, 3, 5, 7, 1, 9, 4, 10, 6)):
    x = np.full(4, i, np.float32)
    tx = Tensor(x).realize() if i % 3 else Tensor(x - 1) + 1
    np.testing.assert_allclose(f(tx, Variable("pos", 1, 10).bind(n)).numpy(), data[:n].sum(0) + x, err_msg=f"pos {n}")
  with pytest.raises(JitError, match="changed"):
    f(Tensor(np.ones(4, np.float32)).realize(), Variable("p", 1, 10).bind(3))

def test_an_unbound_variable_argument_raises_instead_of_replaying_the_last_value():
  from ember import Variable
  data = np.arange(40, dtype=np.float32).reshape(10, 4)
  cache = Tensor(data).realize()
  f = TinyJit(lambda x, pos: (cache[:pos].sum(0) + x).realize())
  for n in (2, 3, 5): f(Tensor(np.zeros(4, np.float32)).realize(), Variable("pos", 1, 10).bind(n))
  with pytest.raises(JitError, match="bound to no value"):
    f(Tensor(np.zeros(4, np.float32)).realize(), Variable("pos", 1, 10))  # replayed the last value, 5, before
  np.testing.assert_allclose(f(Tensor(np.zeros(4, np.float32)).realize(), Variable("pos", 1, 10).bind(4)).numpy(),
                             data[:4].sum(0))

def test_a_returned_input_is_this_calls() -> None:
  # the capture's return value held the captured call's input tensor (or a reshape of it): replays handed it back
  def bump(x: Tensor) -> Tensor:
    x.assign(x + 1)
    return x
  for fn, want in ((lambda x: x, lambda i: [i]), (lambda x: x.reshape(1, 1), lambda i: [[i]]),
                   (bump, lambda i: [i + 1]), (lambda x: (x * 2, {"same": x}), None)):
    jit = TinyJit(fn)
    for i in range(5):
      out = jit(Tensor([float(i)]).realize())
      if want is not None: assert out.numpy().tolist() == want(float(i))
      else: assert out[0].numpy().tolist() == [2.0 * i] and out[1]["same"].numpy().tolist() == [float(i)]
    assert jit.cnt >= 3

def test_a_returned_sharded_input_is_this_calls() -> None:
  # the same for sharded inputs: a replay handed back the captured call's shards (the second call's values)
  devs = ("PYTHON", "PYTHON:1")
  for fn, view in ((lambda x, y: x, lambda a: a), (lambda x, y: (x.reshape(2, 2), (x + y).realize()), None)):
    jit = TinyJit(fn)
    for i in range(5):
      xn = np.arange(4, dtype=np.float32) + i
      x, y = Tensor(xn).shard(devs, 0).realize(), Tensor(np.ones(4, np.float32)).shard(devs, 0).realize()
      out = jit(x, y)
      if view is not None: np.testing.assert_array_equal(out.numpy(), xn)
      else:
        np.testing.assert_array_equal(out[0].numpy(), xn.reshape(2, 2))
        np.testing.assert_array_equal(out[1].numpy(), xn + 1)
    assert jit.cnt >= 3
