"""Recurrent ops: RNN, GRU and LSTM (both directions, layout 0 and 1, clip, custom activations, LSTM peepholes,
GRU's linear_before_reset). The time loop is unrolled in Python over lazy Tensors, so a whole sequence is one graph."""
from __future__ import annotations
from typing import Callable, Sequence
from ember import Tensor
from ember.nn.onnx.errors import UnsupportedOpError
from ember.nn.onnx.registry import onnx_op
from ember.nn.onnx.ops.common import dim

def _activation(name: str, alpha: float | None, beta: float | None) -> Callable[[Tensor], Tensor]:
  acts: dict[str, Callable[[Tensor], Tensor]] = {
    "sigmoid": Tensor.sigmoid, "tanh": Tensor.tanh, "relu": Tensor.relu, "softsign": Tensor.softsign,
    "softplus": lambda x: (x.exp() + 1).log(),
    "leakyrelu": lambda x: x.leaky_relu(alpha if alpha is not None else 0.01),
    "thresholdedrelu": lambda x: (x > (alpha if alpha is not None else 1.0)).where(x, 0).cast(x.dtype),
    "elu": lambda x: x.elu(alpha if alpha is not None else 1.0),
    "affine": lambda x: x * (alpha if alpha is not None else 1.0) + (beta if beta is not None else 0.0),
    "scaledtanh": lambda x: (x * (beta if beta is not None else 1.0)).tanh() * (alpha if alpha is not None else 1.0),
    "hardsigmoid": lambda x: (x * (alpha if alpha is not None else 0.2) +
                              (beta if beta is not None else 0.5)).clip(0, 1),
  }
  if name.lower() not in acts: raise UnsupportedOpError(f"recurrent activation {name!r}")
  return acts[name.lower()]

def _activations(names: Sequence[str] | None, defaults: list[str], dirs: int, alpha: Sequence[float] | None,
                 beta: Sequence[float] | None) -> list[list[Callable[[Tensor], Tensor]]]:
  """One list of activation functions per direction (ONNX lists every direction's, forward first)."""
  names = list(names) if names else defaults * dirs
  if len(names) == len(defaults): names = names * dirs
  al, be = list(alpha or []), list(beta or [])
  fns = [_activation(n, al[i] if i < len(al) else None, be[i] if i < len(be) else None) for i, n in enumerate(names)]
  k = len(defaults)
  return [fns[d * k:(d + 1) * k] for d in range(dirs)]

def _recurrent(kind: str, x: Tensor, w: Tensor, r: Tensor, b: Tensor | None, sequence_lens: Tensor | None,
               initial_h: Tensor | None, initial_c: Tensor | None, p: Tensor | None, *, hidden_size: int | None,
               activations: Sequence[str] | None, activation_alpha: Sequence[float] | None,
               activation_beta: Sequence[float] | None, clip: float | None, direction: str, layout: int,
               linear_before_reset: int = 0, input_forget: int = 0) -> list[Tensor]:
  if layout: x = x.transpose(0, 1)  # (batch, seq, in) -> (seq, batch, in)
  seq, batch = dim(x, 0), dim(x, 1)
  if sequence_lens is not None and any(v != seq for v in sequence_lens.tolist()):
    raise UnsupportedOpError(f"{kind} with sequence_lens shorter than the sequence")
  dirs = 2 if direction == "bidirectional" else 1
  if direction not in ("forward", "reverse", "bidirectional"):
    raise UnsupportedOpError(f"{kind} direction {direction!r}")
  gates = {"RNN": 1, "GRU": 3, "LSTM": 4}[kind]
  hs = hidden_size or dim(r, -1)
  defaults = {"RNN": ["Tanh"], "GRU": ["Sigmoid", "Tanh"], "LSTM": ["Sigmoid", "Tanh", "Tanh"]}[kind]
  acts = _activations(activations, defaults, dirs, activation_alpha, activation_beta)
  def pre(v: Tensor) -> Tensor: return v.clip(-clip, clip) if clip is not None else v
  ys, hs_out, cs_out = [], [], []
  for d in range(dirs):
    wd, rd = w[d], r[d]  # (gates*H, in), (gates*H, H)
    bd = b[d] if b is not None else Tensor.zeros(2 * gates * hs, dtype=x.dtype, device=x.device)
    wb, rb = bd[:gates * hs], bd[gates * hs:]
    h = initial_h[d] if initial_h is not None else Tensor.zeros(batch, hs, dtype=x.dtype, device=x.device)
    c = initial_c[d] if initial_c is not None else Tensor.zeros(batch, hs, dtype=x.dtype, device=x.device)
    xw = x @ wd.T + wb  # (seq, batch, gates*H): the input projection of every step at once
    reverse = direction == "reverse" or d == 1
    outs: list[Tensor] = []
    for t in (range(seq - 1, -1, -1) if reverse else range(seq)):
      xt = xw[t]
      if kind == "RNN": h = acts[d][0](pre(xt + h @ rd.T + rb))
      elif kind == "GRU":
        f, g = acts[d]
        rz = xt[:, :2 * hs] + h @ rd[:2 * hs].T + rb[:2 * hs]
        z, rr = f(pre(rz[:, :hs])), f(pre(rz[:, hs:]))
        if linear_before_reset: cand = g(pre(xt[:, 2 * hs:] + rr * (h @ rd[2 * hs:].T + rb[2 * hs:])))
        else: cand = g(pre(xt[:, 2 * hs:] + (rr * h) @ rd[2 * hs:].T + rb[2 * hs:]))
        h = (1 - z) * cand + z * h
      else:
        f, g, hact = acts[d]
        gsum = xt + h @ rd.T + rb  # (batch, 4H): gates i, o, f, c
        pi, po, pf = (p[d][k * hs:(k + 1) * hs] for k in range(3)) if p is not None else (None, None, None)
        i_pre, o_pre, f_pre, c_pre = (gsum[:, k * hs:(k + 1) * hs] for k in range(4))
        i = f(pre(i_pre + c * pi if pi is not None else i_pre))
        fg = f(pre(f_pre + c * pf if pf is not None else f_pre))
        if input_forget: fg = 1 - i
        c = fg * c + i * g(pre(c_pre))
        o = f(pre(o_pre + c * po if po is not None else o_pre))
        h = o * hact(c)
      outs.append(h)
    if reverse: outs = outs[::-1]
    ys.append(outs[0].stack(*outs[1:], dim=0))  # (seq, batch, H)
    hs_out.append(h)
    cs_out.append(c)
  y = ys[0].stack(*ys[1:], dim=1)  # (seq, dirs, batch, H)
  yh, yc = hs_out[0].stack(*hs_out[1:], dim=0), cs_out[0].stack(*cs_out[1:], dim=0)  # (dirs, batch, H)
  if layout: y, yh, yc = y.permute(2, 0, 1, 3), yh.transpose(0, 1), yc.transpose(0, 1)
  return [y, yh, yc] if kind == "LSTM" else [y, yh]

@onnx_op("RNN", since=7)
def rnn(x: Tensor, w: Tensor, r: Tensor, b: Tensor | None = None, sequence_lens: Tensor | None = None,
        initial_h: Tensor | None = None, activation_alpha: list[float] | None = None,
        activation_beta: list[float] | None = None, activations: list[str] | None = None, clip: float | None = None,
        direction: str = "forward", hidden_size: int | None = None, layout: int = 0) -> list[Tensor]:
  return _recurrent("RNN", x, w, r, b, sequence_lens, initial_h, None, None, hidden_size=hidden_size,
                    activations=activations, activation_alpha=activation_alpha, activation_beta=activation_beta,
                    clip=clip, direction=direction, layout=layout)

@onnx_op("GRU", since=7)
def gru(x: Tensor, w: Tensor, r: Tensor, b: Tensor | None = None, sequence_lens: Tensor | None = None,
        initial_h: Tensor | None = None, activation_alpha: list[float] | None = None,
        activation_beta: list[float] | None = None, activations: list[str] | None = None, clip: float | None = None,
        direction: str = "forward", hidden_size: int | None = None, layout: int = 0,
        linear_before_reset: int = 0) -> list[Tensor]:
  return _recurrent("GRU", x, w, r, b, sequence_lens, initial_h, None, None, hidden_size=hidden_size,
                    activations=activations, activation_alpha=activation_alpha, activation_beta=activation_beta,
                    clip=clip, direction=direction, layout=layout, linear_before_reset=linear_before_reset)

@onnx_op("LSTM", since=7)
def lstm(x: Tensor, w: Tensor, r: Tensor, b: Tensor | None = None, sequence_lens: Tensor | None = None,
         initial_h: Tensor | None = None, initial_c: Tensor | None = None, p: Tensor | None = None,
         activation_alpha: list[float] | None = None, activation_beta: list[float] | None = None,
         activations: list[str] | None = None, clip: float | None = None, direction: str = "forward",
         hidden_size: int | None = None, input_forget: int = 0, layout: int = 0) -> list[Tensor]:
  return _recurrent("LSTM", x, w, r, b, sequence_lens, initial_h, initial_c, p, hidden_size=hidden_size,
                    activations=activations, activation_alpha=activation_alpha, activation_beta=activation_beta,
                    clip=clip, direction=direction, layout=layout, input_forget=input_forget)
