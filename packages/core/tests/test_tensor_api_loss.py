"""Losses of ember.Tensor (cross-entropy family, nll, binary cross-entropy) against torch: values and gradients."""
from __future__ import annotations
import numpy as np
import pytest
from ember import Tensor
from ember.errors import DTypeError, ShapeError

torch = pytest.importorskip("torch")
F = torch.nn.functional

from torch_oracle import check  # noqa: E402

rng = np.random.default_rng(0)
def rand(*shape: int) -> np.ndarray: return rng.standard_normal(shape).astype(np.float32)

@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("smoothing", [0.0, 0.2])
def test_cross_entropy(reduction: str, smoothing: float) -> None:
  logits, target = rand(4, 5), np.array([1, 0, 4, 2], np.int32)
  check(lambda t: t.cross_entropy(Tensor(target), reduction, smoothing),
        lambda t: F.cross_entropy(t, torch.tensor(target).long(), reduction=reduction, label_smoothing=smoothing),
        logits)
  probs = np.abs(rand(4, 5))
  probs /= probs.sum(1, keepdims=True)
  check(lambda t: t.cross_entropy(Tensor(probs), reduction, smoothing),
        lambda t: F.cross_entropy(t, torch.tensor(probs), reduction=reduction, label_smoothing=smoothing), logits)
  spatial, st = rand(2, 3, 4), np.array([[0, 2, 1, 1], [2, 2, 0, -100]], np.int32)
  weight = np.abs(rand(3)) + 0.5
  check(lambda t: t.cross_entropy(Tensor(st), reduction, smoothing, weight=Tensor(weight)),
        lambda t: F.cross_entropy(t, torch.tensor(st).long(), torch.tensor(weight), reduction=reduction,
                                  label_smoothing=smoothing),
        spatial)

@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_nll_loss(reduction: str) -> None:
  logp, target = rand(5, 4), np.array([1, 3, 0, 2, 3], np.int32)
  weight = np.abs(rand(4)) + 0.5
  for kw in ({}, {"weight": weight}, {"ignore_index": 3}, {"weight": weight, "ignore_index": 1}):
    ours_kw = {k: Tensor(v) if isinstance(v, np.ndarray) else v for k, v in kw.items()}
    ref_kw = {k: torch.tensor(v) if isinstance(v, np.ndarray) else v for k, v in kw.items()}
    check(lambda t, okw=ours_kw: t.nll_loss(Tensor(target), reduction=reduction, **okw),
          lambda t, rkw=ref_kw: F.nll_loss(t, torch.tensor(target).long(), reduction=reduction, **rkw), logp)
  with pytest.raises(DTypeError): Tensor(logp).nll_loss(Tensor(target.astype(np.float32)))
  with pytest.raises(ShapeError): Tensor(logp).nll_loss(Tensor(target[:3]))

@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_binary_cross_entropy(reduction: str) -> None:
  p = 1 / (1 + np.exp(-rand(3, 4)))
  y = (rng.random((3, 4)) > 0.5).astype(np.float32)
  check(lambda t: t.binary_crossentropy(Tensor(y), reduction),
        lambda t: F.binary_cross_entropy(t, torch.tensor(y), reduction=reduction),
        p.astype(np.float32))
  logits, pw = rand(3, 4) * 4, np.abs(rand(4)) + 0.2
  check(lambda t: t.binary_crossentropy_logits(Tensor(y), reduction),
        lambda t: F.binary_cross_entropy_with_logits(t, torch.tensor(y), reduction=reduction), logits)
  check(lambda t: t.binary_crossentropy_logits(Tensor(y), reduction, pos_weight=Tensor(pw)),
        lambda t: F.binary_cross_entropy_with_logits(t, torch.tensor(y), reduction=reduction,
                                                     pos_weight=torch.tensor(pw)), logits)
  edge = np.array([0.0, 1.0], np.float32)
  np.testing.assert_allclose(Tensor(edge).binary_crossentropy(Tensor([1.0, 0.0])).numpy(),
                             F.binary_cross_entropy(torch.tensor(edge), torch.tensor([1.0, 0.0])).numpy())

@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_sparse_categorical_crossentropy(smoothing: float) -> None:
  logits, target = rand(2, 3, 5), np.array([[1, -1, 4], [0, 2, -1]], np.int32)
  check(lambda t: t.sparse_categorical_crossentropy(Tensor(target), label_smoothing=smoothing),
        lambda t: F.cross_entropy(t.reshape(-1, 5), torch.tensor(target).long().flatten(), ignore_index=-1,
                                  label_smoothing=smoothing), logits)
