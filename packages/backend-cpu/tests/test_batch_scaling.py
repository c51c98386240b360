"""A model's kernels at a large batch are its kernels at a small batch with longer loops: the same opts, packing and
index width, the same code but for the loop bounds, and work that grows with the batch alone.

tinygrad's beautiful_mnist took 127 s (1.6 GFLOP/s) for its second convolution over the 10,000 test images against
~0.1 s for 1,000: past 6,710 images the flat index of the conv's window view (a reshape of B x 320,000 elements) no
longer fit int32, symbolic kept its div/mod chain and the kernel did a dozen divisions per multiply-add. With int64
indices chosen by the largest view (B x 10.24M elements, the product before the reduction), every conv past a batch
of 210 ran with 64-bit index math instead. Each reshape now indexes its runs of dims on their own, and only buffers,
dims and those runs decide the index width. Checked without timing: the schedules are compared as code."""
from __future__ import annotations
import re
from typing import Callable
import numpy as np
import pytest
from ember import Tensor
from ember.codegen import get_program
from ember.schedule import CallKind
from ember.uop.ops import Ops
from cpu_kernels import RENDERERS, device

def _mnist_model(x: Tensor) -> Tensor:
  """beautiful_mnist's forward pass in eval mode (BatchNorm as a per-channel scale and shift)."""
  def conv(x: Tensor, cin: int, cout: int, k: int) -> Tensor:
    return x.conv2d(Tensor.empty(cout, cin, k, k), Tensor.empty(cout)).relu()
  def bn(x: Tensor, c: int) -> Tensor: return x * Tensor.empty(1, c, 1, 1) + Tensor.empty(1, c, 1, 1)
  x = bn(conv(conv(x, 1, 32, 5), 32, 32, 5), 32).max_pool2d()
  x = bn(conv(conv(x, 32, 64, 3), 64, 64, 3), 64).max_pool2d()
  return x.flatten(1) @ Tensor.empty(10, 576).T + Tensor.empty(10)

def _resnet_block(x: Tensor) -> Tensor:
  """A ResNet basic block, 64 channels: conv-bn-relu-conv-bn plus the input, relu."""
  def conv_bn(x: Tensor) -> Tensor:
    return x.conv2d(Tensor.empty(64, 64, 3, 3), padding=1) * Tensor.empty(1, 64, 1, 1) + Tensor.empty(1, 64, 1, 1)
  return (conv_bn(conv_bn(x).relu()) + x).relu()

# name: (input shape without the batch, forward, small batch, large batch); the large batch is past the size where
# the old index choice changed the kernels (the ResNet block's conv went int64 from a batch of 19)
WORKLOADS: dict[str, tuple[tuple[int, ...], Callable[[Tensor], Tensor], int, int]] = {
  "mnist_conv2": ((32, 24, 24), lambda x: x.conv2d(Tensor.empty(32, 32, 5, 5)), 64, 10000),
  # (a batch of 512: at 64 its input copy and last block's elementwise kernels run on one thread, by design, under
  # THREAD_MIN_ELEMENTS)
  "mnist_model": ((1, 28, 28), _mnist_model, 512, 10000),
  "classifier_head": ((800,), lambda x: x @ Tensor.empty(800, 10), 64, 10000),
  "resnet_block": ((64, 56, 56), _resnet_block, 8, 1024),
  # the input's gradient (the weight's sums over the batch: past SUM_CHUNK_MIN elements per output they are chunked
  # for precision, a switch by design)
  "mnist_conv2_backward": ((32, 24, 24), None, 128, 4096),  # type: ignore[dict-item]
}

def _conv_backward(batch: int) -> list[Tensor]:
  x = Tensor.empty(batch, 32, 24, 24, requires_grad=True)
  x.conv2d(Tensor.empty(32, 32, 5, 5)).relu().sum().backward()
  assert x.grad is not None
  return [x.grad]

def _kernels(name: str, batch: int, kind: str) -> list[tuple[str, str, bool, int]]:
  """(call kind, source with every integer literal as N, packed, ops) for each kernel of the workload."""
  shape, fn, _, _ = WORKLOADS[name]
  outs = _conv_backward(batch) if fn is None else [fn(Tensor.empty(batch, *shape))]
  renderer = device(kind).renderer
  out = []
  for it in outs[0].schedule(*outs[1:]):
    if it.kind is CallKind.COPY or it.program is None: continue
    prog = get_program(it.program, renderer)
    out.append((it.kind.value, re.sub(r"\d+", "N", prog.src), it.packed is not None, int(prog.estimates.ops)))
  return out

@pytest.mark.parametrize("kind", RENDERERS)
@pytest.mark.parametrize("name", list(WORKLOADS))
def test_large_batch_runs_the_small_batch_kernels(name: str, kind: str) -> None:
  _, _, small, large = WORKLOADS[name]
  few, many = _kernels(name, small, kind), _kernels(name, large, kind)
  assert [k[0] for k in many] == [k[0] for k in few]
  for i, ((_, src_few, packed_few, ops_few), (_, src_many, packed_many, ops_many)) in enumerate(zip(few, many)):
    assert packed_many == packed_few, f"kernel {i}"
    assert src_many == src_few, f"kernel {i}: the code at batch {large} differs from the code at batch {small}"
    # the work of a kernel over the batch grows with it; one over the weights alone (packing, the bias) does not
    assert ops_many * small in (ops_few * small, ops_few * large), f"kernel {i}: {ops_few} -> {ops_many} ops"

def test_long_sums_over_several_dims_chunk_along_the_dims() -> None:
  # a conv's weight gradient at a batch of 200 sums 80,000 products per weight: past SUM_CHUNK_MIN it is chunked for
  # precision, and the chunks are whole images (8 x 20 x 20), not flat runs of 4,096 that div/mod split back into
  # (image, row, column) in the inner loop (0.15 GFLOP/s at a batch of 512)
  rng = np.random.default_rng(0)
  x, w = rng.standard_normal((200, 8, 24, 24), dtype=np.float32), rng.standard_normal((8, 8, 5, 5), dtype=np.float32)
  g = rng.standard_normal((200, 8, 20, 20), dtype=np.float32)
  tw = Tensor(w, requires_grad=True)
  (Tensor(x).conv2d(tw) * Tensor(g)).sum().backward()
  assert tw.grad is not None
  renderer = device("C").renderer
  progs = [get_program(it.program, renderer) for it in tw.grad.schedule() if it.kind is CallKind.KERNEL]
  sums = [p for p in progs if any(u.op is Ops.DEFINE_ACC for u in p.uops)]
  assert len(sums) == 2 and not any(u.op in (Ops.IDIV, Ops.MOD) for p in sums for u in p.uops)
  from numpy.lib.stride_tricks import sliding_window_view
  want = np.einsum("nohw,nchwij->ocij", g.astype(np.float64), sliding_window_view(x, (5, 5), axis=(2, 3)))
  np.testing.assert_allclose(tw.grad.numpy(), want, rtol=1e-4, atol=1e-3)
