"""Benchmark suite: the performance table's workloads, ember against numpy, torch and tinygrad in one process run.

  python bench/bench_suite.py [--only matmul_1024,sum] [--rounds 7] [--json bench/results.json] [--markdown FILE]

torch and tinygrad columns appear when they are importable (tinygrad's CPU device also needs clang on PATH). Each
round runs every framework once, in turn (interleaved, so background load hits all of them alike); the figure is
the median over the rounds after one warmup round. ember runs each workload under TinyJit (as tinygrad's column does);
its first-call latency (schedule + codegen + compile, with the compile cache cold and warm) is measured separately on
the plain, un-JIT'd call. Every ember (and tinygrad) result is checked against numpy before timing. Ratios are
other / ember: above 1 means ember is faster.
"""
from __future__ import annotations
import argparse
import functools
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable
import numpy as np

try:
  import torch
  torch.set_grad_enabled(False)
except ImportError:
  torch = None

@functools.cache
def _tinygrad() -> Any:
  """tinygrad, when importable (`pip install tinygrad==0.14.0`; its CPU device needs clang on PATH), else None. Imported
  after ember has picked its own device: both read DEV, and here both mean the CPU."""
  try:
    import tinygrad
    tinygrad.Device[tinygrad.Device.DEFAULT]  # its CPU device compiles helper programs with clang on creation
    return tinygrad
  except Exception:  # noqa: BLE001  (not installed, or no usable device here: the column is left out)
    return None

@dataclass
class Workload:
  name: str
  title: str
  make: Callable[[np.random.Generator], dict[str, np.ndarray]]
  ember: Callable[..., Any]        # Tensors -> Tensor (or tuple), JIT'd
  numpy: Callable[..., Any]        # arrays -> array
  torch: Callable[..., Any] | None  # torch tensors -> tensor
  flops: float = 0.0
  nbytes: float = 0.0  # bytes a memory-bound workload must read (the weights of a matvec): GB/s is reported
  rtol: float = 1e-4
  atol: float = 1e-4
  check: bool = True
  stateful: bool = False  # the ember function updates state (a train step): checked by its own test, not here
  tinygrad: Callable[..., Any] | None = None  # tinygrad Tensors -> Tensor, JIT'd; None: the ember function (same API)
  extra: dict[str, Any] = field(default_factory=dict)
  rounds: int = 0  # timed rounds; 0: the suite's --rounds (a large batch takes seconds a call)
  skip: tuple[str, ...] = ()  # frameworks left out of this row (tinygrad's matmul 4096 takes ~30 s a call)
  numpy_timed: bool = True  # False: numpy is the oracle only (a large batch's im2col in numpy takes minutes)

# ** the workloads **

def _elementwise() -> Workload:
  n = 16 * 1024 * 1024
  return Workload("elementwise", "relu(a*b+c)*0.5, 16M float32",
                  lambda r: {k: r.standard_normal(n, dtype=np.float32) for k in "abc"},
                  lambda a, b, c: (a * b + c).relu() * 0.5,
                  lambda a, b, c: np.maximum(a * b + c, 0) * 0.5,
                  lambda a, b, c: torch.relu(a * b + c) * 0.5)

def _sum() -> Workload:
  n = 16 * 1024 * 1024
  return Workload("sum", "sum of 16M float32", lambda r: {"x": r.standard_normal(n, dtype=np.float32)},
                  lambda x: x.sum(), lambda x: x.sum(), lambda x: x.sum(), rtol=1e-3, atol=1e-1)

def _rowmax() -> Workload:
  return Workload("rowmax", "row max of 4096x4096", lambda r: {"x": r.standard_normal((4096, 4096), dtype=np.float32)},
                  lambda x: x.max(axis=1), lambda x: x.max(axis=1), lambda x: x.amax(dim=1))

def _np_softmax(x: np.ndarray) -> np.ndarray:
  e = np.exp(x - x.max(axis=-1, keepdims=True))
  return e / e.sum(axis=-1, keepdims=True)

def _softmax(cols: int = 1024) -> Workload:
  """Softmax over rows of `cols` elements, 4M elements in all (the growth rows: 1k to 64k long rows)."""
  rows = 4 * 1024 * 1024 // cols
  name = "softmax" if cols == 1024 else f"softmax_{cols // 1024}k"
  return Workload(name, f"softmax over ({rows}, {cols})",
                  lambda r: {"x": r.standard_normal((rows, cols), dtype=np.float32)},
                  lambda x: x.softmax(-1), _np_softmax, lambda x: torch.softmax(x, -1), rtol=1e-4, atol=1e-6)

def _custom_softmax() -> Workload:
  """The one-kernel softmax of examples/custom_softmax.py (a hand-written kernel) on the softmax row's (4096, 1024)."""
  from pathlib import Path
  from ember.testing.custom_kernels import load_example
  example = load_example(Path(__file__).resolve().parents[1] / "examples", "custom_softmax")
  return Workload("softmax_custom", "softmax over (4096, 1024), one custom kernel (examples/custom_softmax.py)",
                  lambda r: {"x": r.standard_normal((4096, 1024), dtype=np.float32)}, example.custom_softmax,
                  _np_softmax, lambda x: torch.softmax(x, -1), rtol=1e-4, atol=1e-6, skip=("tinygrad",))

def _matmul(n: int) -> Workload:
  return Workload(f"matmul_{n}", f"matmul {n} fp32",
                  lambda r: {k: r.standard_normal((n, n), dtype=np.float32) for k in "ab"},
                  lambda a, b: a @ b, lambda a, b: a @ b, lambda a, b: a @ b, flops=2.0 * n ** 3,
                  rtol=1e-3, atol=1e-3 * n ** 0.5, rounds=3 if n >= 4096 else 0,
                  skip=("tinygrad",) if n >= 4096 else ())

def _matvec(k: int, n: int) -> Workload:
  """A decode step's projection: x (1, k) @ W.T with W (n, k) row-major, the reduction over W's contiguous rows."""
  return Workload(f"matvec_{k}x{n}", f"matvec x(1,{k}) @ W({n},{k}).T",
                  lambda r: {"x": r.standard_normal((1, k), dtype=np.float32),
                             "w": r.standard_normal((n, k), dtype=np.float32)},
                  lambda x, w: x @ w.T, lambda x, w: x @ w.T, lambda x, w: x @ w.T, flops=2.0 * k * n,
                  nbytes=4.0 * k * n, rtol=1e-3, atol=1e-3 * k ** 0.5)

def _np_conv(x: np.ndarray, w: np.ndarray) -> np.ndarray:
  from numpy.lib.stride_tricks import sliding_window_view
  xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
  win = sliding_window_view(xp, (3, 3), axis=(2, 3))  # (N, C, H, W, 3, 3)
  return np.einsum("nchwij,ocij->nohw", win, w, optimize=True)

def _conv2d() -> Workload:
  return Workload("conv2d", "conv2d (16,64,56,56) x 64 3x3 pad 1",
                  lambda r: {"x": r.standard_normal((16, 64, 56, 56), dtype=np.float32),
                             "w": (r.standard_normal((64, 64, 3, 3), dtype=np.float32) * 0.05).astype(np.float32)},
                  lambda x, w: x.conv2d(w, padding=1), _np_conv,
                  lambda x, w: torch.nn.functional.conv2d(x, w, padding=1), flops=2.0 * 16 * 64 * 56 * 56 * 64 * 9,
                  rtol=1e-3, atol=1e-3)

# ** a real model's layers at batch 1, 64 and a large batch: the cost of a kernel must grow with the batch alone **

def _np_conv_padded(x: np.ndarray, w: np.ndarray, pad: int = 0, chunk: int = 64) -> np.ndarray:
  """NCHW conv2d, stride 1, in chunks of images (one einsum over a whole large batch copies its windows: 13 GB)."""
  from numpy.lib.stride_tricks import sliding_window_view
  k = w.shape[-1]
  out = []
  for i in range(0, len(x), chunk):
    xp = np.pad(x[i:i + chunk], ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    win = sliding_window_view(xp, (k, k), axis=(2, 3))  # (n, C, H, W, k, k)
    out.append(np.einsum("nchwij,ocij->nohw", win, w, optimize=True))
  return np.concatenate(out)

# tinygrad's beautiful_mnist: (in channels, out channels, kernel, input size) of its four convolutions
MNIST_CONVS = ((1, 32, 5, 28), (32, 32, 5, 24), (32, 64, 3, 10), (64, 64, 3, 8))
MODEL_BATCHES = {"mnist": (1, 64, 10000), "resnet": (1, 64, 256)}

def _mnist_conv(i: int, batch: int) -> Workload:
  cin, cout, k, size = MNIST_CONVS[i]
  out = size - k + 1
  big = batch >= 1000
  return Workload(f"mnist_conv{i + 1}_b{batch}", f"beautiful_mnist conv{i + 1} {cin}->{cout} {k}x{k} on {size}x{size}, "
                  f"batch {batch}",
                  lambda r: {"x": r.standard_normal((batch, cin, size, size), dtype=np.float32),
                             "w": (r.standard_normal((cout, cin, k, k), dtype=np.float32) / k / cin ** 0.5),
                             "b": r.standard_normal(cout, dtype=np.float32)},
                  lambda x, w, b: x.conv2d(w, b).relu(),
                  lambda x, w, b: np.maximum(_np_conv_padded(x, w) + b.reshape(1, -1, 1, 1), 0),
                  lambda x, w, b: torch.relu(torch.nn.functional.conv2d(x, w, b)),
                  flops=2.0 * batch * cout * out * out * cin * k * k, rtol=1e-3, atol=1e-3,
                  rounds=3 if big else 0, numpy_timed=not big)

def _bn_np(x: np.ndarray, mean: np.ndarray, var: np.ndarray, gamma: np.ndarray, beta: np.ndarray) -> np.ndarray:
  c = (1, -1, 1, 1)
  return (x - mean.reshape(c)) / np.sqrt(var.reshape(c) + 1e-5) * gamma.reshape(c) + beta.reshape(c)

def _resnet_params(r: np.random.Generator, batch: int) -> dict[str, np.ndarray]:
  c = 64
  ps = {"x": r.standard_normal((batch, c, 56, 56), dtype=np.float32)}
  for j in "12":
    ps[f"w{j}"] = (r.standard_normal((c, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32)
    ps[f"m{j}"], ps[f"g{j}"], ps[f"b{j}"] = (r.standard_normal(c).astype(np.float32) * 0.1 for _ in range(3))
    ps[f"v{j}"] = r.uniform(0.5, 1.5, c).astype(np.float32)
  return ps

def _resnet_numpy(x, w1, m1, g1, b1, v1, w2, m2, g2, b2, v2):
  h = np.maximum(_bn_np(_np_conv_padded(x, w1, 1), m1, v1, g1, b1), 0)
  return np.maximum(_bn_np(_np_conv_padded(h, w2, 1), m2, v2, g2, b2) + x, 0)

def _resnet_ember(x, w1, m1, g1, b1, v1, w2, m2, g2, b2, v2):
  def bn(h, m, v, g, b):  # eval mode: the running statistics
    c = (1, -1, 1, 1)
    return (h - m.reshape(c)) * (g / (v + 1e-5).sqrt()).reshape(c) + b.reshape(c)
  h = bn(x.conv2d(w1, padding=1), m1, v1, g1, b1).relu()
  return (bn(h.conv2d(w2, padding=1), m2, v2, g2, b2) + x).relu()

def _resnet_torch(x, w1, m1, g1, b1, v1, w2, m2, g2, b2, v2):
  F = torch.nn.functional
  h = torch.relu(F.batch_norm(F.conv2d(x, w1, padding=1), m1, v1, g1, b1, training=False))
  return torch.relu(F.batch_norm(F.conv2d(h, w2, padding=1), m2, v2, g2, b2, training=False) + x)

def _resnet_block(batch: int) -> Workload:
  big = batch >= 256
  return Workload(f"resnet_block_b{batch}", f"ResNet basic block 64ch 56x56 (conv-bn-relu-conv-bn+x), batch {batch}",
                  lambda r: _resnet_params(r, batch), _resnet_ember, _resnet_numpy, _resnet_torch,
                  flops=2 * 2.0 * batch * 64 * 56 * 56 * 64 * 9, rtol=2e-3, atol=2e-3, rounds=3 if big else 0,
                  numpy_timed=not big)

# MLP 784-512-512-10, batch 256: forward, cross-entropy, backward, SGD update (lr 0.01)
MLP_SIZES = (784, 512, 512, 10)
MLP_BATCH, MLP_LR = 256, 0.01

def _mlp_params(r: np.random.Generator) -> list[np.ndarray]:
  ps = []
  for i, o in zip(MLP_SIZES[:-1], MLP_SIZES[1:]):
    ps += [(r.standard_normal((i, o), dtype=np.float32) / np.sqrt(i)).astype(np.float32), np.zeros(o, np.float32)]
  return ps

def _mlp_numpy_step(params: list[np.ndarray], x: np.ndarray, y: np.ndarray) -> float:
  acts, h = [x], x
  for i in range(0, len(params), 2):
    h = h @ params[i] + params[i + 1]
    if i + 2 < len(params): h = np.maximum(h, 0)
    acts.append(h)
  m = h.max(-1, keepdims=True)
  e = np.exp(h - m)
  p = e / e.sum(-1, keepdims=True)
  loss = float(-np.log(p[np.arange(len(y)), y]).mean())
  g = p
  g[np.arange(len(y)), y] -= 1
  g /= len(y)
  for i in reversed(range(0, len(params), 2)):
    gw, gb = acts[i // 2].T @ g, g.sum(0)
    if i > 0: g = (g @ params[i].T) * (acts[i // 2] > 0)
    params[i] -= MLP_LR * gw
    params[i + 1] -= MLP_LR * gb
  return loss

def _mlp() -> Workload:
  wl = Workload("mlp_train", "MLP 784-512-512-10 train step, batch 256",
                lambda r: {"x": r.standard_normal((MLP_BATCH, 784), dtype=np.float32),
                           "y": r.integers(0, 10, MLP_BATCH).astype(np.int32)},
                None, None, None, stateful=True)  # type: ignore[arg-type]
  fl = sum(6 * MLP_BATCH * i * o for i, o in zip(MLP_SIZES[:-1], MLP_SIZES[1:]))
  wl.flops = float(fl)
  return wl

# transformer block: pre-LN, 8-head causal attention, 4x GELU MLP; seq 128, dim 512
T_SEQ, T_DIM, T_HEADS = 128, 512, 8

def _tf_params(r: np.random.Generator) -> dict[str, np.ndarray]:
  s = 1 / np.sqrt(T_DIM)
  return {"x": r.standard_normal((T_SEQ, T_DIM), dtype=np.float32),
          "wqkv": (r.standard_normal((T_DIM, 3 * T_DIM)) * s).astype(np.float32),
          "wo": (r.standard_normal((T_DIM, T_DIM)) * s).astype(np.float32),
          "w1": (r.standard_normal((T_DIM, 4 * T_DIM)) * s).astype(np.float32),
          "w2": (r.standard_normal((4 * T_DIM, T_DIM)) * s / 2).astype(np.float32)}

def _ln_np(x: np.ndarray) -> np.ndarray:
  m = x.mean(-1, keepdims=True)
  return (x - m) / np.sqrt(((x - m) ** 2).mean(-1, keepdims=True) + 1e-5)

def _gelu_np(x: np.ndarray) -> np.ndarray:
  return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))

def _tf_numpy(x, wqkv, wo, w1, w2):
  hd = T_DIM // T_HEADS
  qkv = _ln_np(x) @ wqkv
  q, k, v = (qkv[:, i * T_DIM:(i + 1) * T_DIM].reshape(T_SEQ, T_HEADS, hd).transpose(1, 0, 2) for i in range(3))
  att = q @ k.transpose(0, 2, 1) / np.sqrt(hd) + np.triu(np.full((T_SEQ, T_SEQ), -np.inf, np.float32), 1)
  o = (_np_softmax(att) @ v).transpose(1, 0, 2).reshape(T_SEQ, T_DIM)
  h = x + o @ wo
  return h + _gelu_np(_ln_np(h) @ w1) @ w2

def _tf_ember(x, wqkv, wo, w1, w2, gelu=lambda t: t.gelu(approximate="tanh")):
  hd = T_DIM // T_HEADS
  def ln(t):
    c = t - t.mean(-1, keepdim=True)
    return c / (c.square().mean(-1, keepdim=True) + 1e-5).sqrt()
  qkv = ln(x) @ wqkv
  q, k, v = (qkv[:, i * T_DIM:(i + 1) * T_DIM].reshape(T_SEQ, T_HEADS, hd).permute(1, 0, 2) for i in range(3))
  o = q.scaled_dot_product_attention(k, v, is_causal=True).permute(1, 0, 2).reshape(T_SEQ, T_DIM)
  h = x + o @ wo
  return h + gelu(ln(h) @ w1) @ w2

def _tf_tinygrad(x, wqkv, wo, w1, w2):
  return _tf_ember(x, wqkv, wo, w1, w2, gelu=lambda t: t.gelu())  # tinygrad's gelu is the tanh form

def _tf_torch(x, wqkv, wo, w1, w2):
  F = torch.nn.functional
  hd = T_DIM // T_HEADS
  qkv = F.layer_norm(x, (T_DIM,)) @ wqkv
  q, k, v = (qkv[:, i * T_DIM:(i + 1) * T_DIM].reshape(T_SEQ, T_HEADS, hd).transpose(0, 1) for i in range(3))
  o = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(0, 1).reshape(T_SEQ, T_DIM)
  h = x + o @ wo
  return h + F.gelu(F.layer_norm(h, (T_DIM,)) @ w1, approximate="tanh") @ w2

def _transformer() -> Workload:
  fl = 2.0 * T_SEQ * T_DIM * (3 * T_DIM + T_DIM + 8 * T_DIM) + 4.0 * T_SEQ * T_SEQ * T_DIM
  return Workload("transformer", "transformer block fwd, seq 128, dim 512, 8 heads", _tf_params, _tf_ember, _tf_numpy,
                  _tf_torch, flops=fl, rtol=2e-3, atol=2e-3, tinygrad=_tf_tinygrad)

WORKLOADS: dict[str, Callable[[], Workload]] = {
  "elementwise": _elementwise, "sum": _sum, "rowmax": _rowmax, "softmax": _softmax, "softmax_custom": _custom_softmax,
  "matmul_1024": lambda: _matmul(1024), "matmul_2048": lambda: _matmul(2048),
  "matmul_256": lambda: _matmul(256), "matmul_512": lambda: _matmul(512), "matmul_4096": lambda: _matmul(4096),
  "softmax_4k": lambda: _softmax(4096), "softmax_16k": lambda: _softmax(16384), "softmax_64k": lambda: _softmax(65536),
  "matvec_576x1536": lambda: _matvec(576, 1536), "matvec_1536x576": lambda: _matvec(1536, 576),
  "matvec_576x49152": lambda: _matvec(576, 49152), "conv2d": _conv2d, "mlp_train": _mlp,
  "transformer": _transformer}
WORKLOADS.update({f"mnist_conv{i + 1}_b{b}": functools.partial(_mnist_conv, i, b)
                  for i in range(len(MNIST_CONVS)) for b in MODEL_BATCHES["mnist"]})
WORKLOADS.update({f"resnet_block_b{b}": functools.partial(_resnet_block, b) for b in MODEL_BATCHES["resnet"]})

# ** timing **

# Worker threads keep spinning after a call: numpy's OpenBLAS pool for ~2^28 cycles (0.1 s), torch's OpenMP pool for
# a few ms. Run right after either, ember's matmul 1024 measured 18-25 ms instead of 12-14 ms (its own pool spins
# 2000 iterations, then sleeps). So in each round every framework starts after SETTLE_S of quiet, makes untimed calls
# (waking its own pool) for at least WARM_S, and then the timed one, as it would inside its own loop. One untimed call
# was not enough on every host: on one, torch's OpenMP pool took 2-3 calls to come back after the quiet (a 512^3
# matmul timed 7.9 ms after one untimed call, 0.70 ms back to back), which made small rows look 5-9x faster in ember.
SETTLE_S = 0.15
WARM_S = 0.02

def _timed(fn: Callable[[], Any]) -> float:
  st = time.perf_counter()
  fn()
  return time.perf_counter() - st

def _backward_grads(loss: Any, params: list[Any]) -> list[Any]:
  for p in params: p.grad = None
  loss.backward()
  return [p.grad for p in params]

def _mlp_jit_step(Tensor: Any, TinyJit: Any, init: list[np.ndarray], data: dict[str, np.ndarray],
                  trainable: bool = True, grads: Callable[[Any, list[Any]], list[Any]] = _backward_grads
                  ) -> Callable[[], Any]:
  """The JIT'd train step on ember or tinygrad (the same API but for gradients: tinygrad 0.14 has no requires_grad and
  takes `loss.gradient(*params)`): a function running one step, returning the loss."""
  params = [(Tensor(p.copy(), requires_grad=True) if trainable else Tensor(p.copy())).realize() for p in init]
  def step(x: Any, y: Any) -> Any:
    h = x
    for i in range(0, len(params), 2):
      h = h @ params[i] + params[i + 1]
      if i + 2 < len(params): h = h.relu()
    loss = h.sparse_categorical_crossentropy(y)
    for p, g in zip(params, grads(loss, params)): p.assign(p.detach() - MLP_LR * g)
    Tensor.realize(loss, *params)
    return loss
  jit_step = TinyJit(step)
  x, y = Tensor(data["x"]).realize(), Tensor(data["y"]).realize()
  return lambda: jit_step(x, y).numpy()

def _mlp_runners(data: dict[str, np.ndarray], r: np.random.Generator) -> dict[str, Callable[[], Any]]:
  import ember
  init = _mlp_params(r)
  nparams = [p.copy() for p in init]
  runners: dict[str, Callable[[], Any]] = {"ember": _mlp_jit_step(ember.Tensor, ember.TinyJit, init, data),
                                           "numpy": lambda: _mlp_numpy_step(nparams, data["x"], data["y"])}
  if torch is not None:
    tparams = [torch.tensor(p.copy(), requires_grad=True) for p in init]
    tx, ty = torch.tensor(data["x"]), torch.tensor(data["y"]).long()
    def torch_step() -> float:
      with torch.enable_grad():
        h = tx
        for i in range(0, len(tparams), 2):
          h = h @ tparams[i] + tparams[i + 1]
          if i + 2 < len(tparams): h = torch.relu(h)
        loss = torch.nn.functional.cross_entropy(h, ty)
        for p in tparams: p.grad = None
        loss.backward()
      with torch.no_grad():
        for p in tparams: p -= MLP_LR * p.grad
      return float(loss)
    runners["torch"] = torch_step
  if (tg := _tinygrad()) is not None:
    runners["tinygrad"] = _mlp_jit_step(tg.Tensor, tg.TinyJit, init, data, trainable=False,
                                        grads=lambda loss, params: list(loss.gradient(*params)))
  return runners

# the scheduler's and codegen's passes (ember.codegen.pass_seconds), in the order they run; a first call's remaining
# time is the lowering passes between them, the C compiler (on worker threads, beside codegen) and the run
PASSES = ("schedule", "plan packing", "simplify", "choose opts", "apply opts", "linearize", "render")

def _passes_ms(before: dict[str, float]) -> dict[str, float]:
  """Milliseconds per pass since `before` (a copy of ember.codegen.pass_seconds)."""
  from ember.codegen import pass_seconds
  return {k: (v - before.get(k, 0.0)) * 1e3 for k, v in pass_seconds.items() if v > before.get(k, 0.0)}

def _first_call(wl: Workload, data: dict[str, np.ndarray]) -> dict[str, Any]:
  """Schedule + codegen + compile + run of the plain (un-JIT'd) call: compile cache cold, then warm (on disk); the
  cold call's time per pass."""
  from ember import Tensor, Context
  from ember.codegen import pass_seconds
  from ember.engine import realize as engine
  out: dict[str, Any] = {}
  for label, cachelevel in (("cold_ms", 0), ("warm_ms", 2)):
    engine._runner_cache.clear()
    with Context(CACHELEVEL=cachelevel):
      ts = [Tensor(v).realize() for v in data.values()]
      res = wl.ember(*ts)
      outs = res if isinstance(res, tuple) else (res,)
      before = dict(pass_seconds)
      st = time.perf_counter()
      Tensor.realize(*outs)
      out[label] = (time.perf_counter() - st) * 1e3
      if cachelevel == 0: out["passes_ms"] = _passes_ms(before)
  return out

def _mlp_first_call(data: dict[str, np.ndarray]) -> dict[str, Any]:
  """The first call of a new TinyJit'd MLP train step (it runs normally: schedule + codegen + compile + run), with the
  compile cache cold, then warm (on disk); the cold call's time per pass."""
  from ember import Context, Tensor, TinyJit
  from ember.codegen import pass_seconds
  from ember.engine import realize as engine
  out: dict[str, Any] = {}
  for label, cachelevel in (("cold_ms", 0), ("warm_ms", 2)):
    engine._runner_cache.clear()
    with Context(CACHELEVEL=cachelevel):
      step = _mlp_jit_step(Tensor, TinyJit, _mlp_params(np.random.default_rng(1)), data)
      before = dict(pass_seconds)
      out[label] = _timed(step) * 1e3
      if cachelevel == 0: out["passes_ms"] = _passes_ms(before)
  return out

def bench_workload(wl: Workload, rounds: int, seed: int = 0) -> dict[str, Any]:
  from ember import Tensor, TinyJit
  r = np.random.default_rng(seed)
  data = wl.make(r)
  result: dict[str, Any] = {"name": wl.name, "title": wl.title}
  if wl.stateful:
    result["first_call"] = _mlp_first_call(data)
    runners = _mlp_runners(data, r)
  else:
    result["first_call"] = _first_call(wl, data)
    jit = TinyJit(wl.ember)
    ets = [Tensor(v).realize() for v in data.values()]
    runners = {"ember": lambda: jit(*ets).realize()}
    if wl.numpy_timed: runners["numpy"] = lambda: wl.numpy(*data.values())
    if torch is not None and wl.torch is not None:
      tts = [torch.tensor(v) for v in data.values()]
      runners["torch"] = lambda: wl.torch(*tts)
    if (tg := _tinygrad()) is not None and "tinygrad" not in wl.skip:
      tg_fn = tg.TinyJit(lambda *a: (wl.tinygrad or wl.ember)(*a).realize())
      gts = [tg.Tensor(v).realize() for v in data.values()]
      tg_dev = tg.Device[tg.Device.DEFAULT]
      runners["tinygrad"] = lambda: (tg_fn(*gts), tg_dev.synchronize())  # its CPU queue runs asynchronously
      if wl.check:
        got = (wl.tinygrad or wl.ember)(*gts).numpy()
        np.testing.assert_allclose(got, wl.numpy(*data.values()), rtol=wl.rtol, atol=wl.atol,
                                   err_msg=f"tinygrad {wl.name} differs from numpy")
    if wl.check:
      got, want = wl.ember(*ets).numpy(), wl.numpy(*data.values())
      np.testing.assert_allclose(got, want, rtol=wl.rtol, atol=wl.atol, err_msg=f"ember {wl.name} differs from numpy")
  times: dict[str, list[float]] = {k: [] for k in runners}
  for rnd in range((wl.rounds or rounds) + 1):  # round 0 warms up (JIT capture, caches)
    for k, fn in runners.items():
      time.sleep(SETTLE_S)  # the previous framework's workers stop spinning (see SETTLE_S)
      warm = time.perf_counter()
      fn()  # untimed: the timed call follows calls of its own framework, for at least WARM_S
      while time.perf_counter() - warm < WARM_S: fn()
      t = _timed(fn)
      if rnd > 0: times[k].append(t)
  if wl.stateful:  # the JIT'd train step's replay launches: µs per kernel
    from ember.engine.realize import GlobalCounters
    GlobalCounters.reset()
    runners["ember"]()
    result["kernels_per_step"] = GlobalCounters.kernel_count
  med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
  result["median_ms"] = med
  result["ratio"] = {k: med[k] / med["ember"] for k in med if k != "ember"}
  if wl.flops: result["ember_gflops"] = wl.flops / (med["ember"] / 1e3) / 1e9
  if wl.flops and "numpy" in med: result["numpy_gflops"] = wl.flops / (med["numpy"] / 1e3) / 1e9
  if wl.nbytes: result["gbs"] = {k: wl.nbytes / (v / 1e3) / 1e9 for k, v in med.items()}
  return result

def machine() -> dict[str, Any]:
  from ember import Device
  cpu = platform.processor()
  try:
    with open("/proc/cpuinfo") as f:
      cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
  except OSError: pass
  return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(), "numpy": np.__version__,
          "torch": torch.__version__ if torch is not None else None, "device": Device.DEFAULT,
          "tinygrad": _version("tinygrad") if _tinygrad() is not None else None,
          "cc": os.path.basename(getattr(Device[Device.DEFAULT].compiler, "cc", "") or "") or None,
          "renderer": type(Device[Device.DEFAULT].renderer).__name__, "load_avg": os.getloadavg()}

def _version(dist: str) -> str:
  from importlib.metadata import version, PackageNotFoundError
  try: return version(dist)
  except PackageNotFoundError: return "?"

def _passes_table(results: list[dict[str, Any]]) -> list[str]:
  """The cold first calls split by pass (ms): the scheduler's and codegen's passes, then the rest (lowering passes,
  the C compiler beside codegen, the run)."""
  rows = [r for r in results if "passes_ms" in (r.get("first_call") or {})]
  if not rows: return []
  header = "| workload | cold ms | " + " | ".join(PASSES) + " | rest |"
  rule = "| --- | ---: |" + " ---: |" * (len(PASSES) + 1)
  lines = ["First call, compile cache cold, by pass (ms):", "", header, rule]
  for r in rows:
    fc = r["first_call"]
    ms = [fc["passes_ms"].get(p, 0.0) for p in PASSES]
    lines.append(f"| {r['title']} | {fc['cold_ms']:.0f} | " + " | ".join(f"{x:.0f}" for x in ms) +
                 f" | {fc['cold_ms'] - sum(ms):.0f} |")
  return lines + [""]

def markdown(results: list[dict[str, Any]], mach: dict[str, Any]) -> str:
  others = [k for k in ("numpy", "torch", "tinygrad") if any(k in r["median_ms"] for r in results)]
  lines = ["| workload | ember ms | " + " | ".join(f"{k} ms" for k in others) + " | " +
           " | ".join(f"{k}/ember" for k in others) + " | first call cold / warm ms | ember rate |",
           "| --- | ---: | " + " | ".join("---:" for _ in others * 2) + " | ---: | ---: |"]
  for r in results:
    med, ratio = r["median_ms"], r["ratio"]
    fc = r.get("first_call")
    fcs = f"{fc['cold_ms']:.0f} / {fc['warm_ms']:.0f}" if fc else "-"
    def f(x: float | None) -> str: return "-" if x is None else f"{x:.2f}"
    rate = f"{r['gbs']['ember']:.1f} GB/s" if "gbs" in r else \
      f"{r['ember_gflops']:.1f} GFLOP/s" if "ember_gflops" in r else "-"
    lines.append(f"| {r['title']} | {f(med['ember'])} | " + " | ".join(f(med.get(k)) for k in others) + " | " +
                 " | ".join(f"{f(ratio.get(k))}x" for k in others) + f" | {fcs} | {rate} |")
  lines.append("")
  lines += _passes_table(results)
  load = ", ".join(f"{x:.1f}" for x in mach["load_avg"])
  cc = f", C compiler {mach['cc']}" if mach.get("cc") else ""
  tg = f", tinygrad {mach['tinygrad']} (CPU, default renderer)" if mach.get("tinygrad") else ""
  lines.append(f"Machine: {mach['cpu']}, {mach['cores']} cores, load average {load} at the start; "
               f"ember {mach['device']} ({mach['renderer']}{cc}), numpy {mach['numpy']}, torch {mach['torch']}{tg}, "
               f"Python {mach['python']}.")
  return "\n".join(lines)

def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--only", default="", help="comma-separated workloads: " + ", ".join(WORKLOADS))
  parser.add_argument("--rounds", type=int, default=7)
  parser.add_argument("--json", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results.json"))
  parser.add_argument("--markdown", default="", help="also write the table to this file")
  args = parser.parse_args(argv)
  names = [n for n in args.only.split(",") if n] or list(WORKLOADS)
  for n in names:
    if n not in WORKLOADS: parser.error(f"unknown workload {n!r}; choose from {', '.join(WORKLOADS)}")
  mach = machine()
  print(f"{mach['cpu']} x{mach['cores']}, ember {mach['device']} ({mach['renderer']}), torch {mach['torch']}",
        flush=True)
  results = []
  for n in names:
    res = bench_workload(WORKLOADS[n](), args.rounds)
    results.append(res)
    med, ratio = res["median_ms"], res["ratio"]
    extra = f"  {res['ember_gflops']:.1f} GFLOP/s" if "ember_gflops" in res else ""
    if "numpy_gflops" in res: extra += f" (numpy {res['numpy_gflops']:.1f})"
    if "gbs" in res: extra += "  GB/s " + " ".join(f"{k} {v:.1f}" for k, v in res["gbs"].items())
    fc = res.get("first_call")
    fcs = f"  first call cold {fc['cold_ms']:.0f} ms warm {fc['warm_ms']:.0f} ms" if fc else ""
    if fc and fc.get("passes_ms"): fcs += " (" + ", ".join(f"{k} {v:.0f}" for k, v in fc["passes_ms"].items()) + ")"
    others = "  ".join(f"{k} {med[k]:9.2f} ms ({ratio[k]:5.2f}x)" for k in ratio)
    print(f"{res['title']:52s} ember {med['ember']:9.2f} ms  {others}{extra}{fcs}", flush=True)
  with open(args.json, "w") as f: json.dump({"machine": mach, "results": results}, f, indent=1)
  if args.markdown:
    with open(args.markdown, "w") as f: f.write(markdown(results, mach) + "\n")
  return results

if __name__ == "__main__":
  sys.exit(0 if main() else 1)
