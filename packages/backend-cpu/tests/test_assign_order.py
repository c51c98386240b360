"""Assigns realized with the tensors that read the old value of what they overwrite: one schedule, each assign after
those readers (write after read), results as numpy computes them."""
from __future__ import annotations
import numpy as np
from ember import Tensor, TinyJit
from ember.engine import realize as engine

def _schedules(monkeypatch) -> list[int]:
  """Counts the schedules run from now on (their calls each)."""
  runs: list[int] = []
  run = engine.run_schedule
  def counting(items, var_vals=None):
    runs.append(len(items))
    return run(items, var_vals)
  monkeypatch.setattr(engine, "run_schedule", counting)
  return runs

def test_a_reader_of_the_old_value_runs_in_the_assigns_schedule(monkeypatch) -> None:
  a = np.random.default_rng(0).standard_normal((16, 16)).astype(np.float32)
  w = Tensor(a.copy()).realize()
  r = w * 2 + 1  # reads w's buffer; w's assign does not need it
  w.assign(w * 3)
  assert not r.is_realized  # not run when the assign was made
  runs = _schedules(monkeypatch)
  Tensor.realize(w)
  assert len(runs) == 1
  np.testing.assert_allclose(r.numpy(), a * 2 + 1, rtol=1e-6)
  np.testing.assert_allclose(w.numpy(), a * 3, rtol=1e-6)
  assert len(runs) == 1  # r was computed with the assign

def test_an_assign_goes_after_readers_listed_after_it(monkeypatch) -> None:
  a = np.random.default_rng(1).standard_normal((8, 32)).astype(np.float32)
  w = Tensor(a.copy()).realize()
  r = (w.T @ w).sum(0)  # a reduction over w (its own kernel), and a row sum of it
  w.assign(w - 1)
  Tensor.realize(w, r)  # w's graph first: its assign would come before r's kernels by dependencies alone
  np.testing.assert_allclose(r.numpy(), (a.T @ a).sum(0), rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(w.numpy(), a - 1, rtol=1e-6)

def _step(ws: list[Tensor], x: Tensor) -> Tensor:
  """Two linear layers, a squared loss, backward, SGD: the first layer's gradient reads the second layer's weights,
  which the second update overwrites."""
  for w in ws: w.grad = None
  loss = ((x @ ws[0]).relu() @ ws[1]).square().mean()
  loss.backward()
  for w in ws: w.assign(w.detach() - 0.1 * w.grad)
  Tensor.realize(loss, *ws)
  return loss

def _numpy_step(ws: list[np.ndarray], x: np.ndarray) -> float:
  h = x @ ws[0]
  hr = np.maximum(h, 0)
  out = hr @ ws[1]
  g_out = 2 * out / out.size
  g1 = hr.T @ g_out
  g0 = x.T @ ((g_out @ ws[1].T) * (h > 0))
  ws[0] -= 0.1 * g0
  ws[1] -= 0.1 * g1
  return float((out ** 2).mean())

def test_a_train_step_is_one_schedule_and_its_replays_match(monkeypatch) -> None:
  rng = np.random.default_rng(2)
  xs = rng.standard_normal((32, 24)).astype(np.float32)
  init = [(rng.standard_normal((24, 16)) / 5).astype(np.float32), (rng.standard_normal((16, 8)) / 4).astype(np.float32)]
  ws = [Tensor(w.copy(), requires_grad=True).realize() for w in init]
  x = Tensor(xs).realize()
  runs = _schedules(monkeypatch)
  _step(ws, x)
  assert len(runs) == 1, runs  # backward and the updates together
  want = [w.copy() for w in init]
  _numpy_step(want, xs)
  for w, ref in zip(ws, want): np.testing.assert_allclose(w.numpy(), ref, rtol=1e-4, atol=1e-5)
  jit_ws = [Tensor(w.copy(), requires_grad=True).realize() for w in init]
  jit_step = TinyJit(lambda x: _step(jit_ws, x))
  ref_ws = [w.copy() for w in init]
  for _ in range(4):
    loss = jit_step(x).numpy()
    np.testing.assert_allclose(loss, _numpy_step(ref_ws, xs), rtol=1e-4)
  for w, ref in zip(jit_ws, ref_ws): np.testing.assert_allclose(w.numpy(), ref, rtol=1e-4, atol=1e-5)

def test_a_kernel_reading_old_and_new_values_still_runs() -> None:
  """Two assigns whose later readers each need one assign's result and the other's old buffer (through tensors over
  the buffers that are no pending readers) admit no write-after-read order: the schedule falls back to dependency
  order, and realizing it does not fail."""
  a, b = np.arange(4, dtype=np.float32), np.arange(4, dtype=np.float32) * 10
  p1, p2 = Tensor(a.copy()).realize(), Tensor(b.copy()).realize()
  q1, q2 = Tensor(p1.uop), Tensor(p2.uop)  # the buffers themselves: computed, nothing to realize before an assign
  p1.assign(p1 + 1)
  p2.assign(p2 + 1)
  n1, n2 = q1 + p2, q2 + p1
  Tensor.realize(n1, n2, p1, p2)
  np.testing.assert_allclose(p1.numpy(), a + 1)
  np.testing.assert_allclose(p2.numpy(), b + 1)
  assert n1.numpy().shape == n2.numpy().shape == (4,)

def test_two_writes_into_parts_of_one_buffer_and_a_reader_of_its_old_value() -> None:
  a = np.arange(8, dtype=np.float32)
  x = Tensor(a.copy()).realize()
  r = x * 10  # the old value
  x[0:4] = x[0:4] + 1
  x[4:8] = x[4:8] + 2
  y = x * 1  # the new value
  Tensor.realize(y, r)
  np.testing.assert_allclose(r.numpy(), a * 10)
  np.testing.assert_allclose(y.numpy(), a + np.array([1] * 4 + [2] * 4, np.float32))
  np.testing.assert_allclose(x.numpy(), a + np.array([1] * 4 + [2] * 4, np.float32))
