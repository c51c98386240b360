"""Packed weights kept between calls (ember.schedule.pack_is_fresh): a matmul's B that no call of its schedule writes is
packed once into a scratch buffer kept with it, and packed again only after something wrote it: an assign, an
optimizer step, a copy-in, a TinyJit replay (through the CPU graph or call by call). Results against numpy each time."""
from __future__ import annotations
import numpy as np
import pytest
from ember import Context, Tensor, TinyJit
from ember.engine.realize import GlobalCounters
from ember.schedule import buffer_of

def _rand(*shape: int, seed: int = 0) -> np.ndarray:
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)

def _run(fn: object) -> tuple[np.ndarray, int]:
  """fn's result and the kernels it launched."""
  GlobalCounters.reset()
  out = fn().numpy()  # type: ignore[operator]
  return out, GlobalCounters.kernel_count

X, W0, W1 = _rand(64, 96), _rand(128, 96, seed=1), _rand(128, 96, seed=2)

def test_unchanged_weight_is_packed_once() -> None:
  x, w = Tensor(X).realize(), Tensor(W0).realize()
  for i in range(3):
    out, n = _run(lambda: x @ w.T)
    np.testing.assert_allclose(out, X @ W0.T, rtol=1e-4, atol=1e-4)
    assert n == (2 if i == 0 else 1)  # the pack kernel and the matmul, then the matmul alone

@pytest.mark.parametrize("how", ["assign", "assign from host", "copyin", "optimizer step"])
def test_written_weight_is_packed_again(how: str) -> None:
  x, w = Tensor(X).realize(), Tensor(W0, requires_grad=True).realize()
  _run(lambda: x @ w.T)
  if how == "assign": w.assign(Tensor(W1).realize() + 0).realize()
  elif how == "assign from host": w.assign(Tensor(W1)).realize()
  elif how == "copyin": buffer_of(w.uop).copyin(memoryview(W1.copy()).cast("B"))
  else:
    (x @ w.T).sum().backward()
    assert w.grad is not None
    w.assign(w.detach() - 0.5 * w.grad).realize()
  want_w = W0 - 0.5 * X.sum(0, keepdims=True).repeat(128, 0) if how == "optimizer step" else W1
  out, n = _run(lambda: x @ w.T)
  np.testing.assert_allclose(out, X @ want_w.T, rtol=1e-4, atol=1e-3)
  assert n == 2

def test_weight_written_in_the_same_step_is_not_kept() -> None:
  # a train step reads W, then writes it: its pack runs every step into an ordinary scratch buffer
  x, w = Tensor(X).realize(), Tensor(W0).realize()
  want = W0.copy()
  for _ in range(3):
    out = x @ w.T
    w.assign(w * 0.5)
    Tensor.realize(out, w)
    np.testing.assert_allclose(out.numpy(), X @ want.T, rtol=1e-4, atol=1e-4)
    want = want * 0.5

@pytest.mark.parametrize("graph", [True, False])
def test_jit_replay_packs_only_a_written_weight(graph: bool) -> None:
  x, w = Tensor(X).realize(), Tensor(W0).realize()
  fwd = TinyJit(lambda x: (x @ w.T).realize())
  scale = TinyJit(lambda: w.assign(w * 0.5).realize())
  want = W0.copy()
  # DEBUG=2 replays kernel by kernel instead of through the CPU graph: both paths count the weight's writes
  with Context(DEBUG=0 if graph else 2):
    for i in range(10):
      out, n = _run(lambda: fwd(x))
      np.testing.assert_allclose(out, X @ want.T, rtol=1e-4, atol=1e-4)
      if i >= 3 and i % 2: assert n == 1  # a replay after an unchanged weight: the matmul alone
      if i >= 2 and i % 2 == 0: assert n == 2  # the weight was scaled (by a replay of `scale` from i = 4): packed
      if i % 2:
        if i < 3: w.assign(w * 0.5).realize()
        else: scale()
        want = want * 0.5

def test_jit_input_weight_is_packed_where_it_changed() -> None:
  # a weight passed as the JIT's input: packed again where the call brings another buffer (a new one may take a dead
  # one's id and write count: the packed copy remembers its source by reference), not where it brings the same one
  fwd = TinyJit(lambda x, w: (x @ w.T).realize())
  x = Tensor(X).realize()
  for i in range(6):
    w_np = _rand(128, 96, seed=10 + i)
    out, n = _run(lambda w_np=w_np: fwd(x, Tensor(w_np).realize()))
    np.testing.assert_allclose(out, X @ w_np.T, rtol=1e-4, atol=1e-4)
    if i >= 2: assert n == 2
  w = Tensor(W0).realize()
  for i in range(3):
    out, n = _run(lambda: fwd(x, w))
    np.testing.assert_allclose(out, X @ W0.T, rtol=1e-4, atol=1e-4)
    assert n == (2 if i == 0 else 1)

def test_weight_with_a_host_view_is_packed_every_call() -> None:
  # writes through a zero-copy host view (a KV cache's rows) are not counted: such a B is never kept
  x, w = Tensor(X).realize(), Tensor(W0).realize()
  _run(lambda: x @ w.T)
  view = buffer_of(w.uop).as_buffer()
  assert view is not None
  np.frombuffer(view, np.float32)[:] = W1.reshape(-1)
  for _ in range(2):
    out, n = _run(lambda: x @ w.T)
    np.testing.assert_allclose(out, X @ W1.T, rtol=1e-4, atol=1e-4)
    assert n == 2

@pytest.mark.parametrize("graph", [True, False])
def test_jit_writing_its_input_makes_that_buffer_s_pack_stale(graph: bool) -> None:
  # a replay writes the buffer passed in for the captured one: its write count moves, so a kept pack of it (the matmul
  # reading it as B after the replay) is packed again, and the other weight's pack stays valid
  x, ws, wants = Tensor(X).realize(), [Tensor(W0).realize(), Tensor(W1).realize()], [W0.copy(), W1.copy()]
  scale = TinyJit(lambda w: w.assign(w * 0.5).realize())
  with Context(DEBUG=0 if graph else 2):
    for i in range(8):
      scale(ws[i % 2])
      wants[i % 2] = wants[i % 2] * 0.5
      for w, want in zip(ws, wants): np.testing.assert_allclose((x @ w.T).numpy(), X @ want.T, rtol=1e-4, atol=1e-4)
