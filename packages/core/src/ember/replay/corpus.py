"""The fixed corpus of process replay: workloads whose kernels every capture records.

Each workload builds its tensors on the default device and realizes them. The capture makes that device NULL (nothing
runs; inputs are `Tensor.empty`, never read) or, for the small Tensor API workloads whose ops read data back (index
bounds checks read `.item()`), PYTHON, the interpreter, where the empty inputs hold zeros. The scheduler does not
depend on the device, so the kernels are the same either way. The corpus never changes with the tree it captures: the
driver and this file always come from the working tree, and they use only Tensor and ember.nn APIs that exist at
b3dcab1, so the same corpus runs against older trees (`python -m ember.replay capture --tree`).

* ``bench/*``: bench/bench_suite.py's workloads at its sizes (the bench runs them under TinyJit, whose first call
  runs the same kernels).
* ``api/*``: a representative set of Tensor API ops (elementwise, reductions, movement, indexing, nn ops, losses and
  backward passes) at small, odd sizes.
* ``nn/*``: the train steps of ember.nn's examples (demo, train_mnist, examples/train_fashion_mnist.py's CNN).
* ``llm/*``: the ember.nn.llm Llama with SmolLM2-135M's shapes and random weights (two layers: every layer runs the
  same kernels): a prefill of four tokens, then one decode step.
"""
from __future__ import annotations
from dataclasses import dataclass
from typing import Any, Callable, cast
import numpy as np
from ember import Tensor, dtypes
from . import pipeline

@dataclass(frozen=True)
class Workload:
  run: Callable[[], None]
  device: str = "NULL"

def _realize(*ts: Tensor) -> None: Tensor.realize(*ts)

def _f(*shape: int) -> Tensor: return Tensor.empty(*shape, dtype=dtypes.float32)
# index buffers hold zeros, not empty()'s arbitrary contents: gather, one_hot and the losses read their indices when
# called (an index out of range raises), and 0 is in range for every use here; the kernels read a buffer either way
def _i(*shape: int) -> Tensor: return Tensor(np.zeros(shape, np.int32))
def _max_pool(x: Tensor, size: int) -> Tensor: return cast(Tensor, x.max_pool2d(size))  # no indices asked for

# ** bench/bench_suite.py's workloads **

BENCH_N = 16 * 1024 * 1024
MLP_SIZES, MLP_BATCH, MLP_LR = (784, 512, 512, 10), 256, 0.01
T_SEQ, T_DIM, T_HEADS = 128, 512, 8

def _bench_mlp_train() -> None:
  """One SGD step of the bench's MLP 784-512-512-10, batch 256: forward, cross-entropy, backward, update."""
  params = []
  for i, o in zip(MLP_SIZES[:-1], MLP_SIZES[1:]): params += [_f(i, o).requires_grad_(), _f(o).requires_grad_()]
  h = _f(MLP_BATCH, 784)
  for i in range(0, len(params), 2):
    h = h @ params[i] + params[i + 1]
    if i + 2 < len(params): h = h.relu()
  loss = h.sparse_categorical_crossentropy(_i(MLP_BATCH))
  loss.backward()
  for p in params:
    assert p.grad is not None
    p.assign(p.detach() - MLP_LR * p.grad)
  _realize(loss, *params)

def _bench_transformer() -> None:
  """The bench's pre-LN transformer block: 8-head causal attention and a 4x GELU MLP, seq 128, dim 512."""
  hd = T_DIM // T_HEADS
  x, wqkv, wo = _f(T_SEQ, T_DIM), _f(T_DIM, 3 * T_DIM), _f(T_DIM, T_DIM)
  w1, w2 = _f(T_DIM, 4 * T_DIM), _f(4 * T_DIM, T_DIM)
  def ln(t: Tensor) -> Tensor:
    c = t - t.mean(-1, keepdim=True)
    return c / (c.square().mean(-1, keepdim=True) + 1e-5).sqrt()
  qkv = ln(x) @ wqkv
  q, k, v = (qkv[:, i * T_DIM:(i + 1) * T_DIM].reshape(T_SEQ, T_HEADS, hd).permute(1, 0, 2) for i in range(3))
  o = q.scaled_dot_product_attention(k, v, is_causal=True).permute(1, 0, 2).reshape(T_SEQ, T_DIM)  # (T, D)
  h = x + o @ wo
  _realize(h + (ln(h) @ w1).gelu(approximate="tanh") @ w2)

BENCH: dict[str, Callable[[], None]] = {
  "bench/elementwise": lambda: _realize((_f(BENCH_N) * _f(BENCH_N) + _f(BENCH_N)).relu() * 0.5),
  "bench/sum": lambda: _realize(_f(BENCH_N).sum()),
  "bench/rowmax": lambda: _realize(_f(4096, 4096).max(axis=1)),
  "bench/softmax": lambda: _realize(_f(4096, 1024).softmax(-1)),
  "bench/matmul_1024": lambda: _realize(_f(1024, 1024) @ _f(1024, 1024)),
  "bench/matmul_2048": lambda: _realize(_f(2048, 2048) @ _f(2048, 2048)),
  "bench/matvec_576x1536": lambda: _realize(_f(1, 576) @ _f(1536, 576).T),
  "bench/matvec_1536x576": lambda: _realize(_f(1, 1536) @ _f(576, 1536).T),
  "bench/matvec_576x49152": lambda: _realize(_f(1, 576) @ _f(49152, 576).T),
  "bench/conv2d": lambda: _realize(_f(16, 64, 56, 56).conv2d(_f(64, 64, 3, 3), padding=1)),
  "bench/mlp_train": _bench_mlp_train,
  "bench/transformer": _bench_transformer,
}

# ** Tensor API ops **

def _backward(loss: Tensor, *params: Tensor) -> None:
  loss.backward()
  _realize(loss, *[p.grad for p in params if p.grad is not None])

def _matmul_backward() -> None:
  a, b = _f(9, 17).requires_grad_(), _f(17, 5).requires_grad_()
  _backward((a @ b).relu().sum(), a, b)

def _conv_backward() -> None:
  x, w, bias = _f(2, 3, 9, 8).requires_grad_(), _f(4, 3, 3, 3).requires_grad_(), _f(4).requires_grad_()
  y = _max_pool(x.conv2d(w, bias, padding=1).relu(), 2)
  _backward(y.mean((2, 3)).cross_entropy(_i(2)), x, w, bias)

def _attention_backward() -> None:
  q, k, v = (_f(2, 3, 7, 8).requires_grad_() for _ in range(3))
  _backward(q.scaled_dot_product_attention(k, v, is_causal=True).square().mean(), q, k, v)

def _norm_backward() -> None:
  x, w = _f(6, 10).requires_grad_(), _f(10).requires_grad_()
  c = x - x.mean(-1, keepdim=True)
  normed = c / (c.square().mean(-1, keepdim=True) + 1e-5).sqrt()
  _backward((normed * w).gelu().logsumexp(1).sum(), x, w)

def _embedding_backward() -> None:
  table = _f(11, 6).requires_grad_()
  idx = _i(3, 5)
  _backward((table[idx] * 2).tanh().sum(), table)

def _setitem() -> None:
  x = _f(6, 10).contiguous()
  x[1:4, ::2] = _f(3, 5)
  _realize(x)

API: dict[str, Callable[[], None]] = {
  "api/unary_math": lambda: _realize(_f(6, 10).exp() + _f(6, 10).log() * _f(6, 10).sqrt() + _f(6, 10).rsqrt()),
  "api/trig": lambda: _realize(_f(6, 10).sin() + _f(6, 10).cos() + _f(6, 10).tan() + _f(6, 10).atan()),
  "api/activations": lambda: _realize(_f(6, 10).gelu() + _f(6, 10).silu() + _f(6, 10).elu(0.7)
                                      + _f(6, 10).leaky_relu(0.2) + _f(6, 10).hardswish() + _f(6, 10).softplus()
                                      + _f(6, 10).mish() + _f(6, 10).sigmoid() + _f(6, 10).erf()),
  "api/rounding": lambda: _realize(_f(6, 10).round() + _f(6, 10).sign() + _f(6, 10).abs() + _f(6, 10).floor()
                                   + _f(6, 10).ceil() + _f(6, 10).trunc()),
  "api/pow_div_where": lambda: _realize((_f(6, 10) ** _f(6, 10)) / _f(6, 10)
                                        + (_f(6, 10) > 0).where(_f(6, 10), _f(6, 10) * 0.1)),
  "api/int_math": lambda: _realize((_i(6, 10) // 3 + _i(6, 10) % 4) * 2 - _i(6, 10).maximum(_i(6, 10))),
  "api/bitwise": lambda: _realize(((_i(6, 10) & 5) | (_i(6, 10) ^ 3)) << 2 >> 1),
  "api/compare_logical": lambda: _realize(((_f(6, 10) < _f(6, 10)) & (_f(6, 10) != 0)).logical_not()),
  "api/casts": lambda: _realize(_f(6, 10).cast(dtypes.int8).cast(dtypes.float16).cast(dtypes.float32)
                                + _i(6, 10).cast(dtypes.float64).cast(dtypes.float32)),
  "api/half": lambda: _realize((_f(6, 10).half() * _f(6, 10).half()).exp().sum(1)),
  "api/bfloat16_softmax": lambda: _realize(_f(6, 10).cast(dtypes.bfloat16).softmax(1)),
  "api/bitcast": lambda: _realize(_f(6, 10).bitcast(dtypes.int32) + 1),
  "api/reduce": lambda: _realize(_f(6, 10).sum(1) + _f(6, 10).max(1) + _f(6, 10).mean(1) + _f(6, 10).min(1)
                                 + _f(6, 10).prod(1)),
  "api/reduce_axes": lambda: _realize(_f(3, 5, 7).sum((0, 2)), _f(3, 5, 7).max(0, keepdim=True),
                                      _i(3, 5, 7).sum()),
  "api/reduce_large": lambda: _realize(_f(300, 1000).sum(1), _f(1000, 300).mean(0), _f(1 << 21).max()),
  "api/var_std_logsumexp": lambda: _realize(_f(6, 10).var(0) + _f(6, 10).std(0), _f(6, 10).logsumexp(1)),
  "api/arg_any_all": lambda: _realize(_f(6, 10).argmax(1), _f(6, 10).argmin(0), (_f(6, 10) > 0).any(1),
                                      (_f(6, 10) > 0).all()),
  "api/softmax_family": lambda: _realize(_f(6, 10).softmax(1), _f(6, 10).log_softmax(0), _f(6, 10).softmin(1)),
  "api/cumulative": lambda: _realize(_f(6, 10).cumsum(1), _i(6, 10).cumsum(0), _f(6, 10).cummax(1)[0],
                                     _f(6, 10).cumprod(1)),
  "api/movement": lambda: _realize(_f(6, 10).permute(1, 0).reshape(5, 12).flip(0)
                                   + _f(5, 1).expand(5, 12) + _f(4, 10).pad(((1, 0), (1, 1)))[:5]),
  "api/pad_modes": lambda: _realize(_f(2, 3, 5, 6).pad((1, 2, 2, 1), mode="reflect"),
                                    _f(2, 3, 5, 6).pad((1, 1, 1, 1), mode="replicate"),
                                    _f(2, 3, 5, 6).pad((2, 0, 0, 2), mode="circular")),
  "api/cat_stack_split": lambda: _realize(Tensor.cat(_f(3, 4), _f(5, 4)), Tensor.stack(_f(3, 4), _f(3, 4), dim=1),
                                          *_f(7, 4).split(3)),
  "api/repeat_roll_tril": lambda: _realize(_f(3, 4).repeat(2, 3), _f(3, 4).repeat_interleave(2, 1),
                                           _f(5, 6).roll(2, 1), _f(5, 6).tril(), _f(5, 6).triu(1)),
  "api/getitem": lambda: _realize(_f(6, 10)[1:5:2, ::-3], _f(6, 10)[_i(4)], _f(6, 10)[:, None, 3]),
  "api/setitem": _setitem,
  "api/gather_scatter": lambda: _realize(_f(6, 10).gather(1, _i(6, 3)),
                                         _f(6, 10).scatter(1, _i(6, 3), _f(6, 3)),
                                         _f(6, 10).scatter_reduce(1, _i(6, 3), _f(6, 3), reduce="sum")),
  "api/one_hot_masked_fill": lambda: _realize(_i(6).one_hot(10).float() + _f(6, 10).masked_fill(_f(6, 10) > 0.5, -1)),
  "api/sort_topk": lambda: _realize(_f(6, 10).sort(1)[0], _f(6, 10).sort(0, descending=True)[1],
                                    _f(6, 10).topk(3, 1)[0]),
  "api/matmul": lambda: _realize(_f(5, 7) @ _f(7, 3), _f(2, 3, 4) @ _f(2, 4, 5), _f(33, 65) @ _f(65, 17)),
  "api/einsum": lambda: _realize(Tensor.einsum("bij,bjk->bik", _f(2, 3, 4), _f(2, 4, 5)),
                                 Tensor.einsum("ii->", _f(5, 5))),
  "api/conv2d": lambda: _realize(_f(2, 3, 7, 6).conv2d(_f(4, 3, 3, 3), _f(4), stride=2, padding=1),
                                 _f(1, 4, 6, 5).conv2d(_f(6, 2, 3, 2), groups=2, dilation=(1, 2), padding=(1, 0))),
  "api/conv_transpose2d": lambda: _realize(_f(1, 4, 5, 5).conv_transpose2d(_f(4, 2, 3, 3), stride=2, padding=1)),
  "api/pooling": lambda: _realize(_max_pool(_f(2, 2, 6, 6), 2),
                                  _f(2, 2, 7, 7).avg_pool2d(kernel_size=3, stride=2, padding=1)),
  "api/interpolate": lambda: _realize(_f(1, 2, 4, 5).interpolate(size=(7, 8), mode="bilinear"),
                                      _f(1, 2, 4, 5).interpolate(size=(8, 10), mode="nearest")),
  "api/attention": lambda: _realize(_f(2, 3, 7, 8).scaled_dot_product_attention(_f(2, 3, 7, 8), _f(2, 3, 7, 8),
                                                                                 is_causal=True)),
  "api/losses": lambda: _realize(_f(6, 10).cross_entropy(_i(6)), _f(6, 10).log_softmax(1).nll_loss(_i(6)),
                                 _f(6, 10).binary_crossentropy_logits(_f(6, 10)),
                                 _f(6, 10).sparse_categorical_crossentropy(_i(6), label_smoothing=0.1)),
  "api/creation": lambda: _realize(Tensor.arange(12).reshape(3, 4) + Tensor.eye(3, 4),
                                   Tensor.linspace(0, 1, 7), Tensor.full((2, 3), 2.5)),
  "api/random": lambda: _realize(Tensor.rand(5, 6), Tensor.randn(4, 3), Tensor.randint(3, 4, low=0, high=9)),
  "api/backward_matmul": _matmul_backward,
  "api/backward_conv": _conv_backward,
  "api/backward_attention": _attention_backward,
  "api/backward_norm": _norm_backward,
  "api/backward_embedding": _embedding_backward,
}

# ** ember.nn: the examples' train steps **

def _train_step(model: Callable[[Tensor], Tensor], x: Tensor, y: Tensor, jit: bool) -> None:
  """One Adam step of `model` on (x, y) with cross-entropy, in training mode."""
  from ember.nn.functional import cross_entropy
  from ember.nn.optim import Adam, jit_train_step
  from ember.nn.state import get_parameters
  opt = Adam(get_parameters(model), lr=1e-3)
  prev, Tensor.training = Tensor.training, True
  try:
    if jit: _realize(jit_train_step(model, opt)(x, y))  # TinyJit's first call runs the step as written
    else:
      opt.zero_grad()
      loss = cross_entropy(model(x), y)
      loss.backward()
      opt.step()
      _realize(loss)
  finally: Tensor.training = prev

def _demo_step() -> None:
  """python -m ember.nn.demo: a 2-64-64-2 MLP on two spirals, batch 256."""
  from ember.nn import Linear, Sequential
  model = Sequential(Linear(2, 64), Tensor.relu, Linear(64, 64), Tensor.relu, Linear(64, 2))
  _train_step(model, _f(256, 2), _i(256), jit=True)

def _train_mnist_step() -> None:
  """python -m ember.nn.train_mnist: the 784-128-10 MLP, batch 128 (examples/mnist_data_parallel.py's model too)."""
  from ember.nn.train_mnist import mlp
  _train_step(mlp(784, 128, 10), _f(128, 784), _i(128), jit=False)

def _fashion_cnn_step() -> None:
  """examples/train_fashion_mnist.py's SmallCNN (conv, max-pool, BatchNorm2d, linear, BatchNorm1d, linear), batch
  128, through jit_train_step as the example runs it."""
  from ember.nn import BatchNorm1d, BatchNorm2d, Conv2d, Linear
  conv, bn_conv = Conv2d(1, 16, 3, padding=1), BatchNorm2d(16)
  fc, bn_fc, head = Linear(16 * 14 * 14, 128), BatchNorm1d(128), Linear(128, 10)
  class SmallCNN:
    def __init__(self) -> None: self.conv, self.bn_conv, self.fc, self.bn_fc, self.head = conv, bn_conv, fc, bn_fc, head
    def __call__(self, x: Tensor) -> Tensor:
      x = _max_pool(self.conv(x).relu(), 2).contiguous()  # (B, 16, 14, 14)
      return self.head(self.bn_fc(self.fc(self.bn_conv(x).flatten(1))).relu())
  _train_step(SmallCNN(), _f(128, 1, 28, 28), _i(128), jit=True)

NN: dict[str, Callable[[], None]] = {
  "nn/demo_step": _demo_step,
  "nn/train_mnist_step": _train_mnist_step,
  "nn/fashion_cnn_step": _fashion_cnn_step,
}

# ** ember.nn.llm: SmolLM2-135M's shapes, random weights **

SMOLLM2 = {"n_layers": 2, "dim": 576, "n_heads": 9, "n_kv_heads": 3, "ffn_dim": 1536, "vocab_size": 49152,
           "rope_theta": 100000.0, "rms_eps": 1e-5, "context_length": 8192}

def _llm_decode() -> None:
  """A prefill of 4 tokens and one decode step, with SmolLM2-135M's Q4_1 matrices and Q8_0 tied embedding/LM head
  (as the GGUF the LLM bench runs), filled with random bytes."""
  Llama, LlamaConfig, _Source, GGMLType, tensor_nbytes = pipeline.llm_api()
  cfg = LlamaConfig(**SMOLLM2)
  rng = np.random.default_rng(0)
  def quant(kind: Any, rows: int, cols: int) -> Any:
    raw = rng.integers(0, 256, tensor_nbytes(kind, (rows, cols)), dtype=np.uint8)
    blocks = raw.reshape(-1, tensor_nbytes(kind, (1, 32)))
    scales = 2 if kind is GGMLType.Q4_1 else 1  # Q4_1 blocks start with a scale and an offset, Q8_0 with a scale
    blocks[:, :2 * scales] = np.full(scales, 0.01, np.float16).view(np.uint8)  # finite float16s, not random bits
    return _Source((rows, cols), raw=raw, ggml_type=kind)
  kv, q41 = cfg.kv_dim, GGMLType.Q4_1
  sources: dict[str, Any] = {"token_embd.weight": quant(GGMLType.Q8_0, cfg.vocab_size, cfg.dim),
                             "output_norm.weight": np.ones(cfg.dim, np.float32)}
  for i in range(cfg.n_layers):
    shapes = {"attn_q": (cfg.dim, cfg.dim), "attn_k": (kv, cfg.dim), "attn_v": (kv, cfg.dim),
              "attn_output": (cfg.dim, cfg.dim), "ffn_gate": (cfg.ffn_dim, cfg.dim), "ffn_up": (cfg.ffn_dim, cfg.dim),
              "ffn_down": (cfg.dim, cfg.ffn_dim)}
    sources.update({f"blk.{i}.{name}.weight": quant(q41, *shape) for name, shape in shapes.items()})
    sources.update({f"blk.{i}.{name}.weight": np.ones(cfg.dim, np.float32) for name in ("attn_norm", "ffn_norm")})
  model = Llama(cfg, sources, max_context=128)
  model.forward([1, 2, 3, 4])
  model.forward([5])

LLM: dict[str, Callable[[], None]] = {"llm/decode": _llm_decode}

WORKLOADS: dict[str, Workload] = {**{name: Workload(fn) for name, fn in BENCH.items()},
                                  **{name: Workload(fn, "PYTHON") for name, fn in API.items()},
                                  **{name: Workload(fn) for name, fn in NN.items()},
                                  **{name: Workload(fn) for name, fn in LLM.items()}}
