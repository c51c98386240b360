"""The Tensor methods tinygrad programs use beyond the core set: functional layers, casts, random sampling, einops-style
`rearrange`, padding/shrinking to a shape, QR/SVD/Newton-Schulz, Keccak hashing, and device helpers.

`ExtraMixin` is a mixin that `Tensor` inherits; ember.tensor hands this module `Tensor` once it exists
(`LATE_NAMES`). Where tinygrad and torch give a name different meanings, these follow torch and say so (`allclose`
returns a Python bool, `qr`/`svd` take torch's `some=` and `svd` returns V, not V^H); docs/tinygrad-compat.md lists
every difference.
"""
from __future__ import annotations
import functools
import math
import re
from typing import TYPE_CHECKING, Any, Callable, Sequence
import numpy as np
from ember.dtype import DType, dtypes, to_dtype
from ember.errors import ArgumentError, DTypeError, ShapeError
from ember.helpers import prod
from ember.uop.ops import int_size
if TYPE_CHECKING:
  from ember.engine.jit import TinyJit
  from ember.tensor import Tensor

LATE_NAMES = ("Tensor",)

def _shape_args(shape: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
  """`f(2, 3)`, `f((2, 3))` and `f([2, 3])` all mean the shape (2, 3)."""
  return tuple(shape) if isinstance(shape, (tuple, list)) and not args else (shape, *args)

# ** keccak constants (FIPS 202) **
# lane (x, y) of the 5x5 state is index x + 5*y; _KECCAK_ROT[x + 5*y] is its rho rotation
_KECCAK_ROT = [0, 1, 62, 28, 27, 36, 44, 6, 55, 20, 3, 10, 43, 25, 39, 41, 45, 15, 21, 8, 18, 2, 61, 56, 14]
# pi moves lane (x, y) to (y, 2x + 3y): _KECCAK_PI_SRC[dest] is the lane each destination reads
_KECCAK_PI_SRC = [0] * 25
for _x in range(5):
  for _y in range(5): _KECCAK_PI_SRC[_y + 5 * ((2 * _x + 3 * _y) % 5)] = _x + 5 * _y
_KECCAK_RC = [0x0000000000000001, 0x0000000000008082, 0x800000000000808A, 0x8000000080008000, 0x000000000000808B,
              0x0000000080000001, 0x8000000080008081, 0x8000000000008009, 0x000000000000008A, 0x0000000000000088,
              0x0000000080008009, 0x000000008000000A, 0x000000008000808B, 0x800000000000008B, 0x8000000000008089,
              0x8000000000008003, 0x8000000000008002, 0x8000000000000080, 0x000000000000800A, 0x800000008000000A,
              0x8000000080008081, 0x8000000000008080, 0x0000000080000001, 0x8000000080008008]
# rate in bytes and the domain-separation byte of each named configuration
KECCAK_CONFIGS = {"sha3_224": (144, 0x06), "sha3_256": (136, 0x06), "sha3_384": (104, 0x06), "sha3_512": (72, 0x06),
                  "shake_128": (168, 0x1F), "shake_256": (136, 0x1F)}
_HASH_CHUNK = 1 << 20  # Tensor.hash digests 1 MiB chunks, each as 256 shake_128 leaves of 4 KiB

class ExtraMixin:
  """Mixin holding the tinygrad-compatible Tensor methods of this module (see the module docstring)."""
  __slots__ = ()

  # ** functional nn **
  def sequential(self: Tensor, ll: Sequence[Callable[[Tensor], Tensor]]) -> Tensor:
    """Apply the callables in `ll` in order, each to the previous one's output.

    >>> Tensor([1, 2, 3]).sequential([lambda x: x * 2, lambda x: x + 1]).tolist()
    [3, 5, 7]
    """
    return functools.reduce(lambda x, f: f(x), ll, self)

  def linear(self: Tensor, weight: Tensor, bias: Tensor | None = None, dtype: DType | str | None = None) -> Tensor:
    """`self @ weight + bias` with `weight` laid out (in_features, out_features), as tinygrad does: torch's
    `F.linear` takes the transpose, (out, in). A 1-d `weight` scales elementwise. `dtype` casts all three first.

    >>> Tensor([[1.0, 2.0]]).linear(Tensor([[1.0], [1.0]]), Tensor([0.5])).tolist()
    [[3.5]]
    """
    if dtype is not None:
      dt = to_dtype(dtype)
      return self.cast(dt).linear(weight.cast(dt), None if bias is None else bias.cast(dt))
    x = self * weight if weight.ndim == 1 else self.dot(weight)
    return x if bias is None else x + bias

  def layernorm(self: Tensor, axis: int | Sequence[int] = -1, eps: float = 1e-5) -> Tensor:
    """Normalize to zero mean and unit (biased) variance over `axis`, with no affine part.

    >>> round(Tensor([[1.0, 3.0]]).layernorm().abs().sum().item(), 3)
    2.0
    """
    y = self - self.mean(axis, keepdim=True)
    return y * (y * y).mean(axis, keepdim=True).add(eps).rsqrt()

  def batchnorm(self: Tensor, weight: Tensor | None, bias: Tensor | None, mean: Tensor, invstd: Tensor,
                axis: int | Sequence[int] = 1) -> Tensor:
    """`(self - mean) * weight * invstd + bias`, the statistics laid out along `axis` (the channel axis by default);
    `invstd` is 1/sqrt(var + eps).

    >>> Tensor([[1.0, 2.0]]).batchnorm(None, None, Tensor([1.0, 1.0]), Tensor([2.0, 2.0])).tolist()
    [[0.0, 2.0]]
    """
    axes = tuple(self._resolve_dim(a) for a in ((axis,) if isinstance(axis, int) else axis))
    shape = tuple(s if d in axes else 1 for d, s in enumerate(self.shape))
    x = self - mean.reshape(shape)
    if weight is not None: x = x * weight.reshape(shape)
    x = x * (invstd.reshape(shape) if invstd.ndim == len(axes) else invstd)
    return x if bias is None else x + bias.reshape(shape)

  # ** comparisons and properties **
  def eq(self: Tensor, x: Any) -> Tensor:
    """Elementwise `==` as a bool tensor (torch.Tensor.eq)."""
    return self == x
  def ne(self: Tensor, x: Any) -> Tensor:
    """Elementwise `!=` as a bool tensor (torch.Tensor.ne)."""
    return self != x
  def lt(self: Tensor, x: Any) -> Tensor:
    """Elementwise `<` as a bool tensor (torch.Tensor.lt)."""
    return self < x
  def le(self: Tensor, x: Any) -> Tensor:
    """Elementwise `<=` as a bool tensor (torch.Tensor.le): False where either side is NaN."""
    return (self < x) | (self == x)
  def gt(self: Tensor, x: Any) -> Tensor:
    """Elementwise `>` as a bool tensor (torch.Tensor.gt)."""
    return self > x
  def ge(self: Tensor, x: Any) -> Tensor:
    """Elementwise `>=` as a bool tensor (torch.Tensor.ge): False where either side is NaN."""
    return (self > x) | (self == x)

  def allclose(self: Tensor, other: Any, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False) -> bool:
    """Whether every element is `isclose` to `other`, as a Python bool like torch.Tensor.allclose (tinygrad returns
    a 0-d bool tensor instead; wrap the call in `Tensor(...)` if you need one).

    >>> Tensor([1.0, 2.0]).allclose(Tensor([1.0, 2.0 + 1e-7]))
    True
    """
    return bool(self.isclose(other, rtol=rtol, atol=atol, equal_nan=equal_nan).all().item())

  def is_floating_point(self: Tensor) -> bool:
    """True for float16, bfloat16, float32, float64 and fp8 tensors.

    >>> Tensor([1, 2]).is_floating_point(), Tensor([1.0]).is_floating_point()
    (False, True)
    """
    return dtypes.is_float(self.dtype)

  def size(self: Tensor, dim: int | None = None) -> Any:
    """The shape, or the length of dimension `dim` (negative counts from the end).

    >>> Tensor.zeros(2, 3).size(), Tensor.zeros(2, 3).size(-1)
    ((2, 3), 3)
    """
    return self.shape if dim is None else self.shape[self._resolve_dim(dim)]

  # ** cast shorthands (float, half, int, long, bool, double are in tensor.py) **
  def bfloat16(self: Tensor) -> Tensor:
    """Cast to bfloat16."""
    return self.cast(dtypes.bfloat16)
  def short(self: Tensor) -> Tensor:
    """Cast to int16."""
    return self.cast(dtypes.int16)

  # ** movement to a shape **
  def pad_to(self: Tensor, shape: Any, *args: Any, value: Any = 0) -> Tensor:
    """Pad each dim at its end up to `shape` (None keeps a dim), filling with `value`.

    >>> Tensor([1, 2]).pad_to(4).tolist()
    [1, 2, 0, 0]
    """
    target = _shape_args(shape, args)
    if len(target) != self.ndim: raise ShapeError(f"pad_to: {len(target)} sizes given for shape {self.shape}")
    pads = []
    for d, (s, ns) in enumerate(zip(self.shape, target)):
      if ns is not None and ns < s:
        raise ShapeError(f"pad_to: dim {d} of shape {self.shape} is {s}, larger than the target {ns}; use shrink_to")
      pads.append((0, 0 if ns is None else ns - s))
    return self.pad(pads, value=value)

  def shrink_to(self: Tensor, shape: Any, *args: Any) -> Tensor:
    """Keep the first `shape[d]` elements of each dim (None keeps a dim).

    >>> Tensor([1, 2, 3]).shrink_to(2).tolist()
    [1, 2]
    """
    target = _shape_args(shape, args)
    if len(target) != self.ndim: raise ShapeError(f"shrink_to: {len(target)} sizes given for shape {self.shape}")
    for d, (s, ns) in enumerate(zip(self.shape, target)):
      if ns is not None and not 0 <= ns <= s:
        raise ShapeError(f"shrink_to: dim {d} of shape {self.shape} is {s}, cannot shrink it to {ns}; use pad_to")
    return self.shrink([None if ns is None else (0, ns) for ns in target])

  def rearrange(self: Tensor, formula: str, **sizes: int) -> Tensor:
    """einops-style `rearrange`: split, merge and reorder axes by name, with `(...)` groups, `1` for unit axes and
    one `...` for the axes not named. Sizes for split axes go in `sizes`.

    >>> Tensor.arange(6).rearrange("(h w) -> w h", h=2).tolist()
    [[0, 3], [1, 4], [2, 5]]
    """
    return _rearrange(self, formula, sizes)

  # ** devices **
  def to_(self: Tensor, device: str | tuple[str, ...] | None) -> Tensor:
    """Move to `device` in place: this object (and its `.grad`) now live there."""
    moved = self.to(device)
    grad = self.grad.to(device) if self.grad is not None else None
    self.replace(moved)
    self.grad = grad
    return self

  def shard_like(self: Tensor, y: Tensor) -> Tensor:
    """Lay this tensor out like `y`: on `y`'s device, or sharded over `y`'s devices along `y`'s axis."""
    if isinstance(y.device, str): return self.to(y.device)
    ret = self.shard(y.device, y.axis)
    return ret.sharding.shard_like(ret, y)  # the same split points as `y` (a reshape can leave them unbalanced)

  @staticmethod
  def from_blob(ptr: int, shape: Sequence[int], **kwargs: Any) -> Tensor:
    """A tensor over existing host memory at address `ptr` (not copied, not owned: it must outlive the tensor).
    `dtype` and `device` go in `kwargs`; the device's allocator must accept external pointers (CPU, PYTHON).

    >>> a = np.arange(4, dtype=np.float32)
    >>> Tensor.from_blob(a.ctypes.data, (4,), dtype=dtypes.float32).tolist()
    [0.0, 1.0, 2.0, 3.0]
    """
    from ember.device.base import BufferSpec
    from ember.schedule import buffer_of
    if not isinstance(ptr, int) or ptr <= 0: raise ArgumentError(f"from_blob needs a non-null int address, got {ptr!r}")
    t = Tensor.empty(*shape, **kwargs)
    buf = buffer_of(t.uop)
    buf.options = BufferSpec(external_ptr=ptr)  # freeing the tensor then never frees, or caches, the foreign memory
    buf.allocate()
    return t

  # ** random **
  def rand_like(self: Tensor, **kwargs: Any) -> Tensor:
    """Uniform samples in [0, 1) with this tensor's shape, dtype and device (or the `dtype`/`device` given).

    >>> Tensor.ones(2, 3).rand_like().shape
    (2, 3)
    """
    return _random_like(self, "rand_like", kwargs)

  def randn_like(self: Tensor, dtype: DType | str | None = None, **kwargs: Any) -> Tensor:
    """Standard normal samples with this tensor's shape, dtype and device (or the `dtype`/`device` given).

    >>> Tensor.ones(2, 3).randn_like().shape
    (2, 3)
    """
    return _random_like(self, "randn_like", {**kwargs, "dtype": dtype})

  @staticmethod
  def randperm(n: int, device: str | None = None, dtype: DType | str = dtypes.int32, **kwargs: Any) -> Tensor:
    """A random permutation of 0 .. n-1 (int32 by default, as tinygrad; torch's default is int64).

    >>> sorted(Tensor.randperm(5).tolist())
    [0, 1, 2, 3, 4]
    """
    if not isinstance(n, int) or n < 0: raise ShapeError(f"randperm needs a non-negative int n, got {n!r}")
    if n == 0: return Tensor.empty(0, device=device, dtype=dtype, **kwargs)
    return Tensor.rand(n, device=device).argsort().cast(dtype).requires_grad_(kwargs.get("requires_grad"))

  def multinomial(self: Tensor, num_samples: int = 1, replacement: bool = False) -> Tensor:
    """`num_samples` category indices per row, drawn with probability proportional to the (non-negative) weights in
    the last dim of a 1-d or 2-d tensor; without replacement no index repeats in a row. int32 (torch gives int64).

    >>> Tensor([0.0, 1.0, 0.0]).multinomial(2, replacement=True).tolist()
    [1, 1]
    """
    if not 1 <= self.ndim <= 2:
      raise ShapeError(f"multinomial needs a 1-d or 2-d weight tensor, got shape {self.shape}")
    if not isinstance(num_samples, int) or num_samples <= 0:
      raise ShapeError(f"multinomial needs num_samples > 0, got {num_samples!r}")
    n = int_size(self.shape[-1], "multinomial")
    if n == 0: raise ShapeError("multinomial needs at least one category, got an empty last dim")
    if not replacement and num_samples > n:
      raise ShapeError(f"multinomial cannot draw {num_samples} samples without replacement from {n} categories; "
                       "pass replacement=True or fewer samples")
    w = (self if self.ndim == 2 else self.unsqueeze(0)).float()
    rows = int_size(w.shape[0], "multinomial")
    _check_multinomial_weights(w)
    if replacement or num_samples == 1:
      cw = w.cumsum(1)
      cdf = cw / cw[:, -1:]  # (rows, n); the last entry is exactly 1
      u = Tensor.rand(rows, num_samples, 1, device=self.device)
      # the index is how many categories' cdf lie at or below u; clamp guards rounding at the top end
      idx = (u >= cdf.unsqueeze(1)).sum(2, dtype=dtypes.int32).minimum(n - 1)
    else:
      # Efraimidis-Spirakis: the k largest keys u^(1/w) (compared as log(u)/w) are a weighted draw without replacement
      u = 1.0 - Tensor.rand(rows, n, device=self.device)  # in (0, 1]: log is finite
      keys = (w > 0).where(u.log() / w, -math.inf)
      idx = keys.topk(num_samples, dim=1)[1]
    idx = idx.cast(dtypes.int32)
    return idx if self.ndim == 2 else idx.squeeze(0)

  @staticmethod
  def random_bits(key: Tensor, counter: Tensor, num: int) -> Tensor:
    """`num` uint32 words of a counter-based stream: Threefry-2x32-20 keyed by `key` (2 uint32: low, high) hashes
    `counter` (2 uint32) into a per-draw key, which then hashes the word indices. A pure function of its inputs:
    the same key and counter give the same words on every device, eagerly or under TinyJit.

    >>> k = Tensor(np.array([1, 2], np.uint32))
    >>> Tensor.random_bits(k, Tensor(np.array([0, 0], np.uint32)), 3).shape
    (3,)
    """
    for name, t in (("key", key), ("counter", counter)):
      if t.dtype is not dtypes.uint32 or t.shape != (2,):
        raise DTypeError(f"random_bits: {name} must be a uint32 tensor of shape (2,), got {t.dtype!r} {t.shape}")
    if not isinstance(num, int) or not 0 <= num < 1 << 33:
      raise ShapeError(f"random_bits: num must be an int in [0, 2**33), got {num!r}")
    if num == 0: return Tensor.empty(0, device=key.device, dtype=dtypes.uint32)
    k0, k1 = Tensor._threefry2x32((key[0:1], key[1:2]), (counter[0:1], counter[1:2]))
    half = (num + 1) // 2
    idx = Tensor.arange(half, device=key.device, dtype=dtypes.uint32)
    x0, x1 = Tensor._threefry2x32((k0.expand(half), k1.expand(half)), (idx, idx + half))
    return x0.cat(x1)[:num]

  # ** linear algebra **
  def qr(self: Tensor, some: bool = True) -> tuple[Tensor, Tensor]:
    """Householder QR of the last two dims (batched): `Q @ R == self`, Q orthonormal, R upper triangular, with
    LAPACK's signs. torch.Tensor.qr's `some=True` gives the reduced (m, k), (k, n) factors, k = min(m, n);
    `some=False` the full (m, m), (m, n) ones. (tinygrad's qr() always returns the full ones.)

    >>> q, r = Tensor([[3.0, 1.0], [4.0, 2.0]]).qr()
    >>> [round(v, 4) for v in r.numpy().ravel()]
    [-5.0, -2.2, 0.0, -0.4]
    """
    _check_matrix(self, "qr")
    m, n = int_size(self.shape[-2], "qr"), int_size(self.shape[-1], "qr")
    q, r = _householder_qr(self)
    if some and m > n: return q[..., :, :n], r[..., :n, :]
    return q, r

  def svd(self: Tensor, some: bool = True, compute_uv: bool = True, *,
          full_matrices: bool | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """Singular value decomposition of the last two dims (batched), as torch.Tensor.svd: `(U, S, V)` with
    `U @ diag(S) @ V.mT == self`, S descending; `some=True` gives (m, k), (k,), (n, k), k = min(m, n), `some=False`
    square U and V. tinygrad's `svd(full_matrices=)` returns V^H instead: pass `some=not full_matrices` and use
    `V.mT`. QR first, then one-sided Jacobi sweeps until the columns are orthogonal (this realizes as it goes).

    >>> u, s, v = Tensor([[3.0, 0.0], [0.0, -2.0]]).svd()
    >>> [round(x, 4) for x in s.tolist()]
    [3.0, 2.0]
    """
    if full_matrices is not None:
      raise TypeError(f"svd follows torch.Tensor.svd(some=True, compute_uv=True) and returns V, not V^H; for "
                      f"tinygrad's svd(full_matrices={full_matrices}) call svd(some={not full_matrices}) and use V.mT")
    _check_matrix(self, "svd")
    if not dtypes.is_float(self.dtype): raise DTypeError(f"svd needs a float tensor, got {self.dtype!r}")
    m, n = int_size(self.shape[-2], "svd"), int_size(self.shape[-1], "svd")
    if m < n:
      v, s, u = Tensor.svd(self.transpose(-2, -1), some=some)
      return u, s, v
    q, r = _householder_qr(self)
    ub, s, vb = _jacobi_svd(r[..., :n, :])
    if not compute_uv:
      batch = self.shape[:-2]
      return Tensor.zeros(*batch, m, m if not some else n), s, Tensor.zeros(*batch, n, n)
    if some: return q[..., :, :n] @ ub, s, vb
    # full U: Q times blockdiag(U_R, I); Q's last m-n columns span the complement of self's column space
    corner = [None] * (self.ndim - 2) + [(0, m - n), (0, m - n)]
    eye_m, eye_n = Tensor.eye(m, dtype=ub.dtype, device=self.device), Tensor.eye(n, dtype=ub.dtype, device=self.device)
    return q @ (ub.pad(corner) + eye_m - eye_n.pad(corner[-2:])), s, vb

  def newton_schulz(self: Tensor, steps: int, params: Sequence[float], eps: float = 1e-7) -> Tensor:
    """Newton-Schulz iteration of an odd matrix polynomial on the last two dims: X <- sum_i params[i] (X X^T)^i X,
    starting from self / (||self||_F + eps). With Muon's params (3.4445, -4.775, 2.0315) it drives every singular
    value towards 1 (an approximate orthogonalisation).

    >>> Tensor.eye(2).newton_schulz(10, (1.5, -0.5)).numpy().round(3).tolist()
    [[1.0, 0.0], [0.0, 1.0]]
    """
    _check_matrix(self, "newton_schulz")
    if int_size(self.shape[-2], "newton_schulz") > int_size(self.shape[-1], "newton_schulz"):
      return self.transpose(-2, -1).newton_schulz(steps, params, eps).transpose(-2, -1)
    g = self / (self.square().sum(axis=(-2, -1), keepdim=True).sqrt() + eps)
    for _ in range(steps):
      gram = g @ g.transpose(-2, -1)
      term, out = g, g * params[0]
      for p in params[1:]:
        term = gram @ term
        out = out + p * term
      g = out
    return g

  # ** hashing **
  def keccak(self: Tensor, cfg: str | tuple[int, int] = "sha3_256") -> Tensor:
    """Keccak (FIPS 202) over the bytes of the last dim, batched over the others: `cfg` is "sha3_224/256/384/512",
    "shake_128/256" or (rate bytes, domain byte). The digest is (200 - rate) // 2 bytes (shake_128: 16, as
    tinygrad), uint8.

    >>> bytes(Tensor(b"abc").keccak().tolist()).hex()[:16]
    '3a985da74fe225b2'
    """
    return _keccak(self, cfg)

  def hash(self: Tensor) -> Tensor:
    """tinygrad's 16-byte tree hash of the tensor's bytes: 1 MiB chunks, each the shake_128 of its 256 4-KiB leaves'
    shake_128 digests, chunk digests hashed the same way until one chunk is left. Python's `hash(t)` is unchanged.

    >>> Tensor(b"Hello World!").hash().shape
    (16,)
    """
    flat = self.flatten()
    data = flat.bitcast(dtypes.uint8) if flat.dtype is not dtypes.uint8 else flat
    chunks = -(-int_size(data.shape[0], "hash") // _HASH_CHUNK)
    while chunks > 1:
      data = _hash_1mb(data.pad_to(chunks * _HASH_CHUNK).reshape(chunks, _HASH_CHUNK)).flatten()
      chunks = -(-chunks // (_HASH_CHUNK // 16))
    return _hash_1mb(data.pad_to(_HASH_CHUNK).unsqueeze(0)).flatten()

# ** helpers **

def _check_matrix(t: Tensor, op: str) -> None:
  if t.ndim < 2: raise ShapeError(f"{op} needs a tensor of at least 2 dims (..., m, n), got shape {t.shape}")

def _random_like(t: Tensor, op: str, kwargs: dict[str, Any]) -> Tensor:
  dt = to_dtype(kwargs.pop("dtype", None) or t.dtype)
  if dt.weak: dt = dtypes.default_float if dtypes.is_float(dt) else dt
  if not dtypes.is_float(dt) or dt.weak:
    raise DTypeError(f"{op} draws floats; got dtype {dt!r}: pass a float dtype, e.g. {op}(dtype=dtypes.float32)")
  device = kwargs.pop("device", None)
  make = Tensor.rand if op == "rand_like" else Tensor.randn
  if device is not None or isinstance(t.device, str): return make(*t.shape, device=device or t.device, dtype=dt,
                                                                  **kwargs)
  # a sharded tensor: draw on its first device, then lay the draw out as it is laid out
  return make(*t.shape, device=t.device[0], dtype=dt, **kwargs).shard_like(t)

def _householder_qr(a: Tensor) -> tuple[Tensor, Tensor]:
  """Full Householder QR of (..., m, n), LAPACK's dgeqrf convention: column i's reflector I - tau v v^T (v[i] = 1)
  maps x = R[i:, i] to beta e_i with beta = -sign(x_i) ||x||; a column already zero below the diagonal is left alone
  (tau = 0), so the signs of R match LAPACK's."""
  m, n = int_size(a.shape[-2], "qr"), int_size(a.shape[-1], "qr")
  dt = a.dtype if dtypes.is_float(a.dtype) and not a.dtype.weak else dtypes.default_float
  r = a.cast(dt)
  q = Tensor.eye(m, dtype=dt, device=a.device).expand(*a.shape[:-2], m, m)
  rows = Tensor.arange(m, device=a.device)
  for i in range(min(m - 1, n)):
    col = r[..., :, i]  # (..., m)
    x0 = col[..., i:i + 1]  # (..., 1)
    below = (rows > i).where(col, 0.0)
    tail2 = below.square().sum(-1, keepdim=True)
    active = tail2 > 0
    norm = (x0.square() + tail2).sqrt()
    beta = -(x0 >= 0).where(norm, -norm)
    denom = active.where(x0 - beta, 1.0)
    v = (rows == i).where(1.0, below / denom).unsqueeze(-1)  # (..., m, 1)
    tau = active.where((beta - x0) / active.where(beta, 1.0), 0.0).unsqueeze(-1)  # (..., 1, 1)
    r = (r - (tau * v) @ (v.transpose(-2, -1) @ r)).contiguous()
    q = (q - (q @ v) @ (tau * v).transpose(-2, -1)).contiguous()
  return q, r.triu()

def _round_robin(n: int) -> list[list[tuple[int, int]]]:
  """A tournament schedule over n columns: n-1 rounds (n even) of disjoint pairs covering every pair once. An odd n
  plays with a bye slot n, whose pairs are dropped."""
  slots = list(range(n + n % 2))
  rounds = []
  for _ in range(len(slots) - 1):
    half = len(slots) // 2
    pairs = [(min(a, b), max(a, b)) for a, b in zip(slots[:half], reversed(slots[half:]))]
    rounds.append([p for p in pairs if p[1] < n])
    slots = [slots[0], slots[-1], *slots[1:-1]]
  return rounds

def _jacobi_svd(b: Tensor, max_sweeps: int = 30) -> tuple[Tensor, Tensor, Tensor]:
  """One-sided (Hestenes) Jacobi SVD of square (..., n, n): rotate column pairs of U = b (and V = I) until every pair
  is orthogonal; then S is the column norms, U's columns are normalized, and both are sorted by S descending."""
  n, dt, dev = int_size(b.shape[-1], "svd"), b.dtype, b.device
  batch = b.shape[:-2]
  u = b.contiguous().realize()
  v = Tensor.eye(n, dtype=dt, device=dev).expand(*batch, n, n).contiguous().realize()
  tol = float(np.finfo(np.float64 if dt is dtypes.float64 else np.float32).eps) * n
  # each round's pairing as one permutation matrix: columns [left ..., right ..., rest ...] = x @ perm
  perms = []
  for pairs in _round_robin(n):
    order = [p for p, _ in pairs] + [q for _, q in pairs]
    order += [c for c in range(n) if c not in order]
    onehot = np.zeros((n, n), np.float64)
    onehot[order, range(n)] = 1.0
    perms.append((len(pairs), Tensor(onehot, dtype=dt, device=dev)))
  for _ in range(max_sweeps if n > 1 else 0):
    worst = []
    for h, perm in perms:
      up, vp = u @ perm, v @ perm
      ul, ur, urest = up[..., :h], up[..., h:2 * h], up[..., 2 * h:]
      vl, vr, vrest = vp[..., :h], vp[..., h:2 * h], vp[..., 2 * h:]
      alpha, beta, gamma = ul.square().sum(-2), ur.square().sum(-2), (ul * ur).sum(-2)  # (..., h)
      off = gamma.abs() / (alpha * beta).sqrt().maximum(np.finfo(np.float32).tiny)
      rotate = gamma != 0
      zeta = (beta - alpha) / (2 * rotate.where(gamma, 1.0))
      t = (zeta >= 0).where(1.0, -1.0) / (zeta.abs() + (1 + zeta.square()).sqrt())
      t = rotate.where(t, 0.0)
      c = (1 + t.square()).rsqrt()
      s = c * t
      c, s = c.unsqueeze(-2), s.unsqueeze(-2)
      u = Tensor.cat(c * ul - s * ur, s * ul + c * ur, urest, dim=-1) @ perm.transpose()
      v = Tensor.cat(c * vl - s * vr, s * vl + c * vr, vrest, dim=-1) @ perm.transpose()
      u, v, off = u.contiguous(), v.contiguous(), off.max()
      u.realize(v, off)
      worst.append(off)
    if max(float(w.contiguous().item()) for w in worst) <= tol: break
  sv = u.square().sum(-2).sqrt()  # (..., n)
  sv_sorted, order_idx = sv.sort(-1, descending=True)
  pick = (Tensor.arange(n, device=dev).reshape(n, 1) == order_idx.unsqueeze(-2)).cast(dt)  # (..., n, n)
  u, v = u @ pick, v @ pick
  u = u / (sv_sorted > 0).where(sv_sorted, 1.0).unsqueeze(-2)
  return u, sv_sorted, v

def _keccak(t: Tensor, cfg: str | tuple[int, int]) -> Tensor:
  if isinstance(cfg, str):
    if cfg not in KECCAK_CONFIGS:
      raise ArgumentError(f"unknown keccak config {cfg!r}; use one of {sorted(KECCAK_CONFIGS)}")
    rate, dsbyte = KECCAK_CONFIGS[cfg]
  else: rate, dsbyte = cfg
  if not (0 < rate < 200 and rate % 8 == 0 and 0 < dsbyte < 0x80):
    raise ArgumentError(f"keccak config (rate={rate}, domain byte={dsbyte:#x}): rate must be a multiple of 8 in "
                        "(0, 200) and the domain byte in (0, 0x80)")
  if t.ndim == 0: raise ShapeError("keccak hashes the last dim: give a tensor of at least 1 dim")
  data = t if t.dtype is dtypes.uint8 else t.contiguous().bitcast(dtypes.uint8)
  batch, length = data.shape[:-1], int_size(data.shape[-1], "keccak")
  bs = int(prod(batch))
  data = data.reshape(bs, length)
  nblocks = length // rate + 1
  # the pad10*1 rule, with the domain bits first: XOR a constant mask onto the zero-padded message
  mask = np.zeros(nblocks * rate, np.uint8)
  mask[length] ^= dsbyte
  mask[-1] ^= 0x80
  blocks = data.pad(((0, 0), (0, nblocks * rate - length))) ^ Tensor(mask, device=t.device)
  lanes = blocks.reshape(bs, nblocks, rate).pad(((0, 0), (0, 0), (0, 200 - rate))).contiguous().bitcast(dtypes.uint64)
  from ember.engine.jit import capturing
  # inside a TinyJit capture, an inner jit's replays would launch kernels the outer capture never sees
  permute = _keccak_f1600 if capturing() else _keccak_f1600_jit(bs, t.device)
  state = Tensor.zeros(bs, 25, dtype=dtypes.uint64, device=t.device)
  for k in range(nblocks):
    # a fresh buffer each block: a replay of the jitted permutation overwrites the one it returned last time
    state = permute((state ^ lanes[:, k]).contiguous().realize())
  out = (200 - rate) // 2
  return state.bitcast(dtypes.uint8)[:, :out].reshape(*batch, out).contiguous().realize()

def _keccak_f1600(state: Tensor) -> Tensor:
  """The 24-round Keccak-f[1600] permutation of (bs, 25) uint64 states, realized round by round (a round mixes
  lanes across the state, so fusing rounds would recompute each one per output lane)."""
  bs, dev = int_size(state.shape[0], "keccak"), state.device
  rot = Tensor(np.array(_KECCAK_ROT, np.uint64), device=dev)
  rot_back = Tensor(np.array([(64 - r) % 64 for r in _KECCAK_ROT], np.uint64), device=dev)
  pi_src = np.zeros((25, 25), np.bool_)
  pi_src[range(25), _KECCAK_PI_SRC] = True
  pi = Tensor(pi_src, device=dev)  # (dest, src)
  for rc in _KECCAK_RC:
    # theta: every lane XORs the parities of its two neighbouring columns (one rotated by 1)
    cols = state.reshape(bs, 5, 5)  # (bs, y, x)
    parity = cols[:, 0] ^ cols[:, 1] ^ cols[:, 2] ^ cols[:, 3] ^ cols[:, 4]  # (bs, x)
    right = parity.roll(-1, 1)
    d = parity.roll(1, 1) ^ ((right << 1) | (right >> 63))
    state = (cols ^ d.unsqueeze(1)).reshape(bs, 25)
    # rho (rotate each lane; a rotation by 0 ORs x with itself) and pi (move lanes)
    state = (state << rot) | (state >> rot_back)
    state = pi.where(state.unsqueeze(1), 0).sum(2, dtype=dtypes.uint64)  # one source lane per row: an exact gather
    # chi and iota
    rows = state.reshape(bs, 5, 5)
    rows = rows ^ (~rows.roll(-1, 2) & rows.roll(-2, 2))
    iota = np.zeros(25, np.uint64)
    iota[0] = rc
    state = (rows.reshape(bs, 25) ^ Tensor(iota, device=dev)).realize()
  return state

@functools.lru_cache(maxsize=8)
def _keccak_f1600_jit(bs: int, device: str) -> TinyJit:
  """The permutation under TinyJit, one per batch size and device: a 1 MiB `hash` runs it ~1200 times, and a replay
  launches its ~100 kernels without scheduling them again."""
  from ember.engine.jit import TinyJit
  return TinyJit(_keccak_f1600)

def _hash_1mb(chunks: Tensor) -> Tensor:
  """(c, 1 MiB) uint8 -> (c, 16): shake_128 of the 256 shake_128 digests of each chunk's 4 KiB leaves."""
  c = int_size(chunks.shape[0], "hash")
  return chunks.reshape(c * 256, 4096).keccak("shake_128").reshape(c, 4096).keccak("shake_128")

# ** rearrange **

_REARRANGE_TOKEN = re.compile(r"\.\.\.|…|\(|\)|[A-Za-z_][A-Za-z0-9_]*|\d+|\S")

def _parse_side(side: str, formula: str) -> list[tuple[bool, list[str]]]:
  """One side of a rearrange pattern as (parenthesized, names) groups: `a (b c) 1 ...` ->
  [(False, [a]), (True, [b, c]), (True, []), (False, [...])]."""
  groups: list[tuple[bool, list[str]]] = []
  current: list[str] | None = None
  for tok in _REARRANGE_TOKEN.findall(side):
    tok = "..." if tok == "…" else tok
    if tok == "(":
      if current is not None: raise ShapeError(f"rearrange {formula!r}: nested parentheses are not allowed")
      current = []
    elif tok == ")":
      if current is None: raise ShapeError(f"rearrange {formula!r}: ')' without a matching '('")
      groups.append((True, current))
      current = None
    elif tok == "1":  # a unit axis: an empty group
      if current is None: groups.append((True, []))
    elif tok == "..." or tok.isidentifier():
      if tok != "..." and (tok.startswith("_") or tok.endswith("_")):
        raise ShapeError(f"rearrange {formula!r}: axis name {tok!r} may not start or end with '_'")
      if current is not None: current.append(tok)
      else: groups.append((False, [tok]))
    else: raise ShapeError(f"rearrange {formula!r}: unexpected {tok!r}; use axis names, (groups), 1 and ...")
  if current is not None: raise ShapeError(f"rearrange {formula!r}: '(' without a matching ')'")
  names = [n for _, g in groups for n in g]
  if len(names) != len(set(names)): raise ShapeError(f"rearrange {formula!r}: an axis name repeats on one side")
  return groups

def _rearrange(t: Tensor, formula: str, sizes: dict[str, int]) -> Tensor:
  if formula.count("->") != 1: raise ShapeError(f"rearrange {formula!r}: the pattern needs exactly one '->'")
  lhs_s, rhs_s = formula.split("->")
  lhs, rhs = _parse_side(lhs_s, formula), _parse_side(rhs_s, formula)
  lnames, rnames = [n for _, g in lhs for n in g], [n for _, g in rhs for n in g]
  if set(lnames) != set(rnames):
    raise ShapeError(f"rearrange {formula!r}: both sides must name the same axes; only on one side: "
                     f"{sorted(set(lnames) ^ set(rnames))}")
  if any(grouped and "..." in g for grouped, g in lhs):
    raise ShapeError(f"rearrange {formula!r}: '...' cannot be inside a group on the left side")
  if unknown := sorted(set(sizes) - set(lnames)):
    raise ShapeError(f"rearrange {formula!r}: sizes given for axes not in the pattern: {unknown}")
  n_ell = 0
  if "..." in lnames:
    n_ell = t.ndim - (len(lhs) - 1)
    if n_ell < 0: raise ShapeError(f"rearrange {formula!r}: shape {t.shape} has fewer dims than the pattern names")
  elif len(lhs) != t.ndim:
    raise ShapeError(f"rearrange {formula!r}: the left side has {len(lhs)} dims, the tensor {t.ndim} {t.shape}")
  ell = [f"...{i}" for i in range(n_ell)]
  # resolve every axis size from the tensor's dims and the given sizes
  axis_size: dict[str, int] = {}
  dims = iter(t.shape)
  for grouped, group in lhs:
    if not grouped and group == ["..."]:
      for name in ell: axis_size[name] = int_size(next(dims), "rearrange")
      continue
    dim = int_size(next(dims), "rearrange")
    known = [sizes[n] for n in group if n in sizes]
    missing = [n for n in group if n not in sizes]
    if len(missing) > 1:
      raise ShapeError(f"rearrange {formula!r}: group ({' '.join(group)}) splits dim {dim} into several unknown "
                       f"sizes; give all but one of {missing} as keyword arguments")
    rest, rem = divmod(dim, prod(known)) if prod(known) else (0, dim)
    if rem or (not missing and prod(known) != dim):
      raise ShapeError(f"rearrange {formula!r}: dim of size {dim} cannot be split into ({' '.join(group)}) with "
                       f"sizes {sizes}")
    for n in group: axis_size[n] = sizes.get(n, rest)
  expand = lambda names: [a for n in names for a in (ell if n == "..." else [n])]  # noqa: E731
  flat_l, flat_r = expand(lnames), expand(rnames)
  x = t.reshape(tuple(axis_size[n] for n in flat_l)) if flat_l else t.reshape(())
  x = x.permute(tuple(flat_l.index(n) for n in flat_r)) if flat_r else x
  out: list[int] = []
  for grouped, g in rhs:
    if grouped: out.append(prod(axis_size[a] for a in expand(g)))
    else: out.extend(axis_size[a] for a in expand(g))
  return x.reshape(tuple(out))

def _check_multinomial_weights(w: Tensor) -> None:
  """ArgumentError for weights torch refuses (negative, NaN or infinite ones, a row summing to zero): the draws would be
  silently wrong. One read of two flags (a sync), where the index checks run (`data_checks_run`)."""
  from ember.tensor import Tensor
  from ember.tensor_index import data_checks_run
  if not data_checks_run() or w.numel() == 0: return
  negative, empty_row = Tensor.stack(((w < 0) | w.isnan() | w.isinf()).any(), (w.sum(1) <= 0).any()).tolist()
  if negative: raise ArgumentError("multinomial weights must be finite and >= 0; got a negative, NaN or infinite one")
  if empty_row: raise ArgumentError("multinomial weights of a row sum to 0: there is nothing to draw from")
