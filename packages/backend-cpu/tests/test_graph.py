"""CPUGraph: TinyJit replays through one C call give what the kernels give one by one (numpy as the oracle), with
inputs swapped, kernels split over threads, bound Variables changing between replays, and both CPU runtimes."""
from __future__ import annotations
from typing import Iterator
import numpy as np
import pytest
from cpu_kernels import reopened_cpu
from ember import Tensor, TinyJit, Variable, Context
from ember_cpu.graph import CPUGraph, worker_wakeups

@pytest.fixture(params=["CPU:C", "CPU:LLVM"])
def cpu(request: pytest.FixtureRequest) -> Iterator[str]:
  with reopened_cpu(request.param) as dev:
    assert type(dev.renderer).__name__ == ("ClangRenderer" if request.param == "CPU:C" else "CPULLVMRenderer")
    yield "CPU"

def test_replays_match_numpy_with_swapped_inputs_and_threads(cpu: str) -> None:
  rng = np.random.default_rng(0)
  @TinyJit
  def step(a: Tensor, b: Tensor) -> Tensor:
    c = (a * 2 + b).contiguous().realize()          # elementwise, large enough to split over threads
    d = (c.exp() - a).contiguous().realize()
    return (d.sum(1) + c.max(1)).realize()           # reductions
  for k in range(5):
    x = rng.standard_normal((256, 512)).astype(np.float32)
    y = rng.standard_normal((256, 512)).astype(np.float32)
    got = step(Tensor(x, device=cpu), Tensor(y, device=cpu)).numpy()
    c = x * 2 + y
    np.testing.assert_allclose(got, (np.exp(c) - x).sum(1) + c.max(1), rtol=1e-4, atol=1e-3)
    if k >= 2: assert isinstance(step.graph, CPUGraph)  # captured on the second call, replayed through C after

def test_bound_variable_changes_between_replays(cpu: str) -> None:
  data = np.arange(64, dtype=np.float32)
  buf = Tensor(data, device=cpu).realize()
  @TinyJit
  def prefix_sum(t: Tensor, n: Variable) -> Tensor:
    return (t[:n].sum() * 1).reshape(1).realize()
  for length in (5, 9, 17, 33, 64, 3):
    n = Variable("n", 1, 64).bind(length)
    got = prefix_sum(buf, n).numpy()
    assert got[0] == data[:length].sum(), length
  assert isinstance(prefix_sum.graph, CPUGraph) and prefix_sum.graph.takes_var_vals

def test_one_thread_and_many_threads_agree(cpu: str) -> None:
  x = np.random.default_rng(1).standard_normal((512, 256)).astype(np.float32)
  outs = []
  for threads in (1, 2, 3):
    with Context(NUM_CPU_THREADS=threads):
      @TinyJit
      def f(a: Tensor) -> Tensor: return ((a @ a.T).relu().contiguous().realize() + 1).realize()
      for _ in range(3): out = f(Tensor(x, device=cpu)).numpy()
      assert isinstance(f.graph, CPUGraph)
      outs.append(out)
  want = np.maximum(x @ x.T, 0) + 1
  for out in outs: np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-3)

def test_replays_in_a_loop_find_the_workers_awake(cpu: str) -> None:
  # a sleeping worker took ~35 us to wake (a quarter of a small matvec's replay); workers stay awake for a while after
  # a replay, so only a replay after a long pause wakes them from their sleep
  x = np.random.default_rng(2).standard_normal((512, 512)).astype(np.float32)
  with Context(NUM_CPU_THREADS=2):
    @TinyJit
    def f(a: Tensor) -> Tensor: return (a * 2 + 1).realize()  # split over both threads
    a = Tensor(x, device=cpu).realize()
    for _ in range(3): f(a)
    assert isinstance(f.graph, CPUGraph) and 2 in f.graph.T
    before = worker_wakeups()
    for _ in range(50): out = f(a)
    woken = worker_wakeups() - before
  np.testing.assert_allclose(out.numpy(), x * 2 + 1, rtol=1e-6)
  assert woken < 25, f"{woken} of 50 back-to-back replays woke a sleeping worker"
