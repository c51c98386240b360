"""DEBUG levels (docs/debugging.md): each level prints what the table says and everything below it, nothing above:
1 a line per realize, 2 a line per kernel with its time, 3 each new kernel's opts, 4 its source, 5 its UOp graphs
(the AST and the lowered graph), 6 its linear program. Codegen output (3-6) shows for kernels built in that realize."""
from __future__ import annotations
import itertools
import re
import numpy as np
import pytest
from ember import Context, Tensor
from ember.engine import realize as engine
from ember.helpers import ansistrip

_fresh = itertools.count(1)

def run_fresh_kernel(level: int, capsys: pytest.CaptureFixture[str]) -> tuple[str, engine.CompiledRunner, np.ndarray]:
  """A reduction with a constant never used before (so it is built now) realized at DEBUG=`level`: what it printed,
  its runner and its value."""
  c = float(next(_fresh)) + 0.5 + 1000 * level
  data = np.arange(24, dtype=np.float32).reshape(4, 6)
  x = Tensor(data).realize()
  out = (x * c).sum(1)
  capsys.readouterr()
  with Context(DEBUG=level): result = out.numpy()
  np.testing.assert_allclose(result, (data * np.float32(c)).sum(1), rtol=1e-6)
  runner = next(r for r in engine._runner_cache.values() if any(u.op.name == "CONST" and u.arg == c
                                                                for u in r.spec.uops))
  return ansistrip(capsys.readouterr().err), runner, result

def kernel_lines(err: str) -> list[str]: return [ln for ln in err.splitlines() if ln.startswith("***")]

@pytest.mark.parametrize("level", [0, 1, 2, 3, 4, 5, 6])
def test_each_level_prints_its_own_and_lower_levels_output(level, capsys):
  err, runner, _ = run_fresh_kernel(level, capsys)
  name, spec = runner.spec.name, runner.spec
  assert (re.search(r"^realize: \d+ calls", err, re.M) is not None) == (level >= 1)
  assert (len([ln for ln in kernel_lines(err) if f" {name} " in ln]) == 1) == (level >= 2)
  opts = re.search(rf"^kernel {name}: opts \[.*\], global .*, local .*$", err, re.M)
  assert (opts is not None) == (level >= 3)
  assert (spec.src.strip() in err) == (level >= 4)
  assert (f"kernel {name}, AST:" in err and f"kernel {name}, lowered:" in err) == (level >= 5)
  assert (f"kernel {name}, linear program:" in err) == (level >= 6)
  if level == 0: assert err == ""

def test_level_5_prints_every_node_of_the_kernel_graph(capsys):
  err, runner, _ = run_fresh_kernel(5, capsys)
  ast_text = err.split(f"kernel {runner.spec.name}, AST:\n", 1)[1].split(f"kernel {runner.spec.name}:", 1)[0]
  nodes = [ln for ln in ast_text.splitlines() if re.match(r"x\d+ = UOp\(Ops\.", ln)]
  assert nodes and nodes[-1].startswith(f"x{len(nodes) - 1} = UOp(Ops.SINK")
  assert sum("Ops.REDUCE" in ln for ln in nodes) == 1 and sum("Ops.STORE" in ln for ln in nodes) == 1

def test_level_6_lists_the_linear_program_one_uop_a_line(capsys):
  err, runner, _ = run_fresh_kernel(6, capsys)
  listing = err.split(f"kernel {runner.spec.name}, linear program:\n", 1)[1].splitlines()[:len(runner.spec.uops)]
  assert [ln.split()[:2] for ln in listing] == [[str(i), u.op.name] for i, u in enumerate(runner.spec.uops)]
  for ln, u in zip(listing, runner.spec.uops):  # each source by its index in the list, always an earlier one
    srcs = [int(s) for s in re.findall(r"\d+", ln.split("[", 1)[1].split("]", 1)[0])] if "[" in ln else []
    assert srcs == [runner.spec.uops.index(s) for s in u.src] and all(s < int(ln.split()[0]) for s in srcs)
