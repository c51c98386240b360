"""Checks of TinyJit's HCQ graph (`ember.device.hcq.HCQJitGraph`) that every HCQ backend runs on its MOCK device:
a replay is one queue submission, executes the captured kernels in capture order, signals the device timeline and
writes a timestamp around every kernel; swapped inputs and bound Variables are patched into the kernel arguments in
place. numpy is the oracle."""
from __future__ import annotations
from typing import Any, Callable
import numpy as np
from ember.device.hcq import HCQCompiled, HCQJitGraph
from ember.engine.jit import TinyJit
from ember.tensor import Tensor

def _mlp_step_numpy(w1: np.ndarray, w2: np.ndarray, x: np.ndarray, y: np.ndarray,
                    lr: float) -> tuple[np.ndarray, np.ndarray, float]:
  """One SGD step of relu(x @ w1) @ w2 against y under the mean squared error: the new weights and the loss."""
  h = np.maximum(x @ w1, 0)
  p = h @ w2
  dp = 2 * (p - y) / p.size
  dw2 = h.T @ dp
  dw1 = x.T @ ((dp @ w2.T) * (h > 0))
  return w1 - lr * dw1, w2 - lr * dw2, float(((p - y) ** 2).mean())

def check_mlp_step_replays_as_one_submission(dev: HCQCompiled, device: str, launches: Callable[[], list[int]],
                                             address: Callable[[Any], int], steps: int = 4) -> None:
  """An MLP training step under TinyJit on `device` (the opened HCQ device `dev`): after the capture every replay is
  one submission, runs the captured kernels in order (`launches()` lists the program address of each kernel the MOCK
  ran since the last call, `address(prg)` is a loaded program's), leaves the timeline signal at the value the replay
  signalled, records increasing per-kernel timestamps and matches numpy step by step."""
  rng = np.random.default_rng(0)
  w1n, w2n = rng.normal(size=(6, 16)).astype(np.float32), rng.normal(size=(16, 3)).astype(np.float32)
  w1, w2 = Tensor(w1n, device=device, requires_grad=True).realize(), Tensor(w2n, device=device,
                                                                            requires_grad=True).realize()
  lr = 0.05
  @TinyJit
  def step(x: Tensor, y: Tensor) -> Tensor:
    loss = (((x @ w1).relu() @ w2 - y) ** 2).mean()
    g1, g2 = loss.gradient(w1, w2)
    w1.assign(w1 - lr * g1)
    w2.assign(w2 - lr * g2)
    return loss.realize(w1, w2)
  for i in range(steps):
    xn, yn = rng.normal(size=(5, 6)).astype(np.float32), rng.normal(size=(5, 3)).astype(np.float32)
    x, y = Tensor(xn, device=device).realize(), Tensor(yn, device=device).realize()
    launches()
    before = dev.submissions
    loss = step(x, y)
    ran = launches()
    if i >= 2:  # the 1st call runs normally, the 2nd captures, later ones replay through the graph
      graph = step.graph
      assert isinstance(graph, HCQJitGraph), f"TinyJit on {device} replays without the HCQ graph: {graph!r}"
      assert dev.submissions - before == 1, f"a replay took {dev.submissions - before} submissions, not 1"
      assert ran == [address(runner.prg) for runner, _, _ in step.captured if runner is not None], \
        "kernels ran out of capture order"
      dev.synchronize()
      assert dev.timeline_signal.value == graph.graph.last_value == dev.timeline_value - 1
      times = graph.graph.kernel_times_ns()
      assert len(times) == len(step.captured) and all(0 < a <= b for a, b in times), times
      assert all(times[k][1] == times[k + 1][0] for k in range(len(times) - 1)), "timestamps are not chained"
    w1n, w2n, want = _mlp_step_numpy(w1n, w2n, xn, yn, lr)
    np.testing.assert_allclose(loss.item(), want, rtol=1e-4)
    np.testing.assert_allclose(w1.numpy(), w1n, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(w2.numpy(), w2n, rtol=1e-4, atol=1e-5)

def check_profiled_replay_is_one_submission(dev: HCQCompiled, device: str, steps: int = 5) -> None:
  """Under `ember.profile()` a TinyJit replay on `device` is still one submission, and the profile shows it: one
  kernel event per captured kernel, on the device's timer, in capture order, chained as the graph stamped them, and
  one TinyJit event that says it was one submission."""
  import ember
  w = Tensor(np.random.default_rng(1).normal(size=(8, 8)).astype(np.float32), device=device).realize()
  @TinyJit
  def step(x: Tensor) -> Tensor: return ((x @ w).relu().contiguous() * 2).sum(1).realize()  # two kernels at least
  xs = [Tensor(np.full((4, 8), i, np.float32), device=device).realize() for i in range(steps)]
  for x in xs[:2]: step(x)  # run, then capture
  assert isinstance(step.graph, HCQJitGraph), f"TinyJit on {device} replays without the HCQ graph"
  names = [runner.spec.name for runner, _, _ in step.captured if runner is not None]
  assert len(names) >= 2, names  # one launch per kernel would be more than one submission
  with ember.profile() as p:
    for i, x in enumerate(xs[2:]):
      before = dev.submissions
      out = step(x)
      # the profile's first device event measures the device clock's offset once (a timer-only submission)
      if i > 0: assert dev.submissions - before == 1, f"a profiled replay took {dev.submissions - before} submissions"
      np.testing.assert_allclose(out.numpy(), (np.maximum(x.numpy() @ w.numpy(), 0) * 2).sum(1), rtol=1e-5)
  kernels = [e for e in p.events if e.kind == "kernel"]
  assert [e.name for e in kernels] == names * (steps - 2), [e.name for e in kernels]
  assert all(e.args["timer"] == "device" and e.args["jit"] and e.args["graph"] for e in kernels)
  for r in range(steps - 2):
    one = kernels[r * len(names):(r + 1) * len(names)]
    assert all(a.args["device_end_ns"] == b.args["device_start_ns"] for a, b in zip(one, one[1:])), "not chained"
  jits = [e for e in p.events if e.kind == "jit"]
  assert len(jits) == steps - 2 and all(e.args["submissions"] == 1 for e in jits)

def check_bound_variables_patch_in_place(dev: HCQCompiled, device: str) -> None:
  """A capture symbolic in a bound Variable (a prefix of a cache, its length bound per call) and with a swapped
  input replays through the graph with each call's value written into the kernel arguments: one submission per
  call, numpy's result every time."""
  from ember import Variable
  data = np.arange(40, dtype=np.float32).reshape(10, 4)
  cache = Tensor(data, device=device).realize()
  @TinyJit
  def f(x: Tensor, pos: Any) -> Tensor: return (cache[:pos].sum(0) * x).realize()
  for k, n in enumerate((2, 3, 9, 1, 7, 4)):
    xn = np.full(4, k + 1, np.float32)
    x = Tensor(xn, device=device).realize()
    before = dev.submissions
    out = f(x, Variable("pos", 1, 10).bind(n))
    if k >= 2:
      assert isinstance(f.graph, HCQJitGraph) and dev.submissions - before == 1, dev.submissions - before
    np.testing.assert_allclose(out.numpy(), data[:n].sum(0) * xn)

__all__ = ["check_mlp_step_replays_as_one_submission", "check_bound_variables_patch_in_place"]
