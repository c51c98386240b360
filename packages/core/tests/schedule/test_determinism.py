"""The same program schedules the same kernels in the same order, in any process and after any other work.

Two causes made the MLP train step 37 or 38 kernels from one run to the next: the live-tensor registry iterated in
address order (the tensors an assign realizes, and backward's leaves, reached the scheduler in another order each
process), and `find_realize` decided whether a matmul-like sum gets a buffer by whether another reduction in its
epilogue had been decided first (cross-entropy's division fused into its sum or not).
"""
from __future__ import annotations
import itertools
from ember import Tensor, dtypes
from ember.replay.record import ast_text
from ember.testing.determinism import assert_schedules_identical

# ember-nn's train steps (nn/demo_step, nn/train_mnist_step, nn/fashion_cnn_step) are checked the same way in
# packages/nn/tests/test_schedule_determinism.py, where ember-nn is installed
PROGRAMS = ["bench/mlp_train"]
OTHER_WORK = ["api/backward_attention", "bench/transformer", "api/backward_conv"]

def test_train_steps_schedule_identically_across_processes() -> None:
  assert_schedules_identical(PROGRAMS, OTHER_WORK)

def _train_step_targets() -> list[Tensor]:
  """A small MLP's cross-entropy loss and its gradients: the sum over the batch is matmul-like, and its epilogue
  divides by the count of labels that are not ignored, a reduction of a compare."""
  w1, b1 = Tensor.empty(12, 8, device="NULL", requires_grad=True), Tensor.empty(8, device="NULL", requires_grad=True)
  w2 = Tensor.empty(8, 4, device="NULL", requires_grad=True)
  x, y = Tensor.empty(16, 12, device="NULL"), Tensor.empty(16, dtype=dtypes.int32, device="NULL")
  loss = ((x @ w1 + b1).relu() @ w2).sparse_categorical_crossentropy(y)
  loss.backward()
  assert w1.grad is not None and b1.grad is not None and w2.grad is not None
  return [loss, w1.grad, b1.grad, w2.grad]

def test_kernels_do_not_depend_on_the_order_of_targets() -> None:
  targets = _train_step_targets()
  kernel_sets = set()
  for perm in itertools.permutations(targets):
    kernel_sets.add(tuple(sorted(ast_text(it.ast) for it in perm[0].schedule(*perm[1:]))))
  assert len(kernel_sets) == 1, [len(s) for s in kernel_sets]

def test_live_tensors_iterate_in_creation_order() -> None:
  from ember import tensor as tensor_module
  made = [Tensor.empty(3, device="NULL") for _ in range(50)]
  ids = {id(t) for t in made}
  assert [id(t) for t in tensor_module.all_tensors if id(t) in ids] == [id(t) for t in made]  # not ==: elementwise
  del made[10:20]
  assert len([t for t in tensor_module.all_tensors if id(t) in ids]) == 40

def test_broadcast_buffers_do_not_depend_on_the_order_of_targets() -> None:
  """`e` is worth a buffer before its broadcast (an exp); `e * 2 + 1` is cheap to recompute from that buffer, but not
  from `x`: it got a buffer of its own only when its broadcast was visited before `e`'s."""
  def kernels(first: int) -> list[str]:
    x, y, z = (Tensor.empty(*s, device="NULL") for s in ((1, 4), (64, 4), (64, 4)))
    e = x.exp()
    ts = [e.expand(64, 4) + y, (e * 2 + 1).expand(64, 4) * z]
    ts = ts[first:] + ts[:first]
    return sorted(ast_text(it.ast) for it in ts[0].schedule(*ts[1:]))
  assert kernels(0) == kernels(1)
  assert len(kernels(0)) == 3  # e, and the two outputs, each recomputing the cheap part from e's buffer
