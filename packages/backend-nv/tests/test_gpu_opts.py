"""GPU kernel opts (LOCAL, PADTO, GROUP, GROUPTOP, UNROLL, TC) on MOCK+NV: each kernel compiled with an opt runs through
the host shim (shared memory checked) and matches the same kernel without opts; the launch it asks for is the one the
program gets, and an opt that does not fit raises KernelOptError."""
from __future__ import annotations
from typing import Callable
import numpy as np
import pytest
from ember import Tensor, dtypes
from ember.codegen import get_program
from ember.codegen.opt import KernelOptError, Opt, output_ranges
from ember.codegen.search import _buffers, _compile, _outputs
from ember.testing.hostshim import selected_device
from ember.uop.ops import AxisType, Ops, UOp
from ember_nv.renderer import CUDARenderer

def _t(*shape: int, seed: int = 0, dt=np.float32) -> Tensor:
  return Tensor(np.random.default_rng(seed).standard_normal(shape).astype(dt), device="PYTHON")

def _ast(t: Tensor) -> UOp: return next(it.ast for it in t.schedule() if it.kind == "kernel")

def _out(ast: UOp, i: int = -1) -> int: return output_ranges(ast)[i].arg[0]
def _red(ast: UOp) -> int:
  return next(r.arg[0] for r in ast.toposort() if r.op is Ops.RANGE and r.arg[1] is AxisType.REDUCE)

CASES: dict[str, tuple[Callable[[], Tensor], Callable[[UOp], list[Opt]], list[int]]] = {
  "local_16": (lambda: _t(64, 48) * 2 + 1, lambda a: [Opt("LOCAL", _out(a), 16)], [16, 1, 1]),
  "padto_local_100": (lambda: _t(100).exp2(), lambda a: [Opt("PADTO", _out(a), 32), Opt("LOCAL", _out(a), 32)],
                      [32, 1, 1]),
  "group_64_sum": (lambda: _t(4, 512).sum(1), lambda a: [Opt("GROUP", 0, 64)], [64, 1, 1]),
  "grouptop_64_max": (lambda: _t(4, 512).max(1), lambda a: [Opt("GROUPTOP", 0, 64)], [64, 1, 1]),
  "grouptop_48_sum": (lambda: _t(3, 96).sum(1), lambda a: [Opt("GROUPTOP", 0, 48)], [48, 1, 1]),
  "unroll_4_sum": (lambda: _t(8, 64).sum(1), lambda a: [Opt("UNROLL", _red(a), 4)], [8, 1, 1]),
  "tc_4_2": (lambda: _t(64, 64, dt=np.float16).float() @ _t(64, 64, seed=1, dt=np.float16).float(),
             lambda a: [Opt("TC", 4, 2)], [128, 1, 1]),
  "tc_1_0": (lambda: _t(64, 64, dt=np.float16).float() @ _t(64, 64, seed=1, dt=np.float16).float(),
             lambda a: [Opt("TC", 1, 0)], [32, 1, 1]),
}

def _run(ast: UOp, opts: list[Opt]) -> list[np.ndarray]:
  runner = _compile(ast, CUDARenderer(), "NV", opts)
  bufs = _buffers(runner.spec, "NV", 0)
  runner(bufs, {}, wait=True)
  return _outputs(bufs, runner.spec)

@pytest.mark.parametrize("name", list(CASES))
def test_opt_matches_the_unoptimised_kernel(name: str) -> None:
  build, opts_for, local = CASES[name]
  ast = _ast(build())
  opts = opts_for(ast)
  assert get_program(ast, CUDARenderer(), opts=opts).local_size == local
  with selected_device("MOCK+NV", "NV"):
    for got, want in zip(_run(ast, opts), _run(ast, [])):
      np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)

@pytest.mark.parametrize("opts", [[Opt("LOCAL", 1, 10)], [Opt("GROUP", 0, 32)], [Opt("TC", 4, 4)],
                                  [Opt("GROUP", 0, 64), Opt("LOCAL", 1, 16)], [Opt("UNROLL", 1, 3)],
                                  [Opt("PADTO", 0, 1)]])
def test_opts_that_do_not_fit_raise(opts: list[Opt]) -> None:
  ast = _ast(_t(64, 48, dt=np.float16).float() @ _t(48, 64, seed=1, dt=np.float16).float())
  with pytest.raises(KernelOptError): get_program(ast, CUDARenderer(), opts=opts)

def test_padto_gates_the_extra_iterations() -> None:
  ast = _ast(_t(100).exp2())
  spec = get_program(ast, CUDARenderer(), opts=[Opt("PADTO", _out(ast), 32), Opt("LOCAL", _out(ast), 32)])
  assert spec.global_size == [4, 1, 1] and "<100" in spec.src.replace(" ", "")
  assert dtypes.float32 in {u.dtype for u in spec.uops}

def test_beam_candidates_hold_the_gpu_opts_that_fit() -> None:
  from ember.codegen.search import candidate_opts
  matmul = _ast(_t(64, 64, dt=np.float16).float() @ _t(64, 64, seed=1, dt=np.float16).float())
  kinds = {o.op for cand in candidate_opts(matmul, CUDARenderer()) for o in cand}
  assert {"TC", "LOCAL", "UNROLL", "GROUP", "GROUPTOP"} <= kinds
  assert (Opt("TC", 4, 2),) in candidate_opts(matmul, CUDARenderer()) and (Opt("TC", 4, 4),) not in \
    candidate_opts(matmul, CUDARenderer())
  elementwise = _ast(_t(64, 48) * 2)
  assert {o.op for cand in candidate_opts(elementwise, CUDARenderer()) for o in cand} == {"LOCAL"}
