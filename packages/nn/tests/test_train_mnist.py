"""Training end to end: a tiny MLP on synthetic blobs (fast), and the full Fashion-MNIST run (slow)."""
from __future__ import annotations
import numpy as np
import pytest
from ember.nn.datasets import DatasetError, find_fashion_mnist, synthetic_classification
from ember.nn.train_mnist import main, train

def test_tiny_mlp_learns_synthetic_data():
  x, y = synthetic_classification(384, features=12, classes=3, seed=0)
  x_test, y_test = synthetic_classification(192, features=12, classes=3, seed=0)
  acc, losses = train(x, y, x_test, y_test, epochs=2, batch_size=64, lr=1e-2)
  assert len(losses) == 12
  assert np.mean(losses[-3:]) < 0.5 * np.mean(losses[:3])
  # the blobs are separable: a trained model must beat chance (1/3) by far
  assert acc >= 0.9

def _installed() -> bool:
  try: find_fashion_mnist()
  except DatasetError: return False
  return True

@pytest.mark.slow
@pytest.mark.skipif(not _installed(), reason="Fashion-MNIST is absent (apt-get install -y dataset-fashion-mnist)")
def test_fashion_mnist_two_epochs_reach_80_percent(capsys):
  acc = main(["--epochs", "2", "--log-every", "100"])
  out = capsys.readouterr().out
  assert "test accuracy" in out
  assert acc >= 0.80
