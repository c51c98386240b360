"""Integer division by zero and MIN // -1 follow one rule (numpy's values, no trap): x // 0 == x % 0 == 0 for a zero
divisor tensor (a Python 0 raises), MIN // -1 == MIN, MIN % -1 == 0. Codegen guards every integer IDIV/MOD whose
divisor may trap (pm_safe_division); divisors known to be safe (index math by positive constants) render exactly as
before."""
from __future__ import annotations
from typing import Any, Callable
import numpy as np
import pytest
from ember import Tensor, dtypes
from ember.errors import IntegerDivisionByZeroError
from ember.codegen import full_rewrite, pm_safe_division
from ember.device.python import PythonRenderer
from ember.dtype import DType
from ember.uop.ops import AxisType, Ops, UOp
from ember.uop.rewrite import PatternMatcher
from ember.testing import division_operands, trunc_div
from ember.testing.programs import param

INTS = [dtypes.int8, dtypes.int16, dtypes.int32, dtypes.int64,
        dtypes.uint8, dtypes.uint16, dtypes.uint32, dtypes.uint64]

OPS: dict[str, tuple[Callable[[Any, Any], Any], Callable[[np.ndarray, np.ndarray], np.ndarray]]] = {
  "floordiv": (lambda a, b: a // b, lambda a, b: a // b),
  "mod": (lambda a, b: a % b, lambda a, b: a % b),
  "trunc": (lambda a, b: a.div(b, rounding_mode="trunc"), trunc_div),
  "fmod": (lambda a, b: a.fmod(b), np.fmod),
}

def check_rule(device: str, dt: DType) -> None:
  a, b = division_operands(dt)
  ta, tb = Tensor(a, device=device), Tensor(b, device=device)
  scalars = [0, 3, -1] if dt.kind == "i" else [0, 3]
  for name, (ours, theirs) in OPS.items():
    with np.errstate(all="ignore"):
      np.testing.assert_array_equal(ours(ta, tb).numpy(), theirs(a, b), err_msg=f"{name} {dt!r} tensor divisor")
      for s in scalars:
        want = theirs(a, np.full_like(b[:1], s))
        if s == 0:  # a Python 0 is refused (as by torch); a zero tensor (a folded constant) gives the rule's value
          with pytest.raises(IntegerDivisionByZeroError): ours(ta, s)
          zero = Tensor.full((), 0, dtype=dt, device=device)
          np.testing.assert_array_equal(ours(ta, zero).numpy(), want, err_msg=f"{name} {dt!r} by a zero tensor")
          continue
        np.testing.assert_array_equal(ours(ta, s).numpy(), want, err_msg=f"{name} {dt!r} by {s}")
  with np.errstate(all="ignore"):  # a Python int over a tensor of divisors (zeros among them)
    np.testing.assert_array_equal((7 // tb).numpy(), np.full_like(b, 7) // b, err_msg=f"7 // {dt!r}")
    np.testing.assert_array_equal((7 % tb).numpy(), np.full_like(b, 7) % b, err_msg=f"7 % {dt!r}")

@pytest.mark.parametrize("dt", INTS, ids=lambda d: d.name)
def test_python_device_follows_the_rule(dt: DType) -> None:
  check_rule("PYTHON", dt)

def _program(divisor_of: Callable[[UOp, UOp], UOp], dt: DType = dtypes.int32, n: int = 16) -> UOp:
  out, a, b = param(0, dt, n), param(1, dt, n), param(2, dt, n)
  rng = UOp.range(n, 0, AxisType.GLOBAL)
  x, y = a.index(rng).load(), b.index(rng).load()
  return out.index(rng).store(x.alu(Ops.IDIV, divisor_of(x, y))).sink()

def _render(sink: UOp, guard: bool, monkeypatch: pytest.MonkeyPatch) -> str:
  import ember.codegen
  if not guard: monkeypatch.setattr(ember.codegen, "pm_safe_division", PatternMatcher([]))
  uops, _, _ = full_rewrite(sink, PythonRenderer(), [])
  monkeypatch.undo()
  return PythonRenderer().render(uops, "k")

@pytest.mark.parametrize("divisor", [lambda x, y: y.const_like(3), lambda x, y: y.cast(dtypes.uint8).cast(y.dtype) + 1],
                         ids=["const", "positive_range"])
def test_divisors_that_cannot_trap_render_unchanged(divisor: Callable[[UOp, UOp], UOp],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
  sink = _program(divisor)
  assert _render(sink, True, monkeypatch) == _render(sink, False, monkeypatch)

def test_index_math_by_constants_has_no_guard() -> None:
  a = Tensor(np.arange(24, dtype=np.float32)).reshape(2, 3, 4).permute(2, 0, 1).contiguous()
  for item in a.schedule():
    uops, _, _ = full_rewrite(item.ast, PythonRenderer(), [])
    assert not [u for u in uops if u.op in (Ops.CMPEQ, Ops.WHERE)], "index math got a division guard"

@pytest.mark.parametrize("dt", [dtypes.int8, dtypes.int32, dtypes.uint32, dtypes.int64], ids=lambda d: d.name)
def test_guarded_program_never_divides_by_a_trapping_divisor(dt: DType) -> None:
  """After codegen, every IDIV/MOD divisor is provably safe or selected away from 0 (and from -1 next to MIN)."""
  sink = _program(lambda x, y: y, dt)
  uops, _, _ = full_rewrite(sink, PythonRenderer(), [])
  divs = [u for u in uops if u.op in (Ops.IDIV, Ops.MOD)]
  assert divs
  for d in divs:
    guard = d.src[1]
    assert guard.op is Ops.WHERE and guard.src[1].op is Ops.CONST and guard.src[1].arg == 1
  assert pm_safe_division.rewrite(divs[0]) is None  # already guarded: the rewrite reached its fixed point

def test_division_by_constant_zero_folds_to_zero() -> None:
  sink = _program(lambda x, y: y.const_like(0))
  uops, _, _ = full_rewrite(sink, PythonRenderer(), [])
  assert not [u for u in uops if u.op in (Ops.IDIV, Ops.MOD)]
