"""ember.nn.Module against torch.nn.Module: the names and order of parameters, buffers and modules, state dicts
loaded from torch, train()/eval() as Dropout and BatchNorm see them, and user subclasses with forward()."""
from __future__ import annotations
from typing import Any
import numpy as np
import pytest
from ember import Context, Tensor, dtypes
import ember.nn as nn

torch = pytest.importorskip("torch")

def models() -> tuple[Any, nn.Sequential]:
  tm = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                           torch.nn.Dropout(0.5), torch.nn.Flatten(), torch.nn.Linear(8 * 4 * 4, 10))
  em = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Dropout(0.5), nn.Flatten(),
                     nn.Linear(8 * 4 * 4, 10))
  return tm, em

def test_names_and_order_are_torchs() -> None:
  tm, em = models()
  for what in ("named_parameters", "named_buffers", "named_modules", "named_children"):
    assert [n for n, _ in getattr(em, what)()] == [n for n, _ in getattr(tm, what)()], what
  assert sum(p.numel() for p in em.parameters()) == sum(p.numel() for p in tm.parameters())
  assert [p.shape for p in em.parameters()] == [tuple(p.shape) for p in tm.parameters()]
  assert list(em.state_dict()) == list(tm.state_dict())

def test_torch_state_dict_loads_and_eval_matches() -> None:
  tm, em = models()
  with torch.no_grad():
    tm[1].running_mean.uniform_(-1, 1)
    tm[1].running_var.uniform_(0.5, 2)
  assert em.load_state_dict({k: Tensor(v.detach().numpy()) for k, v in tm.state_dict().items()}) == ([], [])
  x = np.random.default_rng(0).standard_normal((2, 3, 4, 4)).astype(np.float32)
  np.testing.assert_allclose(em.eval()(Tensor(x)).numpy(), tm.eval()(torch.tensor(x)).detach().numpy(), atol=1e-5)
  missing = em.load_state_dict({"5.bias": Tensor(tm[5].bias.detach().numpy())}, strict=False)
  assert missing.unexpected_keys == [] and "0.weight" in missing.missing_keys

def test_train_and_eval_reach_dropout_and_batchnorm() -> None:
  tm, em = models()
  em.load_state_dict({k: Tensor(v.detach().numpy()) for k, v in tm.state_dict().items()})
  x = np.random.default_rng(1).standard_normal((4, 3, 4, 4)).astype(np.float32)
  tm.train()
  em.train()
  assert em.training and all(m.training for m in em.modules())
  with Context(TRAINING=0):  # the module's own mode wins over the global one
    drop = em[3](Tensor.ones(4000)).numpy()
    assert 0.4 < (drop == 0).mean() < 0.6 and set(np.unique(drop)) <= {0.0, 2.0}
    em[1](em[0](Tensor(x))).realize()
    em[1].running_mean.realize()
  tm[1](tm[0](torch.tensor(x)))
  np.testing.assert_allclose(em[1].running_mean.numpy(), tm[1].running_mean.numpy(), atol=1e-5)
  np.testing.assert_allclose(em[1].running_var.numpy(), tm[1].running_var.numpy(), atol=1e-5)
  em.eval()
  with Context(TRAINING=1): assert (em[3](Tensor.ones(100)).numpy() == 1).all()
  fresh = nn.Dropout(0.5)  # neither train() nor eval(): follows the global mode, as tinygrad programs expect
  assert not fresh.training and (fresh(Tensor.ones(100)).numpy() == 1).all()
  with Context(TRAINING=1): assert fresh.training

class Net(nn.Module):
  def __init__(self) -> None:
    self.stem = nn.Linear(2, 3)
    self.blocks = nn.ModuleList([nn.Linear(3, 3), nn.Linear(3, 1)])
    self.scale = nn.Parameter(Tensor.ones(1))
    self.register_buffer("seen", Tensor.zeros(1))
  def forward(self, x: Tensor) -> Tensor:
    x = self.stem(x)
    for b in self.blocks: x = b(x).relu()
    return x * self.scale

class TorchNet(torch.nn.Module):
  def __init__(self) -> None:
    super().__init__()
    self.stem = torch.nn.Linear(2, 3)
    self.blocks = torch.nn.ModuleList([torch.nn.Linear(3, 3), torch.nn.Linear(3, 1)])
    self.scale = torch.nn.Parameter(torch.ones(1))
    self.register_buffer("seen", torch.zeros(1))

def test_subclass_with_forward_parameters_and_buffers() -> None:
  net, ref = Net(), TorchNet()
  for what in ("named_parameters", "named_buffers", "named_modules"):
    assert [n for n, _ in getattr(net, what)()] == [n for n, _ in getattr(ref, what)()], what
  assert net(Tensor.ones(4, 2)).shape == (4, 1)
  net.requires_grad_(False)  # frozen weights stay parameters, as in torch
  assert len(list(net.parameters())) == 7 and not any(p.requires_grad for p in net.parameters())
  order: list[str] = []
  net.apply(lambda m: order.append(type(m).__name__))
  assert order == ["Linear", "Linear", "Linear", "ModuleList", "Net"]
  net.to(dtypes.half)
  assert {p.dtype for p in net.parameters()} == {dtypes.half}
  assert net(Tensor.ones(1, 2, dtype=dtypes.half)).shape == (1, 1)
  net.zero_grad()
  assert all(p.grad is None for p in net.parameters())
  with pytest.raises(NotImplementedError, match="forward"): nn.Module()(Tensor.ones(1))
