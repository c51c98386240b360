"""compile_ahead's codegen order: small kernels smallest first, then the large ones largest first."""
from __future__ import annotations
import numpy as np
from ember import Tensor
from ember.uop.ops import UOp
from ember.engine.realize import LARGE_WORK, _codegen_order, _work

def _ast(t: Tensor) -> UOp:  # the kernel computing `t`
  return t.schedule()[-1].ast

def test_small_ascending_then_large_descending() -> None:
  rng = np.random.default_rng(0)
  def rand(*shape: int) -> Tensor: return Tensor(rng.standard_normal(shape).astype(np.float32))
  asts = {"add16": _ast(rand(16) + 1), "sum4k": _ast(rand(64, 64).sum(1)),
          "mm256": _ast(rand(256, 512) @ rand(512, 256)), "mm512": _ast(rand(512, 512) @ rand(512, 512))}
  work = {k: _work(a) for k, a in asts.items()}
  assert work["add16"] < work["sum4k"] < LARGE_WORK <= work["mm256"] < work["mm512"]
  todo = {k: ("CPU", None, a) for k, a in reversed(asts.items())}
  assert _codegen_order(todo) == ["add16", "sum4k", "mm512", "mm256"]
