"""No per-call growth outside a JIT: each op family runs many times after a warm-up, and neither the process's memory
nor any of ember's internal registries and caches (kernels, calls, interned UOps, buffers, tensors, RNG state,
allocator free lists) may grow with the number of calls. A call that keeps ~0.1 MB (what `Tensor.randn` kept while its
RNG counter was a new constant in every kernel, so every call compiled and cached a new one) fails the RSS bound
within a few hundred calls and the kernel-cache bound within one."""
from __future__ import annotations
import gc
import os
from typing import Any, Callable
import numpy as np
import pytest
from ember import Device, Tensor
from ember.engine import realize as engine
from ember.multi import all_multi
from ember import schedule as schedule_module
from ember.schedule import _buffers
from ember import tensor as tensor_module
from ember.uop.ops import UOpMetaClass

RSS_BOUND_MB = 5.0
WARMUP = 20

def _rss_mb() -> float:
  with open("/proc/self/statm") as f: return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6

def _registries() -> dict[str, int]:
  allocator = Device[Device.DEFAULT].allocator
  free_lists = getattr(allocator, "cache", {})
  return {"kernel runners": len(engine._runner_cache), "packing plans": len(schedule_module._pack_plans),
          "interned UOps": len(UOpMetaClass.ucache), "buffers of UOps": len(_buffers),
          "live tensors": len(tensor_module.all_tensors), "multi tensors": len(all_multi),
          "RNG states": len(getattr(tensor_module, "_rng_states", {})),
          "free buffers": sum(len(v) for v in free_lists.values()),
          "gc objects": len(gc.get_objects())}

A = np.random.default_rng(0).standard_normal((16, 16)).astype(np.float32)
B = np.random.default_rng(1).standard_normal((16, 8)).astype(np.float32)
W = Tensor(A, requires_grad=True).realize()

def _backward() -> None:
  W.grad = None
  ((Tensor(B).T @ W).relu().sum() * 0.5).backward()
  assert W.grad is not None
  W.grad.realize()

def _numpy() -> np.ndarray:
  out = (Tensor(A) * 2).numpy()
  np.testing.assert_allclose(out, A * 2)  # the reads are real, not a no-op
  return out

# family -> (one call, iterations). The random families (a draw runs the RNG's state kernels, then a 20-round
# Threefry) and the backward pass cost several elementwise kernels per call: fewer calls keep the file fast, and still
# far outrun a 0.1 MB-per-call leak (10 MB over 100 calls) and any per-call registry growth (1 per call).
FAMILIES: dict[str, tuple[Callable[[], Any], int]] = {
  "randn": (lambda: Tensor.randn(16, 16).realize(), 100),
  "rand": (lambda: Tensor.rand(16, 16).realize(), 100),
  "randint": (lambda: Tensor.randint(16, 16, low=0, high=10).realize(), 100),
  "zeros/ones/full": (lambda: (Tensor.zeros(16, 16) + Tensor.ones(16, 16) * Tensor.full((16, 16), 3)).realize(), 1000),
  "arange/eye": (lambda: (Tensor.arange(16).reshape(1, 16) + Tensor.eye(16)).realize(), 1000),
  "from numpy": (lambda: Tensor(A).realize(), 1000),
  "elementwise": (lambda: ((Tensor(A) * 2 + 1).exp().sqrt() - Tensor(A).maximum(0)).realize(), 1000),
  "reduction": (lambda: (Tensor(A).sum(1) + Tensor(A).max(0) + Tensor(A).mean()).realize(), 1000),
  "movement": (lambda: Tensor(A).permute(1, 0).reshape(256)[3:100].pad(((2, 2),)).flip(0).contiguous().realize(), 1000),
  "matmul": (lambda: (Tensor(A) @ Tensor(B)).realize(), 1000),
  "backward": (_backward, 300),
  "realize + numpy": (_numpy, 1000),
}

@pytest.mark.parametrize("family", list(FAMILIES))
def test_no_growth_per_call(family: str) -> None:
  call, iterations = FAMILIES[family]
  for _ in range(WARMUP): call()
  gc.collect()
  before, rss_before = _registries(), _rss_mb()
  for _ in range(iterations): call()
  gc.collect()
  after, rss_after = _registries(), _rss_mb()
  grown = {k: after[k] - before[k] for k in before if after[k] - before[k] > (100 if k == "gc objects" else 0)}
  assert not grown, f"{family}: {iterations} calls after warm-up grew {grown}"
  rss_grown = rss_after - rss_before
  assert rss_grown < RSS_BOUND_MB, f"{family}: RSS grew {rss_grown:.1f} MB in {iterations} calls after warm-up"
