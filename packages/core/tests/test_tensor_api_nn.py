"""einsum, convolution, pooling, interpolation and attention of ember.Tensor against torch."""
from __future__ import annotations
from typing import Any
import numpy as np
import pytest
from ember import Tensor, dtypes
from ember.errors import ShapeError

torch = pytest.importorskip("torch")
F = torch.nn.functional

from torch_oracle import check  # noqa: E402

rng = np.random.default_rng(0)
def rand(*shape: int) -> np.ndarray: return rng.standard_normal(shape).astype(np.float32)

EINSUMS = [("ij,jk->ik", (3, 4), (4, 5)), ("bij,bjk->bik", (2, 3, 4), (2, 4, 2)), ("ii->i", (4, 4)), ("ii", (3, 3)),
           ("i,j->ij", (3,), (4,)), ("...ij,...jk", (2, 3, 4), (4, 2)), ("bhqd,bhkd->bhqk", (1, 2, 3, 4), (1, 2, 5, 4)),
           ("ij->", (3, 4)), ("ijk->kji", (2, 3, 4)), ("i,i->", (5,), (5,))]

@pytest.mark.parametrize("formula,shapes", [(e[0], e[1:]) for e in EINSUMS], ids=[e[0] for e in EINSUMS])
def test_einsum(formula: str, shapes: tuple[tuple[int, ...], ...]) -> None:
  arrays = [rand(*s) for s in shapes]
  check(lambda *ts: Tensor.einsum(formula, *ts), lambda *ts: torch.einsum(formula, *ts), *arrays)
  with pytest.raises(ShapeError): Tensor.einsum("ij,jk->ik", Tensor(rand(2, 3)), Tensor(rand(4, 2)))

CONVS: list[tuple[tuple[int, ...], tuple[int, ...], dict[str, Any]]] = [
  ((2, 3, 7), (4, 3, 3), {"stride": 2, "padding": 1}),
  ((1, 4, 6, 5), (6, 2, 3, 2), {"groups": 2, "stride": (2, 1), "dilation": (1, 2), "padding": (1, 0)}),
  ((2, 2, 5, 5), (3, 2, 3, 3), {"padding": 2, "dilation": 2}),
  ((1, 2, 4, 4, 3), (2, 2, 2, 2, 2), {"stride": 1, "padding": 1}),
]

@pytest.mark.parametrize("xs,ws,kw", CONVS, ids=[str(i) for i in range(len(CONVS))])
def test_conv(xs: tuple[int, ...], ws: tuple[int, ...], kw: dict[str, Any]) -> None:
  x, w, b = rand(*xs), rand(*ws), rand(ws[0])
  ref = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[len(ws) - 2]
  check(lambda x_, w_, b_: x_.conv2d(w_, b_, **kw), lambda x_, w_, b_: ref(x_, w_, b_, **kw), x, w, b)

def test_conv_asymmetric_padding_and_errors() -> None:
  x, w = rand(1, 2, 5, 4), rand(3, 2, 2, 2)
  # F.pad order: (left, right, top, bottom)
  check(lambda x_, w_: x_.conv2d(w_, padding=(1, 0, 2, 1)), lambda x_, w_: F.conv2d(F.pad(x_, (1, 0, 2, 1)), w_), x, w)
  with pytest.raises(ShapeError, match="channels"): Tensor(x).conv2d(Tensor(rand(3, 3, 2, 2)))

@pytest.mark.parametrize("kw", [{"stride": 2}, {"stride": 2, "padding": 1, "output_padding": 1},
                                {"groups": 2, "dilation": 2}, {"stride": (1, 2), "padding": (0, 1)}])
def test_conv_transpose(kw: dict[str, Any]) -> None:
  x, w, b = rand(2, 4, 3, 4), rand(4, 3, 3, 2), rand(3 * kw.get("groups", 1))
  check(lambda x_, w_, b_: x_.conv_transpose2d(w_, b_, **kw), lambda x_, w_, b_: F.conv_transpose2d(x_, w_, b_, **kw),
        x, w, b)

POOLS: list[dict[str, Any]] = [
  {"kernel_size": 2}, {"kernel_size": 3, "stride": 2, "padding": 1},
  {"kernel_size": (2, 3), "stride": (1, 2), "ceil_mode": True},
  {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True}, {"kernel_size": 2, "stride": 1, "dilation": 2},
]

@pytest.mark.parametrize("kw", POOLS, ids=[str(i) for i in range(len(POOLS))])
def test_max_pool(kw: dict[str, Any]) -> None:
  x = rand(1, 2, 7, 6)
  check(lambda t: t.max_pool2d(**kw), lambda t: F.max_pool2d(t, **kw), x)
  ours_v, ours_i = Tensor(x).max_pool2d(**kw, return_indices=True)
  want_v, want_i = F.max_pool2d(torch.tensor(x), **kw, return_indices=True)
  np.testing.assert_array_equal(ours_v.numpy(), want_v.numpy())
  np.testing.assert_array_equal(ours_i.numpy(), want_i.numpy())
  assert ours_i.dtype == dtypes.int32

def test_max_pool_1d_ints_and_unpool() -> None:
  xi = rng.integers(-9, 9, (1, 2, 9)).astype(np.int32)
  want = F.max_pool1d(torch.tensor(xi).float(), 3, ceil_mode=True).int().numpy()
  np.testing.assert_array_equal(Tensor(xi).max_pool2d((3,), ceil_mode=True).numpy(), want)
  x = rand(1, 1, 4, 4)
  v, i = Tensor(x).max_pool2d(2, return_indices=True)
  tv, ti = F.max_pool2d(torch.tensor(x), 2, return_indices=True)
  np.testing.assert_array_equal(v.max_unpool2d(i, 2).numpy(), F.max_unpool2d(tv, ti, 2).numpy())
  want = F.max_unpool2d(tv, ti, 2, output_size=(5, 5)).numpy()
  np.testing.assert_array_equal(v.max_unpool2d(i, 2, output_size=(5, 5)).numpy(), want)

AVGS: list[dict[str, Any]] = [
  {"kernel_size": 2}, {"kernel_size": 3, "stride": 2, "padding": 1},
  {"kernel_size": 3, "stride": 2, "padding": 1, "count_include_pad": False},
  {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True},
  {"kernel_size": (2, 3), "stride": 2, "ceil_mode": True, "padding": (1, 1), "count_include_pad": False},
]

@pytest.mark.parametrize("kw", AVGS, ids=[str(i) for i in range(len(AVGS))])
def test_avg_pool(kw: dict[str, Any]) -> None:
  check(lambda t: t.avg_pool2d(**kw), lambda t: F.avg_pool2d(t, **kw), rand(2, 2, 7, 6))

INTERPS: list[dict[str, Any]] = [
  {"size": (5, 9), "mode": "bilinear"}, {"size": (3, 2), "mode": "bilinear", "align_corners": True},
  {"size": (9, 4), "mode": "nearest"}, {"size": (5, 11), "mode": "nearest-exact"},
  {"scale_factor": 2.0, "mode": "nearest"},
  {"scale_factor": 1.5, "mode": "bilinear"},
]

@pytest.mark.parametrize("kw", INTERPS, ids=[str(i) for i in range(len(INTERPS))])
def test_interpolate(kw: dict[str, Any]) -> None:
  check(lambda t: t.interpolate(**kw), lambda t: F.interpolate(t, **kw), rand(1, 2, 4, 6))

def test_interpolate_linear_and_trilinear() -> None:
  check(lambda t: t.interpolate(size=7), lambda t: F.interpolate(t, size=7, mode="linear"), rand(2, 3, 5))
  check(lambda t: t.interpolate(size=(3, 4, 5), mode="trilinear", align_corners=True),
        lambda t: F.interpolate(t, size=(3, 4, 5), mode="trilinear", align_corners=True), rand(1, 1, 2, 3, 2))

@pytest.mark.parametrize("kw", [{}, {"is_causal": True}, {"scale": 0.3}])
def test_sdpa(kw: dict[str, Any]) -> None:
  q, k, v = rand(2, 2, 3, 4), rand(2, 2, 5, 4), rand(2, 2, 5, 3)
  check(lambda a, b, c: a.scaled_dot_product_attention(b, c, **kw),
        lambda a, b, c: F.scaled_dot_product_attention(a, b, c, **kw), q, k, v)

def test_sdpa_masks_and_gqa() -> None:
  q, k, v = rand(1, 4, 3, 4), rand(1, 2, 5, 4), rand(1, 2, 5, 4)
  bool_mask = rng.random((3, 5)) > 0.3
  bool_mask[:, 0] = True
  float_mask = rand(3, 5)
  kk, vv = np.repeat(k, 2, axis=1), np.repeat(v, 2, axis=1)
  check(lambda a, b, c: a.scaled_dot_product_attention(b, c, attn_mask=Tensor(bool_mask)),
        lambda a, b, c: F.scaled_dot_product_attention(a, b, c, attn_mask=torch.tensor(bool_mask)), q, kk, vv)
  check(lambda a, b, c: a.scaled_dot_product_attention(b, c, attn_mask=Tensor(float_mask)),
        lambda a, b, c: F.scaled_dot_product_attention(a, b, c, attn_mask=torch.tensor(float_mask)), q, kk, vv)
  check(lambda a, b, c: a.scaled_dot_product_attention(b, c, enable_gqa=True),
        lambda a, b, c: F.scaled_dot_product_attention(a, b, c, enable_gqa=True), q, k, v)
