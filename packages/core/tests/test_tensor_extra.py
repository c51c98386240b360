"""The tinygrad-compatible Tensor methods of ember.tensor_ops.extra against torch, numpy and hashlib."""
from __future__ import annotations
import hashlib
import numpy as np
import pytest
from ember import Tensor, dtypes, function
from ember.errors import DTypeError, ShapeError
from ember.function import FunctionError
from torch_oracle import check, torch

RNG = np.random.default_rng(0)
def randf(*shape: int) -> np.ndarray: return RNG.standard_normal(shape).astype(np.float32)

# ** functional nn **

def test_sequential_linear_layernorm_batchnorm_match_torch():
  x, w, b = randf(3, 4), randf(4, 5), randf(5)
  check(lambda t: t.sequential([lambda y: y * 2, lambda y: y + 1]), lambda t: t * 2 + 1, x)
  # tinygrad's linear takes weight as (in, out): torch's F.linear with the transpose
  check(lambda t, wt, bt: t.linear(wt, bt), lambda t, wt, bt: torch.nn.functional.linear(t, wt.T, bt), x, w, b)
  check(lambda t, wt: t.linear(wt), lambda t, wt: t * wt, x, randf(4))
  x3 = randf(2, 3, 6)
  check(lambda t: t.layernorm(), lambda t: torch.nn.functional.layer_norm(t, (6,)), x3, tol=1e-4)
  check(lambda t: t.layernorm(axis=(1, 2), eps=1e-3), lambda t: torch.nn.functional.layer_norm(t, (3, 6), eps=1e-3),
        x3, tol=1e-4)
  x4, mean, var, g, beta = randf(2, 3, 4, 4), randf(3), np.abs(randf(3)) + 0.5, randf(3), randf(3)
  with torch.no_grad():  # the statistics of inference-mode batch norm
    ref = torch.nn.functional.batch_norm(*(torch.tensor(v) for v in (x4, mean, var, g, beta)), eps=1e-5)
  np.testing.assert_allclose(Tensor(x4).batchnorm(Tensor(g), Tensor(beta), Tensor(mean), (Tensor(var) + 1e-5).rsqrt())
                             .numpy(), ref.numpy(), atol=1e-4)
  check(lambda t, m, v, gt, bt: t.batchnorm(gt, bt, m, (v + 1e-5).rsqrt()),
        lambda t, m, v, gt, bt: (t - m.reshape(1, 3, 1, 1)) * gt.reshape(1, 3, 1, 1) / (v.reshape(1, 3, 1, 1) + 1e-5)
        .sqrt() + bt.reshape(1, 3, 1, 1),
        x4, mean, var, g, beta, tol=1e-4)

def test_linear_dtype_casts_all_operands():
  out = Tensor([[1, 2]]).linear(Tensor([[1], [1]]), Tensor([1]), dtype=dtypes.float32)
  assert out.dtype is dtypes.float32 and out.tolist() == [[4.0]]

# ** comparisons, properties, casts **

@pytest.mark.parametrize("name", ["eq", "ne", "lt", "le", "gt", "ge"])
def test_comparison_methods_match_torch(name):
  a, b = np.array([1.0, 2.0, 3.0, np.nan], np.float32), np.array([2.0, 2.0, 1.0, np.nan], np.float32)
  check(lambda x, y: getattr(x, name)(y), lambda x, y: getattr(x, name)(y), a, b, grad=False)
  check(lambda x: getattr(x, name)(2), lambda x: getattr(x, name)(2), a, grad=False)

def test_allclose_is_a_python_bool_like_torch():
  a = randf(5)
  for other, kw in ((a + 1e-7, {}), (a + 1e-2, {}), (a + 1e-2, {"atol": 0.1}), (a * 1.01, {"rtol": 0.02})):
    got = Tensor(a).allclose(Tensor(other), **kw)
    assert isinstance(got, bool) and got == torch.tensor(a).allclose(torch.tensor(other), **kw)
  nan = np.array([np.nan, 1.0], np.float32)
  assert not Tensor(nan).allclose(Tensor(nan)) and Tensor(nan).allclose(Tensor(nan), equal_nan=True)

def test_is_floating_point_size_and_cast_shorthands():
  for np_dt in (np.float16, np.float32, np.float64, np.int8, np.int32, np.uint8, np.bool_):
    arr = np.zeros(3, np_dt)
    assert Tensor(arr).is_floating_point() == torch.from_numpy(arr).is_floating_point()
  assert Tensor([1.0]).bfloat16().is_floating_point() and not Tensor([True]).is_floating_point()
  t = Tensor.zeros(2, 3, 4)
  assert t.size() == (2, 3, 4) and t.size(1) == 3 and t.size(-1) == 4
  with pytest.raises(IndexError): t.size(3)
  x = np.array([-1.7, 0.5, 300.25], np.float32)
  assert Tensor(x).short().dtype is dtypes.int16
  np.testing.assert_array_equal(Tensor(x).short().numpy(), torch.tensor(x).short().numpy())
  np.testing.assert_array_equal(Tensor(x).bfloat16().float().numpy(), torch.tensor(x).bfloat16().float().numpy())

# ** pad_to / shrink_to / rearrange **

def test_pad_to_and_shrink_to():
  x = randf(2, 3)
  np.testing.assert_array_equal(Tensor(x).pad_to(4, None).numpy(), np.pad(x, ((0, 2), (0, 0))))
  np.testing.assert_array_equal(Tensor(x).pad_to((3, 5), value=7).numpy(), np.pad(x, ((0, 1), (0, 2)),
                                                                                    constant_values=7))
  np.testing.assert_array_equal(Tensor(x).shrink_to(None, 2).numpy(), x[:, :2])
  np.testing.assert_array_equal(Tensor(x).shrink_to([1, 0]).numpy(), x[:1, :0])
  with pytest.raises(ShapeError, match="shrink_to"): Tensor(x).pad_to(1, 3)
  with pytest.raises(ShapeError, match="pad_to"): Tensor(x).shrink_to(2, 4)
  with pytest.raises(ShapeError): Tensor(x).pad_to(3)

REARRANGE = [  # (input shape, pattern, sizes, numpy reference)
  ((2, 3, 4), "b h w -> b w h", {}, lambda a: a.transpose(0, 2, 1)),
  ((2, 3, 4), "b h w -> (b h) w", {}, lambda a: a.reshape(6, 4)),
  ((2, 3, 4), "b h w -> w (h b)", {}, lambda a: a.transpose(2, 1, 0).reshape(4, 6)),
  ((6, 4), "(b h) w -> b h w", {"b": 2}, lambda a: a.reshape(2, 3, 4)),
  ((6, 4), "(b h) w -> h (w b)", {"h": 3}, lambda a: a.reshape(2, 3, 4).transpose(1, 2, 0).reshape(3, 8)),
  ((2, 3, 4, 5), "b ... c -> c b ...", {}, lambda a: a.transpose(3, 0, 1, 2)),
  ((2, 3, 4, 5), "b ... -> b (...)", {}, lambda a: a.reshape(2, 60)),
  ((2, 3, 4, 5), "... h w -> ... (h w)", {}, lambda a: a.reshape(2, 3, 20)),
  ((2, 3), "b c -> b 1 c 1", {}, lambda a: a.reshape(2, 1, 3, 1)),
  ((2, 1, 3), "b 1 c -> c b", {}, lambda a: a[:, 0, :].T),
  ((2, 3), "b c -> b () c", {}, lambda a: a.reshape(2, 1, 3)),
  ((4, 6), "(h1 h2) (w1 w2) -> (h1 w1) (h2 w2)", {"h1": 2, "w1": 3},
   lambda a: a.reshape(2, 2, 3, 2).transpose(0, 2, 1, 3).reshape(6, 4)),
  ((3,), "… -> …", {}, lambda a: a),
]

@pytest.mark.parametrize("shape,pattern,sizes,ref", REARRANGE, ids=[r[1] for r in REARRANGE])
def test_rearrange_matches_numpy(shape, pattern, sizes, ref):
  a = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
  np.testing.assert_array_equal(Tensor(a).rearrange(pattern, **sizes).numpy(), ref(a))

@pytest.mark.parametrize("pattern,sizes", [
  ("b h -> b", {}), ("b h w -> b h", {}), ("b h -> h b b", {}), ("(b h) w -> b h w", {}), ("b h w", {}),
  ("(b h) w -> b h w", {"b": 4}), ("b h -> h b", {"x": 2}), ("(b ...) -> b ...", {}), ("b (h -> b h", {}),
  ("b h w c -> b h w c", {}),
])
def test_rearrange_bad_patterns_raise_shape_errors(pattern, sizes):
  with pytest.raises(ShapeError, match="rearrange"): Tensor.zeros(6, 4, 2).rearrange(pattern, **sizes)

def test_methods_needing_concrete_sizes_name_them_for_a_symbolic_dim():
  # the sizes feed Python loops and numpy: a bound Variable's dim is a ShapeError naming the method, not a TypeError
  from ember import Variable
  n = Variable("n", 1, 4).bind(3)
  x, raw = Tensor(randf(4, 4))[:n], Tensor(np.arange(4, dtype=np.uint8))[:n]
  for name, call in (("rearrange", lambda: x.rearrange("a b -> b a")), ("qr", x.qr), ("svd", x.svd),
                     ("newton_schulz", lambda: x.newton_schulz(2, (3.4445, -4.775, 2.0315))), ("hash", raw.hash)):
    with pytest.raises(ShapeError, match=f"{name} needs concrete sizes"): call()

def test_rearrange_backward():
  check(lambda t: t.rearrange("(b h) w -> w b h", b=2) * 3, lambda t: t.reshape(2, 3, 4).permute(2, 0, 1) * 3,
        randf(6, 4))

# ** random **

def test_rand_like_randn_like_follow_shape_dtype_device_and_seed():
  x = Tensor.zeros(3, 4, dtype=dtypes.float16)
  r, n = x.rand_like(), x.randn_like()
  assert r.shape == n.shape == (3, 4) and r.dtype is n.dtype is dtypes.float16
  assert x.rand_like(dtype=dtypes.float32).dtype is dtypes.float32
  vals = r.numpy()
  assert ((vals >= 0) & (vals < 1)).all() and len(np.unique(vals)) > 6
  Tensor.manual_seed(5)
  a = Tensor.ones(500).randn_like().numpy()
  Tensor.manual_seed(5)
  np.testing.assert_array_equal(a, Tensor.ones(500).randn_like().numpy())
  assert abs(a.mean()) < 0.2 and abs(a.std() - 1) < 0.15
  with pytest.raises(DTypeError, match="rand_like"): Tensor([1, 2]).rand_like()
  with pytest.raises(TypeError): Tensor([1, 2]).randn_like()

def test_randperm_is_a_permutation_and_seeded():
  Tensor.manual_seed(0)
  perms = [Tensor.randperm(20).numpy() for _ in range(3)]
  for p in perms: np.testing.assert_array_equal(np.sort(p), np.arange(20))
  assert perms[0].dtype == np.int32 and len({p.tobytes() for p in perms}) == 3
  Tensor.manual_seed(0)
  np.testing.assert_array_equal(Tensor.randperm(20).numpy(), perms[0])
  assert Tensor.randperm(6, dtype=dtypes.int64).dtype is dtypes.int64 and Tensor.randperm(0).shape == (0,)
  # every position is uniform over the values: counts over many draws
  Tensor.manual_seed(1)
  first = np.bincount([int(Tensor.randperm(4).numpy()[0]) for _ in range(200)], minlength=4)
  assert first.min() > 25, first

def test_multinomial_with_replacement_matches_the_weights():
  Tensor.manual_seed(3)
  w = np.array([[1.0, 0.0, 3.0, 4.0], [0.0, 0.0, 1.0, 0.0]], np.float32)
  s = Tensor(w).multinomial(4000, replacement=True).numpy()
  assert s.shape == (2, 4000) and s.dtype == np.int32
  freq = np.bincount(s[0], minlength=4) / 4000
  np.testing.assert_allclose(freq, w[0] / w[0].sum(), atol=0.03)
  assert (s[1] == 2).all()
  assert Tensor(w[0]).multinomial(3, replacement=True).shape == (3,)

def test_multinomial_without_replacement_never_repeats_and_prefers_heavy_weights():
  Tensor.manual_seed(4)
  w = np.array([1.0, 2.0, 0.0, 50.0, 3.0], np.float32)
  firsts = []
  for _ in range(60):
    s = Tensor(w).multinomial(4).numpy()
    assert len(set(s.tolist())) == 4 and 2 not in s  # a zero weight is never drawn while others remain
    firsts.append(int(s[0]))
  assert firsts.count(3) > 40  # weight 50 of 56
  assert sorted(Tensor(w).multinomial(4).tolist()) == [0, 1, 3, 4]
  with pytest.raises(ShapeError, match="without replacement"): Tensor(w).multinomial(6)
  with pytest.raises(ShapeError): Tensor.ones(2, 2, 2).multinomial()

def _threefry_np(key: tuple[int, int], ctr: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
  """Threefry-2x32-20 (Random123) in numpy uint32 arithmetic."""
  k0, k1 = np.uint32(key[0]), np.uint32(key[1])
  ks = (k0, k1, k0 ^ k1 ^ np.uint32(0x1BD11BDA))
  x0, x1 = ctr[0].astype(np.uint32) + ks[0], ctr[1].astype(np.uint32) + ks[1]
  for r in range(20):
    rot = (13, 15, 26, 6, 17, 29, 16, 24)[r % 8]
    x0 = x0 + x1
    x1 = ((x1 << np.uint32(rot)) | (x1 >> np.uint32(32 - rot))) ^ x0
    if r % 4 == 3:
      s = r // 4 + 1
      x0, x1 = x0 + ks[s % 3], x1 + ks[(s + 1) % 3] + np.uint32(s)
  return x0, x1

def test_random_bits_is_threefry_over_a_derived_key():
  z = np.zeros(1, np.uint32)
  # the numpy reference reproduces Random123's known answers first
  assert [int(v[0]) for v in _threefry_np((0, 0), (z, z))] == [0x6B200159, 0x99BA4EFE]
  key, counter = (0x13198A2E, 0x03707344), (7, 1)
  for num in (1, 5, 8):
    k0, k1 = _threefry_np(key, (np.array([counter[0]]), np.array([counter[1]])))
    half = (num + 1) // 2
    idx = np.arange(half, dtype=np.uint32)
    x0, x1 = _threefry_np((int(k0[0]), int(k1[0])), (idx, idx + np.uint32(half)))
    got = Tensor.random_bits(Tensor(np.array(key, np.uint32)), Tensor(np.array(counter, np.uint32)), num).numpy()
    np.testing.assert_array_equal(got, np.concatenate([x0, x1])[:num])
  with pytest.raises(DTypeError, match="uint32"): Tensor.random_bits(Tensor([1, 2]), Tensor([0, 0]), 4)

# ** linear algebra **

@pytest.mark.parametrize("shape", [(4, 4), (6, 3), (3, 5), (2, 5, 4), (1, 1), (5, 1)])
def test_qr_reconstructs_with_lapack_signs(shape):
  a = randf(*shape)
  for some in (True, False):
    q, r = Tensor(a).qr(some=some)
    tq, tr = torch.tensor(a).qr(some=some)
    assert q.shape == tuple(tq.shape) and r.shape == tuple(tr.shape)
    np.testing.assert_allclose(q.numpy(), tq.numpy(), atol=1e-4)
    np.testing.assert_allclose(r.numpy(), tr.numpy(), atol=1e-4)
    np.testing.assert_allclose((q @ r).numpy(), a, atol=1e-4)

def test_qr_of_a_column_already_triangular():
  a = np.array([[2.0, 1.0], [0.0, 3.0], [0.0, 4.0]], np.float32)
  q, r = Tensor(a).qr()
  tq, tr = torch.tensor(a).qr()
  np.testing.assert_allclose(r.numpy(), tr.numpy(), atol=1e-5)
  np.testing.assert_allclose(q.numpy(), tq.numpy(), atol=1e-5)

@pytest.mark.parametrize("shape", [(4, 4), (6, 3), (3, 5), (2, 4, 3), (5, 5)])
def test_svd_matches_numpy_singular_values_and_reconstructs(shape):
  a = randf(*shape)
  k = min(shape[-2:])
  u, s, v = Tensor(a).svd()
  assert u.shape == (*shape[:-2], shape[-2], k) and s.shape == (*shape[:-2], k) and v.shape == (*shape[:-2],
                                                                                                    shape[-1], k)
  np.testing.assert_allclose(s.numpy(), np.linalg.svd(a, compute_uv=False), rtol=1e-4, atol=1e-5)
  un, sn, vn = u.numpy(), s.numpy(), v.numpy()
  np.testing.assert_allclose(un @ (sn[..., :, None] * np.swapaxes(vn, -1, -2)), a, atol=1e-4)
  eye = np.broadcast_to(np.eye(k, dtype=np.float32), (*shape[:-2], k, k))
  np.testing.assert_allclose(np.swapaxes(un, -1, -2) @ un, eye, atol=1e-4)
  np.testing.assert_allclose(np.swapaxes(vn, -1, -2) @ vn, eye, atol=1e-4)

def test_svd_full_matrices_are_orthogonal():
  a = randf(5, 3)
  u, s, v = Tensor(a).svd(some=False)
  assert u.shape == (5, 5) and v.shape == (3, 3)
  np.testing.assert_allclose(u.numpy().T @ u.numpy(), np.eye(5), atol=1e-4)
  np.testing.assert_allclose(u.numpy()[:, :3] @ np.diag(s.numpy()) @ v.numpy().T, a, atol=1e-4)
  with pytest.raises(TypeError, match="some="): Tensor(a).svd(full_matrices=False)
  with pytest.raises(ShapeError): Tensor([1.0, 2.0]).svd()

def test_newton_schulz_orthogonalises():
  a = randf(4, 6)
  # the classic cubic iteration (1.5, -0.5) converges to U V^T, the orthogonal polar factor
  u, _, vt = np.linalg.svd(a, full_matrices=False)
  np.testing.assert_allclose(Tensor(a).newton_schulz(40, (1.5, -0.5)).numpy(), u @ vt, atol=1e-4)
  np.testing.assert_allclose(Tensor(a.T).newton_schulz(40, (1.5, -0.5)).numpy(), (u @ vt).T, atol=1e-4)
  # Muon's quintic: singular values land near 1 (within ~0.3) after 5 steps
  sv = np.linalg.svd(Tensor(a).newton_schulz(5, (3.4445, -4.775, 2.0315)).numpy(), compute_uv=False)
  assert ((sv > 0.6) & (sv < 1.3)).all(), sv

# ** hashing **

@pytest.mark.parametrize("cfg,ref", [("sha3_256", lambda m: hashlib.sha3_256(m).digest()),
                                     ("sha3_224", lambda m: hashlib.sha3_224(m).digest()),
                                     ("sha3_512", lambda m: hashlib.sha3_512(m).digest()),
                                     ("shake_128", lambda m: hashlib.shake_128(m).digest(16))])
def test_keccak_matches_hashlib(cfg, ref):
  rate = {"sha3_256": 136, "sha3_224": 144, "sha3_512": 72, "shake_128": 168}[cfg]
  for n in (0, 3, rate - 1, rate, rate + 1):
    msgs = RNG.integers(0, 256, (2, n), dtype=np.uint8)
    got = Tensor(msgs).keccak(cfg).numpy() if n else Tensor.empty(2, 0, dtype=dtypes.uint8).keccak(cfg).numpy()
    assert got.shape == (2, len(ref(b""))) and got.dtype == np.uint8
    for row, msg in zip(got, msgs): assert row.tobytes() == ref(msg.tobytes()), (cfg, n)

def test_keccak_hashes_the_bytes_of_other_dtypes():
  a = np.arange(10, dtype=np.int32)
  assert Tensor(a).keccak().numpy().tobytes() == hashlib.sha3_256(a.tobytes()).digest()
  with pytest.raises(ValueError, match="keccak"): Tensor(b"x").keccak("md5")

def test_hash_is_the_shake128_tree_of_tinygrad():
  data = b"Hello World!"
  padded = data.ljust(1 << 20, b"\0")
  leaves = b"".join(hashlib.shake_128(padded[i:i + 4096]).digest(16) for i in range(0, len(padded), 4096))
  assert bytes(Tensor(data).hash().tolist()) == hashlib.shake_128(leaves).digest(16)

# ** devices and memory **

def test_from_blob_reads_the_memory_in_place():
  a = np.arange(6, dtype=np.float32)
  t = Tensor.from_blob(a.ctypes.data, (2, 3), dtype=dtypes.float32)
  np.testing.assert_array_equal(t.numpy(), a.reshape(2, 3))
  a[0] = 42.0
  assert t.numpy()[0, 0] == 42.0
  np.testing.assert_array_equal((t * 2).numpy(), a.reshape(2, 3) * 2)
  del t
  with pytest.raises(ValueError, match="address"): Tensor.from_blob(0, (2,))

def test_to_in_place_moves_the_tensor_and_grad():
  t = Tensor([1.0, 2.0], requires_grad=True)
  (t * t).sum().backward()
  same = t.to_("PYTHON")
  assert same is t and t.device == "PYTHON" and t.grad is not None and t.grad.device == "PYTHON"
  assert t.tolist() == [1.0, 2.0] and t.grad.tolist() == [2.0, 4.0]

def test_shard_like_follows_the_layout_of_y():
  devices = ("PYTHON", "PYTHON:1")
  y = Tensor.zeros(4, 2).shard(devices, axis=0)
  x = Tensor(np.arange(8, dtype=np.float32).reshape(4, 2)).shard_like(y)
  assert x.device == devices and x.axis == 0  # type: ignore[attr-defined]
  np.testing.assert_array_equal(x.numpy(), np.arange(8).reshape(4, 2))
  assert Tensor([1.0]).shard_like(Tensor([2.0], device="PYTHON")).device == "PYTHON"
  r = y.rand_like()
  assert r.device == devices and r.shape == (4, 2)

# ** ember.function **

def test_function_decorator_keeps_values_and_gradients():
  @function
  def f(x: Tensor, w: Tensor) -> Tensor: return (x @ w).relu()
  @function(precompile=True)
  def pair(x: Tensor) -> tuple[Tensor, Tensor]: return x + 1, x * 2
  check(lambda x, w: f(x, w), lambda x, w: (x @ w).relu(), randf(3, 4), randf(4, 2))
  a, b = pair(Tensor([1.0]))
  assert a.tolist() == [2.0] and b.tolist() == [2.0] and f.__name__ == "f"
  with pytest.raises(FunctionError, match="must return a Tensor"): function(lambda x: 1)(Tensor([1]))
  with pytest.raises(TypeError, match="grad_fxn"): function(grad_fxn=lambda g: g)  # type: ignore[call-overload]
