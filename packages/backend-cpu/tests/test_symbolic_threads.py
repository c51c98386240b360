"""Kernels whose outermost loop runs over a bound Variable (a decode step's cached positions) are split over the CPU
threads like loops of constant trip count: each thread's share is computed when the kernel runs, from the value bound
then. Checked against numpy on both CPU renderers, launched one by one and replayed through CPUGraph, with values
below, at and above the thread count."""
from __future__ import annotations
from typing import Callable, Iterator
import numpy as np
import pytest
from cpu_kernels import reopened_cpu
from ember import Tensor, TinyJit, Variable, Context
from ember.codegen import get_program
from ember.device import Device
from ember_cpu.graph import CPUGraph

THREADS = 4
ROWS, COLS = 4096, 64  # the Variable's largest value x COLS elements: past the thread-split thresholds
VALUES = (1, 2, 3, THREADS, 5, 7, 1000, ROWS)

@pytest.fixture(params=["CPU:C", "CPU:LLVM"])
def cpu(request: pytest.FixtureRequest) -> Iterator[str]:
  with reopened_cpu(request.param), Context(NUM_CPU_THREADS=THREADS): yield "CPU"

# kernel bodies over the first n rows of x (n, COLS): the symbolic loop outermost (elementwise, a reduction of each
# row), or inside a constant one (a reduction over the rows)
CASES: dict[str, tuple[Callable[[Tensor], Tensor], Callable[[np.ndarray], np.ndarray], bool]] = {
  "elementwise": (lambda x: x * 2 + 1, lambda a: a * 2 + 1, True),
  "row sums": (lambda x: x.exp().sum(-1), lambda a: np.exp(a).sum(-1), True),
  "sums over the rows": (lambda x: (x * x).sum(0), lambda a: (a * a).sum(0), False),
}

def _check(got: Tensor, want: np.ndarray, n: int, symbolic_rows: bool) -> None:
  if symbolic_rows:
    host = np.frombuffer(got.realize().buffer().as_buffer(), np.float32)
    width = want.size // n
    np.testing.assert_allclose(host[:n * width].reshape(want.shape), want, rtol=1e-5, atol=1e-4)
  else: np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-3)

@pytest.mark.parametrize("case", list(CASES))
def test_split_over_threads(cpu: str, case: str) -> None:
  fn, ref, symbolic_rows = CASES[case]
  a = np.random.default_rng(1).standard_normal((ROWS, COLS)).astype(np.float32)
  x = Tensor(a, device=cpu).realize()
  v = Variable("n", 1, ROWS)
  out = fn(x.shrink(((0, v.bind(3)), (0, COLS))))
  ast = [it for it in out.schedule() if it.kind != "copy"][-1].ast
  assert get_program(ast, Device[cpu].renderer).global_size == [THREADS, 1, 1]
  for n in VALUES: _check(fn(x.shrink(((0, v.bind(n)), (0, COLS)))), ref(a[:n]), n, symbolic_rows)

@pytest.mark.parametrize("case", list(CASES))
def test_graph_replays_with_changing_values(cpu: str, case: str) -> None:
  fn, ref, symbolic_rows = CASES[case]
  a = np.random.default_rng(2).standard_normal((ROWS, COLS)).astype(np.float32)
  x = Tensor(a, device=cpu).realize()
  v = Variable("n", 1, ROWS)
  step = TinyJit(lambda t, n: fn(t.shrink(((0, n), (0, COLS)))).contiguous().realize())
  for k, n in enumerate((9, 10) + VALUES):  # the first two calls run and capture
    _check(step(x, v.bind(n)), ref(a[:n]), n, symbolic_rows)
    if k >= 2: assert isinstance(step.graph, CPUGraph)
