"""Kernels whose index range exceeds int32 index with int64 (a tensor of 2**31+8 elements rendered a kernel named
`E_-2147483640`: its range end wrapped to int32); every other kernel keeps int32 indices and renders as before."""
from __future__ import annotations
from typing import Any
import numpy as np
import pytest
import ember.schedule.kernel
from ember import Tensor, dtypes
from ember.codegen import get_program
from ember.device.python import PythonRenderer
from ember.uop.ops import Ops, UOp

BIG = 2 ** 31 + 8

def kernels(t: Tensor) -> list[UOp]: return [it.ast for it in t.schedule() if it.kind == "kernel"]

def index_dtypes(uops: list[UOp]) -> set[Any]:
  return {u.dtype for u in uops if u.op is Ops.RANGE} | {u.src[1].dtype for u in uops if u.op is Ops.INDEX}

@pytest.mark.parametrize("build", [lambda t: t + 1, lambda t: t.sum(), lambda t: t.reshape(2, BIG // 2).sum(1),
                                   lambda t: t.reshape(2, BIG // 2).permute(1, 0).contiguous(),
                                   lambda t: t.reshape(2, BIG // 2)[:, 3:].contiguous()],
                         ids=["elementwise", "sum", "row_sum", "permute", "shrink"])
def test_kernels_over_int32_render_int64_indices(build: Any) -> None:
  asts = kernels(build(Tensor.empty(BIG, device="NULL")))
  wide = [a for a in asts if any(p.op is Ops.PARAM and p.dtype.size > 2 ** 31 - 1 for p in a.toposort())]
  assert wide
  for ast in wide:
    prog = get_program(ast, PythonRenderer())
    assert index_dtypes(prog.uops) == {dtypes.int64}, prog.name
    assert "-" not in prog.name and all(int(s) > 0 for s in prog.name.split("_")[1:]), prog.name

def test_elementwise_kernel_name_counts_every_element() -> None:
  (ast,) = kernels(Tensor.empty(BIG, device="NULL") + 1)
  assert get_program(ast, PythonRenderer()).name == f"E_{BIG}"

def test_ordinary_kernels_keep_int32_indices() -> None:
  t = Tensor.empty(4096, 512, device="NULL")
  for ast in kernels(t.sum(1) + t.permute(1, 0).reshape(4096, 512).max(1)):
    assert index_dtypes(get_program(ast, PythonRenderer()).uops) == {dtypes.int32}

@pytest.fixture
def int64_everywhere(monkeypatch: pytest.MonkeyPatch) -> None:
  """Every kernel over more than 50 elements indexes with int64: the int64 path runs at a size a test can afford."""
  monkeypatch.setattr(ember.schedule.kernel, "INT32_MAX", 50)

def test_int64_indices_compute_what_int32_ones_do(int64_everywhere: None) -> None:
  rng = np.random.default_rng(0)
  a, b = rng.standard_normal((37, 64)).astype(np.float32), rng.standard_normal((64, 48)).astype(np.float32)
  ta, tb = Tensor(a, device="PYTHON"), Tensor(b, device="PYTHON")
  assert index_dtypes(get_program(kernels(ta + 1)[0], PythonRenderer()).uops) == {dtypes.int64}
  idx = np.array([[5, 0, 63]] * 37, np.int32)
  checks = {"matmul": (ta @ tb, a @ b), "sum": (ta.sum(1), a.sum(1)), "max": (ta.max(0), a.max(0)),
            "permute": (ta.T.contiguous(), a.T), "pad": (ta.pad(((1, 2), (3, 0))), np.pad(a, ((1, 2), (3, 0)))),
            "flip_strided": (ta.flip(1)[2:30:3], a[:, ::-1][2:30:3]),
            "expand": (ta[:, :1].expand(37, 5), np.broadcast_to(a[:, :1], (37, 5))),
            "gather": (ta.gather(1, Tensor(idx, device="PYTHON")), np.take_along_axis(a, idx, 1)),
            "cumsum": (ta.cumsum(1), a.cumsum(1))}
  for name, (got, want) in checks.items():
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-4, err_msg=name)
