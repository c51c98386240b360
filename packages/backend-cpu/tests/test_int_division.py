"""Integer division on both CPU renderers follows ember's rule instead of trapping (SIGFPE killed the process):
x // 0 == x % 0 == 0 for a zero divisor tensor (a Python 0 raises), MIN // -1 == MIN, MIN % -1 == 0, for every int
dtype, tensor and scalar divisors, numpy as the oracle. Each case runs in a child process first, so a regression is a
failed test, not a dead test run."""
from __future__ import annotations
import os
import subprocess
import sys
from typing import Any, Callable, Iterator
import numpy as np
import pytest
from cpu_kernels import reopened_cpu
from ember import Tensor, dtypes
from ember.errors import IntegerDivisionByZeroError
from ember.dtype import DType
from ember.testing import division_operands, trunc_div

INTS = [dtypes.int8, dtypes.int16, dtypes.int32, dtypes.int64,
        dtypes.uint8, dtypes.uint16, dtypes.uint32, dtypes.uint64]

@pytest.fixture(params=["CPU:C", "CPU:LLVM"])
def cpu(request: pytest.FixtureRequest) -> Iterator[str]:
  with reopened_cpu(request.param): yield request.param

OPS: dict[str, tuple[Callable[[Any, Any], Any], Callable[[np.ndarray, np.ndarray], np.ndarray]]] = {
  "floordiv": (lambda a, b: a // b, lambda a, b: a // b),
  "mod": (lambda a, b: a % b, lambda a, b: a % b),
  "trunc": (lambda a, b: a.div(b, rounding_mode="trunc"), trunc_div),
  "fmod": (lambda a, b: a.fmod(b), np.fmod),
}

def test_division_by_zero_does_not_kill_the_process() -> None:
  code = ("from ember import Tensor, dtypes\n"
          "a = Tensor([7, -2**31], dtype=dtypes.int32)\n"
          "b = Tensor([0, -1], dtype=dtypes.int32)\n"
          "print((a // b).tolist(), (a % b).tolist())")
  for dev in ("CPU:C", "CPU:LLVM"):
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "DEV": dev})
    assert done.returncode == 0, f"DEV={dev}: exit {done.returncode}\n{done.stderr[-2000:]}"
    assert done.stdout.split() == ["[0,", "-2147483648]", "[0,", "0]"]

@pytest.mark.parametrize("dt", INTS, ids=lambda d: d.name)
def test_int_division_rule(cpu: str, dt: DType) -> None:
  a, b = division_operands(dt)
  ta, tb = Tensor(a, device="CPU"), Tensor(b, device="CPU")
  scalars = [0, 3, -1] if dt.kind == "i" else [0, 3]
  with np.errstate(all="ignore"):
    for name, (ours, theirs) in OPS.items():
      np.testing.assert_array_equal(ours(ta, tb).numpy(), theirs(a, b), err_msg=f"{name} {dt!r} tensor divisor {cpu}")
      for s in scalars:
        want = theirs(a, np.full_like(b[:1], s))
        if s == 0:  # a Python 0 is refused (as by torch); a zero tensor (a folded constant) gives the rule's value
          with pytest.raises(IntegerDivisionByZeroError): ours(ta, s)
          zero = Tensor.full((), 0, dtype=dt, device="CPU")
          np.testing.assert_array_equal(ours(ta, zero).numpy(), want, err_msg=f"{name} {dt!r} by 0 on {cpu}")
          continue
        np.testing.assert_array_equal(ours(ta, s).numpy(), want, err_msg=f"{name} {dt!r} by {s} on {cpu}")
    np.testing.assert_array_equal((7 // tb).numpy(), np.full_like(b, 7) // b, err_msg=f"7 // {dt!r} on {cpu}")
    np.testing.assert_array_equal((7 % tb).numpy(), np.full_like(b, 7) % b, err_msg=f"7 % {dt!r} on {cpu}")
