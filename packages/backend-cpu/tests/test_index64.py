"""Kernels whose index range exceeds int32 compile with 64-bit indices on both CPU renderers (a tensor of 2**31+8
elements rendered `E_-2147483640`, which the compiler rejected), and int64-indexed kernels compute what numpy does."""
from __future__ import annotations
from typing import Iterator
import numpy as np
import pytest
import ember.schedule.kernel
from ember import Tensor
from ember.codegen import get_program
from ember.device import Device
from cpu_kernels import device, reopened_cpu

BIG = 2 ** 31 + 8

@pytest.mark.parametrize("kind", ["C", "LLVM"])
def test_big_kernels_compile_with_64bit_indices(kind: str) -> None:
  dev = device(kind)
  t = Tensor.empty(BIG, device="NULL")
  for out in (t + 1, t.reshape(2, BIG // 2).sum(1)):
    for it in out.schedule():
      if max(b.size for b in it.bufs) <= 2 ** 31 - 1: continue  # later stages of a split sum are small
      prog = get_program(it.ast, dev.renderer)
      assert "-" not in prog.name, prog.name
      if kind == "C": assert "long long ridx0" in prog.src and " int ridx" not in prog.src
      else: assert "i64" in prog.src
      dev.compiler.compile(prog.src)  # the compiler accepts it (raises CompileError otherwise)

@pytest.fixture(params=["CPU:C", "CPU:LLVM"])
def cpu(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
  """CPU with each renderer, every kernel over more than 50 elements indexing with int64."""
  monkeypatch.setattr(ember.schedule.kernel, "INT32_MAX", 50)
  with reopened_cpu(request.param): yield "CPU"

def test_int64_indexed_kernels_match_numpy(cpu: str) -> None:
  rng = np.random.default_rng(0)
  a, b = rng.standard_normal((37, 64)).astype(np.float32), rng.standard_normal((64, 48)).astype(np.float32)
  ta, tb = Tensor(a, device=cpu), Tensor(b, device=cpu)
  src = get_program((ta + 1).schedule()[-1].ast, Device[cpu].renderer).src
  assert "long long ridx0" in src or "i64" in src
  idx = np.array([[5, 0, 63]] * 37, np.int32)
  checks = {"matmul": (ta @ tb, a @ b), "sum": (ta.sum(1), a.sum(1)), "max": (ta.max(0), a.max(0)),
            "permute": (ta.T.contiguous(), a.T), "pad": (ta.pad(((1, 2), (3, 0))), np.pad(a, ((1, 2), (3, 0)))),
            "flip_strided": (ta.flip(1)[2:30:3], a[:, ::-1][2:30:3]),
            "gather": (ta.gather(1, Tensor(idx, device=cpu)), np.take_along_axis(a, idx, 1)),
            "big_matmul": (Tensor(np.ones((96, 128), np.float32), device=cpu) @ Tensor(np.ones((128, 160), np.float32),
                                                                                       device=cpu),
                           np.full((96, 160), 128, np.float32))}
  for name, (got, want) in checks.items():
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-4, err_msg=name)
