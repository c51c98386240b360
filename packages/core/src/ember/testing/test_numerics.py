"""Tier 4, numerics against the PYTHON reference device: elementwise, reduce, movement and matmul over every dtype the
device's renderer supports. Inputs are identical on both devices; results must agree within a few ulps."""
from __future__ import annotations
from typing import Any, Callable
import pytest
from ember.testing import REFERENCE_DEVICE, assert_matches, sample, tensor

pytestmark = pytest.mark.ember_tier("numerics")

def _needs_compute(caps) -> None:
  if not caps.has_renderer or not caps.has_compiler: pytest.skip(f"{caps.device} cannot compile kernels")
  if not caps.holds_data: pytest.skip(f"{caps.device} declares that it holds no data, so results cannot be read")
  if caps.device == REFERENCE_DEVICE:
    pytest.skip(f"{caps.device} is the reference device; test_reference_agrees_with_numpy checks it against numpy")

def _compare(device: str, dt, build: Callable[..., Any], *inputs: Inputs, what: str, errors: list[str]) -> None:
  """Check one op; a mismatch is recorded in `errors` so one test reports every failing (op, dtype) at once."""
  try: _compare_one(device, dt, build, *inputs, what=what)
  except AssertionError as e: errors.append(" ".join(str(e).split())[:400])

Inputs = tuple[tuple[int, ...], dict[str, bool]]  # (shape, options of `sample`)

def _compare_one(device: str, dt, build: Callable[..., Any], *inputs: Inputs, what: str) -> None:
  datas = [sample(shape, dt, seed=i + 10, **kw) for i, (shape, kw) in enumerate(inputs)]
  out = build(*(tensor(d, dt, device) for d in datas))
  ref = build(*(tensor(d, dt, REFERENCE_DEVICE) for d in datas))
  assert_matches(out, ref, f"{what} in {dt!r} on {device}", computed_in=dt)

def _ops(dt) -> dict[str, tuple[Callable[..., Any], list[dict[str, bool]]]]:
  from ember.dtype import dtypes
  both: dict[str, tuple[Callable[..., Any], list[dict[str, bool]]]] = {
    "add": (lambda a, b: a + b, [{}, {}]), "mul": (lambda a, b: a * b, [{}, {}]),
    "maximum": (lambda a, b: a.maximum(b), [{}, {}]), "cmplt": (lambda a, b: a < b, [{}, {}]),
    "cmpne": (lambda a, b: a != b, [{}, {}]), "where": (lambda a, b: (a < b).where(a, b), [{}, {}]),
    "cast_f32": (lambda a: a.cast(dtypes.float32), [{}]), "cast_i32": (lambda a: a.cast(dtypes.int32), [{}]),
    "cast_bool": (lambda a: a.cast(dtypes.bool), [{}]),
  }
  if dt is dtypes.bool:
    both.update({"and": (lambda a, b: a & b, [{}, {}]), "or": (lambda a, b: a | b, [{}, {}]),
                 "xor": (lambda a, b: a ^ b, [{}, {}]), "not": (lambda a: a.logical_not(), [{}])})
    return both
  both["sub"] = (lambda a, b: a - b, [{}, {}])
  if dtypes.is_float(dt):
    both.update({"div": (lambda a, b: a / b, [{}, {"nonzero": True}]), "neg": (lambda a: -a, [{}]),
                 "exp2": (lambda a: a.exp2(), [{}]), "log2": (lambda a: a.log2(), [{"positive": True}]),
                 "sqrt": (lambda a: a.sqrt(), [{"positive": True}]), "sin": (lambda a: a.sin(), [{}]),
                 "reciprocal": (lambda a: a.reciprocal(), [{"nonzero": True}]), "trunc": (lambda a: a.trunc(), [{}]),
                 "exp": (lambda a: a.exp(), [{}]), "sigmoid": (lambda a: a.sigmoid(), [{}])})
  else:
    both.update({"idiv": (lambda a, b: a // b, [{}, {"positive": True}]),
                 "mod": (lambda a, b: a % b, [{}, {"positive": True}]),
                 "and": (lambda a, b: a & b, [{}, {}]), "or": (lambda a, b: a | b, [{}, {}]),
                 "xor": (lambda a, b: a ^ b, [{}, {}]), "shl": (lambda a: a << 2, [{}]),
                 "shr": (lambda a: a >> 1, [{}])})
    if not dtypes.is_unsigned(dt): both["neg"] = (lambda a: -a, [{}])
  return both

def test_elementwise(ember_device, ember_capabilities):
  _needs_compute(ember_capabilities)
  errors: list[str] = []
  for dt in ember_capabilities.dtypes:
    for name, (fn, kws) in _ops(dt).items():
      _compare(ember_device, dt, fn, *[((3, 5), kw) for kw in kws], what=name, errors=errors)
  assert not errors, "\n".join(errors)

def test_reduce(ember_device, ember_capabilities):
  from ember.dtype import dtypes
  _needs_compute(ember_capabilities)
  errors: list[str] = []
  for dt in ember_capabilities.dtypes:
    for axis in (0, 1, None):
      _compare(ember_device, dt, lambda a, axis=axis: a.sum(axis), ((6, 9), {}), what=f"sum({axis})", errors=errors)
      _compare(ember_device, dt, lambda a, axis=axis: a.max(axis), ((6, 9), {}), what=f"max({axis})", errors=errors)
      if dt is not dtypes.bool:
        _compare(ember_device, dt, lambda a, axis=axis: a.min(axis), ((6, 9), {}), what=f"min({axis})", errors=errors)
    if dtypes.is_float(dt):
      _compare(ember_device, dt, lambda a: a.mean(1), ((6, 9), {}), what="mean", errors=errors)
      _compare(ember_device, dt, lambda a: (a - a.max(1, keepdim=True)).exp().sum(1), ((6, 9), {}),
               what="softmax denominators", errors=errors)
  assert not errors, "\n".join(errors)

def test_movement(ember_device, ember_capabilities):
  _needs_compute(ember_capabilities)
  errors: list[str] = []
  movements: dict[str, Callable[[Any], Any]] = {
    "permute": lambda a: a.permute(2, 0, 1), "reshape": lambda a: a.reshape(6, 4),
    "expand": lambda a: a[:, :1].expand(2, 5, 4),
    "pad": lambda a: a.pad(((1, 0), (0, 2), (1, 1))), "shrink": lambda a: a.shrink(((0, 1), (1, 3), (1, 4))),
    "flip": lambda a: a.flip((0, 2)), "strided": lambda a: a[:, ::2, ::-3],
    "chain": lambda a: a.permute(1, 0, 2).reshape(3, 8).pad(((1, 1), (0, 0))).flip(0).shrink(((1, 4), (2, 6))),
  }
  for dt in ember_capabilities.dtypes:
    for name, fn in movements.items():
      _compare(ember_device, dt, lambda a, fn=fn: fn(a).contiguous(), ((2, 3, 4), {}), what=name, errors=errors)
  assert not errors, "\n".join(errors)

def test_matmul(ember_device, ember_capabilities):
  from ember.dtype import dtypes
  _needs_compute(ember_capabilities)
  errors: list[str] = []
  for dt in ember_capabilities.dtypes:
    if dt is dtypes.bool: continue
    _compare(ember_device, dt, lambda a, b: a @ b, ((4, 5), {}), ((5, 3), {}), what="matmul", errors=errors)
    _compare(ember_device, dt, lambda a, b: (a @ b).maximum(0), ((2, 3, 4), {}), ((4, 2), {}), what="batched matmul",
             errors=errors)
  assert not errors, "\n".join(errors)

def test_integer_division_rule(ember_device, ember_capabilities):
  """Integer division never traps and gives numpy's values: x // 0 == x % 0 == 0, MIN // -1 == MIN, MIN % -1 == 0."""
  import numpy as np
  from ember.dtype import dtypes
  caps = ember_capabilities  # numpy is the oracle, so the reference device runs this too
  if not caps.has_renderer or not caps.has_compiler: pytest.skip(f"{caps.device} cannot compile kernels")
  if not caps.holds_data: pytest.skip(f"{caps.device} declares that it holds no data, so results cannot be read")
  errors: list[str] = []
  for dt in caps.dtypes:
    if not dtypes.is_int(dt): continue
    info = np.iinfo(np.dtype(dt.fmt))
    divisors = [0, 3, -1, info.min] if info.min < 0 else [0, 3, info.max]
    a = np.array([info.min, info.max, 7, 0] * len(divisors), dt.fmt)
    b = np.repeat(np.array(divisors, dt.fmt), 4)
    with np.errstate(all="ignore"): want = {"//": a // b, "%": a % b}
    got = {"//": tensor(a, dt, ember_device) // tensor(b, dt, ember_device),
           "%": tensor(a, dt, ember_device) % tensor(b, dt, ember_device)}
    for op in want:
      if not np.array_equal(got[op].numpy(), want[op]):
        errors.append(f"{a} {op} {b} in {dt!r} on {ember_device}: {got[op].numpy()}, numpy gives {want[op]}")
  assert not errors, "\n".join(errors)

def test_reference_agrees_with_numpy():
  """The reference itself, checked against numpy where numpy has the dtype (guards the oracle of this tier)."""
  import numpy as np
  from ember.dtype import dtypes
  a, b = sample((4, 5), dtypes.float32, 1), sample((5, 3), dtypes.float32, 2)
  out = tensor(a, dtypes.float32, REFERENCE_DEVICE) @ tensor(b, dtypes.float32, REFERENCE_DEVICE)
  np.testing.assert_allclose(out.numpy(), a.astype(np.float32) @ b.astype(np.float32), rtol=1e-5, atol=1e-6)
  x = sample((3, 5), dtypes.int32, 3)
  y = sample((3, 5), dtypes.int32, 4, positive=True)
  t = tensor(x, dtypes.int32, REFERENCE_DEVICE) // tensor(y, dtypes.int32, REFERENCE_DEVICE)
  np.testing.assert_array_equal(t.numpy(), (x // y).astype(np.int32))
