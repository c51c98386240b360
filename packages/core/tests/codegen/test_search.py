"""BEAM search: candidates apply and match the unoptimised kernel, the winner is cached on disk, BEAM=N end to end."""
from __future__ import annotations
import numpy as np
import pytest
from ember import Tensor, Device, Context
from ember.codegen.opt import Opt, apply_opts_list
from ember.codegen.search import CACHE_TABLE, beam_search, cache_key, candidate_opts, _buffers, _compile, _outputs
from ember.engine import realize as engine
from ember.helpers import diskcache_get, diskcache_put
from ember.uop.ops import UOp
from ember.uop.rewrite import graph_rewrite
from ember.uop.symbolic import symbolic

class _Wide:
  """A renderer stand-in with a SIMD width, so candidates include register blocks whatever the test device."""
  simd_width = 4
  has_threads = True

def _kernel(t: Tensor) -> UOp:
  return graph_rewrite([it for it in t.schedule() if it.kind != "copy"][-1].ast, symbolic, name="test: simplify")

def _matmul_ast(seed: int) -> tuple[UOp, np.ndarray, np.ndarray]:
  rng = np.random.default_rng(seed)
  a, b = rng.standard_normal((8, 12)).astype(np.float32), rng.standard_normal((12, 16)).astype(np.float32)
  return _kernel(Tensor(a).realize() @ Tensor(b).realize()), a, b

def test_every_candidate_matches_the_unoptimised_kernel() -> None:
  ast, _, _ = _matmul_ast(0)
  cands = candidate_opts(ast, _Wide())  # type: ignore[arg-type]
  assert () in cands and any(len(c) == 2 for c in cands) and len(set(cands)) == len(cands)
  dev = Device.DEFAULT
  base = _compile(ast, Device[dev].renderer, dev, [])
  bufs = _buffers(base.spec, dev, seed=1)
  base(bufs, {}, wait=True)
  want = _outputs(bufs, base.spec)
  for c in cands:
    apply_opts_list(ast, c)
    r = _compile(ast, Device[dev].renderer, dev, c)
    r(bufs, {}, wait=True)
    for got, exp in zip(_outputs(bufs, r.spec), want):
      np.testing.assert_allclose(got, exp, rtol=1e-4, atol=1e-4, err_msg=str(c))

def test_beam_search_picks_a_candidate_and_caches_it() -> None:
  ast, _, _ = _matmul_ast(2)
  renderer, dev = Device[Device.DEFAULT].renderer, Device.DEFAULT
  best = beam_search(ast, renderer, dev, 2, budget_s=20)
  key = cache_key(ast, renderer, dev)
  assert [Opt(*o) for o in diskcache_get(CACHE_TABLE, key)] == best  # stored as plain data: [[op, axis, amt], ...]
  assert tuple(o for o in best if o.op != "THREADS") in [tuple(c) for c in candidate_opts(ast, renderer)]
  # a cached choice is returned without searching: plant one and read it back
  diskcache_put(CACHE_TABLE, key, [["THREADS", 0, 1]])
  assert beam_search(ast, renderer, dev, 2, budget_s=0) == [Opt("THREADS", 0, 1)]

def test_beam_env_end_to_end_matches_numpy() -> None:
  rng = np.random.default_rng(5)
  a, b = rng.standard_normal((16, 24)).astype(np.float32), rng.standard_normal((24, 32)).astype(np.float32)
  x = rng.standard_normal((4, 64)).astype(np.float32)
  with Context(BEAM=1):
    engine._runner_cache.clear()
    np.testing.assert_allclose((Tensor(a) @ Tensor(b)).numpy(), a @ b, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(Tensor(x).max(1).numpy(), x.max(1))
    np.testing.assert_allclose(Tensor(x).sum(1).numpy(), x.sum(1), rtol=1e-5, atol=1e-5)

def test_cache_key_depends_on_kernel_and_device() -> None:
  ast1, _, _ = _matmul_ast(0)
  ast2 = _kernel(Tensor(np.ones((4, 8), np.float32)).realize().sum(1))
  r = Device[Device.DEFAULT].renderer
  assert cache_key(ast1, r, "CPU") != cache_key(ast2, r, "CPU")
  assert cache_key(ast1, r, "CPU") != cache_key(ast1, r, "PYTHON")

@pytest.mark.parametrize("shape", [(4, 64), (3, 48)])
def test_split_candidates_for_reductions(shape: tuple[int, int]) -> None:
  x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
  ast = _kernel(Tensor(x).realize().sum(1))
  splits = [c for c in candidate_opts(ast, _Wide()) if c and c[0].op == "SPLIT"]  # type: ignore[arg-type]
  assert all(shape[1] % c[0].amt == 0 for c in splits) and splits

def test_a_device_without_a_compiler_is_a_compile_error(tmp_path) -> None:
  # BEAM on a DISK tensor's kernel: a typed error naming the device, not an AttributeError on its missing compiler
  from ember.errors import CompileError
  ast, _, _ = _matmul_ast(2)
  device = f"DISK:{tmp_path / 'weights.bin'}"
  with pytest.raises(CompileError, match="has no compiler"):
    _compile(ast, Device[Device.DEFAULT].renderer, device, [])

def _symbolic_ast() -> tuple[UOp, np.ndarray]:
  from ember import Variable
  data = np.arange(40, dtype=np.float32).reshape(10, 4)
  return _kernel(Tensor(data).realize()[:Variable("pos", 1, 10).bind(3)].sum(0)), data

def test_symbolic_kernels_are_searched_at_a_representative_value() -> None:
  from ember.codegen.search import representative_values
  from ember.uop.ops import Ops
  ast, _ = _symbolic_ast()
  assert any(u.op is Ops.DEFINE_VAR for u in ast.toposort())
  assert representative_values(ast) == {"pos": 5}  # the middle of 1..10
  renderer, dev = Device[Device.DEFAULT].renderer, Device.DEFAULT
  with Context(IGNORE_BEAM_CACHE=1):
    best = beam_search(ast, renderer, dev, 2, budget_s=20)
  # searched (its winner cached), not handed back as the default untimed
  assert [Opt(*o) for o in diskcache_get(CACHE_TABLE, cache_key(ast, renderer, dev))] == best

def test_beam_on_a_symbolic_kernel_matches_numpy_at_every_value() -> None:
  from ember import Variable
  data = np.random.default_rng(3).standard_normal((10, 4)).astype(np.float32)
  cache = Tensor(data).realize()
  with Context(BEAM=1, IGNORE_BEAM_CACHE=1):
    for n in (1, 4, 10):
      engine._runner_cache.clear()
      got = cache[:Variable("pos", 1, 10).bind(n)].sum(0).numpy()
      np.testing.assert_allclose(got, data[:n].sum(0), rtol=1e-5, atol=1e-5)

def test_ignore_beam_cache_searches_again_and_stores_the_new_winner() -> None:
  ast, _, _ = _matmul_ast(4)
  renderer, dev = Device[Device.DEFAULT].renderer, Device.DEFAULT
  key = cache_key(ast, renderer, dev)
  planted = [["SPLIT", 0, 3]]  # well formed, but never a candidate (splits are 4..64)
  diskcache_put(CACHE_TABLE, key, planted)
  assert beam_search(ast, renderer, dev, 2, budget_s=0) == [Opt("SPLIT", 0, 3)]
  with Context(IGNORE_BEAM_CACHE=1):
    best = beam_search(ast, renderer, dev, 2, budget_s=20)
  assert best != [Opt("SPLIT", 0, 3)] and diskcache_get(CACHE_TABLE, key) == [[o.op, o.axis, o.amt] for o in best]

def test_jitbeam_searches_the_captured_kernels_only(monkeypatch) -> None:
  from ember import TinyJit
  from ember.codegen import search
  searched: list[UOp] = []
  real = search.beam_search
  def recording(ast: UOp, *args, **kwargs):
    searched.append(ast)
    return real(ast, *args, **kwargs)
  monkeypatch.setattr(search, "beam_search", recording)
  rng = np.random.default_rng(6)
  w = Tensor(rng.standard_normal((6, 5)).astype(np.float32)).realize()
  @TinyJit
  def f(x: Tensor) -> Tensor: return ((x @ w).relu() + 1).realize()
  with Context(JITBEAM=1, BEAM=0):
    engine._runner_cache.clear()
    for i in range(4):
      xn = rng.standard_normal((3, 6)).astype(np.float32)
      out = f(Tensor(xn).realize())
      if i == 0: assert searched == []  # the first call runs normally, under BEAM=0
      np.testing.assert_allclose(out.numpy(), np.maximum(xn @ w.numpy(), 0) + 1, rtol=1e-5, atol=1e-5)
  assert searched and len(searched) == len([r for r, _, _ in f.captured if r is not None])  # once each, at capture
