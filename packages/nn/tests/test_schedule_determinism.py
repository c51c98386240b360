"""ember-nn's train steps schedule the same kernels in the same order in every process (core's
tests/schedule/test_determinism.py checks core-only programs; these need ember-nn)."""
from ember.testing.determinism import assert_schedules_identical

def test_nn_train_steps_schedule_identically_across_processes() -> None:
  assert_schedules_identical(["nn/demo_step", "nn/train_mnist_step", "nn/fashion_cnn_step"],
                             ["api/backward_attention", "bench/transformer", "api/backward_conv"])
