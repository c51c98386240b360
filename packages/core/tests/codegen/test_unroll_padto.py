"""UNROLL and PADTO (ember.codegen.opt) are opts of the kernel AST, so they apply on every device: on the PYTHON
reference device each kernel with them computes what the unoptimised kernel does, and the program has the loop
trips and gates they promise."""
from __future__ import annotations
import numpy as np
import pytest
from ember import Tensor
from ember.codegen import get_program
from ember.codegen.opt import KernelOptError, Opt, output_ranges
from ember.codegen.search import _buffers, _compile, _outputs
from ember.device import Device
from ember.uop.ops import AxisType, Ops, UOp

def _t(*shape: int, seed: int = 0) -> Tensor:
  return Tensor(np.random.default_rng(seed).standard_normal(shape).astype(np.float32), device="PYTHON")

def _ast(t: Tensor) -> UOp: return next(it.ast for it in t.schedule() if it.kind == "kernel")

def _run(ast: UOp, opts: list[Opt]) -> list[np.ndarray]:
  runner = _compile(ast, Device["PYTHON"].renderer, "PYTHON", opts)
  bufs = _buffers(runner.spec, "PYTHON", 0)
  runner(bufs, {}, wait=True)
  return _outputs(bufs, runner.spec)

def _reduce_axis(ast: UOp) -> int:
  return next(r.arg[0] for r in ast.toposort() if r.op is Ops.RANGE and r.arg[1] is AxisType.REDUCE)

@pytest.mark.parametrize("build", [lambda: _t(6, 40).sum(1), lambda: _t(5, 24).max(1), lambda: _t(3, 16) @ _t(16, 4)])
@pytest.mark.parametrize("amt", [2, 4, 8])
def test_unroll_matches_unoptimised(build, amt: int) -> None:
  ast = _ast(build())
  opts = [Opt("UNROLL", _reduce_axis(ast), amt)]
  uops = get_program(ast, Device["PYTHON"].renderer, opts=opts).uops
  loops = [u.src[0].arg for u in uops if u.op is Ops.RANGE and u.arg[1] is AxisType.REDUCE]
  assert loops and all(n * amt in (40, 24, 16) for n in loops)  # the reduction runs 1/amt of its trips
  for got, want in zip(_run(ast, opts), _run(ast, [])): np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)

@pytest.mark.parametrize("amt", [8, 16, 64])
def test_padto_matches_unoptimised(amt: int) -> None:
  ast = _ast((_t(10, 20) * 2).exp2() + _t(10, 20, seed=1))
  opts = [Opt("PADTO", output_ranges(ast)[-1].arg[0], amt)]
  uops = get_program(ast, Device["PYTHON"].renderer, opts=opts).uops
  assert -(-20 // amt) * amt in {u.src[0].arg for u in uops if u.op is Ops.RANGE}
  assert all(len(u.src[0].src) == 3 for u in uops if u.op in (Ops.LOAD, Ops.STORE))  # every access gated
  for got, want in zip(_run(ast, opts), _run(ast, [])): np.testing.assert_array_equal(got, want)

def test_unroll_and_padto_refuse_what_does_not_fit() -> None:
  ast = _ast(_t(6, 40).sum(1))
  for opt in (Opt("UNROLL", _reduce_axis(ast), 3), Opt("UNROLL", output_ranges(ast)[0].arg[0], 2),
              Opt("PADTO", _reduce_axis(ast), 8), Opt("PADTO", output_ranges(ast)[0].arg[0], 1)):
    with pytest.raises(KernelOptError): get_program(ast, Device["PYTHON"].renderer, opts=[opt])
