"""@ember.function: traced once per signature (a counter in the body), scheduled once with precompile=True, traced again
for a new shape; values and gradients against torch; composition inside other functions, TinyJit and errors."""
from __future__ import annotations
import importlib
import numpy as np
import pytest
import ember
from ember import Tensor, TinyJit
from ember import schedule as scheduler
from ember.function import FunctionError

def rand(*shape: int, seed: int = 0) -> np.ndarray:
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)

@pytest.fixture
def schedules(monkeypatch: pytest.MonkeyPatch) -> list[int]:
  """How many times the scheduler ran (create_schedule calls), from the fixture on."""
  count = [0]
  original = scheduler.create_schedule
  def counted(*args, **kwargs):
    count[0] += 1
    return original(*args, **kwargs)
  monkeypatch.setattr(scheduler, "create_schedule", counted)
  return count

def test_100_calls_trace_once_and_schedule_once(schedules):
  traces = []
  @ember.function(precompile=True)
  def mlp(x: Tensor, w: Tensor) -> Tensor:
    traces.append(1)
    return (x @ w).relu().sum(1) + 1
  w_np = rand(16, 8)
  w = Tensor(w_np).realize()
  xs_np = [rand(4, 16, seed=s) for s in range(3)]
  xs = [Tensor(x).realize() for x in xs_np]
  schedules[0] = 0
  outs = [mlp(xs[i % 3], w) for i in range(100)]
  assert len(traces) == 1 and schedules[0] == 1
  for i, out in enumerate(outs):  # each call has its own output buffer
    np.testing.assert_allclose(out.numpy(), np.maximum(xs_np[i % 3] @ w_np, 0).sum(1) + 1, rtol=1e-5, atol=1e-5)
  mlp(Tensor(rand(5, 16)), w).realize()  # a new shape: a new trace
  assert len(traces) == 2
  mlp(Tensor(rand(5, 16)).cast("float16"), w.cast("float16")).realize()  # a new dtype too
  assert len(traces) == 3

def test_lazy_function_traces_once_and_composes():
  traces = []
  @ember.function
  def affine(x: Tensor, scale: float) -> Tensor:
    traces.append(1)
    return x * scale + 1
  x_np = rand(3, 4)
  for _ in range(10): out = affine(Tensor(x_np), 2.0)
  np.testing.assert_allclose((out.sum(0) * 3).numpy(), ((x_np * 2 + 1).sum(0) * 3), rtol=1e-5)
  assert len(traces) == 1
  affine(Tensor(x_np), 3.0)  # another value of a non-Tensor argument: another signature
  assert len(traces) == 2

def test_gradients_flow_through_a_function_to_arguments_and_captured_weights():
  torch = pytest.importorskip("torch")
  x_np, w_np, b_np = rand(5, 6), rand(6, 3, seed=1), rand(3, seed=2)
  b = Tensor(b_np, requires_grad=True)  # read from outside the function: its gradient flows too
  @ember.function(precompile=True, precompile_backward=True)
  def layer(x: Tensor, w: Tensor) -> Tensor: return ((x @ w) + b).gelu()
  x, w = Tensor(x_np, requires_grad=True), Tensor(w_np, requires_grad=True)
  for _ in range(2):
    x.grad = w.grad = b.grad = None
    (layer(x, w) * layer(x, w)).sum().backward()
  xt, wt, bt = (torch.tensor(a, requires_grad=True) for a in (x_np, w_np, b_np))
  yt = torch.nn.functional.gelu(xt @ wt + bt)
  (yt * yt).sum().backward()
  for ours, ref in ((x, xt), (w, wt), (b, bt)):
    np.testing.assert_allclose(ours.grad.numpy(), ref.grad.numpy(), rtol=1e-4, atol=1e-5)

def test_functions_compose_inside_functions_and_tinyjit():
  inner_traces = []
  @ember.function(precompile=True)
  def inner(x: Tensor) -> Tensor:
    inner_traces.append(1)
    return x.exp2() - 1
  @ember.function(precompile=True)
  def outer(x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]: return inner(x) * y, inner(y)
  @TinyJit
  def step(x: Tensor, y: Tensor) -> Tensor:
    a, b = outer(x, y)
    return (a + b).realize()
  x_np, y_np = rand(8), rand(8, seed=1)
  for _ in range(4):
    got = step(Tensor(x_np).realize(), Tensor(y_np).realize()).numpy()
    np.testing.assert_allclose(got, (np.exp2(x_np) - 1) * y_np + np.exp2(y_np) - 1, rtol=1e-5, atol=1e-6)
  assert len(inner_traces) == 1  # one signature, traced once inside outer's trace

def test_state_updates_in_the_body_happen_on_every_call_and_modes_are_part_of_the_signature():
  from ember import Context
  running = Tensor([0.0, 0.0]).realize()  # a running mean the body updates, like BatchNorm's
  traces = []
  @ember.function
  def norm(x: Tensor) -> Tensor:
    traces.append(Tensor.is_training())
    if not Tensor.is_training(): return x - running
    running.assign(running * 0.5 + x.mean(0) * 0.5)
    return x - x.mean(0)
  xs = [rand(4, 2, seed=s) for s in range(3)]
  expected = np.zeros(2, np.float32)
  with Context(TRAINING=1):
    for x in xs:
      np.testing.assert_allclose(norm(Tensor(x)).numpy(), x - x.mean(0), rtol=1e-5, atol=1e-6)
      expected = expected * 0.5 + x.mean(0) * 0.5
      np.testing.assert_allclose(running.numpy(), expected, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(norm(Tensor(xs[0])).numpy(), xs[0] - expected, rtol=1e-5, atol=1e-6)  # eval: own trace
  np.testing.assert_allclose(running.numpy(), expected, rtol=1e-5, atol=1e-6)
  assert traces == [True, False]

def test_function_errors():
  with pytest.raises(FunctionError, match="must return a Tensor"): ember.function(lambda x: 1)(Tensor([1]))
  with pytest.raises(FunctionError, match="hashable"): ember.function(lambda x, d: x)(Tensor([1]), {})
  w = Tensor([2.0])
  @ember.function(allow_implicit=False)
  def uses_w(x: Tensor) -> Tensor: return x * w
  with pytest.raises(FunctionError, match="not its arguments"): uses_w(Tensor([1.0]))
  assert isinstance(FunctionError("x"), TypeError)

def _sgd_steps(fn, steps: int, make_b=lambda b: b):
  """`steps` SGD steps of a loss through `fn(x, w)` (which also reads a bias `b` from outside), in ember and in torch:
  the losses and every gradient of each step, side by side."""
  torch = pytest.importorskip("torch")
  w_np, b_np = rand(5, 4, seed=1), rand(4, seed=2)
  w, b = Tensor(w_np).realize(), Tensor(b_np).realize()
  fn.bias = b
  wt, bt = torch.tensor(w_np, requires_grad=True), torch.tensor(b_np, requires_grad=True)
  got, want = [], []
  for step in range(steps):
    xs = rand(6, 5, seed=10 + step)
    x = Tensor(xs, requires_grad=True)
    if step == 1: w.requires_grad = b.requires_grad = True  # after the trace, as an optimizer sets it
    out = fn(x, w)
    loss = (out * out).sum() + out.max()
    if step == 0:  # nothing requires grad yet: a plain replay
      got.append((loss.numpy(),))
    else:
      x.grad = w.grad = b.grad = None
      loss.backward()
      got.append((loss.numpy(), x.grad.numpy(), w.grad.numpy(), b.grad.numpy()))
      w.assign(w - w.grad * 0.01).realize()
      b.assign(b - b.grad * 0.01).realize()
    xt = torch.tensor(xs, requires_grad=True)
    yt = torch.nn.functional.gelu(xt @ wt + bt).exp2() - 1
    lt = (yt * yt).sum() + yt.max()
    if step == 0: want.append((lt.detach().numpy(),))
    else:
      lt.backward()
      want.append((lt.detach().numpy(), xt.grad.numpy(), wt.grad.numpy(), bt.grad.numpy()))
      with torch.no_grad():
        wt -= wt.grad * 0.01
        bt -= bt.grad * 0.01
        wt.grad = bt.grad = None
  for g, r in zip(got, want):
    for a, e in zip(g, r): np.testing.assert_allclose(a, e, rtol=2e-4, atol=2e-4)

@pytest.mark.parametrize("precompile_backward", [False, True])
def test_precompiled_calls_train_forward_replayed_gradients_against_torch(precompile_backward, monkeypatch):
  fmod = importlib.import_module("ember.function")  # (`import ember.function` names the decorator)
  replays = []
  class Counted(fmod._Replay):
    def __init__(self, *args, **kwargs):
      replays.append(1)
      super().__init__(*args, **kwargs)
  monkeypatch.setattr(fmod, "_Replay", Counted)
  traces = []
  @ember.function(precompile=True, precompile_backward=precompile_backward)
  def layer(x: Tensor, w: Tensor) -> Tensor:
    traces.append(1)
    return ((x @ w) + layer.bias).gelu().exp2() - 1
  _sgd_steps(layer, 5)
  assert len(traces) == 1
  # the forward is scheduled once; with precompile_backward its backward too (one unit per output and signature)
  assert len(replays) == (2 if precompile_backward else 1)
  (trace,) = layer.traces.values()
  (bwd,) = trace.backwards.values()
  assert (bwd.replay is not None) == precompile_backward

def test_precompiled_backward_replays_with_several_outputs_and_views():
  torch = pytest.importorskip("torch")
  @ember.function(precompile=True, precompile_backward=True)
  def two(x: Tensor, w: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    h = (x @ w).tanh()
    return h, (h * x.sum(1, keepdim=True)).relu(), x.T  # the last one no kernel computes: it stays a view of x
  x_np, w_np = rand(3, 4), rand(4, 4, seed=1)
  for _ in range(3):
    x, w = Tensor(x_np, requires_grad=True), Tensor(w_np, requires_grad=True)
    a, c, t = two(x, w)
    ((a * 2).sum() + (c * c).sum() + (t * t.exp()).sum()).backward()
  xt, wt = torch.tensor(x_np, requires_grad=True), torch.tensor(w_np, requires_grad=True)
  at = (xt @ wt).tanh()
  ct = (at * xt.sum(1, keepdim=True)).relu()
  ((at * 2).sum() + (ct * ct).sum() + (xt.T * xt.T.exp()).sum()).backward()
  np.testing.assert_allclose(x.grad.numpy(), xt.grad.numpy(), rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(w.grad.numpy(), wt.grad.numpy(), rtol=1e-4, atol=1e-5)

def test_precompile_backward_needs_precompile():
  with pytest.raises(FunctionError, match="precompile=True"): ember.function(lambda x: x, precompile_backward=True)

def test_precompiled_calls_chain_gradients_through_lazy_arguments():
  # the arguments are lazy graphs over a trainable tensor (one the other function's output): replaying must not cut
  # them off from it
  torch = pytest.importorskip("torch")
  @ember.function(precompile=True, precompile_backward=True)
  def f(x: Tensor) -> Tensor: return (x * 3).exp2()
  @ember.function(precompile=True)
  def g(x: Tensor) -> Tensor: return x.sin() * 2
  a_np = rand(4)
  at = torch.tensor(a_np, requires_grad=True)
  torch.exp2(torch.sin(at * 1.5) * 2 * 3).sum().backward()
  for _ in range(3):
    a = Tensor(a_np, requires_grad=True)
    f(g(a * 1.5)).sum().backward()
    np.testing.assert_allclose(a.grad.numpy(), at.grad.numpy(), rtol=1e-4, atol=1e-5)

def test_precompiled_forward_and_backward_replay_inside_a_tinyjit_training_step():
  torch = pytest.importorskip("torch")
  w_np = rand(5, 3, seed=3)
  w = Tensor(w_np).realize()
  w.requires_grad = True
  @ember.function(precompile=True, precompile_backward=True)
  def f(x: Tensor) -> Tensor: return (x @ w).tanh()
  @TinyJit
  def step(x: Tensor) -> Tensor:
    w.grad = None
    loss = (f(x) ** 2).sum()
    loss.backward()
    w.assign(w - w.grad * 0.1)
    return loss.realize(w)
  wt = torch.tensor(w_np, requires_grad=True)
  for i in range(5):  # traced, captured, then replayed by the JIT with new inputs
    x_np = rand(4, 5, seed=20 + i)
    loss = step(Tensor(x_np).realize()).item()
    lt = (torch.tanh(torch.tensor(x_np) @ wt) ** 2).sum()
    lt.backward()
    with torch.no_grad():
      wt -= wt.grad * 0.1
      wt.grad = None
    np.testing.assert_allclose(loss, lt.item(), rtol=1e-5)
  np.testing.assert_allclose(w.numpy(), wt.detach().numpy(), rtol=1e-5, atol=1e-6)

def test_precompiled_state_updates_replay_in_place():
  # a BatchNorm-like body in training: the running mean it assigns is written by every replayed call, into its buffer
  torch = pytest.importorskip("torch")
  running = Tensor([0.0, 0.0, 0.0]).realize()
  buf = running.buffer()
  @ember.function(precompile=True)
  def norm(x: Tensor, w: Tensor) -> Tensor:
    running.assign(running * 0.9 + x.mean(0) * 0.1)
    return (x - x.mean(0)) * w
  w_np = rand(3, seed=5)
  w = Tensor(w_np, requires_grad=True)
  expected = np.zeros(3, np.float32)
  xs = [rand(4, 3, seed=s) for s in range(4)]
  wt = torch.tensor(w_np, requires_grad=True)
  from ember import Context
  with Context(TRAINING=1):
    for x in xs:
      out = norm(Tensor(x), w)
      w.grad = None
      (out * out).sum().backward()
      expected = expected * 0.9 + x.mean(0) * 0.1
      np.testing.assert_allclose(out.numpy(), (x - x.mean(0)) * w_np, rtol=1e-5, atol=1e-6)
      np.testing.assert_allclose(running.numpy(), expected, rtol=1e-5, atol=1e-6)
      ot = (torch.tensor(x) - torch.tensor(x).mean(0)) * wt
      wt.grad = None
      (ot * ot).sum().backward()
      np.testing.assert_allclose(w.grad.numpy(), wt.grad.numpy(), rtol=1e-4, atol=1e-5)
  assert running.buffer() is buf  # updated in place, not moved to another buffer
  (trace,) = norm.traces.values()
  assert trace.replay is not None

@pytest.mark.parametrize("precompile", [False, True])
def test_random_draws_in_a_body_draw_anew_each_call_as_plain_code_does(precompile):
  # a draw inside the trace stays in the graph and advances the RNG state every call: the same numbers as the body
  # run as plain code after the same seed (not one mask frozen at the trace)
  from ember import Context
  def body(x: Tensor) -> Tensor: return x.dropout(0.5) + x.dropout(0.5) * 10 + Tensor.rand(16)
  fn = ember.function(body, precompile=precompile)
  with Context(TRAINING=1):
    Tensor.manual_seed(7)
    plain = [body(Tensor.ones(16).contiguous()).numpy() for _ in range(4)]
    Tensor.manual_seed(7)
    got = [fn(Tensor.ones(16).contiguous()).numpy() for _ in range(4)]
  assert len(fn.traces) == 1
  for a, b in zip(got, plain): np.testing.assert_array_equal(a, b)
  assert len({a.tobytes() for a in got}) == 4

class _Scale:
  def __init__(self, k: float): self.w = Tensor([k, 2 * k])
  @ember.function
  def __call__(self, x: Tensor) -> Tensor: return x * self.w

class _Slotted:
  __slots__ = ("w",)
  def __init__(self, k: float): self.w = Tensor([k, k])
  @ember.function
  def __call__(self, x: Tensor) -> Tensor: return x + self.w

def test_a_method_traces_per_instance_and_lets_the_instance_go():
  import gc
  import weakref
  x = Tensor([1.0, 3.0])
  a, b = _Scale(1.0), _Scale(10.0)
  np.testing.assert_allclose(a(x).numpy(), [1.0, 6.0])
  np.testing.assert_allclose(b(x).numpy(), [10.0, 60.0])
  np.testing.assert_allclose(a(x).numpy(), [1.0, 6.0])  # a's own trace, not b's
  assert len(a.__call__.traces) == 1 and len(b.__call__.traces) == 1
  gone = weakref.ref(a)
  del a
  gc.collect()
  assert gone() is None and len(_Scale.__call__._by_instance) == 1  # b's traces only
  # an instance without __weakref__ is part of the signature of the function's own traces
  s, t = _Slotted(1.0), _Slotted(5.0)
  np.testing.assert_allclose(s(x).numpy(), [2.0, 4.0])
  np.testing.assert_allclose(t(x).numpy(), [6.0, 8.0])
  assert len(_Slotted.__call__.traces) == 2
