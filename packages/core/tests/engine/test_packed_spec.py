"""A runner's ProgramSpec keeps its linear program packed (`ember.engine.realize.PackedSpec`): reading it gives what
codegen generated, and the runner cache does not keep the program's nodes alive."""
from __future__ import annotations
import dataclasses
import numpy as np
from ember import Device, Tensor
from ember.codegen import get_program
from ember.engine.realize import PackedSpec, get_runner
from ember.uop.ops import Ops, UOp

def _ast(scale: float, device: str = "PYTHON") -> UOp:
  t = (Tensor(np.arange(24, dtype=np.float32).reshape(4, 6), device=device) * scale).sum(1)
  return next(it.ast for it in t.schedule() if it.kind == "kernel")

def test_runner_uops_are_the_generated_program():
  ast = _ast(3.25)
  spec = get_runner("PYTHON", ast).spec
  fresh = get_program(ast, Device["PYTHON"].renderer, "PYTHON")
  assert isinstance(spec, PackedSpec)
  assert spec.uops == fresh.uops and spec.src == fresh.src and spec.name == fresh.name  # hash-consed: the same nodes
  assert [u.op for u in spec.uops] == [u.op for u in fresh.uops]
  assert dataclasses.replace(spec, name="other").uops == fresh.uops

def test_runner_spec_holds_no_node_but_its_variables():
  spec = get_runner("PYTHON", _ast(5.75)).spec
  def nodes(value: object) -> list[UOp]:
    items = value if isinstance(value, (list, tuple)) else value.values() if isinstance(value, dict) else [value]
    return [x for x in items if isinstance(x, UOp)]
  held = {name: len(nodes(value)) for name, value in vars(spec).items() if name != "vars" and nodes(value)}
  assert not held, f"the runner's spec holds nodes in {held}"
  assert len(spec.uops) > 5  # and still gives them when read

def test_a_program_pickle_refuses_is_kept_as_it_is():
  spec = get_program(_ast(7.5), Device["PYTHON"].renderer, "PYTHON")
  odd = UOp(Ops.NOOP, arg=lambda: None)  # a lambda cannot be pickled
  fields = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}
  packed = PackedSpec(**{**fields, "uops": [*spec.uops, odd]})
  assert packed.uops[-1] is odd and packed.uops[:-1] == spec.uops
