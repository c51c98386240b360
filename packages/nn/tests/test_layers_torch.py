"""torch.nn's stateless modules, MultiheadAttention, RNN, LSTM and GRU: ember's layers with torch's parameter names
load torch's state dicts as they are and give torch's outputs and gradients (torch 2.13 CPU as the oracle)."""
from __future__ import annotations
from typing import Any
import numpy as np
import pytest
from ember import Tensor, dtypes, nn
from ember.errors import ArgumentError, ShapeError
from ember.nn.state import get_state_dict, load_state_dict

torch = pytest.importorskip("torch")

rng = np.random.default_rng(0)

def _load_from_torch(ours: Any, theirs: Any) -> None:
  load_state_dict(ours, {k: Tensor(v.detach().numpy().copy()) for k, v in theirs.state_dict().items()})

def _close(a: Tensor, b: Any, tol: float = 1e-5) -> None:
  np.testing.assert_allclose(a.numpy(), b.detach().numpy(), rtol=tol, atol=tol)

@pytest.mark.parametrize("ours,theirs", [
  (nn.ReLU(), torch.nn.ReLU()), (nn.SiLU(), torch.nn.SiLU()), (nn.Sigmoid(), torch.nn.Sigmoid()),
  (nn.Tanh(), torch.nn.Tanh()), (nn.GELU(), torch.nn.GELU()), (nn.GELU("tanh"), torch.nn.GELU("tanh")),
  (nn.LeakyReLU(0.2), torch.nn.LeakyReLU(0.2)), (nn.ELU(0.5), torch.nn.ELU(0.5)), (nn.Softmax(1), torch.nn.Softmax(1)),
  (nn.LogSoftmax(-1), torch.nn.LogSoftmax(-1)), (nn.Flatten(), torch.nn.Flatten()),
  (nn.Identity(3), torch.nn.Identity(3)),
  (nn.Flatten(0, 2), torch.nn.Flatten(0, 2)), (nn.MaxPool2d(2), torch.nn.MaxPool2d(2)),
  (nn.MaxPool2d(3, 2, 1), torch.nn.MaxPool2d(3, 2, 1)),
  (nn.AvgPool2d(2, ceil_mode=True), torch.nn.AvgPool2d(2, ceil_mode=True)),
  (nn.Upsample(scale_factor=2), torch.nn.Upsample(scale_factor=2)),
  (nn.Upsample(size=(7, 5), mode="bilinear"), torch.nn.Upsample(size=(7, 5), mode="bilinear")),
], ids=lambda m: repr(m))
def test_stateless_modules(ours: Any, theirs: Any) -> None:
  x = rng.standard_normal((2, 3, 5, 6)).astype(np.float32)
  _close(ours(Tensor(x)), theirs(torch.tensor(x)))

def test_sequential_and_modulelist_state_dict_keys_match_torch() -> None:
  ours = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
  theirs = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
  _load_from_torch(ours, theirs)
  x = rng.standard_normal((3, 4)).astype(np.float32)
  _close(ours(Tensor(x)), theirs(torch.tensor(x)))
  assert sorted(get_state_dict(nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 3)]))) == sorted(
    torch.nn.ModuleList([torch.nn.Linear(2, 2), torch.nn.Linear(2, 3)]).state_dict())

@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("masks", ["none", "causal", "bool_mask", "padding", "unbatched"])
def test_multihead_attention_matches_torch(batch_first: bool, masks: str) -> None:
  E, H, L, S, N = 8, 2, 5, 5, 3
  theirs = torch.nn.MultiheadAttention(E, H, batch_first=batch_first)
  ours = nn.MultiheadAttention(E, H, batch_first=batch_first)
  assert sorted(get_state_dict(ours)) == sorted(theirs.state_dict())
  _load_from_torch(ours, theirs)
  shape = (L, E) if masks == "unbatched" else ((N, L, E) if batch_first else (L, N, E))
  q = rng.standard_normal(shape).astype(np.float32)
  kv_shape = (S, E) if masks == "unbatched" else ((N, S, E) if batch_first else (S, N, E))
  kv = rng.standard_normal(kv_shape).astype(np.float32)
  kw_ours: dict[str, Any] = {}
  kw_theirs: dict[str, Any] = {}
  if masks == "causal":
    m = np.triu(np.ones((L, S), bool), 1)
    kw_ours["attn_mask"], kw_theirs["attn_mask"] = Tensor(m), torch.tensor(m)
  if masks == "bool_mask":
    m = rng.random((L, S)) < 0.3
    m[:, 0] = False  # no fully masked row (torch gives NaN there)
    kw_ours["attn_mask"], kw_theirs["attn_mask"] = Tensor(m), torch.tensor(m)
  if masks == "padding":
    m = np.zeros((N, S), bool)
    m[1, -2:] = True
    kw_ours["key_padding_mask"], kw_theirs["key_padding_mask"] = Tensor(m), torch.tensor(m)
  for need_weights in (True, False):
    tq = torch.tensor(q, requires_grad=True)
    eq = Tensor(q, requires_grad=True)
    out_t, w_t = theirs(tq, torch.tensor(kv), torch.tensor(kv), need_weights=need_weights, **kw_theirs)
    out_e, w_e = ours(eq, Tensor(kv), Tensor(kv), need_weights=need_weights, **kw_ours)
    _close(out_e, out_t)
    if need_weights: _close(w_e, w_t)  # type: ignore[arg-type]
    else: assert w_e is None and w_t is None
    out_t.square().sum().backward()
    out_e.square().sum().backward()
    _close(eq.grad, tq.grad, 1e-4)  # type: ignore[arg-type]
  _close(ours.in_proj_weight.grad, theirs.in_proj_weight.grad, 1e-4)  # type: ignore[arg-type]

RNNS = [("RNN", {"nonlinearity": "relu", "num_layers": 2}), ("LSTM", {}), ("GRU", {"num_layers": 2}),
        ("LSTM", {"bidirectional": True, "batch_first": True, "bias": False}), ("GRU", {"bidirectional": True})]

@pytest.mark.parametrize("kind,kwargs", RNNS, ids=[f"{k}-{'-'.join(f'{a}={b}' for a, b in kw.items())}"
                                                    for k, kw in RNNS])
def test_recurrent_layers_match_torch(kind: str, kwargs: dict[str, Any]) -> None:
  F_in, Hd, T, N = 3, 4, 3, 2  # few steps: the time loop unrolls into the graph
  theirs = getattr(torch.nn, kind)(F_in, Hd, **kwargs)
  ours = getattr(nn, kind)(F_in, Hd, **kwargs)
  assert sorted(get_state_dict(ours)) == sorted(theirs.state_dict())
  _load_from_torch(ours, theirs)
  shape = (N, T, F_in) if kwargs.get("batch_first") else (T, N, F_in)
  x = rng.standard_normal(shape).astype(np.float32)
  tx, ex = torch.tensor(x, requires_grad=True), Tensor(x, requires_grad=True)
  out_t, st_t = theirs(tx)
  out_e, st_e = ours(ex)
  _close(out_e, out_t)
  for a, b in zip(st_e if isinstance(st_e, tuple) else (st_e,), st_t if isinstance(st_t, tuple) else (st_t,)):
    _close(a, b)
  out_t.sum().backward()
  out_e.sum().backward()
  _close(ex.grad, tx.grad, 1e-4)  # type: ignore[arg-type]
  _close(ours.weight_hh_l0.grad, theirs.weight_hh_l0.grad, 1e-4)
  # an initial state and an unbatched sequence
  dirs = 2 if kwargs.get("bidirectional") else 1
  h0 = rng.standard_normal((kwargs.get("num_layers", 1) * dirs, Hd)).astype(np.float32)
  state_t = (torch.tensor(h0), torch.tensor(h0)) if kind == "LSTM" else torch.tensor(h0)
  state_e = (Tensor(h0), Tensor(h0)) if kind == "LSTM" else Tensor(h0)
  xs = rng.standard_normal((T, F_in)).astype(np.float32)
  _close(ours(Tensor(xs), state_e)[0], theirs(torch.tensor(xs), state_t)[0])

def test_bad_arguments_are_typed() -> None:
  with pytest.raises(ShapeError): nn.MultiheadAttention(6, 4)
  with pytest.raises(ArgumentError): nn.RNN(2, 3, nonlinearity="sigmoid")
  with pytest.raises(ShapeError, match="input features"): nn.LSTM(3, 4)(Tensor.zeros(5, 2, 7))
  with pytest.raises(ShapeError, match="hidden state"): nn.GRU(3, 4)(Tensor.zeros(5, 2, 3), Tensor.zeros(1, 3, 4))
  assert nn.LSTM(3, 4)(Tensor.zeros(5, 2, 3, dtype=dtypes.float32))[0].shape == (5, 2, 4)
