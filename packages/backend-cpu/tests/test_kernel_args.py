"""A kernel's arguments are what its program declares: simplification may drop a buffer the scheduler gave it (x*0,
x%1, a select of one value, a sort of zeros), and the launch must still pass what the kernel takes. These ops and
short chains of them, forward and backward, against numpy on the CPU (both renderers) and the PYTHON device."""
from __future__ import annotations
import os
import subprocess
import sys
from typing import Any, Callable
import numpy as np
import pytest
from ember import Tensor

def _rand(*shape: int, seed: int = 0) -> np.ndarray:
  return np.random.default_rng(seed).permutation(np.prod(shape)).reshape(shape).astype(np.float32) / 7 - 1.3

A, B = _rand(4, 5, seed=1), _rand(4, 5, seed=2) + 1 / 14  # no ties between A and B, nor with 0.25
I32 = np.arange(20, dtype=np.int32).reshape(4, 5) - 6
TRIL, TRIU = np.tril(np.ones((4, 5), np.float32)), np.triu(np.ones((4, 5), np.float32), 1)

# name: (ember forward over requires_grad inputs, numpy forward, numpy gradient of sum() for each float input or None)
CASES: dict[str, tuple[Callable[..., Tensor], Callable[..., np.ndarray], Callable[..., list[np.ndarray]] | None]] = {
  "int x*0+1": (lambda: Tensor(I32) * 0 + 1, lambda: I32 * 0 + 1, None),
  "int x%1": (lambda: Tensor(I32) % 1, lambda: I32 % 1, None),
  "bool x&False": (lambda: Tensor(I32 > 0) & False, lambda: (I32 > 0) & False, None),
  "where of one value": (lambda a: (a > 0).where(Tensor.full((4, 5), 2.0), 2.0), lambda a: np.full((4, 5), 2.0),
                         lambda a: [np.zeros_like(a)]),
  "sort of zeros": (lambda: Tensor.zeros(4, 5, requires_grad=True).sort()[0], lambda: np.zeros((4, 5)), None),
  "maximum": (lambda a, b: a.maximum(b), np.maximum, lambda a, b: [(a > b) * 1.0, (b > a) * 1.0]),
  "maximum scalar": (lambda a: a.maximum(0.25), lambda a: np.maximum(a, 0.25), lambda a: [(a > 0.25) * 1.0]),
  "maximum broadcast buffer": (lambda a: a.maximum(Tensor(np.float32([0.25]))), lambda a: np.maximum(a, 0.25),
                               lambda a: [(a > 0.25) * 1.0]),
  "pad": (lambda a: a.pad(((1, 1), (0, 2))), lambda a: np.pad(a, ((1, 1), (0, 2))), lambda a: [np.ones_like(a)]),
  "pad then slice": (lambda a: a.pad(((1, 1), (0, 2)))[1:3, 2:6], lambda a: np.pad(a, ((1, 1), (0, 2)))[1:3, 2:6],
                     lambda a: [np.pad(np.ones((2, 3)), ((0, 2), (2, 0)))]),
  "stack then max": (lambda a, b: Tensor.stack(a, b).max(0), lambda a, b: np.stack([a, b]).max(0),
                     lambda a, b: [(a > b) * 1.0, (b > a) * 1.0]),
  "tril": (lambda a: a.tril(), np.tril, lambda a: [TRIL]),
  "triu": (lambda a: a.triu(1), lambda a: np.triu(a, 1), lambda a: [TRIU]),
  "sort": (lambda a: a.sort()[0], lambda a: np.sort(a, -1), lambda a: [np.ones_like(a)]),
  "the same buffer twice": (lambda a: a * a + a, lambda a: a * a + a, lambda a: [2 * a + 1]),
  "tril of a maximum times zero": (lambda a, b: (a.maximum(b) * 0).tril() + a, lambda a, b: a,
                                   lambda a, b: [np.ones_like(a), np.zeros_like(b)]),
}

def _inputs(fn: Callable[..., Any]) -> list[np.ndarray]: return [A, B][:fn.__code__.co_argcount]

def check(name: str) -> None:
  """Run case `name` on the default device and compare its value and gradients with numpy."""
  fn, ref, grad = CASES[name]
  xs = _inputs(fn)
  ts = [Tensor(x, requires_grad=True) for x in xs]
  out = fn(*ts)
  np.testing.assert_allclose(out.numpy(), ref(*xs), rtol=1e-6, err_msg=name)
  if grad is None: return
  out.float().sum().backward()
  for t, want in zip(ts, grad(*xs)):
    assert t.grad is not None, name
    np.testing.assert_allclose(t.grad.numpy(), want, rtol=1e-6, err_msg=f"{name}: gradient")

def check_all() -> None:
  for name in CASES: check(name)

@pytest.mark.parametrize("name", list(CASES))
def test_kernel_args_on_the_default_device(name: str) -> None:
  check(name)

@pytest.mark.parametrize("dev", ["CPU:C", "CPU:LLVM", "PYTHON"])
def test_kernel_args_on_each_renderer(dev: str) -> None:
  """Every case in a fresh process with DEV set (the renderer is chosen once per process)."""
  here = os.path.dirname(os.path.abspath(__file__))
  code = f"import sys\nsys.path.insert(0, {here!r})\nimport test_kernel_args\ntest_kernel_args.check_all()\n"
  proc = subprocess.run([sys.executable, "-c", code], env={**os.environ, "DEV": dev}, capture_output=True, text=True,
                        timeout=600)
  assert proc.returncode == 0, proc.stderr[-4000:]
